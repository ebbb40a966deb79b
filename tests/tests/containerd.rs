//! containerd with its CRI plugin, driven over the CRI gRPC API as the kubelet drives it
//! (`RunPodSandbox` with the pod's metadata and annotations, `PodSandboxStatus`,
//! `StopPodSandbox`, `RemovePodSandbox`), its CNI configuration chained by `interceptor cni
//! install` after the reference bridge and host-local plugins. containerd hands the plugin each
//! pod's annotations in `runtimeConfig["io.kubernetes.cri.pod-annotations"]` because the
//! installer declares that capability; the plugin meshes only the pods Linkerd injected, each
//! with its own `config.linkerd.io/*` annotations. Every case is checked by connecting from
//! inside the pod's network namespace.
//!
//! Everything is the test's own: containerd's root, state, sockets and configuration in a
//! temporary directory; containerd itself runs in a network namespace of the test's, so the
//! bridge it has the plugins make (the pods' gateway, the node side) is there, with no route
//! out; the sandboxes' cgroups go under the test's cgroup, where the agent attaches; the sandbox
//! image is built from Debian's busybox-static (no registry is reachable) and imported with
//! `ctr`.
//!
//! The repair tests run the node as a kubelet with the cgroupfs driver lays it out: each sandbox
//! under `kubepods/besteffort/pod<uid>` in the test's cgroup, the agent finding `kubepods` there
//! (`--kubepods-under`) and the node's pods in the stand-in API server, with the status the
//! kubelet would report; their sandboxes are created while our entry is not in the chain.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use interceptor_tests::{
    Netns, Probe,
    agent_home::{Agent, AgentHome, free_loopback_addr, http_get, metric},
    cni_network::{CniNetwork, PRIMARY, REFERENCE_PLUGINS},
    fake_api::{self, FakeApi},
    fixture::{Cgroup, remove_v1_cgroup_dirs},
    privileged,
    probe::Listener,
    scenario::{APP_UID, PROXY_UID},
    unique_name,
};
use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StatusRequest, StopPodSandboxRequest,
    runtime_service_client::RuntimeServiceClient,
};
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint, Uri};

const INTERCEPTOR: &str = env!("CARGO_BIN_EXE_interceptor-under-test");
const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");
const RUNTIME: &str = env!("CARGO_BIN_EXE_runc-without-rlimits");
/// The sandbox ("pause") image, in this containerd's own store.
const PAUSE_IMAGE: &str = "localhost/interceptor-test/pause:1";
/// The pods' bridge network, inside the node namespace: its gateway is the node.
const GATEWAY: &str = "10.98.0.1";
const POD_NAMESPACE: &str = "shop";
const PROXY_VERSION: (&str, &str) = ("linkerd.io/proxy-version", "edge-24.11.8");
/// The plugin's `linkerd` block, as the DaemonSet's ConfigMap gives it to the installer and to
/// the agent (for its repairs).
const LINKERD: &str = r#"{"inbound-ports-to-ignore": ["4190", "4191"]}"#;
/// This node's name in the stand-in API server.
const NODE_NAME: &str = "node-a";
/// The init container Linkerd's CNI mode injects instead of `linkerd-init`.
const VALIDATOR: &str = "linkerd-network-validator";

/// Where the node's sandboxes' cgroups are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Right under the node's cgroup, where the agent attaches (`--cgroup`).
    Flat,
    /// As the kubelet's cgroupfs driver makes them, `kubepods/besteffort/pod<uid>` under the
    /// node's cgroup: the agent finds `kubepods` (`--kubepods-under`), and a pod's cgroup by
    /// its UID.
    Kubepods,
}

/// A node: the agent, containerd with its CRI plugin and CNI network, all the test's own.
struct Node {
    dir: PathBuf,
    layout: Layout,
    /// The agent's arguments beyond its home's.
    agent_args: Vec<String>,
    agents_started: usize,
    // Stopped before its home is removed (fields drop in order); `None` while a test has it
    // down.
    agent: Option<Agent>,
    home: AgentHome,
    netns: Netns,
    cni: CniNetwork,
    containerd: Child,
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    cgroup_parent: String,
    sandboxes: Vec<String>,
    // Dropped last: the pods' processes are killed with it.
    cgroup: Cgroup,
}

/// A pod sandbox that containerd started.
struct Pod {
    id: String,
    netns: PathBuf,
    ip: String,
    uid: String,
    /// Its sandbox's process.
    pid: u32,
    /// Where the test's processes of the pod run.
    cgroup: PathBuf,
}

/// The node's server ([`Node::serve_on_node`]) as pods connect to it, through the gateway.
fn to_node() -> String {
    format!("{GATEWAY}:1404")
}

/// The UID of the node's pod `name`.
fn pod_uid(name: &str) -> String {
    format!("{}-{name}", std::process::id())
}

impl Node {
    fn new(tag: &str) -> Self {
        Self::build(tag, Layout::Flat, |_| Vec::new())
    }

