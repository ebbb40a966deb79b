//! Namespaces, cgroups and the standard test pod.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Probe, unique_name};

fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace created with `ip netns add`, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        let name = unique_name(tag);
        sh("ip", &["netns", "add", &name]);
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// A network namespace owned by a user namespace of its own whose ids 0-65535 are the
    /// host's [`POD_USERS_ON_HOST`] on (what the kubelet makes for `hostUsers: false`). Made by a
    /// child that unshares both, whose maps this process writes (as a runtime does), then named
    /// with `ip netns attach`: the network namespace keeps its user namespace alive.
    pub fn with_own_users(tag: &str) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let name = unique_name(tag);
        let mut child = Command::new("unshare")
            .args(["--user", "--net", "sleep", "60"])
            .spawn()
            .expect("unshare");
        let ours = std::fs::metadata("/proc/self/ns/net")
            .expect("our netns")
            .ino();
        let deadline = Instant::now() + Duration::from_secs(10);
        // unshare makes the namespaces, then runs sleep: wait for the first.
        loop {
            let theirs = std::fs::metadata(format!("/proc/{}/ns/net", child.id()));
            if theirs.is_ok_and(|m| m.ino() != ours) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "unshare never made its namespaces"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let map = format!("0 {POD_USERS_ON_HOST} 65536\n");
        for file in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{file}", child.id()), &map)
                .unwrap_or_else(|e| panic!("writing the pod's {file}: {e}"));
        }
        let pid = child.id().to_string();
        let attached = Command::new("ip")
            .args(["netns", "attach", &name, &pid])
            .output();
        let _ = child.kill();
        let _ = child.wait();
        let out = attached.expect("ip netns attach");
        assert!(
            out.status.success(),
            "ip netns attach: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let netns = Self { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    pub fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// `ip -n NAME ...`
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        sh("ip", &all);
    }

    /// `ip -n NAME -batch -` with `commands`, one per line: many changes in one go.
    pub fn ip_batch(&self, commands: &str) {
        ip_batch_ok(&["-n", &self.name], commands);
    }

    /// Connects two namespaces with a veth pair and gives each end its addresses (IPv6 ones
    /// without duplicate address detection, so they are usable at once).
    pub fn veth_to(&self, self_cidrs: &[&str], other: &Netns, other_cidrs: &[&str]) {
        let (a, b) = ("eth0", "peer0");
        self.ip(&[
            "link",
            "add",
            a,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            &other.name,
        ]);
        for (netns, cidrs, dev) in [(self, self_cidrs, a), (other, other_cidrs, b)] {
            for cidr in cidrs {
                let mut args = vec!["addr", "add", cidr, "dev", dev];
                if cidr.contains(':') {
                    args.push("nodad");
                }
                netns.ip(&args);
            }
            netns.ip(&["link", "set", dev, "up"]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// `ip GLOBAL -batch -` with `commands`, one per line: many changes in one process.
fn ip_batch(global: &[&str], commands: &str) -> std::io::Result<std::process::ExitStatus> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(global)
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(commands.as_bytes())?;
    child.wait()
}

/// [`ip_batch`], which must succeed.
fn ip_batch_ok(global: &[&str], commands: &str) {
    match ip_batch(global, commands) {
        Ok(status) if status.success() => {}
        other => panic!("ip {} -batch: {other:?} on\n{commands}", global.join(" ")),
    }
}

/// Empty network namespaces, made and deleted many at a time with one `ip -batch` (a node's
/// pods, for an agent to register); deleted on drop.
pub struct Namespaces {
    tag: String,
    names: Vec<String>,
}

impl Namespaces {
    pub fn new(tag: &str, count: usize) -> Self {
        let mut namespaces = Self {
            tag: tag.to_owned(),
            names: Vec::new(),
        };
        namespaces.add(count);
        namespaces
    }

    /// Makes `count` more; returns their paths.
    pub fn add(&mut self, count: usize) -> Vec<PathBuf> {
        let names: Vec<String> = (0..count).map(|_| unique_name(&self.tag)).collect();
        // Kept before they are made: a batch that fails half-way leaves some to delete.
        self.names.extend(names.iter().cloned());
        if !names.is_empty() {
            ip_batch_ok(&[], &batch("add", &names));
        }
        names.iter().map(|name| netns_path(name)).collect()
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn paths(&self) -> impl Iterator<Item = PathBuf> + '_ {
        self.names.iter().map(|name| netns_path(name))
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        if !self.names.is_empty() {
            let _ = ip_batch(&["-force"], &batch("del", &self.names));
        }
    }
}

/// `netns VERB NAME` for each name, one per line.
fn batch(verb: &str, names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("netns {verb} {n}\n"))
        .collect()
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// A child cgroup of the cgroup2 root (never the root itself); its processes, and those of the
/// cgroups below it, are killed and the directories removed on drop.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn new(tag: &str) -> Self {
        let root = interceptor::cgroup::cgroup2_root().expect("a cgroup2 mount");
        let path = root.join(unique_name(tag));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path }
    }

    /// A child of `parent` (a test's own cgroup); drop it before its parent.
    pub fn new_in(parent: &Path, tag: &str) -> Self {
        let path = parent.join(unique_name(tag));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Self { path }
    }

    pub fn pids(&self) -> Vec<i32> {
        pids_in(&self.path)
    }
}

