//! A throwaway dual-stack pod for the demo and the bench: a network namespace with a veth to a
//! "peer" namespace (its default route for both families, standing for the rest of the
//! network), and a child cgroup — never the root cgroup. The peer owns 192.0.2.0/24,
//! 198.51.100.0/24 and 2001:db8::/64 and has no route out, so a connection that is not
//! intercepted is refused there and nothing leaves the machine.
//! Everything is removed on drop, even when the caller fails half-way.
use std::{
    env, fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::{cmd, setup, workspace_root};

pub const PROXY_UID: &str = "2102";
pub const APP_UID: &str = "1000";
pub const POD_ADDR: &str = "10.99.0.10";
pub const PEER_ADDR: &str = "10.99.0.20";
pub const POD_ADDR6: &str = "fd99::10";
pub const PEER_ADDR6: &str = "fd99::20";
/// The proxy's ports and UID, as `interceptor run` takes them for this pod (`--ipv6` is on by
/// default, as in proxy-init).
pub const PROXY_ARGS: [&str; 6] = ["-p", "4143", "-o", "4140", "-u", PROXY_UID];

/// The release binaries a sandbox runs.
pub struct Binaries {
    pub interceptor: PathBuf,
    pub netprobe: PathBuf,
    /// The bench's lean load generator and proxy.
    pub connload: PathBuf,
}

/// Installs what is missing, builds the release binaries.
pub fn build() -> anyhow::Result<Binaries> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "this attaches eBPF programs and creates namespaces: run it as root"
    );
    let path = setup::run()?;
    cmd::run(
        cmd::cargo()
            .current_dir(workspace_root())
            .args([
                "build",
                "--release",
                "-p",
                "interceptor",
                "-p",
                "interceptor-tests",
                "--bins",
            ])
            .env("PATH", path),
    )?;
    let dir = env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    let release = workspace_root().join(dir).join("release");
    Ok(Binaries {
        interceptor: release.join("interceptor"),
        netprobe: release.join("netprobe"),
        connload: release.join("connload"),
    })
}

pub struct Pod {
    pub interceptor: PathBuf,
    netprobe: PathBuf,
    pub name: String,
    pub netns: PathBuf,
    peer: String,
    pub cgroup: PathBuf,
    /// Run every process on this CPU (`taskset -c`), for the bench.
    cpu: Option<&'static str>,
    children: Vec<Child>,
    meshed: Option<Child>,
}

impl Pod {
    pub fn create(kind: &str, cpu: Option<&'static str>) -> anyhow::Result<Self> {
        Self::with_binaries(&build()?, kind, cpu)
    }

    /// A pod named after `kind` (unique per process) running already built binaries.
    pub fn with_binaries(
        binaries: &Binaries,
        kind: &str,
        cpu: Option<&'static str>,
    ) -> anyhow::Result<Self> {
        let name = format!("interceptor-{kind}-{}", std::process::id());
        let pod = Self {
            interceptor: binaries.interceptor.clone(),
            netprobe: binaries.netprobe.clone(),
            netns: Path::new("/run/netns").join(&name),
            peer: format!("{name}-peer"),
            cgroup: cgroup2_root()?.join(&name),
            name,
            cpu,
            children: Vec::new(),
            meshed: None,
        };
        let (pod_ns, peer_ns) = (pod.name.as_str(), pod.peer.as_str());
        ip(&["netns", "add", pod_ns])?;
        ip(&["netns", "add", peer_ns])?;
        ip(&["-n", pod_ns, "link", "set", "lo", "up"])?;
        ip(&["-n", peer_ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", pod_ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
            peer_ns,
        ])?;
        for (netns, v4, v6) in [
            (pod_ns, POD_ADDR, POD_ADDR6),
            (peer_ns, PEER_ADDR, PEER_ADDR6),
        ] {
            ip(&[
                "-n",
                netns,
                "addr",
                "add",
                &format!("{v4}/24"),
                "dev",
                "eth0",
            ])?;
            // No duplicate address detection: usable at once.
            ip(&[
                "-n",
                netns,
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                "eth0",
                "nodad",
            ])?;
            ip(&["-n", netns, "link", "set", "eth0", "up"])?;
        }
        ip(&["-n", pod_ns, "route", "add", "default", "via", PEER_ADDR])?;
        ip(&[
            "-n", pod_ns, "-6", "route", "add", "default", "via", PEER_ADDR6,
        ])?;
        for range in ["192.0.2.0/24", "198.51.100.0/24", "2001:db8::/64"] {
            ip(&["-n", peer_ns, "route", "add", "local", range, "dev", "lo"])?;
        }
        fs::create_dir(&pod.cgroup)
            .with_context(|| format!("creating cgroup {}", pod.cgroup.display()))?;
        Ok(pod)
    }

