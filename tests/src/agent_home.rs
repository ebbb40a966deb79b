//! The node agent as the tests and the bench run it: its real binary on a state directory,
//! bpffs directory and cgroup of its own, uninstalled when dropped, and its pods. An agent is
//! started through [`AgentHome::agent`].
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    sync::LazyLock,
    time::{Duration, Instant},
};

use interceptor::{
    agent::api::{self, PodAdd, PodMeta, Request},
    config::{InterceptionConfig, linkerd},
};
use serde_json::Value;

use crate::{Probe, unique_name};

mod builder;

pub use builder::AgentBuilder;

/// The proxy's ports and UID (Linkerd's), as proxy-init takes them (the bench's pods).
pub static PROXY_FLAGS: LazyLock<[&str; 6]> = LazyLock::new(|| {
    [
        "-p",
        leak(linkerd::INBOUND_PORT),
        "-o",
        leak(linkerd::OUTBOUND_PORT),
        "-u",
        leak(linkerd::PROXY_UID),
    ]
});

/// The flags Linkerd's injector gives proxy-init ([`PROXY_FLAGS`] and the proxy's admin ports
/// ignored inbound), as the agent tests register their pods.
pub static LINKERD_FLAGS: LazyLock<[&str; 8]> = LazyLock::new(|| {
    let [p, inbound, o, outbound, u, uid] = *PROXY_FLAGS;
    [
        p,
        inbound,
        o,
        outbound,
        u,
        uid,
        "--inbound-ports-to-ignore",
        linkerd::INBOUND_PORTS_TO_IGNORE,
    ]
});

/// A value as text that lasts as long as the tests (the flags above are built once).
fn leak(value: impl ToString) -> &'static str {
    Box::leak(value.to_string().into_boxed_str())
}

/// Refused by the fixture's remote host unless intercepted.
pub const UNREACHABLE: &str = "192.0.2.2:1404";

/// `netprobe check` from `app` for `seconds` (two threads, to [`UNREACHABLE`], its IPv4-mapped
/// form and its IPv6 counterpart): the load the agent tests keep up while they restart, move or
/// upgrade the agent. Its lines go to [`all_reached_the_proxy`].
pub fn check_load(app: &Probe, seconds: &str) -> Vec<String> {
    app.run(&[
        "check",
        UNREACHABLE,
        "[::ffff:192.0.2.2]:1404",
        "[2001:db8::2]:1404",
        "--seconds",
        seconds,
        "--threads",
        "2",
    ])
}

/// A loopback address whose port was free a moment ago, for an agent's `--metrics-addr`.
pub fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("its address");
    addr.to_string()
}

/// `netprobe check`'s summary: every connection reached the proxy with its original
/// destination; returns how many there were.
pub fn all_reached_the_proxy(lines: &[String]) -> u64 {
    let summary = lines
        .iter()
        .find_map(|l| l.strip_prefix("ok="))
        .unwrap_or_else(|| panic!("no summary: {lines:#?}"));
    let (ok, bad) = summary.split_once(" bad=").expect("ok=N bad=M");
    assert_eq!(bad, "0", "every connection reached the proxy: {lines:#?}");
    let ok: u64 = ok.parse().expect("a count");
    assert!(ok > 0, "{lines:#?}");
    ok
}

/// Connections of a `netprobe connect` load that did not land on the proxy's outbound listener:
/// each one reached its destination around the proxy (or failed).
pub fn around_the_proxy(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|l| !l.starts_with("who=proxy:outbound "))
        .collect()
}

/// The app's connections to `targets` (`netprobe connect`, each reset at its close) while
/// `during` runs, and for a second after: every line. The app connects in rounds of a second
/// until then, however long `during` takes (an agent's migration on a busy machine, or in an
/// emulated guest, takes many seconds), so the load always spans it.
pub fn connections_while<T>(
    app: &Probe,
    targets: &[&str],
    during: impl FnOnce() -> T,
) -> (Vec<String>, T) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut args = vec!["connect"];
            args.extend_from_slice(targets);
            args.extend(["--seconds", "1", "--linger0"]);
            let mut lines = Vec::new();
            loop {
                let last = done.load(Ordering::Acquire);
                lines.extend(app.run(&args));
                if last {
                    return lines;
                }
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        let result = {
            // A panic in `during` must end the load too, or the scope waits for ever.
            let _done = StopOnDrop(&done);
            during()
        };
        (load.join().expect("the load"), result)
    })
}

/// Sets the flag when dropped, unwinding included: a load that runs until the flag is set ends
/// when a check fails, instead of keeping its scope waiting for ever.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The `interceptor` command line built for the tests (`interceptor-under-test`), next to the
/// test binaries.
pub fn interceptor_bin() -> PathBuf {
    crate::probe::sibling_binary("interceptor-under-test")
}