    /// A node whose agent reads its pods from `api` (as node [`NODE_NAME`]) and repairs those
    /// started without the plugin every second, with `extra` arguments; its pods' cgroups laid
    /// out as the kubelet's.
    fn repairing(tag: &str, api: &FakeApi, extra: &[&str]) -> Self {
        let node = Self::build(tag, Layout::Kubepods, |dir| {
            let mut args: Vec<String> = vec![
                "--kubeconfig".into(),
                api.kubeconfig(dir).display().to_string(),
                "--node-name".into(),
                NODE_NAME.into(),
                "--linkerd".into(),
                LINKERD.into(),
                "--repair-interval".into(),
                "1".into(),
            ];
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        while api.requests_with("watch=true") == 0 {
            assert!(
                Instant::now() < deadline,
                "the agent never watched the pods"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }

    fn build(tag: &str, layout: Layout, agent_args: impl FnOnce(&Path) -> Vec<String>) -> Self {
        let cgroup = Cgroup::new(tag);
        let dir = std::env::temp_dir().join(unique_name(&format!("{tag}-ctrd")));
        std::fs::create_dir_all(&dir).unwrap();
        let mut agent_args = agent_args(&dir);
        if layout == Layout::Kubepods {
            std::fs::create_dir_all(cgroup.path.join("kubepods/besteffort")).unwrap();
            agent_args.extend(["--kubepods-under".into(), cgroup.path.display().to_string()]);
        }
        let home = AgentHome::new(&cgroup.path);
        let args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
        let agent = home.start_logged(&dir.join("agent-0.log"), &args);
        let netns = Netns::new(&format!("{tag}-node"));
        let cni = CniNetwork::with_primary(
            &format!("{tag}-cni"),
            &json!({
                "cniVersion": "1.0.0",
                "name": "pods",
                "plugins": [{
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": "10.98.0.0/24", "gateway": GATEWAY }]],
                        "routes": [{ "dst": "0.0.0.0/0" }],
                        "dataDir": dir.join("ipam"),
                    },
                }],
            }),
        );
        // containerd takes one plugin directory: the reference plugins beside ours.
        for plugin in ["bridge", "host-local", "loopback"] {
            std::fs::copy(
                Path::new(REFERENCE_PLUGINS).join(plugin),
                cni.bin_dir.join(plugin),
            )
            .unwrap_or_else(|e| panic!("copy {plugin}: {e}"));
        }
        // Chained as the DaemonSet's install-cni container chains it.
        let out = Command::new(INTERCEPTOR)
            .args(["cni", "install", "--plugin", PLUGIN, "--conf-dir"])
            .arg(&cni.conf_dir)
            .arg("--bin-dir")
            .arg(&cni.bin_dir)
            .arg("--agent-socket")
            .arg(home.socket())
            .arg("--log-file")
            .arg(dir.join("cni.log"))
            .args(["--linkerd", LINKERD])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cni install: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            containerd_config(&dir, &socket, &cni.conf_dir, &cni.bin_dir),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let containerd = Command::new("nsenter")
            .arg(format!("--net={}", netns.path().display()))
            .arg("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime.block_on(connect(&socket));
        let cgroup_parent = cgroup
            .path
            .strip_prefix(interceptor::cgroup::cgroup2_root().unwrap())
            .map(|p| format!("/{}", p.display()))
            .expect("the test cgroup under the cgroup2 root");
        let mut node = Self {
            dir,
            layout,
            agent_args,
            agents_started: 1,
            home,
            agent: Some(agent),
            netns,
            cni,
            containerd,
            runtime,
            client,
            cgroup_parent,
            sandboxes: Vec::new(),
            cgroup,
        };
        node.import_pause_image(&socket);
        node.wait_for_network(true);
        node
    }

    /// Starts the node's agent again (the previous one killed first, if it still runs), with
    /// `failpoints` armed; its log is `agent-<n>.log` in the node's directory.
    fn restart_agent(&mut self, failpoints: &str) {
        if let Some(agent) = self.agent.take() {
            agent.kill();
        }
        let log = std::fs::File::create(self.agent_log(self.agents_started)).unwrap();
        self.agents_started += 1;
        let args: Vec<&str> = self.agent_args.iter().map(String::as_str).collect();
        let agent = self.home.spawn_armed(&args, log, failpoints);
        self.agent = Some(self.home.wait_ready(agent));
    }

    /// The log of the `n`th agent started.
    fn agent_log(&self, n: usize) -> PathBuf {
        self.dir.join(format!("agent-{n}.log"))
    }

    /// Takes our entry out of the primary network, as a primary CNI that writes its
    /// configuration again does, and waits until containerd loaded the network without it.
    fn unchain(&mut self) {
        let path = self.cni.conf_dir.join(PRIMARY);
        let mut list: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        list["plugins"]
            .as_array_mut()
            .expect("plugins")
            .retain(|p| p["type"] != "interceptor-cni");
        let staged = path.with_extension("tmp");
        std::fs::write(&staged, list.to_string()).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        self.wait_for_network(false);
    }

    /// Builds the sandbox image (busybox's sleep as its entrypoint) as a docker archive and
    /// imports it into containerd's `k8s.io` namespace, where the CRI plugin looks.
    fn import_pause_image(&self, socket: &Path) {
        let image = self.dir.join("image");
        let rootfs = image.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/sleep")).unwrap();
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&rootfs)
                .arg("-cf")
                .arg(image.join("layer.tar"))
                .arg("."),
        );
        let digest = run_ok(Command::new("sha256sum").arg(image.join("layer.tar")));
        let digest = digest.split_whitespace().next().expect("a digest");
        let config = json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Entrypoint": ["/bin/sleep", "2147483647"] },
            "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{digest}")] },
        });
        std::fs::write(image.join("config.json"), config.to_string()).unwrap();
        let manifest = json!([{
            "Config": "config.json",
            "RepoTags": [PAUSE_IMAGE],
            "Layers": ["layer.tar"],
        }]);
        std::fs::write(image.join("manifest.json"), manifest.to_string()).unwrap();
        run_ok(
            Command::new("tar")
                .arg("-C")
                .arg(&image)
                .arg("-cf")
                .arg(self.dir.join("pause.tar"))
                .args(["manifest.json", "config.json", "layer.tar"]),
        );
        run_ok(
            Command::new("ctr")
                .arg("--address")
                .arg(socket)
                .args(["--namespace", "k8s.io", "images", "import"])
                .arg(self.dir.join("pause.tar")),
        );
    }

    /// containerd reloads its CNI configuration when it is written: waits until the CRI
    /// plugin's network has our entry (`chained`), or has not.
    fn wait_for_network(&mut self, chained: bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = self
                .runtime
                .block_on(self.client.status(StatusRequest { verbose: true }))
                .expect("CRI Status");
            let cni = status
                .into_inner()
                .info
                .get("cniconfig")
                .cloned()
                .unwrap_or_default();
            if cni.contains("interceptor-cni") == chained {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd never loaded the network (chained: {chained}): {cni}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `RunPodSandbox` of pod `name` in namespace `shop` with `annotations`, as the kubelet
    /// sends it; then where its network namespace is and its address.
    fn run_pod(&mut self, name: &str, annotations: &[(&str, &str)]) -> Result<Pod, tonic::Status> {
        self.run_pod_with(name, annotations, false)
    }

    /// [`Self::run_pod`], in the node's network namespace with `host_network`, as the kubelet
    /// runs a `hostNetwork` pod (no CNI).
    fn run_pod_with(
        &mut self,
        name: &str,
        annotations: &[(&str, &str)],
        host_network: bool,
    ) -> Result<Pod, tonic::Status> {
        let uid = pod_uid(name);
        let cgroup_parent = match self.layout {
            Layout::Flat => self.cgroup_parent.clone(),
            Layout::Kubepods => format!("{}/kubepods/besteffort/pod{uid}", self.cgroup_parent),
        };
        let security_context = host_network.then(|| LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        let log_directory = self.dir.join("pods").join(name);
        std::fs::create_dir_all(&log_directory).unwrap();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: POD_NAMESPACE.to_owned(),
                attempt: 0,
            }),
            // As the kubelet: a hostNetwork pod shares the node's UTS namespace and name.
            hostname: if host_network {
                String::new()
            } else {
                name.to_owned()
            },
            log_directory: log_directory.display().to_string(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent,
                security_context,
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .runtime
            .block_on(self.client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            }))?
            .into_inner()
            .pod_sandbox_id;
        self.sandboxes.push(id.clone());
        let status = self
            .runtime
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            }))
            .expect("PodSandboxStatus")
            .into_inner();
        let ip = status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .expect("the pod's address");
        let info: Value = serde_json::from_str(status.info.get("info").expect("verbose info"))
            .expect("verbose info is JSON");
        let netns = if host_network {
            self.netns.path()
        } else {
            info["runtimeSpec"]["linux"]["namespaces"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|ns| ns["type"] == "network")
                .and_then(|ns| ns["path"].as_str())
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("no network namespace in {info}"))
        };
        let pid = info["pid"]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok())
            .unwrap_or_else(|| panic!("no sandbox pid in {info}"));
        let cgroup = match self.layout {
            Layout::Flat => self.cgroup.path.clone(),
            // Beside the sandbox's, as a container's: not in the pod's cgroup itself, which
            // may not hold processes once it has children with controllers.
            Layout::Kubepods => {
                let cgroup = self
                    .cgroup
                    .path
                    .join(format!("kubepods/besteffort/pod{uid}/test-processes"));
                std::fs::create_dir_all(&cgroup).unwrap();
                cgroup
            }
        };
        Ok(Pod {
            id,
            netns,
            ip,
            uid,
            pid,
            cgroup,
        })
    }

    /// `StopPodSandbox` then `RemovePodSandbox`, as the kubelet deletes a pod.
    fn remove_pod(&mut self, id: &str) {
        self.runtime
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .expect("StopPodSandbox");
        self.runtime
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .expect("RemovePodSandbox");
        self.sandboxes.retain(|s| s != id);
    }

    /// A process of `pod` as `uid`, in its cgroup as the pod's containers are.
    fn in_pod(&self, pod: &Pod, uid: u32) -> Probe {
        Probe::new().netns(&pod.netns).cgroup(&pod.cgroup).uid(uid)
    }

    /// `interceptor validate` in `pod` as its `linkerd-network-validator` runs (its namespace
    /// and cgroup, an app UID): its exit code and line.
    fn validate(&self, pod: &Pod) -> (Option<i32>, String) {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec nsenter --net={} setpriv --reuid {APP_UID} --regid {APP_UID} --clear-groups {INTERCEPTOR} validate --timeout-ms 2000",
            pod.cgroup.display(),
            pod.netns.display()
        );
        let out = Command::new("sh").args(["-c", &script]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    /// A stand-in proxy (outbound 4140, inbound 4143) and the app's servers on 8080 and 9090.
    fn serve(&self, pod: &Pod, app: &str) -> Vec<Listener> {
        let proxy = self.in_pod(pod, PROXY_UID);
        vec![
            proxy.listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]),
            proxy.listen(&["proxy", "0.0.0.0:4143", "--name", "inbound"]),
            self.in_pod(pod, APP_UID).listen(&[
                "server",
                "0.0.0.0:8080",
                "0.0.0.0:9090",
                "--name",
                app,
            ]),
        ]
    }

    /// A client on the node (source address the gateway's).
    fn on_node(&self) -> Probe {
        Probe::new().netns(&self.netns.path())
    }

    /// The node's own server, `node-server`, where pods reach it: [`to_node`].
    fn serve_on_node(&self) -> Listener {
        self.on_node()
            .listen(&["server", "0.0.0.0:1404", "--name", "node-server"])
    }

    /// Asserts that the app of `pod` connecting to the node's server lands on its proxy, with
    /// the original destination.
    fn assert_outbound_on_proxy(&self, pod: &Pod) {
        let to_node = to_node();
        assert_eq!(
            self.in_pod(pod, APP_UID)
                .connect(&to_node)
                .proxy_orig()
                .to_string(),
            to_node
        );
    }

    /// Asserts that `pod` is meshed both ways: its app's connection to the node's server, and
    /// the node's to its app's port 8080, land on its proxy with their original destination.
    fn assert_meshed(&self, pod: &Pod) {
        self.assert_outbound_on_proxy(pod);
        let to_pod = format!("{}:8080", pod.ip);
        assert_eq!(
            self.on_node().connect(&to_pod).proxy_orig().to_string(),
            to_pod
        );
    }

    /// Asserts that the app of `pod` connecting to the node's server reaches it, untouched.
    fn assert_outbound_passes(&self, pod: &Pod) {
        assert_eq!(
            self.in_pod(pod, APP_UID).connect(&to_node()).server_name(),
            "node-server"
        );
    }

    /// containerd's view of the node's network: the CRI `Status` condition `NetworkReady`
    /// (containerd 2 sets it from CNI STATUS for `cniVersion` 1.1.0 networks; 1.6 from the
    /// configuration it loaded).
    fn network_ready(&mut self) -> bool {
        let status = self
            .runtime
            .block_on(self.client.status(StatusRequest { verbose: false }))
            .expect("CRI Status")
            .into_inner();
        status
            .status
            .into_iter()
            .flat_map(|s| s.conditions)
            .any(|c| c.r#type == "NetworkReady" && c.status)
    }

    /// CNI STATUS of our entry in the chained network, run as a runtime runs it: the binary
    /// the installer put in the bin directory, the entry with the network's name and version.
    fn plugin_status(&self) -> (bool, String) {
        let list: Value =
            serde_json::from_slice(&std::fs::read(self.cni.conf_dir.join(PRIMARY)).unwrap())
                .unwrap();
        let mut conf = list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "interceptor-cni")
            .expect("our entry in the chain")
            .clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        conf["name"] = list["name"].clone();
        let mut child = Command::new(self.cni.bin_dir.join("interceptor-cni"))
            .env("CNI_COMMAND", "STATUS")
            .env("CNI_PATH", &self.cni.bin_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the plugin");
        std::io::Write::write_all(
            &mut child.stdin.take().unwrap(),
            conf.to_string().as_bytes(),
        )
        .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// The pods the agent has registered, by name, with their records.
    fn registered(&self) -> Vec<(String, Value)> {
        let mut pods: Vec<(String, Value)> = self
            .home
            .pods()
            .into_iter()
            .map(|p| (p["meta"]["name"].as_str().unwrap_or("-").to_owned(), p))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        pods
    }

    /// Asserts that the agent has registered exactly `names` now, and returns the registrations.
    fn assert_registered(&self, names: &[&str]) -> Vec<(String, Value)> {
        let registered = self.registered();
        assert_eq!(
            registered
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            names,
            "{registered:#?}"
        );
        registered
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.sandboxes) {
            let _ = self
                .runtime
                .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }));
            let _ = self.runtime.block_on(
                self.client
                    .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }),
            );
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.containerd.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.containerd.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        // Shims outlive containerd by design; ours are those started for this directory.
        kill_processes_mentioning(&self.dir);
        unmount_under(&self.dir);
        remove_v1_cgroup_dirs(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = &self.cni;
    }
}