    fn command(&self, program: &Path) -> Command {
        match self.cpu {
            Some(cpu) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", cpu]).arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    /// netprobe as a process of the pod (its namespace, cgroup and UID).
    pub fn probe(&self, uid: &str) -> Command {
        let mut cmd = self.command(&self.netprobe);
        cmd.arg("--netns")
            .arg(&self.netns)
            .arg("--cgroup")
            .arg(&self.cgroup)
            .args(["--uid", uid]);
        cmd
    }

    /// The peer's network namespace: the rest of the network, as the pod sees it.
    pub fn peer_netns(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.peer)
    }

    /// netprobe on the peer, a client of the pod.
    pub fn peer_probe(&self) -> Command {
        let mut cmd = self.command(&self.netprobe);
        cmd.arg("--netns")
            .arg(Path::new("/run/netns").join(&self.peer));
        cmd
    }

    /// Starts a netprobe listener and waits until it listens; it lives as long as the pod.
    pub fn listen(&mut self, mut cmd: Command) -> anyhow::Result<()> {
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting netprobe")?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut line)?;
        self.children.push(child);
        ensure!(line.trim() == "ready", "a netprobe listener did not start");
        Ok(())
    }

    /// `interceptor run` in the background for this pod, ready once status lists the pod.
    pub fn mesh_ebpf(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        let mut run = self.command(&self.interceptor);
        run.args(["run", "--mode", "ebpf", "--instance", &self.name, "--netns"])
            .arg(&self.netns)
            .arg("--cgroup")
            .arg(&self.cgroup)
            .args(extra);
        self.meshed = Some(run.spawn().context("starting interceptor run")?);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pods = self.status().map(|s| s["instances"][0]["pods"].clone());
            if pods
                .as_ref()
                .and_then(Value::as_array)
                .is_some_and(|p| !p.is_empty())
            {
                return Ok(());
            }
            if let Some(status) = self.meshed.as_mut().expect("meshed").try_wait()? {
                bail!("interceptor run exited early ({status})");
            }
            ensure!(
                Instant::now() < deadline,
                "interceptor run did not become ready in 20 s"
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// The pid of the running `interceptor run`.
    pub fn meshed_pid(&self) -> Option<u32> {
        self.meshed.as_ref().map(Child::id)
    }

    /// SIGTERM to `interceptor run`: it detaches and exits.
    pub fn unmesh(&mut self) -> anyhow::Result<ExitStatus> {
        stop(self.meshed.take().context("not meshed")?)
    }

    /// `interceptor run --mode iptables` (writes the chains, with more of proxy-init's flags
    /// when installing, and exits) and its cleanup.
    pub fn iptables(
        &self,
        iptables_mode: &str,
        install: bool,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.interceptor);
        if install {
            cmd.args(["run", "--mode", "iptables"])
                .args(PROXY_ARGS)
                .args(extra);
        } else {
            cmd.arg("iptables-cleanup");
        }
        cmd.args([
            "--iptables-mode",
            iptables_mode,
            "-w",
            "--log-level",
            "warn",
            "--netns",
        ])
        .arg(&self.netns);
        cmd::output(&mut cmd).map(drop)
    }

    /// The connections the pod's conntrack holds ("-" when conntrack is not loaded): the
    /// state iptables' NAT leaves behind, which eBPF interception does not create.
    pub fn conntrack_entries(&self) -> String {
        Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .args(["cat", "/proc/sys/net/netfilter/nf_conntrack_count"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or("-".into(), |o| {
                String::from_utf8_lossy(&o.stdout).trim().to_owned()
            })
    }

    /// `interceptor status --json` of this pod's instance.
    pub fn status(&self) -> Option<Value> {
        let out = Command::new(&self.interceptor)
            .args(["status", "--json", "--instance", &self.name])
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        for child in self
            .meshed
            .take()
            .into_iter()
            .chain(self.children.drain(..).rev())
        {
            let _ = stop(child);
        }
        let _ = fs::remove_dir(&self.cgroup);
        for netns in [&self.name, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", netns]).status();
        }
    }
}

pub fn stop(mut child: Child) -> anyhow::Result<ExitStatus> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    Ok(child.wait()?)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    cmd::run(Command::new("ip").args(args))
}

pub fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .context("no cgroup2 mount in /proc/self/mountinfo")
}