/// An agent's places; dropping it uninstalls what an agent left there (stop the agent first).
pub struct AgentHome {
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
    pub cgroup: PathBuf,
    /// The `interceptor` binary it runs: the tests' build ([`interceptor_bin`]) unless
    /// [`Self::with_binary`] says otherwise.
    pub binary: PathBuf,
    /// Environment the agent runs with, beyond this process's ([`Self::with_env`]).
    pub env: Vec<(String, String)>,
    /// Whether `state_dir` is a tmpfs of its own ([`Self::with_state_on_tmpfs`]).
    state_on_tmpfs: bool,
    /// The open-files limit (soft, hard) the agent starts with ([`Self::with_open_files_limit`]).
    open_files_limit: Option<(u64, u64)>,
}

impl AgentHome {
    pub fn new(cgroup: &Path) -> Self {
        let name = unique_name("agent");
        let bpffs_root = Path::new(interceptor::state::BPFFS_ROOT);
        interceptor::state::ensure_bpffs(bpffs_root).expect("a bpffs");
        Self {
            state_dir: std::env::temp_dir().join(&name),
            bpffs: bpffs_root.join("interceptor-tests").join(&name),
            cgroup: cgroup.to_owned(),
            binary: interceptor_bin(),
            env: Vec::new(),
            state_on_tmpfs: false,
            open_files_limit: None,
        }
    }