/// containerd's configuration: every path under `dir`, CRI's CNI directories the test's, runc
/// through the wrapper that drops rlimits this machine's containers cannot have, cgroupfs.
fn containerd_config(dir: &Path, socket: &Path, conf_dir: &Path, bin_dir: &Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNTIME}"
        Root = "{runc_root}"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
"#,
        root = dir.join("root").display(),
        state = dir.join("state").display(),
        opt = dir.join("opt").display(),
        runc_root = dir.join("runc").display(),
        socket = socket.display(),
        bin_dir = bin_dir.display(),
        conf_dir = conf_dir.display(),
    )
}

/// A CRI client on containerd's socket, once it answers.
async fn connect(socket: &Path) -> RuntimeServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let path = socket.to_owned();
        let channel = Endpoint::try_from("http://[::]")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await;
        if let Ok(channel) = channel {
            let mut client = RuntimeServiceClient::new(channel);
            if client
                .version(k8s_cri::v1::VersionRequest::default())
                .await
                .is_ok()
            {
                return client;
            }
        }
        assert!(
            Instant::now() < deadline,
            "containerd's CRI never answered on {} (see containerd.log beside it)",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn run_ok(command: &mut Command) -> String {
    let out = command.output().expect("run a command");
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kill_processes_mentioning(dir: &Path) {
    let needle = dir.display().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Lazily unmounts every mount under `dir` (containerd's rootfs, shm and netns mounts),
/// deepest first.
fn unmount_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn containerd_meshes_the_pods_linkerd_injected_and_passes_the_others_through() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdmesh");
    let _node_server = node.serve_on_node();
    let web = node
        .run_pod("web", &[PROXY_VERSION, ("app", "web")])
        .expect("RunPodSandbox of an injected pod");
    let plain = node
        .run_pod(
            "plain",
            &[("app", "plain"), ("linkerd.io/inject", "enabled")],
        )
        .expect("RunPodSandbox of a pod Linkerd did not inject");

    // Only the injected pod is registered, under its Kubernetes names and UID.
    let registered = node.assert_registered(&["web"]);
    let record = &registered[0].1;
    assert_eq!(record["meta"]["namespace"], POD_NAMESPACE);
    assert_eq!(record["meta"]["uid"], web.uid.as_str());
    assert_eq!(record["meta"]["container_id"], web.id.as_str());

    let _web = node.serve(&web, "web-app");
    let _plain = node.serve(&plain, "plain-app");
    // The injected pod: outbound and inbound on its proxy, from the first connect.
    node.assert_meshed(&web);
    // The other pod: untouched both ways.
    node.assert_outbound_passes(&plain);
    assert_eq!(
        node.on_node()
            .connect(&format!("{}:8080", plain.ip))
            .server_name(),
        "plain-app"
    );

    // The kubelet deletes the pods: the injected one leaves the agent.
    node.remove_pod(&web.id);
    node.remove_pod(&plain.id);
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
}

#[test]
fn containerd_pods_own_annotations_change_only_their_own_interception() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdannot");
    let _node_server = node.serve_on_node();
    let gateway_subnet = format!("{GATEWAY}/32");
    let pods: Vec<(&str, Pod)> = [
        ("plain-mesh", vec![PROXY_VERSION]),
        (
            "skip-out",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-outbound-ports", "1404"),
            ],
        ),
        (
            "skip-in",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-inbound-ports", "8080"),
            ],
        ),
        (
            "skip-subnet",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-subnets", gateway_subnet.as_str()),
            ],
        ),
    ]
    .into_iter()
    .map(|(name, annotations)| {
        let pod = node
            .run_pod(name, &annotations)
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        (name, pod)
    })
    .collect();
    assert_eq!(node.registered().len(), 4);
    let _servers: Vec<_> = pods
        .iter()
        .map(|(name, pod)| node.serve(pod, name))
        .collect();

    let to_node = to_node();
    for (name, pod) in &pods {
        let app = node.in_pod(pod, APP_UID);
        let outbound = app.connect(&to_node);
        if *name == "skip-out" {
            assert_eq!(outbound.server_name(), "node-server", "{name}");
        } else {
            assert_eq!(outbound.proxy_orig().to_string(), to_node, "{name}");
        }
        for port in [8080, 9090] {
            let target = format!("{}:{port}", pod.ip);
            let inbound = node.on_node().connect(&target);
            // The node's client connects from the gateway's address.
            let direct = *name == "skip-subnet" || (*name == "skip-in" && port == 8080);
            if direct {
                assert_eq!(inbound.server_name(), *name, "{name} {port}");
            } else {
                assert_eq!(inbound.proxy_orig().to_string(), target, "{name} {port}");
            }
        }
    }
}

