//! The cgroup v2 directory the programs attach to.
use std::{
    fs::File,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no cgroup2 filesystem in /proc/self/mountinfo: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or pass --cgroup"
    )]
    NoCgroup2Mount,
    #[error("reading /proc/self/mountinfo: {0}")]
    Mountinfo(std::io::Error),
    #[error("cannot open cgroup {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a cgroup v2 directory (pass a directory under the cgroup2 mount)")]
    NotCgroup2 { path: PathBuf },
}

/// The root of the cgroup2 hierarchy, from this process's mount table (never hard-coded: on
/// hybrid systems it is /sys/fs/cgroup/unified, on unified ones /sys/fs/cgroup).
pub fn cgroup2_root() -> Result<PathBuf, CgroupError> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::Mountinfo)?;
    interceptor_parse::proc::cgroup2_mount(&mountinfo).ok_or(CgroupError::NoCgroup2Mount)
}

/// Opens `path` and checks it is a cgroup v2 directory.
pub fn open_cgroup2(path: &Path) -> Result<File, CgroupError> {
    let file = File::open(path).map_err(|source| CgroupError::Open {
        path: path.to_owned(),
        source,
    })?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| CgroupError::Open {
        path: path.to_owned(),
        source: e.into(),
    })?;
    if fs.filesystem_type() != nix::sys::statfs::CGROUP2_SUPER_MAGIC || !path.is_dir() {
        return Err(CgroupError::NotCgroup2 {
            path: path.to_owned(),
        });
    }
    Ok(file)
}

/// The cgroup2 hierarchy at `dir`: `dir` itself, or on a hybrid host (cgroup v1 controllers
/// at /sys/fs/cgroup, cgroup2 beside them) its `unified` directory. A host's /sys/fs/cgroup
/// mounted in a container is either, and the DaemonSet cannot know which.
pub fn cgroup2_at(dir: &Path) -> Result<PathBuf, CgroupError> {
    match open_cgroup2(dir) {
        Ok(_) => Ok(dir.to_owned()),
        Err(e @ CgroupError::NotCgroup2 { .. }) => {
            let unified = dir.join("unified");
            open_cgroup2(&unified).map(|_| unified).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

/// How deep below the directory it is given [`find_kubepods`] looks: kind's
/// `kubelet.slice/kubelet-kubepods.slice` and a custom `--cgroup-root` such as `/k8s/kubepods`
/// are two levels down.
const KUBEPODS_SEARCH_DEPTH: usize = 3;

/// What [`find_kubepods`] found under a cgroup2 directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubepodsSearch {
    /// The one shallowest directory named like the kubelet's pod cgroup.
    Found(PathBuf),
    /// None within the depth searched.
    NotFound,
    /// Several equally shallow ones (e.g. a node whose cgroup driver changed).
    Ambiguous(Vec<PathBuf>),
}

impl KubepodsSearch {
    /// Where to attach: the kubelet's pod cgroup when there is one, else `dir` itself, where
    /// every pod's sockets are seen (the programs select pods by netns cookie, so a socket
    /// outside a meshed pod costs one map lookup).
    pub fn attach_at(&self, dir: &Path) -> PathBuf {
        match self {
            Self::Found(path) => path.clone(),
            Self::NotFound | Self::Ambiguous(_) => dir.to_owned(),
        }
    }
}

impl std::fmt::Display for KubepodsSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Found(_) => f.write_str("the kubelet's pod cgroup"),
            Self::NotFound => write!(
                f,
                "no kubepods or *kubepods.slice directory within {KUBEPODS_SEARCH_DEPTH} levels: \
                 attaching where every pod's sockets are seen"
            ),
            Self::Ambiguous(paths) => write!(
                f,
                "several equally shallow pod cgroups ({}): attaching where every pod's sockets \
                 are seen",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The kubelet's pod cgroup under `dir` (a cgroup2 directory, or any directory tree): the
/// shallowest directory, breadth first and at most [`KUBEPODS_SEARCH_DEPTH`] levels down, named
/// `kubepods` (cgroupfs driver, custom cgroup roots) or ending in `kubepods.slice` (systemd
/// driver; kind's `kubelet-kubepods.slice`). Pod cgroups are not descended into. Directories
/// that cannot be read are passed over.
pub fn find_kubepods(dir: &Path) -> KubepodsSearch {
    let mut level = vec![dir.to_owned()];
    for _ in 0..KUBEPODS_SEARCH_DEPTH {
        let mut found = Vec::new();
        let mut next = Vec::new();
        for (name, path) in subdirectories(&level) {
            if name == "kubepods" || name.ends_with("kubepods.slice") {
                found.push(path);
            } else if !is_pod_cgroup(&name) {
                next.push(path);
            }
        }
        found.sort();
        match found.len() {
            0 => level = next,
            1 => return KubepodsSearch::Found(found.remove(0)),
            _ => return KubepodsSearch::Ambiguous(found),
        }
    }
    KubepodsSearch::NotFound
}

/// The directories right below `parents`, with their names; those that cannot be read are
/// passed over, and symbolic links are not followed (a cgroup tree has none).
fn subdirectories(parents: &[PathBuf]) -> Vec<(String, PathBuf)> {
    parents
        .iter()
        .filter_map(|parent| std::fs::read_dir(parent).ok())
        .flat_map(|entries| entries.filter_map(Result::ok))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            )
        })
        .collect()
}

