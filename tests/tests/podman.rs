//! A real container runtime: podman with its CNI network backend, whose network's conflist
//! chains the plugin after the reference bridge. The container's very first connect is
//! intercepted: the CNI ADD, which registers its namespace with the agent, runs before any of
//! its processes.
//!
//! Network safety: the bridge has no gateway address and the containers no route beyond their
//! subnet, so a connect that is not intercepted fails at once inside the container.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use interceptor_tests::{
    PodFixture, Probe, agent_home::AgentHome, privileged, scenario::PROXY_UID, unique_name,
};
use serde_json::json;

const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");
const RUNTIME: &str = env!("CARGO_BIN_EXE_runc-without-rlimits");

/// Podman configured for this test only: CNI backend, its own network directory and plugin
/// directory, a busybox image of its own; all removed on drop.
struct Podman {
    dir: PathBuf,
    image: String,
    bridge: String,
    containers: Vec<String>,
    cgroup_parent: String,
}

impl Podman {
    fn new(agent: &AgentHome, cgroup: &Path) -> Self {
        let name = unique_name("podman");
        let dir = std::env::temp_dir().join(&name);
        let (net_dir, bin_dir) = (dir.join("net.d"), dir.join("cni-bin"));
        std::fs::create_dir_all(&net_dir).unwrap();
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::create_dir_all(dir.join("rootfs/bin")).unwrap();
        std::fs::copy(PLUGIN, bin_dir.join("interceptor-cni")).unwrap();
        std::fs::copy("/bin/busybox", dir.join("rootfs/bin/busybox")).unwrap();
        for applet in ["sh", "nc", "sleep"] {
            std::os::unix::fs::symlink("busybox", dir.join("rootfs/bin").join(applet)).unwrap();
        }
        let bridge = format!("icp{}", std::process::id() % 100_000);
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"/usr/lib/cni\", \"{}\"]\nnetwork_config_dir = \"{}\"\n[engine]\ncgroup_manager = \"cgroupfs\"\n",
                bin_dir.display(),
                net_dir.display()
            ),
        )
        .unwrap();
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": false,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": "10.97.0.0/24" }]],
                        "dataDir": dir.join("ipam"),
                    },
                },
                {
                    "type": "interceptor-cni",
                    "agent_socket": agent.socket(),
                    "log_file": dir.join("cni.log"),
                    "linkerd": { "proxy-uid": 2102, "ipv6": false },
                },
            ],
        });
        std::fs::write(
            net_dir.join(format!("{name}.conflist")),
            conflist.to_string(),
        )
        .unwrap();
        let cgroup_parent = cgroup
            .strip_prefix(interceptor::cgroup::cgroup2_root().unwrap())
            .map(|p| format!("/{}", p.display()))
            .expect("the test cgroup under the cgroup2 root");
        let podman = Self {
            image: format!("localhost/{name}"),
            dir,
            bridge,
            containers: Vec::new(),
            cgroup_parent,
        };
        let tar = podman.dir.join("rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(podman.dir.join("rootfs"))
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let image = podman.image.clone();
        podman.ok(&["import", &tar.display().to_string(), &image]);
        podman
    }

    fn network(&self) -> String {
        self.dir.file_name().unwrap().to_string_lossy().into_owned()
    }

    /// Mounted at `/signal` in containers: how the test tells them to go on.
    fn signal_dir(&self) -> PathBuf {
        self.dir.join("signal")
    }

    fn podman(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .args(["--runtime", RUNTIME])
            .args(args)
            .output()
            .expect("run podman")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a container on the test's network and cgroup, running `script` in busybox sh.
    fn run(&mut self, name: &str, script: &str) -> String {
        let network = self.network();
        let (image, parent) = (self.image.clone(), self.cgroup_parent.clone());
        let signal = self.signal_dir();
        std::fs::create_dir_all(&signal).unwrap();
        let volume = format!("{}:/signal", signal.display());
        let id = self.ok(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            &network,
            "--cgroup-parent",
            &parent,
            "-v",
            &volume,
            &image,
            "sh",
            "-c",
            script,
        ]);
        self.containers.push(name.to_owned());
        id
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        for container in std::mem::take(&mut self.containers) {
            let _ = self.podman(&["rm", "-f", &container]);
        }
        let image = self.image.clone();
        let _ = self.podman(&["rmi", "-f", &image]);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        interceptor_tests::fixture::remove_v1_cgroup_dirs(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_podman_containers_first_connect_is_intercepted() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("podman");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let mut podman = Podman::new(&home, &fixture.cgroup.path);
    // The app's first connect waits until the test has started the proxy in its namespace (a
    // proxy container would be there from the start).
    let id = podman.run(
        "app",
        "while [ ! -e /signal/proxy-ready ]; do sleep 0.1; done; nc 192.0.2.2 1404 </dev/null; echo rc=$?",
    );
    let netns = podman.ok(&[
        "inspect",
        &id,
        "--format",
        "{{.NetworkSettings.SandboxKey}}",
    ]);
    let pods = home.pods();
    assert_eq!(
        pods.len(),
        1,
        "ADD registered the container's namespace: {pods:#?}"
    );
    assert_eq!(pods[0]["netns"], netns);
    assert_eq!(pods[0]["meta"]["name"], "app");

    let _proxy = Probe::new()
        .netns(Path::new(&netns))
        .cgroup(&fixture.cgroup.path)
        .uid(PROXY_UID)
        .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    std::fs::write(podman.signal_dir().join("proxy-ready"), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let logs = loop {
        let logs = podman.ok(&["logs", &id]);
        if logs.contains("rc=") {
            break logs;
        }
        assert!(Instant::now() < deadline, "the app did not finish: {logs}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        logs.contains("who=proxy:outbound orig=192.0.2.2:1404 ") && logs.contains("rc=0"),
        "the container's first connect reached the proxy with its original destination: {logs}"
    );

    // Removing the container runs CNI DEL: the pod leaves the agent.
    podman.ok(&["rm", "-f", "app"]);
    podman.containers.clear();
    assert!(home.pods().is_empty(), "{:#?}", home.pods());
}
