//! `cargo xtask demo`: a self-contained demo of outbound interception on this machine.
//!
//! It creates a throwaway pod (a network namespace with no route out, and a child cgroup — never
//! the root cgroup), starts a stand-in proxy as the proxy UID, meshes the pod with
//! `interceptor run`, and shows an app's connect to an unreachable address landing on the proxy
//! with the right original destination, the exemptions, the counters, and the detach.
use std::{
    env,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::{cmd, setup, workspace_root};

const PROXY_UID: &str = "2102";
const APP_UID: &str = "1000";

pub fn run() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(unsafe { libc::geteuid() } == 0, "the demo attaches eBPF programs: run it as root");
    let path = setup::run()?;
    cmd::run(
        cmd::cargo()
            .current_dir(workspace_root())
            .args(["build", "--release", "-p", "interceptor", "-p", "interceptor-tests", "--bins"])
            .env("PATH", path),
    )?;
    let release = target_dir().join("release");
    let demo = Demo::create(release.join("interceptor"), release.join("netprobe"))?;
    demo.show()
}

/// cargo's target directory; a relative CARGO_TARGET_DIR is relative to the workspace root.
fn target_dir() -> PathBuf {
    let dir = env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    workspace_root().join(dir)
}

/// The throwaway pod; everything is removed on drop, even when the demo fails half-way.
struct Demo {
    interceptor: PathBuf,
    netprobe: PathBuf,
    name: String,
    netns: PathBuf,
    cgroup: PathBuf,
    children: Vec<Child>,
}

impl Demo {
    fn create(interceptor: PathBuf, netprobe: PathBuf) -> anyhow::Result<Self> {
        let name = format!("interceptor-demo-{}", std::process::id());
        let cgroup_root = cgroup2_root()?;
        let mut demo = Self {
            interceptor,
            netprobe,
            netns: Path::new("/run/netns").join(&name),
            cgroup: cgroup_root.join(&name),
            name,
            children: Vec::new(),
        };
        ip(&["netns", "add", &demo.name])?;
        ip(&["-n", &demo.name, "link", "set", "lo", "up"])?;
        // The pod's own address; no interface leads out and there is no route, so nothing leaves.
        ip(&["-n", &demo.name, "addr", "add", "10.99.0.10/32", "dev", "lo"])?;
        std::fs::create_dir(&demo.cgroup).with_context(|| format!("creating cgroup {}", demo.cgroup.display()))?;
        let proxy = demo.spawn_ready(demo.probe(PROXY_UID).args(["proxy", "127.0.0.1:4140", "--name", "proxy"]))?;
        demo.children.push(proxy);
        // The app's own server, on loopback and on the pod's address.
        let server = demo.spawn_ready(demo.probe(APP_UID).args(["server", "0.0.0.0:8080", "--name", "app"]))?;
        demo.children.push(server);
        Ok(demo)
    }