    /// Keeps the agent's state (its socket and pod records) on a tmpfs mounted for it, as on a
    /// node, whose `/run` is a tmpfs (the DaemonSet's `--state-dir=/run/interceptor`). For the
    /// bench's registration times: this machine's temporary directory is an ext4 without a
    /// journal, where creating a file costs 0.2 to 0.5 ms (it looks for an inode not freed in
    /// the last seconds) and varies with how many files were deleted lately.
    pub fn with_state_on_tmpfs(mut self) -> Self {
        std::fs::create_dir_all(&self.state_dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.state_dir.display()));
        nix::mount::mount(
            Some("tmpfs"),
            &self.state_dir,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=0755,size=64m"),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", self.state_dir.display()));
        self.state_on_tmpfs = true;
        self
    }

    /// Runs the agent with `key=value` in its environment (e.g. `INTERCEPTOR_KERNEL_FEATURES`,
    /// to take away what the eBPF programs need).
    pub fn with_env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Starts the agent with this open-files limit (`RLIMIT_NOFILE`, soft and hard), as a
    /// container runtime would.
    pub fn with_open_files_limit(mut self, soft: u64, hard: u64) -> Self {
        self.open_files_limit = Some((soft, hard));
        self
    }

    /// Runs the agent (and the CLI) without `CAP_NET_BROADCAST`, as a container that drops it
    /// would: through a script in its state directory that takes it out of the bounding set
    /// (`setpriv`), so root's exec does not get it back.
    pub fn without_net_broadcast(mut self) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(&self.state_dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", self.state_dir.display()));
        let wrapper = self.state_dir.join("interceptor-without-net-broadcast");
        let script = format!(
            "#!/bin/sh\nexec setpriv --bounding-set=-net_broadcast --inh-caps=-net_broadcast {} \"$@\"\n",
            self.binary.display()
        );
        std::fs::write(&wrapper, script)
            .and_then(|()| {
                std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
            })
            .unwrap_or_else(|e| panic!("write {}: {e}", wrapper.display()));
        self.binary = wrapper;
        self
    }

    /// Runs `binary` (e.g. the release `interceptor` the bench measures) instead.
    pub fn with_binary(mut self, binary: PathBuf) -> Self {
        self.binary = binary;
        self
    }

    /// The agent's API socket.
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("agent.sock")
    }

    pub fn location(&self) -> Vec<String> {
        vec![
            "--state-dir".into(),
            self.state_dir.display().to_string(),
            "--bpffs".into(),
            self.bpffs.display().to_string(),
        ]
    }

    /// Where a test keeps this agent's log: beside its state directory, removed with it.
    pub fn log_path(&self) -> PathBuf {
        self.state_dir.with_extension("log")
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        let (command, rest) = args.split_first().expect("a command");
        let mut cmd = Command::new(&self.binary);
        cmd.arg(command);
        if let Some((sub, rest)) = rest.split_first().filter(|_| *command == "pod") {
            cmd.arg(sub).args(self.location()).args(rest);
        } else {
            cmd.args(self.location()).args(rest);
        }
        cmd.output().expect("run the CLI")
    }

    pub fn add(&self, netns: &Path, extra: &[&str], config: &[&str]) -> Output {
        let netns = netns.display().to_string();
        let mut args = vec!["pod", "add", "--netns", &netns];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(config);
        self.cli(&args)
    }

    /// `pod add` of the pod in `netns` with `extra` (e.g. `--name web`) and Linkerd's flags,
    /// which must succeed.
    pub fn mesh(&self, netns: &Path, extra: &[&str]) {
        let out = self.add(netns, extra, &*LINKERD_FLAGS);
        assert!(out.status.success(), "pod add: {}", stderr(&out));
    }

    /// Registers the pod in `netns` through the API, as the CNI plugin does; returns the round
    /// trip (request to interception in force).
    pub fn register(&self, netns: &Path, config: &InterceptionConfig) -> Duration {
        let request = Request::Add(PodAdd {
            netns: netns.to_owned(),
            meta: PodMeta::default(),
            config: config.clone(),
            update: false,
            takeover_iptables: false,
        });
        let started = Instant::now();
        api::call(&self.socket(), &request)
            .unwrap_or_else(|e| panic!("registering {}: {e}", netns.display()));
        started.elapsed()
    }

    /// The round trip of a request that does next to nothing (`pod get` of a namespace never
    /// registered: refused after one search of the pods' paths): the floor under a
    /// registration's round trip, thread wake-ups included.
    pub fn ask_nothing(&self) -> Duration {
        let request = Request::Get {
            netns: PathBuf::from("/nonexistent/netns/never-registered"),
        };
        let started = Instant::now();
        let answer = api::call(&self.socket(), &request);
        let elapsed = started.elapsed();
        assert!(answer.is_err(), "a namespace never registered: {answer:?}");
        elapsed
    }

    /// How many pods' sk_lookup links are pinned.
    pub fn pinned_pod_links(&self) -> usize {
        std::fs::read_dir(&self.bpffs)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with("link_icpt_sk_lookup_"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// What the agent reports as not in force as configured (its thorough check: links, every
    /// pod's entries, and anything in the maps, pins or records that belongs to no pod).
    pub fn problems(&self) -> Vec<String> {
        api::health(&self.socket())
            .expect("the agent answers a health request")
            .problems
    }

    /// The agent's state is one the API could have produced: nothing wrong in its thorough
    /// check (nothing in the maps, pins or records without its pod), a record and an sk_lookup
    /// link per pod.
    pub fn assert_consistent(&self) {
        let problems = self.problems();
        assert!(problems.is_empty(), "{problems:#?}");
        let pods = self.pods().len();
        assert_eq!(self.records(), pods, "a record per pod");
        assert_eq!(self.pinned_pod_links(), pods, "an sk_lookup link per pod");
    }

    /// How many pod records the agent keeps.
    pub fn records(&self) -> usize {
        std::fs::read_dir(self.state_dir.join("agent-pods"))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .count()
            })
            .unwrap_or(0)
    }

    pub fn pods(&self) -> Vec<Value> {
        let out = self.cli(&["pod", "list", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<Value>(&out.stdout)
            .expect("pod list --json")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `pod get --json` of the pod in `netns`: its report alone (its listener looked up by its
    /// own keys, where `pods` reads every pod's).
    pub fn pod(&self, netns: &Path) -> Value {
        let out = self.cli(&[
            "pod",
            "get",
            "--json",
            "--netns",
            &netns.display().to_string(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("pod get --json")
    }
}

impl Drop for AgentHome {
    fn drop(&mut self) {
        let _ = Command::new(&self.binary)
            .arg("uninstall")
            .args(self.location())
            .output();
        if self.state_on_tmpfs {
            let _ = nix::mount::umount2(&self.state_dir, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
        let _ = std::fs::remove_file(self.log_path());
    }
}

/// A running agent, SIGKILLed on drop if still running.
pub struct Agent {
    pub child: Child,
}

impl Agent {
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The agent's resident memory, KiB.
    pub fn rss_kib(&self) -> u64 {
        self.status_field("VmRSS", "kB")
    }

    /// A number in the agent's `/proc/PID/status`: the line `name:`, without `unit`.
    fn status_field(&self, name: &str, unit: &str) -> u64 {
        let pid = self.child.id();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("the agent's /proc/{pid}/status: {e}"))
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches(unit).trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    }

    /// The agent's open-files limit (soft, hard), from `/proc/PID/limits`.
    pub fn open_files_limit(&self) -> (u64, u64) {
        let pid = self.child.id();
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .unwrap_or_else(|e| panic!("the agent's /proc/{pid}/limits: {e}"));
        let line = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .expect("Max open files in /proc/PID/limits");
        let mut values = line
            .split_whitespace()
            .map(|v| v.parse().expect("a number"));
        (values.next().unwrap(), values.next().unwrap())
    }

    /// How many descriptors the agent's descriptor table holds (`FDSize`, which only grows).
    pub fn fd_table_size(&self) -> u64 {
        self.status_field("FDSize", "")
    }

    /// SIGTERM: the agent exits, interception stays.
    pub fn stop(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the agent exits 0 on SIGTERM: {status}");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The value of the metric `series` (its name and labels, as exposed) at `addr`, if exposed.
pub fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, body) = http_get(addr, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// One HTTP GET on loopback: (status line, body).
pub fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to the metrics port");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}
