//! A node as the containerd tests run it: the agent, and containerd with its CRI plugin,
//! driven over the CRI gRPC API as the kubelet drives it, its CNI configuration chained by
//! `interceptor cni install` after the reference bridge and host-local plugins.
//!
//! Everything is the test's own: containerd's root, state, sockets and configuration in a
//! temporary directory; containerd itself runs in a network namespace of the test's, so the
//! bridge it has the plugins make (the pods' gateway, the node side) is there, with no route
//! out; the sandboxes' cgroups go under the test's cgroup, where the agent attaches; the sandbox
//! image is built from Debian's busybox-static (no registry is reachable) and imported with
//! `ctr`.
//!
//! A repairing node ([`Node::repairing`]) is laid out as a kubelet with the cgroupfs driver lays
//! it out: each sandbox under `kubepods/besteffort/pod<uid>` in the test's cgroup, the agent
//! finding `kubepods` there (`--kubepods-under`) and the node's pods in the stand-in API server.
mod cleanup;
mod config;
mod cri;
mod images;
mod pause_image;
mod pod;
mod registrations;
mod traffic;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use serde_json::{Value, json};
use tonic::transport::Channel;

pub use pod::{Pod, pod_uid};
pub use traffic::to_node;

use crate::{
    Netns,
    agent_home::{Agent, AgentHome, interceptor_bin},
    cni_network::{CniNetwork, PRIMARY, REFERENCE_PLUGINS, plugin_bin},
    fake_api::FakeApi,
    fixture::{Cgroup, remove_v1_cgroup_dirs},
    unique_name,
};

/// The pods' bridge network, inside the node namespace: its gateway is the node.
pub const GATEWAY: &str = "10.98.0.1";
/// The namespace of the node's pods.
pub const POD_NAMESPACE: &str = "shop";
/// This node's name in the stand-in API server.
pub const NODE_NAME: &str = "node-a";
/// The plugin's `linkerd` block, as the DaemonSet's ConfigMap gives it to the installer and to
/// the agent (for its repairs).
const LINKERD: &str = r#"{"inbound-ports-to-ignore": ["4190", "4191"]}"#;

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
pub struct Node {
    /// Everything of the node's that is not a cgroup or a namespace: logs (`cni.log`,
    /// `agent-<n>.log`, `containerd.log`) and containerd's own directories.
    pub dir: PathBuf,
    layout: Layout,
    /// The agent's arguments beyond its home's.
    agent_args: Vec<String>,
    agents_started: usize,
    // Stopped before its home is removed (fields drop in order); `None` while a test has it
    // down.
    pub agent: Option<Agent>,
    pub home: AgentHome,
    netns: Netns,
    pub cni: CniNetwork,
    containerd: Child,
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    socket: PathBuf,
    cgroup_parent: String,
    sandboxes: Vec<String>,
    // Dropped last: the pods' processes are killed with it.
    cgroup: Cgroup,
}

impl Node {
    pub fn new(tag: &str) -> Self {
        Self::build(tag, Layout::Flat, |_| Vec::new())
    }

    /// A node whose agent reads its pods from `api` (as node [`NODE_NAME`]) and repairs those
    /// started without the plugin every second, with `extra` arguments; its pods' cgroups laid
    /// out as the kubelet's.
    pub fn repairing(tag: &str, api: &FakeApi, extra: &[&str]) -> Self {
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
        let agent = home
            .agent()
            .args(&args)
            .log_to(&dir.join("agent-0.log"))
            .start();
        let netns = Netns::new(&format!("{tag}-node"));
        let cni = CniNetwork::with_primary(&format!("{tag}-cni"), &bridge_network(&dir));
        // containerd takes one plugin directory: the reference plugins beside ours.
        for plugin in ["bridge", "host-local", "loopback"] {
            std::fs::copy(
                Path::new(REFERENCE_PLUGINS).join(plugin),
                cni.bin_dir.join(plugin),
            )
            .unwrap_or_else(|e| panic!("copy {plugin}: {e}"));
        }
        // Chained as the DaemonSet's install-cni container chains it.
        let out = cni_install(&cni, &home, &dir).output().unwrap();
        assert!(
            out.status.success(),
            "cni install: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            config::containerd_config(&dir, &socket, &cni.conf_dir, &cni.bin_dir),
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
        let channel = runtime.block_on(cri::connect(&socket));
        let client = RuntimeServiceClient::new(channel.clone());
        let images = ImageServiceClient::new(channel);
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
            images,
            socket: socket.clone(),
            cgroup_parent,
            sandboxes: Vec::new(),
            cgroup,
        };
        pause_image::import(&node.dir, &socket);
        node.wait_for_network(true);
        node
    }

    /// `interceptor cni install` of this node, as the node was chained: a test adds e.g.
    /// `--watch` and runs it.
    pub fn cni_install(&self) -> Command {
        cni_install(&self.cni, &self.home, &self.dir)
    }

    /// Starts the node's agent again (the previous one killed first, if it still runs), with
    /// `failpoints` armed; its log is `agent-<n>.log` in the node's directory.
    pub fn restart_agent(&mut self, failpoints: &str) {
        if let Some(agent) = self.agent.take() {
            agent.kill();
        }
        let log = std::fs::File::create(self.agent_log(self.agents_started)).unwrap();
        self.agents_started += 1;
        let args: Vec<&str> = self.agent_args.iter().map(String::as_str).collect();
        let agent = self
            .home
            .agent()
            .args(&args)
            .log(log)
            .failpoints(failpoints)
            .start();
        self.agent = Some(agent);
    }

    /// The log of the `n`th agent started.
    pub fn agent_log(&self, n: usize) -> PathBuf {
        self.dir.join(format!("agent-{n}.log"))
    }

    /// Takes our entry out of the primary network, as a primary CNI that writes its
    /// configuration again does, and waits until containerd loaded the network without it.
    pub fn unchain(&mut self) {
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

    /// CNI STATUS of our entry in the chained network, run as a runtime runs it: the binary
    /// the installer put in the bin directory, the entry with the network's name and version.
    pub fn plugin_status(&self) -> (bool, String) {
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
}

impl Drop for Node {
    fn drop(&mut self) {
        self.remove_sandboxes();
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
        cleanup::kill_processes_mentioning(&self.dir);
        cleanup::unmount_under(&self.dir);
        remove_v1_cgroup_dirs(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The node's primary network: a bridge whose gateway is the node ([`GATEWAY`]), addresses
/// from host-local, with its state in `dir`.
fn bridge_network(dir: &Path) -> Value {
    json!({
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
    })
}

/// `interceptor cni install` into `cni` for the agent of `home`, logging to `cni.log` in `dir`,
/// with the node's `linkerd` block.
fn cni_install(cni: &CniNetwork, home: &AgentHome, dir: &Path) -> Command {
    let mut install = cni.install(&interceptor_bin(), &plugin_bin(), &home.socket());
    install
        .arg("--log-file")
        .arg(dir.join("cni.log"))
        .args(["--linkerd", LINKERD]);
    install
}