    fn show(mut self) -> anyhow::Result<()> {
        step("A pod", &format!(
            "network namespace {} (10.99.0.10, no route out), cgroup {},\n  \
             a stand-in proxy listening on 127.0.0.1:4140 as UID {PROXY_UID}, the app's server on :8080.",
            self.netns.display(), self.cgroup.display()
        ));
        step("Before meshing", "the app (UID 1000) connects to Linkerd's validator address 192.0.2.2:1404");
        self.app(APP_UID, "192.0.2.2:1404")?;

        let instance = self.name.clone();
        let mut run = Command::new(&self.interceptor);
        run.args(["run", "--instance", &instance, "--netns"]).arg(&self.netns).arg("--cgroup").arg(&self.cgroup)
            .args(["-p", "4143", "-o", "4140", "-u", PROXY_UID, "--outbound-ports-to-ignore", "443,6443", "--ipv6=false"]);
        step("Meshing", &format!("{} run --netns {} --cgroup {} -p 4143 -o 4140 -u 2102 --outbound-ports-to-ignore 443,6443 --ipv6=false",
            self.interceptor.display(), self.netns.display(), self.cgroup.display()));
        let child = run.stderr(Stdio::inherit()).spawn().context("starting interceptor run")?;
        self.children.push(child);
        self.wait_running(&instance)?;

        step("Meshed", "the same connect now lands on the proxy, whose getsockopt(SO_ORIGINAL_DST) reports where the app meant to go");
        self.app(APP_UID, "192.0.2.2:1404")?;
        self.app(APP_UID, "198.51.100.7:80")?;
        step("Exemptions", "an ignored port (443), the proxy's own UID, loopback and the pod's own address are not redirected");
        self.app(APP_UID, "198.51.100.7:443")?;
        self.app(PROXY_UID, "192.0.2.2:1404")?;
        self.app(APP_UID, "127.0.0.1:8080")?;
        self.app(APP_UID, "10.99.0.10:8080")?;

        step("Status", &format!("{} status --instance {instance}", self.interceptor.display()));
        cmd::run(Command::new(&self.interceptor).args(["status", "--instance", &instance]))?;

        step("Detaching", "SIGTERM to interceptor run: programs detach, connections go direct again");
        let run = self.children.pop().expect("interceptor run");
        let status = stop(run)?;
        ensure!(status.success(), "interceptor run exited with {status}");
        self.app(APP_UID, "192.0.2.2:1404")?;
        println!("\nDemo done; the namespace and cgroup are removed.");
        Ok(())
    }

    /// netprobe inside the pod (namespace, cgroup, UID).
    fn probe(&self, uid: &str) -> Command {
        let mut cmd = Command::new(&self.netprobe);
        cmd.arg("--netns").arg(&self.netns).arg("--cgroup").arg(&self.cgroup).args(["--uid", uid]);
        cmd
    }

    fn app(&self, uid: &str, target: &str) -> anyhow::Result<()> {
        let out = cmd::output(self.probe(uid).args(["connect", target]))?;
        let who = if uid == PROXY_UID { "proxy UID" } else { "app" };
        println!("  {who:>9} -> {target:<18} {}", describe(out.trim()));
        Ok(())
    }

    fn spawn_ready(&self, cmd: &mut Command) -> anyhow::Result<Child> {
        let mut child = cmd.stdout(Stdio::piped()).spawn().context("starting netprobe")?;
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            bail!("the stand-in proxy did not start");
        }
        Ok(child)
    }

    fn wait_running(&mut self, instance: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new(&self.interceptor).args(["status", "--json", "--instance", instance]).output()?;
            if String::from_utf8_lossy(&out.stdout).contains("\"running\": true") {
                return Ok(());
            }
            if let Some(status) = self.children.last_mut().expect("run").try_wait()? {
                bail!("interceptor run exited early ({status})");
            }
            ensure!(Instant::now() < deadline, "interceptor run did not become ready in 20 s");
            sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        for child in self.children.drain(..).rev() {
            let _ = stop(child);
        }
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

fn stop(mut child: Child) -> anyhow::Result<std::process::ExitStatus> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    Ok(child.wait()?)
}

/// Turns netprobe's `who=... orig=... peer=...` line into a sentence.
fn describe(line: &str) -> String {
    if let Some(error) = line.strip_prefix("error=") {
        return format!("not intercepted: {error}");
    }
    let field = |key: &str| line.split(' ').find_map(|kv| kv.strip_prefix(key)).unwrap_or("?");
    let who = field("who=");
    if who.starts_with("proxy") {
        format!("landed on the proxy, SO_ORIGINAL_DST={}, peer={}", field("orig="), field("peer="))
    } else {
        format!("reached {who} directly")
    }
}

fn step(title: &str, text: &str) {
    println!("\n== {title}\n  {text}");
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    cmd::run(Command::new("ip").args(args))
}

fn cgroup2_root() -> anyhow::Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .context("no cgroup2 mount in /proc/self/mountinfo")
}
