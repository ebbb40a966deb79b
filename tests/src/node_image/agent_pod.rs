//! The DaemonSet's pod run from the node's image by `podman kube play`.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};

use super::NodeImage;
use crate::{
    agent_home::{free_loopback_addr, interceptor_bin},
    chart::{args::args_of, render},
    cni_network::CniNetwork,
    command::run,
    unique_name,
};

/// The DaemonSet's pod as a real runtime runs it: its template from the rendered manifests,
/// its host paths redirected into a root of the test's own (never the machine's `/etc/cni`,
/// `/opt/cni` or default bpffs directory), `--cgroup` the test's cgroup, run from the image
/// with `podman kube play`.
pub struct AgentPod {
    pub podman: NodeImage,
    pub network: CniNetwork,
    yaml: PathBuf,
    configmap: PathBuf,
    pub state_dir: PathBuf,
    bpffs: PathBuf,
}

impl AgentPod {
    pub fn new(podman: NodeImage, cgroup: &Path) -> Self {
        // The node's primary network before the agent comes: loopback only (nothing leaves).
        let network = CniNetwork::new("kubeplay");
        let state_dir = network.root.join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let bpffs = Path::new("/sys/fs/bpf/interceptor-tests").join(unique_name("kubeplay"));
        std::fs::create_dir_all(&bpffs).unwrap();

        // The pods here connect over both families (the proxies listen on both), as in a
        // cluster whose Linkerd runs with disableIPv6=false.
        let rendered = render(&[r#"{"disableIPv6": false}"#]);
        let config = rendered.find("ConfigMap", "linkerd-cni-config").clone();
        let daemonset = rendered.daemonset();
        let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
        let mut spec = daemonset["spec"]["template"]["spec"].clone();
        // The host's cgroup2 mount is the test's own cgroup: no kubelet pod cgroup is found
        // under it, so the agent attaches there, never at the machine's root.
        let host_paths = [
            ("/sys/fs/bpf", bpffs.clone()),
            ("/sys/fs/cgroup", cgroup.to_owned()),
            ("/run/interceptor", state_dir.clone()),
            ("/opt/cni/bin", network.bin_dir.clone()),
            ("/etc/cni/net.d", network.conf_dir.clone()),
        ];
        for volume in spec["volumes"].as_array_mut().unwrap() {
            // linkerd-cni's `linkerd-tmp-dir` is an emptyDir: podman makes it as the kubelet does.
            let Some(path) = volume["hostPath"]["path"].as_str().map(str::to_owned) else {
                continue;
            };
            if let Some((_, ours)) = host_paths.iter().find(|(p, _)| *p == path) {
                volume["hostPath"]["path"] = json!(ours.display().to_string());
            }
        }
        let socket = state_dir.join("agent.sock");
        let metrics = free_loopback_addr();
        let data: BTreeMap<String, String> =
            serde_json::from_value(config["data"].clone()).unwrap();
        let mut containers = spec["initContainers"].as_array().unwrap().clone();
        containers.extend(spec["containers"].as_array().unwrap().iter().cloned());
        for container in &mut containers {
            // The kubelet expands `$(VAR)` in arguments; podman 4 does not.
            let mut args = args_of(container, &data, namespace);
            // No API server here to ask whether the DaemonSet is being deleted: without
            // --daemonset the installer unchains the plugin on SIGTERM, as deleting the
            // DaemonSet does, and the agent leaves interception in force, as for a rolling
            // update (tests/cni_install_kube.rs covers --daemonset against a stand-in API
            // server).
            args.retain(|a| !a.starts_with("--daemonset="));
            container["args"] = json!(args);
            // podman refuses port declarations on the host's network (Kubernetes takes them as
            // documentation there); nothing is published either way.
            container.as_object_mut().unwrap().remove("ports");
            // The kubelet resolves `fieldRef`s; podman 4 does not support these.
            for env in container["env"].as_array_mut().into_iter().flatten() {
                let value = match env["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("spec.nodeName") => "test-node",
                    Some("metadata.namespace") => namespace,
                    Some("status.hostIP") => "127.0.0.1",
                    _ => continue,
                };
                *env = json!({"name": env["name"], "value": value});
            }
            for arg in container["args"].as_array_mut().unwrap() {
                let text = arg.as_str().unwrap();
                // The plugin runs on this host: it reaches the agent where the host sees the
                // socket. The node's port 9990 may be taken: the metrics go elsewhere.
                if text.starts_with("--agent-socket=") {
                    *arg = json!(format!("--agent-socket={}", socket.display()));
                } else if text.starts_with("--metrics-addr=") {
                    *arg = json!(format!("--metrics-addr={metrics}"));
                }
            }
        }
        let init = spec["initContainers"].as_array().unwrap().len();
        spec["containers"] = json!(containers.split_off(init));
        spec["initContainers"] = json!(containers);
        let name = unique_name("interceptor");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/name": "interceptor"},
                // Podman 4.3 removes a finished init container ("once", the default) racing
                // its exit (containers/podman#18477); "always" keeps it, as the kubelet does.
                "annotations": {"io.podman.annotations.init.container.type": "always"},
            },
            "spec": spec,
        });
        let yaml = network.root.join("pod.json");
        let configmap = network.root.join("configmap.json");
        std::fs::write(&yaml, pod.to_string()).unwrap();
        std::fs::write(&configmap, config.to_string()).unwrap();
        Self {
            podman,
            network,
            yaml,
            configmap,
            state_dir,
            bpffs,
        }
    }

    /// `podman kube play` (again, after removing the pod, with `replace`); returns once the
    /// agent answers its API and the installer has chained the plugin.
    pub fn play(&self, replace: bool) {
        if replace {
            self.remove_pod();
        }
        let mut cmd = self.podman.command(&["kube", "play", "--configmap"]);
        cmd.arg(&self.configmap);
        run(cmd.arg(&self.yaml), None);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while interceptor::agent::api::call(
            &self.state_dir.join("agent.sock"),
            &interceptor::agent::api::Request::List,
        )
        .is_err()
            || self.network.chained() != 1
        {
            if std::time::Instant::now() > deadline {
                panic!(
                    "the agent's pod did not come up (chained {}): {}",
                    self.network.chained(),
                    self.logs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// `podman pod rm -f`, tried again while podman's own clean-up of a killed container still
    /// holds its `shm` mount: removal then fails with EBUSY (podman's known "unlinkat/EBUSY"
    /// race, containers/podman#11594, #17216), as `kube play --replace` did once in CI.
    fn remove_pod(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let out = self
                .podman
                .command(&["pod", "rm", "--force", "--time", "0"])
                .arg(self.pod_name())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                return;
            }
            if !stderr.contains("device or resource busy") || std::time::Instant::now() > deadline {
                panic!("podman pod rm: {stderr}");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// What the pod's containers logged.
    pub fn logs(&self) -> String {
        let logs = self
            .podman
            .command(&["pod", "logs"])
            .arg(self.pod_name())
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&logs.stdout),
            String::from_utf8_lossy(&logs.stderr)
        )
    }

    /// The effective capabilities of a container's process, from the kernel (`CapEff`).
    pub fn capabilities(&self, container: &str) -> u64 {
        let pid = run(
            self.podman
                .command(&["inspect", "--format", "{{.State.Pid}}"])
                .arg(format!("{}-{container}", self.pod_name())),
            None,
        );
        let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap()
            .trim();
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// The pod's name, unique to the test.
    pub fn pod_name(&self) -> String {
        let pod: Value = serde_json::from_slice(&std::fs::read(&self.yaml).unwrap()).unwrap();
        pod["metadata"]["name"].as_str().unwrap().to_owned()
    }
}

impl Drop for AgentPod {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command(&["kube", "down"])
            .arg(&self.yaml)
            .output();
        // What the agent pinned and recorded: its programs detach here.
        let _ = Command::new(interceptor_bin())
            .arg("uninstall")
            .arg("--bpffs")
            .arg(self.bpffs.join("interceptor"))
            .arg("--state-dir")
            .arg(&self.state_dir)
            .output();
        let _ = std::fs::remove_dir(self.bpffs.join("interceptor"));
        // Where `--mode auto` probed (the probe removes its own directory in it).
        let _ = std::fs::remove_dir(self.bpffs.join("interceptor-probe"));
        let _ = std::fs::remove_dir(&self.bpffs);
    }
}
