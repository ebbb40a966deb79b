//! The node agent with no cgroup setting to get right (`--kubepods-under`): given the host's
//! cgroup2 directory, it finds the kubelet's pod cgroup whatever the cgroup driver (systemd
//! `kubepods.slice/...`, cgroupfs `kubepods/...`), or attaches at the directory itself when
//! there is none, and a pod whose process runs in a container's cgroup is meshed.
//!
//! Each test makes a child cgroup of its own as the stand-in for the host's cgroup2 root and
//! builds the kubelet's layout inside it; nothing is attached to the machine's root cgroup.
use std::{
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use interceptor_tests::{
    Cgroup, Landing, PodFixture,
    agent_home::{AgentHome, UNREACHABLE},
    privileged,
    scenario::{APP_UID, Servers},
};
use serde_json::Value;

/// The kubelet's cgroups, `dirs` (relative paths, parents first) made under a test cgroup that
/// stands for the host's cgroup2 root; removed deepest first, then the root (fields drop in
/// order, a vector's elements too).
struct KubeletLayout {
    /// Deepest first.
    dirs: Vec<Cgroup>,
    root: Cgroup,
}

impl KubeletLayout {
    fn new(tag: &str, dirs: &[&str]) -> Self {
        let root = Cgroup::new(tag);
        let mut made = Vec::new();
        for dir in dirs {
            let path = root.path.join(dir);
            std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
            made.push(Cgroup { path });
        }
        made.reverse();
        Self { dirs: made, root }
    }

    /// The deepest cgroup: a container's, where the pod's processes run.
    fn container(&self) -> &Path {
        &self.dirs[0].path
    }
}

/// The cgroup the agent's pinned connect4 link is attached to, by id (a cgroup2 directory's
/// inode number).
fn attached_cgroup_id(home: &AgentHome) -> u64 {
    let pin = home.bpffs.join("link_icpt_connect4");
    let link = interceptor_sys::obj_get(&pin)
        .unwrap_or_else(|e| panic!("{}: {e}", pin.display()))
        .unwrap_or_else(|| panic!("nothing pinned at {}", pin.display()));
    match interceptor_sys::link_info(link.as_fd())
        .expect("the link's info")
        .target
    {
        interceptor_sys::LinkTarget::Cgroup { id } => id,
        other => panic!("connect4's link is attached to {other:?}"),
    }
}

fn cgroup_id(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .ino()
}

/// The cgroup the agent logged it chose, and why (its JSON log at `log`).
fn logged_choice(log: &Path) -> (PathBuf, String) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let choices: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|entry| entry["message"] == "attaching to this cgroup")
        .collect();
    assert_eq!(choices.len(), 1, "one line says which cgroup: {text}");
    (
        PathBuf::from(choices[0]["cgroup"].as_str().expect("its cgroup field")),
        choices[0]["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Runs an agent with only `--kubepods-under` pointing at the layout's root; checks it chose
/// `expected` (relative to the root; "" for the root itself) and that a pod whose process runs
/// in the layout's deepest cgroup is meshed: its connect lands on the proxy with its original
/// destination. A second pod, not registered, whose process runs in the same cgroup, is left
/// alone. Then an agent started again takes the links over where they are.
fn meshes_a_pod_under(tag: &str, dirs: &[&str], expected: &str) -> String {
    let layout = KubeletLayout::new(tag, dirs);
    let mut fixture = PodFixture::new(tag);
    fixture.set_processes_cgroup(layout.container());
    let _servers = Servers::start(&fixture);
    let mut unmeshed = PodFixture::new(&format!("{tag}-unmeshed"));
    unmeshed.set_processes_cgroup(layout.container());

    let home = AgentHome::new(&layout.root.path);
    let log = home.log_path();
    let root = layout.root.path.display().to_string();
    let extra = ["--kubepods-under", root.as_str(), "--log-format", "json"];
    let agent = home.agent().args(&extra).log_to(&log).start();
    let (chosen, reason) = logged_choice(&log);
    let expected = layout.root.path.join(expected);
    assert_eq!(chosen, expected, "the agent chose ({reason})");
    assert_eq!(attached_cgroup_id(&home), cgroup_id(&expected));

    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert_eq!(
        unmeshed.in_pod().uid(APP_UID).connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into()),
        "a process in the attached cgroup whose namespace is not registered is not intercepted"
    );
    assert_eq!(home.problems(), Vec::<String>::new());

    // The next agent finds the same cgroup and takes the pinned links over there.
    agent.stop();
    let _agent = home.agent().args(&extra).log_to(&log).start();
    assert_eq!(attached_cgroup_id(&home), cgroup_id(&expected));
    assert_eq!(home.problems(), Vec::<String>::new());
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    reason
}

#[test]
fn the_agent_finds_the_systemd_drivers_kubepods_slice_and_meshes_a_pod_in_it() {
    if !privileged() {
        return;
    }
    meshes_a_pod_under(
        "cg-systemd",
        &[
            "system.slice",
            "kubepods.slice",
            "kubepods.slice/kubepods-besteffort.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d.slice",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b2c3d.slice/cri-containerd-1234.scope",
        ],
        "kubepods.slice",
    );
}

#[test]
fn the_agent_finds_the_cgroupfs_drivers_kubepods_and_meshes_a_pod_in_it() {
    if !privileged() {
        return;
    }
    meshes_a_pod_under(
        "cg-cgroupfs",
        &[
            "kubepods",
            "kubepods/besteffort",
            "kubepods/besteffort/pod0a1b2c3d",
            "kubepods/besteffort/pod0a1b2c3d/1234",
        ],
        "kubepods",
    );
}

/// No directory named like the kubelet's: the agent attaches at the directory it was given,
/// where every pod's sockets are seen, and says why.
#[test]
fn without_a_kubepods_cgroup_the_agent_attaches_at_the_directory_given() {
    if !privileged() {
        return;
    }
    let reason = meshes_a_pod_under("cg-none", &["pods", "pods/web", "pods/web/1234"], "");
    assert!(reason.contains("no kubepods"), "{reason}");
}

/// An agent attached elsewhere before (here at the directory itself, as with `--cgroup`) is
/// replaced by one that finds the kubelet's cgroup: the pinned links move there, and the pod
/// stays meshed.
#[test]
fn links_attached_elsewhere_move_to_the_cgroup_found() {
    if !privileged() {
        return;
    }
    let layout = KubeletLayout::new(
        "cg-move",
        &[
            "kubepods",
            "kubepods/pod0a1b2c3d",
            "kubepods/pod0a1b2c3d/1234",
        ],
    );
    let mut fixture = PodFixture::new("cg-move");
    fixture.set_processes_cgroup(layout.container());
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&layout.root.path);
    let first = home.agent().start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    assert_eq!(attached_cgroup_id(&home), cgroup_id(&layout.root.path));
    first.stop();

    let root = layout.root.path.display().to_string();
    let _agent = home.agent().args(&["--kubepods-under", &root]).start();
    assert_eq!(
        attached_cgroup_id(&home),
        cgroup_id(&layout.root.path.join("kubepods"))
    );
    assert_eq!(home.problems(), Vec::<String>::new());
    assert_eq!(
        fixture
            .in_pod()
            .uid(APP_UID)
            .connect(UNREACHABLE)
            .proxy_orig()
            .to_string(),
        UNREACHABLE
    );
}