#[test]
fn containerd_refuses_a_pod_with_a_malformed_annotation_with_the_plugins_message() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdbad");
    let error = match node.run_pod(
        "bad",
        &[
            PROXY_VERSION,
            ("config.linkerd.io/skip-outbound-ports", "25,smtp"),
        ],
    ) {
        Ok(pod) => panic!("a pod with a malformed annotation started: {}", pod.id),
        Err(error) => error,
    };
    let message = error.message();
    for expected in ["config.linkerd.io/skip-outbound-ports", "25,smtp", "smtp"] {
        assert!(message.contains(expected), "{expected:?} not in {message}");
    }
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
}

/// The agent killed (a crash loop): the node's network stays ready, a pod Linkerd did not inject
/// starts at once, an injected one does not start (the plugin answers 11, the kubelet retries);
/// once an agent runs again the injected pod starts, meshed from its first connect.
#[test]
fn containerd_with_the_agent_down_starts_other_pods_at_once_and_injected_ones_once_it_is_back() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrddown");
    let _node_server = node.serve_on_node();
    node.agent.take().expect("the node's agent").kill();

    // STATUS: ready, as the runtime asks it, and as containerd reports the network.
    let (ok, out) = node.plugin_status();
    assert!(ok, "STATUS with the agent down: {out}");
    assert!(node.network_ready(), "containerd's NetworkReady");
    let log = std::fs::read_to_string(node.dir.join("cni.log")).unwrap();
    assert!(
        log.contains("STATUS: ready, but the agent does not answer"),
        "{log}"
    );

    // A pod Linkerd did not inject does not wait for the agent.
    let started = Instant::now();
    let plain = node
        .run_pod("plain", &[("app", "plain")])
        .expect("RunPodSandbox of a pod Linkerd did not inject, with the agent down");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the pod took {took:?} to start"
    );

    // An injected pod does not start unmeshed: the plugin's 11, for the kubelet to retry.
    let error = match node.run_pod("web", &[PROXY_VERSION, ("app", "web")]) {
        Ok(pod) => panic!("an injected pod started with the agent down: {}", pod.id),
        Err(error) => error,
    };
    assert!(
        error
            .message()
            .contains("the interceptor agent is not reachable; try again later"),
        "{}",
        error.message()
    );

    // The agent back: the retried sandbox starts, meshed; the pod started without it is not.
    node.agent = Some(node.home.start());
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
    let web = node
        .run_pod("web", &[PROXY_VERSION, ("app", "web")])
        .expect("RunPodSandbox of the injected pod, retried once the agent answers");
    node.assert_registered(&["web"]);
    let _web = node.serve(&web, "web-app");
    let _plain = node.serve(&plain, "plain-app");
    node.assert_meshed(&web);
    node.assert_outbound_passes(&plain);
}