/// A pod's cgroup: cgroupfs `pod<uid>`, systemd `kubepods-<qos>-pod<uid>.slice`.
fn is_pod_cgroup(name: &str) -> bool {
    name.starts_with("pod") || name.contains("-pod")
}

/// How deep below the kubelet's pod cgroup [`find_pod_cgroup`] looks: a pod's cgroup is right
/// below it (Guaranteed) or below its QoS class's (`besteffort`, `burstable`); one more level
/// for a layout of its own.
const POD_SEARCH_DEPTH: usize = 3;

/// Whether `name` is the cgroup of the pod with `uid`: `pod<uid>` (cgroupfs driver), or
/// `<prefix>-pod<uid, its - as _>.slice` (systemd: `kubepods-besteffort-pod..._...slice`, kind's
/// `kubelet-kubepods-...`).
fn is_cgroup_of_pod(name: &str, uid: &str) -> bool {
    if let Some(rest) = name.strip_prefix("pod") {
        return rest == uid;
    }
    name.strip_suffix(".slice")
        .and_then(|n| n.rsplit_once("-pod"))
        .is_some_and(|(_, escaped)| escaped == uid.replace('-', "_"))
}

/// The cgroup of the pod with `uid` below `kubepods` (the kubelet's pod cgroup, see
/// [`find_kubepods`]): breadth first, at most [`POD_SEARCH_DEPTH`] levels down, not descending
/// into other pods' cgroups. The UID is compared with directory names, never joined to a path.
pub fn find_pod_cgroup(kubepods: &Path, uid: &str) -> Option<PathBuf> {
    if uid.is_empty() {
        return None;
    }
    let mut level = vec![kubepods.to_owned()];
    for _ in 0..POD_SEARCH_DEPTH {
        let mut next = Vec::new();
        for (name, path) in subdirectories(&level) {
            if is_cgroup_of_pod(&name, uid) {
                return Some(path);
            }
            if !is_pod_cgroup(&name) {
                next.push(path);
            }
        }
        level = next;
    }
    None
}

