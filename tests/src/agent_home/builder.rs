//! How a test starts its home's agent.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{Agent, AgentHome};

/// An agent of an [`AgentHome`] to start: `home.agent()`, what differs from the defaults, then
/// [`Self::start`], which waits until its API answers, or [`Self::spawn`], which does not.
///
/// By default the agent runs on the home's state directory, bpffs directory and cgroup
/// (`--cgroup`, unless the arguments have it find the kubelet's with `--kubepods-under`), with
/// the eBPF backend (unless the arguments say `--mode`), no crash point armed, and its log at
/// level warn, thrown away. A log someone reads ([`Self::log_to`], [`Self::log_shown`]) is at
/// level info unless [`Self::level`] says otherwise.
///
/// ```no_run
/// # let home = interceptor_tests::agent_home::AgentHome::new(std::path::Path::new("/sys/fs/cgroup/t"));
/// let agent = home
///     .agent()
///     .args(&["--mode", "iptables"])
///     .log_to(&home.log_path())
///     .start();
/// ```
#[must_use = "an agent starts only with .start() or .spawn()"]
pub struct AgentBuilder<'a> {
    home: &'a AgentHome,
    args: Vec<String>,
    log: Stdio,
    /// The file [`Self::log_to`] names, shown when the agent never answers.
    log_path: Option<PathBuf>,
    /// The level [`Self::level`] set, which wins over the log's own default.
    level: Option<&'a str>,
    log_level: &'static str,
    failpoints: &'a str,
    /// The pod to register once the agent answers, and the `pod add` arguments beyond Linkerd's
    /// flags.
    meshing: Option<(&'a Path, &'a [&'a str])>,
}

impl AgentHome {
    /// An agent of this home to start (see [`AgentBuilder`]).
    pub fn agent(&self) -> AgentBuilder<'_> {
        AgentBuilder {
            home: self,
            args: Vec::new(),
            log: Stdio::null(),
            log_path: None,
            level: None,
            log_level: "warn",
            failpoints: "",
            meshing: None,
        }
    }
}

impl<'a> AgentBuilder<'a> {
    /// `interceptor daemon` arguments beyond the home's, after those already given.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// The agent's log (its stderr) goes to `log`, at level warn: a log kept for when a test
    /// fails, or read by the test itself (`Stdio::piped()`).
    pub fn log(mut self, log: impl Into<Stdio>) -> Self {
        self.log = log.into();
        self.log_level = "warn";
        self
    }

    /// The agent's log goes to a file created at `path`, at level info.
    pub fn log_to(mut self, path: &Path) -> Self {
        let file = std::fs::File::create(path)
            .unwrap_or_else(|e| panic!("create the agent's log {}: {e}", path.display()));
        self.log = file.into();
        self.log_path = Some(path.to_owned());
        self.log_level = "info";
        self
    }

    /// The agent's log goes to this process's stderr, at level info (the demo's agent, shown as
    /// it works).
    pub fn log_shown(mut self) -> Self {
        self.log = Stdio::inherit();
        self.log_level = "info";
        self
    }

    /// The agent's `--log-level`, whatever its log's default.
    pub fn level(mut self, level: &'a str) -> Self {
        self.level = Some(level);
        self
    }

    /// Arms crash points (`FAILPOINTS`, see `interceptor::crash_points`).
    pub fn failpoints(mut self, failpoints: &'a str) -> Self {
        self.failpoints = failpoints;
        self
    }

    /// Once the agent answers, registers the pod in `netns` with Linkerd's flags and `extra`
    /// (see [`AgentHome::mesh`]); for [`Self::start`] only.
    pub fn meshing(mut self, netns: &'a Path, extra: &'a [&'a str]) -> Self {
        self.meshing = Some((netns, extra));
        self
    }

    /// Starts the agent and waits until its API answers (and the pod [`Self::meshing`] names
    /// is registered).
    pub fn start(mut self) -> Agent {
        let meshing = self.meshing.take();
        let home = self.home;
        let log_path = self.log_path.clone();
        let agent = wait_ready(home, self.spawn(), log_path.as_deref());
        if let Some((netns, extra)) = meshing {
            home.mesh(netns, extra);
        }
        agent
    }

    /// Starts the agent without waiting for it.
    pub fn spawn(self) -> Agent {
        assert!(
            self.meshing.is_none(),
            "meshing needs the agent's API: start() the agent instead"
        );
        let home = self.home;
        let has = |flag: &str| self.args.iter().any(|a| a == flag);
        // The backend the test asks for, eBPF unless it says otherwise: never one a probe chose.
        let mode = if has("--mode") {
            &[][..]
        } else {
            &["--mode", "ebpf"][..]
        };
        // Its cgroup, unless the test has the agent find the kubelet's.
        let cgroup = home.cgroup.display().to_string();
        let cgroup = if has("--kubepods-under") {
            &[][..]
        } else {
            &["--cgroup", cgroup.as_str()][..]
        };
        let mut cmd = Command::new(&home.binary);
        if let Some((soft, hard)) = home.open_files_limit {
            use nix::sys::resource::{Resource, setrlimit};
            // SAFETY: setrlimit is async-signal-safe, and the closure touches nothing else.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
                });
            }
        }
        let child = cmd
            .arg("daemon")
            .args(home.location())
            .args(cgroup)
            .args(mode)
            .args(["--log-level", self.level.unwrap_or(self.log_level)])
            .args(&self.args)
            .env("FAILPOINTS", self.failpoints)
            .envs(home.env.iter().map(|(k, v)| (k, v)))
            .stderr(self.log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", home.binary.display()));
        Agent { child }
    }
}

/// Waits until the agent's API answers: a restarted iptables agent first checks every pod's
/// chains, which takes a while in the kernel matrix's emulated guests.
/// A failure says what the agent logged, when its log is a file.
fn wait_ready(home: &AgentHome, mut agent: Agent, log: Option<&Path>) -> Agent {
    let deadline = Instant::now() + Duration::from_secs(60);
    let logged = || {
        log.map(|path| std::fs::read_to_string(path).unwrap_or_default())
            .unwrap_or_else(|| "(not kept: log_to() keeps it)".into())
    };
    while !home.cli(&["pod", "list"]).status.success() {
        assert!(
            agent.child.try_wait().unwrap().is_none(),
            "the agent exited early; its log:\n{}",
            logged()
        );
        assert!(
            Instant::now() < deadline,
            "the agent did not become ready; its log:\n{}",
            logged()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    agent
}