/// A node whose agent repairs pods (see [`Node::repairing`]) and exposes its metrics, in a
/// cluster whose stand-in API server has namespace `shop` and no pods yet: the API server, the
/// metrics' address, the node.
fn repairing_node(tag: &str) -> (FakeApi, String, Node) {
    let api = FakeApi::start(vec![fake_api::namespace(POD_NAMESPACE, &[])]);
    let metrics = free_loopback_addr();
    let node = Node::repairing(tag, &api, &["--metrics-addr", &metrics]);
    (api, metrics, node)
}

/// Pod `name` of the node as the API server has it once created, before the kubelet reported
/// anything: `annotations`, `init_containers`.
fn api_pod(name: &str, annotations: &[(&str, &str)], init_containers: &[&str]) -> Value {
    fake_api::pod(
        POD_NAMESPACE,
        name,
        &pod_uid(name),
        NODE_NAME,
        annotations,
        init_containers,
    )
}

/// Waits (up to 20 s) until the agent has registered exactly `names`, and returns the
/// registrations.
fn wait_registered(node: &Node, names: &[&str]) -> Vec<(String, Value)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let registered = node.registered();
        if registered
            .iter()
            .map(|(n, _)| n.as_str())
            .eq(names.iter().copied())
        {
            return registered;
        }
        assert!(
            Instant::now() < deadline,
            "never registered exactly {names:?}: {registered:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pod Linkerd injected whose sandbox was created while our entry was not in the chain runs
/// unmeshed: its `linkerd-network-validator` exits 95. Once the kubelet reports the validator's
/// container (crash-looping), the agent registers the pod in place, as the plugin would have:
/// the validator passes at its next run, and its app's connections land on its proxy with
/// their original destination. A pod Linkerd did not inject, one with `linkerd-init` and a
/// `hostNetwork` one are left alone.
#[test]
fn containerd_repair_meshes_an_injected_pod_that_started_unchained_and_leaves_the_others_alone() {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrepair");
    let _node_server = node.serve_on_node();
    node.unchain();

    // As the kubelet starts each pod: in the API first, then its sandbox.
    let injected = [PROXY_VERSION];
    let cases = [
        ("web", api_pod("web", &injected, &[VALIDATOR]), false),
        ("plain", api_pod("plain", &[("app", "plain")], &[]), false),
        (
            "old-style",
            api_pod("old-style", &injected, &["linkerd-init"]),
            false,
        ),
        (
            "on-host",
            fake_api::host_network(api_pod("on-host", &injected, &[])),
            true,
        ),
    ];
    let mut pods = HashMap::new();
    for (name, object, host_network) in &cases {
        api.put(object.clone());
        let annotations: Vec<(&str, &str)> = object["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        let pod = node
            .run_pod_with(name, &annotations, *host_network)
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        pods.insert(*name, pod);
    }
    let web = &pods["web"];
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
    let (code, line) = node.validate(web);
    assert_eq!(code, Some(95), "the validator before the repair: {line}");

    // The kubelet reports what runs: the validator's container, crash-looping, for the
    // injected pod; every container for the others.
    api.put(fake_api::reported(&cases[0].1, "Pending", &[VALIDATOR]));
    for (_, object, _) in &cases[1..] {
        let mut started = vec!["app", "linkerd-proxy"];
        if object["spec"]["initContainers"][0]["name"] == "linkerd-init" {
            started.push("linkerd-init");
        }
        api.put(fake_api::reported(object, "Running", &started));
    }
    let registered = wait_registered(&node, &["web"]);
    let record = &registered[0].1;
    assert_eq!(record["meta"]["namespace"], POD_NAMESPACE);
    assert_eq!(record["meta"]["uid"], web.uid.as_str());
    assert_eq!(
        record["meta"]["container_id"],
        Value::Null,
        "the sandbox's ID is not guessed"
    );
    // containerd keeps this node's namespaces under its state directory, not in /run/netns:
    // the pod is registered by its sandbox's process, which lives as long as it.
    assert_eq!(
        record["netns"],
        format!("/proc/{}/ns/net", web.pid),
        "{record:#}"
    );
    assert_eq!(
        record["args"],
        json!([
            "--incoming-proxy-port",
            "4143",
            "--outgoing-proxy-port",
            "4140",
            "--proxy-uid",
            "2102",
            "--inbound-ports-to-ignore",
            "4190,4191",
            "--ipv6=false"
        ]),
        "the linkerd block's configuration, as the plugin's ADD gives it"
    );

    // The validator's next run passes; the app's connections land on the proxy both ways.
    let (code, line) = node.validate(web);
    assert_eq!(code, Some(0), "the validator after the repair: {line}");
    let _web = node.serve(web, "web-app");
    node.assert_meshed(web);
    // The pod Linkerd did not inject: untouched.
    let plain = &pods["plain"];
    let _plain = node.serve(plain, "plain-app");
    node.assert_outbound_passes(plain);

    // Later passes change nothing, and nothing failed.
    std::thread::sleep(Duration::from_millis(2500));
    wait_registered(&node, &["web"]);
    assert_eq!(
        metric(&metrics, "interceptor_pods_repaired_total"),
        Some(1.0)
    );
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(
        !body.contains("interceptor_pods_repair_failed_total{"),
        "{body}"
    );
    let log = std::fs::read_to_string(node.agent_log(0)).unwrap();
    let repaired: Vec<&str> = log.lines().filter(|l| l.contains("pod repaired")).collect();
    assert_eq!(repaired.len(), 1, "{log}");
    for expected in [web.uid.as_str(), "web", POD_NAMESPACE, "/ns/net"] {
        assert!(
            repaired[0].contains(expected),
            "{expected}: {}",
            repaired[0]
        );
    }
    assert_eq!(
        log.matches("pods started without the CNI plugin are repaired")
            .count(),
        1,
        "{log}"
    );
}

/// The agent killed in the middle of a repair (between the maps and the pod's record), and a
/// pod started unchained while no agent runs: the next agent takes back the pods repaired
/// before, removes what the cut-short registration left, and repairs the two that are left,
/// each registered once.
#[test]
fn containerd_an_agent_restarted_midway_repairs_what_is_left_and_registers_nothing_twice() {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrestart");
    let _node_server = node.serve_on_node();
    // Two registrations go through, the third is cut short before its record.
    node.restart_agent("agent-before-record=2*off->return");
    node.unchain();

    let start = |node: &mut Node, name: &str| {
        let object = api_pod(name, &[PROXY_VERSION], &[VALIDATOR]);
        api.put(object.clone());
        let pod = node
            .run_pod(name, &[PROXY_VERSION])
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        api.put(fake_api::reported(&object, "Pending", &[VALIDATOR]));
        pod
    };
    let _a = start(&mut node, "a");
    wait_registered(&node, &["a"]);
    let _b = start(&mut node, "b");
    wait_registered(&node, &["a", "b"]);
    let c = start(&mut node, "c");
    let deadline = Instant::now() + Duration::from_secs(20);
    let agent = node.agent.as_mut().expect("the armed agent");
    while agent.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the agent never crashed registering c"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(node.agent_log(1)).unwrap();
    assert!(log.contains("crash point agent-before-record"), "{log}");
    let d = start(&mut node, "d");

    node.restart_agent("");
    let registered = wait_registered(&node, &["a", "b", "c", "d"]);
    let uids: std::collections::BTreeSet<&str> = registered
        .iter()
        .map(|(_, r)| r["meta"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids.len(), 4, "{registered:#?}");
    assert_eq!(node.home.records(), 4);
    assert_eq!(node.home.problems(), Vec::<String>::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics, "interceptor_pods_repaired_total") != Some(2.0) {
        assert!(
            Instant::now() < deadline,
            "the second agent repaired c and d only: {:?}",
            metric(&metrics, "interceptor_pods_repaired_total")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(node.agent_log(2)).unwrap();
    assert!(
        log.contains("removing what the maps and pins hold for a pod without a record"),
        "the cut-short registration of c is undone: {log}"
    );
    assert_eq!(log.matches("pod repaired").count(), 2, "{log}");
    for pod in [&c, &d] {
        let _served = node.serve(pod, "app");
        node.assert_outbound_on_proxy(pod);
    }
}

/// A primary CNI that writes its configuration again without our entry, three times, while the
/// kubelet starts injected pods right after each rewrite (Cilium with `cni.exclusive=true`
/// does this on every change): the watching installer puts the entry back each time and
/// reports it, and every injected pod ends up meshed exactly once, whether its ADD ran through
/// our plugin or its sandbox was created in between and the agent repaired it.
#[test]
fn containerd_a_primary_rewriting_its_conflist_while_pods_start_ends_with_every_injected_pod_meshed()
 {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrewrite");
    let installer_log = node.dir.join("installer.log");
    let mut installer = Command::new(INTERCEPTOR)
        .args(["cni", "install", "--watch", "--check-ms", "200"])
        .args(["--plugin", PLUGIN, "--conf-dir"])
        .arg(&node.cni.conf_dir)
        .arg("--bin-dir")
        .arg(&node.cni.bin_dir)
        .arg("--agent-socket")
        .arg(node.home.socket())
        .arg("--log-file")
        .arg(node.dir.join("cni.log"))
        .args(["--linkerd", LINKERD])
        .stderr(std::fs::File::create(&installer_log).unwrap())
        .spawn()
        .unwrap();
    let installer_says = || std::fs::read_to_string(&installer_log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !installer_says().contains("watching the CNI configuration") {
        assert!(Instant::now() < deadline, "{}", installer_says());
        std::thread::sleep(Duration::from_millis(50));
    }
    let primary = node.cni.conf_dir.join(PRIMARY);
    let chained = || {
        let list: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["type"] == "interceptor-cni")
    };

    let injected = [PROXY_VERSION];
    let mut names = Vec::new();
    let mut objects = Vec::new();
    let installer_pid = nix::unistd::Pid::from_raw(installer.id() as i32);
    for round in 0..3 {
        // Written again without our entry, by rename-over as Cilium writes it. In the first two
        // rounds the installer is held (SIGSTOP) until containerd has loaded the network
        // without it, so the pods started then miss our plugin; in the last it runs, and the
        // pods get it or not as the race goes.
        let held = round < 2;
        if held {
            nix::sys::signal::kill(installer_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
            // kill() returns before the installer has stopped: until it has, it may still act
            // on an event queued from the last round, see our rewrite and chain the plugin again.
            wait_stopped(installer_pid);
            node.unchain();
        } else {
            let mut list: Value =
                serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
            list["plugins"]
                .as_array_mut()
                .unwrap()
                .retain(|p| p["type"] != "interceptor-cni");
            let staged = primary.with_extension("rewrite");
            std::fs::write(&staged, list.to_string()).unwrap();
            std::fs::rename(&staged, &primary).unwrap();
        }
        // The kubelet starts pods at once: each gets our plugin or not, as the race goes.
        for n in 0..2 {
            let name = format!("web-{round}-{n}");
            let object = api_pod(&name, &injected, &[VALIDATOR]);
            api.put(object.clone());
            node.run_pod_with(&name, &[PROXY_VERSION], false)
                .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
            names.push(name);
            objects.push(object);
        }
        if held {
            nix::sys::signal::kill(installer_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !chained() {
            assert!(Instant::now() < deadline, "{}", installer_says());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The kubelet reports the pods' containers; each is meshed once, by its ADD or repaired.
    for object in &objects {
        api.put(fake_api::reported(
            object,
            "Running",
            &["app", "linkerd-proxy"],
        ));
    }
    let expected: Vec<&str> = names.iter().map(String::as_str).collect();
    wait_registered(&node, &expected);
    let added = std::fs::read_to_string(node.dir.join("cni.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("ADD: ") && l.ends_with(" registered"))
        .count();
    eprintln!("{added} of {} pods registered by their ADD", names.len());
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics, "interceptor_cni_chain_restored_total") != Some(3.0) {
        assert!(
            Instant::now() < deadline,
            "restores counted: {:?}; {}",
            metric(&metrics, "interceptor_cni_chain_restored_total"),
            installer_says()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        added <= 2,
        "the pods started while the installer was held had no ADD of ours"
    );
    assert_eq!(
        metric(&metrics, "interceptor_pods_repaired_total"),
        Some((names.len() - added) as f64),
        "{added} of {} pods registered by their ADD, the others repaired",
        names.len()
    );
    wait_registered(&node, &expected);
    let _ = installer.kill();
    let _ = installer.wait();
}

/// Waits until process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn wait_stopped(pid: nix::unistd::Pid) {
    let path = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(&path).unwrap_or_default();
        // The state follows the command name, which may hold spaces and parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("T") {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never stopped: {stat:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