/// The processes in the cgroup `dir` (not below it).
fn pids_in(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        /// The cgroups below `dir`, deepest first (cgroup directories only go with rmdir, and
        /// only once empty).
        fn below(dir: &Path, out: &mut Vec<PathBuf>) {
            for child in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    below(&child.path(), out);
                    out.push(child.path());
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut dirs = Vec::new();
            below(&self.path, &mut dirs);
            dirs.push(self.path.clone());
            for dir in &dirs {
                for pid in pids_in(dir) {
                    // SAFETY: only our own test processes (and the pods a test's runtime
                    // started there) are ever in this cgroup.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            for dir in &dirs {
                let _ = std::fs::remove_dir(dir);
            }
            if !self.path.exists() || Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The standard pod, dual-stack: its namespace (10.77.0.1/24 and fd77::1/64 on eth0), a remote
/// host namespace (10.77.0.2/24, fd77::2/64) joined by a veth pair, and the pod's cgroup.
///
/// Like a real pod it has default routes (iptables REDIRECT needs one: routing happens before
/// the OUTPUT hook), pointing at the remote namespace. The remote namespace treats the
/// documentation ranges 192.0.2.0/24, 198.51.100.0/24 and 2001:db8::/64 as its own, so a
/// connection to them that is not intercepted is refused there at once. The remote has no other
/// route: nothing leaves the two namespaces.
pub struct PodFixture {
    pub pod: Netns,
    pub remote: Netns,
    pub cgroup: Cgroup,
    /// Where the pod's processes run: its own cgroup unless it shares another pod's.
    processes_cgroup: PathBuf,
}

pub const POD_ADDR: &str = "10.77.0.1";
/// The host's id of id 0 of a pod with a user namespace of its own ([`Netns::with_own_users`]):
/// its proxy's 2102 is the host's 202102.
pub const POD_USERS_ON_HOST: u32 = 200_000;
pub const REMOTE_ADDR: &str = "10.77.0.2";
pub const POD_ADDR6: &str = "fd77::1";
pub const REMOTE_ADDR6: &str = "fd77::2";

impl PodFixture {
    pub fn new(tag: &str) -> Self {
        Self::around(Netns::new(tag), tag)
    }

    /// The standard pod with a user namespace of its own ([`Netns::with_own_users`]): its
    /// processes run in it, with the ids they are given as the pod's ids.
    pub fn with_own_users(tag: &str) -> Self {
        Self::around(Netns::with_own_users(tag), tag)
    }

    fn around(pod: Netns, tag: &str) -> Self {
        let remote = Netns::new(&format!("{tag}-remote"));
        pod.veth_to(
            &[&format!("{POD_ADDR}/24"), &format!("{POD_ADDR6}/64")],
            &remote,
            &[&format!("{REMOTE_ADDR}/24"), &format!("{REMOTE_ADDR6}/64")],
        );
        pod.ip(&["route", "add", "default", "via", REMOTE_ADDR]);
        pod.ip(&["-6", "route", "add", "default", "via", REMOTE_ADDR6]);
        for range in ["192.0.2.0/24", "198.51.100.0/24", "2001:db8::/64"] {
            remote.ip(&["route", "add", "local", range, "dev", "lo"]);
        }
        let cgroup = Cgroup::new(tag);
        let processes_cgroup = cgroup.path.clone();
        Self {
            pod,
            remote,
            cgroup,
            processes_cgroup,
        }
    }

    /// Runs this pod's processes under `other`'s cgroup, as pods share a node's kubepods cgroup
    /// that the programs attach to once.
    pub fn share_cgroup_with(mut self, other: &PodFixture) -> Self {
        self.processes_cgroup = other.cgroup.path.clone();
        self
    }

    /// Runs this pod's processes (its servers and proxies too) under `cgroup`, e.g. a child of
    /// its own.
    pub fn set_processes_cgroup(&mut self, cgroup: &Path) {
        self.processes_cgroup = cgroup.to_owned();
    }

    /// A process of the pod (in its namespace and cgroup).
    pub fn in_pod(&self) -> Probe {
        Probe::new()
            .netns(&self.pod.path())
            .cgroup(&self.processes_cgroup)
    }

    /// A process of the remote host.
    pub fn on_remote(&self) -> Probe {
        Probe::new().netns(&self.remote.path())
    }
}

/// runc without the rlimits this machine's containers cannot have (`runc-without-rlimits`,
/// next to the test binaries), for the container runtimes the tests run.
pub fn runc_without_rlimits() -> PathBuf {
    crate::probe::sibling_binary("runc-without-rlimits")
}

/// Removes the cgroup v1 controllers' directories a runtime's runc made for `cgroup_parent`
/// (a path relative to the hierarchies' roots, such as a test cgroup's name) on this hybrid
/// machine: runc puts a container in every v1 hierarchy as well as the unified one. Deepest
/// first, as cgroup directories only go with rmdir.
pub fn remove_v1_cgroup_dirs(cgroup_parent: &str) {
    fn remove_tree(dir: &Path) {
        if let Ok(children) = std::fs::read_dir(dir) {
            for child in children.filter_map(Result::ok) {
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    remove_tree(&child.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
        for controller in controllers.filter_map(Result::ok) {
            if controller.file_name() != "unified" {
                remove_tree(
                    &controller
                        .path()
                        .join(cgroup_parent.trim_start_matches('/')),
                );
            }
        }
    }
}