/// The processes in `cgroup` and its descendants, breadth first (a pod's processes are in its
/// containers' cgroups, below the pod's), read one directory at a time as they are asked for.
pub fn processes_in(cgroup: &Path) -> impl Iterator<Item = u32> {
    let mut dirs = std::collections::VecDeque::from([cgroup.to_owned()]);
    std::iter::from_fn(move || {
        let dir = dirs.pop_front()?;
        let pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        dirs.extend(
            std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
        Some(pids)
    })
    .flatten()
}

/// The directory of the cgroup with id `id` (on cgroup2, the directory's inode number), found by
/// walking the cgroup2 hierarchy; `None` when it is gone or cannot be read.
pub fn path_of_id(id: u64) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let mut dirs = vec![cgroup2_root().ok()?];
    while let Some(dir) = dirs.pop() {
        if std::fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            return Some(dir);
        }
        let entries = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok);
        dirs.extend(
            entries
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree with `dirs` (relative paths) made under a fresh temporary directory,
    /// removed on drop.
    struct Tree(PathBuf);

    impl Tree {
        fn new(dirs: &[&str]) -> Self {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let root = std::env::temp_dir().join(format!(
                "icpt-kubepods-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            for dir in dirs {
                std::fs::create_dir_all(root.join(dir)).unwrap();
            }
            std::fs::create_dir_all(&root).unwrap();
            Self(root)
        }

        fn search(&self) -> KubepodsSearch {
            match find_kubepods(&self.0) {
                KubepodsSearch::Found(path) => {
                    KubepodsSearch::Found(path.strip_prefix(&self.0).unwrap().to_owned())
                }
                KubepodsSearch::Ambiguous(paths) => KubepodsSearch::Ambiguous(
                    paths
                        .iter()
                        .map(|p| p.strip_prefix(&self.0).unwrap().to_owned())
                        .collect(),
                ),
                KubepodsSearch::NotFound => KubepodsSearch::NotFound,
            }
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn found(path: &str) -> KubepodsSearch {
        KubepodsSearch::Found(PathBuf::from(path))
    }

    #[test]
    fn finds_the_kubelets_pod_cgroup_whatever_the_driver() {
        // systemd driver.
        let systemd = Tree::new(&[
            "system.slice/containerd.service",
            "user.slice/user-1000.slice/session-1.scope",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-a.scope",
            "kubepods.slice/kubepods-pod2.slice/cri-containerd-b.scope",
        ]);
        assert_eq!(systemd.search(), found("kubepods.slice"));
        // cgroupfs driver (k3s too).
        let cgroupfs = Tree::new(&[
            "kubepods/besteffort/pod1/a",
            "kubepods/pod2/b",
            "init.scope",
        ]);
        assert_eq!(cgroupfs.search(), found("kubepods"));
        // kind: the kubelet's own slice first.
        let kind = Tree::new(&[
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
            "system.slice/containerd.service",
        ]);
        assert_eq!(kind.search(), found("kubelet.slice/kubelet-kubepods.slice"));
        // A custom --cgroup-root.
        let custom = Tree::new(&["k8s/kubepods/burstable/pod1", "k8s/other"]);
        assert_eq!(custom.search(), found("k8s/kubepods"));
        // Given the pod cgroup itself: nothing below is named like it.
        let itself = Tree::new(&["besteffort/pod1/a", "pod2/b"]);
        assert_eq!(itself.search(), KubepodsSearch::NotFound);
        assert_eq!(
            KubepodsSearch::NotFound.attach_at(&itself.0),
            itself.0,
            "attached at the directory given"
        );
    }

    #[test]
    fn the_shallowest_wins_and_a_tie_or_nothing_means_the_directory_given() {
        let shallow = Tree::new(&["kubepods.slice", "a/b/kubepods"]);
        assert_eq!(shallow.search(), found("kubepods.slice"));
        let tie = Tree::new(&["kubepods", "kubepods.slice"]);
        assert_eq!(
            tie.search(),
            KubepodsSearch::Ambiguous(vec!["kubepods".into(), "kubepods.slice".into()])
        );
        assert_eq!(tie.search().attach_at(&tie.0), tie.0);
        // Deeper than the search goes, or inside a pod's cgroup: not found.
        let deep = Tree::new(&["a/b/c/kubepods", "pod1/kubepods", "x-pod2.slice/kubepods"]);
        assert_eq!(deep.search(), KubepodsSearch::NotFound);
        // A file of that name is no cgroup.
        let file = Tree::new(&["a"]);
        std::fs::write(file.0.join("kubepods"), "").unwrap();
        assert_eq!(file.search(), KubepodsSearch::NotFound);
    }

    #[test]
    fn finds_a_pods_cgroup_by_its_uid_whatever_the_driver() {
        let uid = "1f0e2d3c-aaaa-4bbb-8ccc-0123456789ab";
        let escaped = uid.replace('-', "_");
        let find = |tree: &Tree, uid: &str| {
            find_pod_cgroup(&tree.0, uid).map(|p| p.strip_prefix(&tree.0).unwrap().to_owned())
        };
        // cgroupfs: below the QoS class, or right below kubepods (Guaranteed).
        let cgroupfs = Tree::new(&[
            "besteffort/pod0a/c1",
            &format!("burstable/pod{uid}/c2"),
            "podffff/c3",
        ]);
        assert_eq!(
            find(&cgroupfs, uid),
            Some(PathBuf::from(format!("burstable/pod{uid}")))
        );
        assert_eq!(find(&cgroupfs, "ffff"), Some(PathBuf::from("podffff")));
        // systemd, and kind's prefix.
        let systemd = Tree::new(&[
            &format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{escaped}.slice/cri-containerd-a.scope"
            ),
            "kubepods-pod0b.slice",
        ]);
        assert_eq!(
            find(&systemd, uid),
            Some(PathBuf::from(format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{escaped}.slice"
            )))
        );
        let kind = Tree::new(&[&format!(
            "kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{escaped}.slice"
        )]);
        assert!(find(&kind, uid).is_some());
        // Not another pod's, whose UID merely starts or ends the same; not inside another pod;
        // not deeper than the search goes; never a path made of the UID.
        let near = Tree::new(&[
            &format!("besteffort/pod{uid}0"),
            &format!("besteffort/pod0{uid}"),
            &format!("podother/pod{uid}"),
            &format!("a/b/c/pod{uid}"),
        ]);
        assert_eq!(find(&near, uid), None);
        assert_eq!(find(&cgroupfs, ""), None);
        assert_eq!(find(&cgroupfs, "../besteffort"), None);
    }

    #[test]
    fn a_pods_processes_are_found_in_its_containers_cgroups() {
        let tree = Tree::new(&["pod1/sandbox", "pod1/app/inner", "pod2/x"]);
        let procs = |dir: &str, pids: &str| {
            std::fs::write(tree.0.join(dir).join("cgroup.procs"), pids).unwrap();
        };
        procs("pod1", "");
        procs("pod1/app/inner", "30\n");
        procs("pod1/sandbox", "10\n11\n");
        procs("pod2/x", "99\n");
        let mut found: Vec<u32> = processes_in(&tree.0.join("pod1")).collect();
        // Breadth first: the containers' before the one nested in a container.
        assert_eq!(found.pop(), Some(30));
        found.sort();
        assert_eq!(found, [10, 11]);
        assert_eq!(processes_in(&tree.0.join("pod3")).count(), 0);
    }

    #[test]
    fn the_cgroup2_hierarchy_is_the_directory_or_its_unified_one() {
        let root = cgroup2_root().expect("a cgroup2 mount");
        assert_eq!(cgroup2_at(&root).unwrap(), root);
        // This machine kind is hybrid: cgroup2 at /sys/fs/cgroup/unified, v1 beside it.
        if root.file_name().is_some_and(|n| n == "unified") {
            assert_eq!(cgroup2_at(root.parent().unwrap()).unwrap(), root);
        }
        let plain = std::env::temp_dir();
        assert!(matches!(
            cgroup2_at(&plain),
            Err(CgroupError::NotCgroup2 { path }) if path == plain
        ));
    }
}
