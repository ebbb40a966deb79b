//! Podman as the tests run it: its CNI network backend, a network directory, plugin directory
//! and busybox image of the test's own, containers in the test's cgroup; all removed on drop.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::json;

use crate::{
    agent_home::AgentHome,
    cni_network::plugin_bin,
    fixture::{remove_v1_cgroup_dirs, runc_without_rlimits},
    unique_name,
};

/// Podman configured for one test only: CNI backend, its own network directory and plugin
/// directory, a busybox image of its own; all removed on drop.
pub struct Podman {
    dir: PathBuf,
    image: String,
    bridge: String,
    containers: Vec<String>,
    cgroup_parent: String,
}

impl Podman {
    pub fn new(agent: &AgentHome, cgroup: &Path) -> Self {
        let name = unique_name("podman");
        let dir = std::env::temp_dir().join(&name);
        let (net_dir, bin_dir) = (dir.join("net.d"), dir.join("cni-bin"));
        std::fs::create_dir_all(&net_dir).unwrap();
        std::fs::create_dir_all(&bin_dir).unwrap();
        std::fs::create_dir_all(dir.join("rootfs/bin")).unwrap();
        std::fs::copy(plugin_bin(), bin_dir.join("interceptor-cni")).unwrap();
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
    pub fn signal_dir(&self) -> PathBuf {
        self.dir.join("signal")
    }

    fn podman(&self, args: &[&str]) -> Output {
        Command::new("podman")
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--runtime")
            .arg(runc_without_rlimits())
            .args(args)
            .output()
            .expect("run podman")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Starts a container on the test's network and cgroup, running `script` in busybox sh.
    pub fn run(&mut self, name: &str, script: &str) -> String {
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

    /// Removes container `name` (`podman rm -f`, which runs CNI DEL).
    pub fn remove(&mut self, name: &str) {
        self.ok(&["rm", "-f", name]);
        self.containers.retain(|c| c != name);
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
        remove_v1_cgroup_dirs(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
