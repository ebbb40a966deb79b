//! A CNI runtime's node, as `tests/tests/cni.rs` drives the plugin: a network namespace of the
//! test's own (the bridge and the pods' gateway live there, with no route out), the network's
//! configuration list (Debian's bridge with host-local IPAM, then our plugin), and each plugin
//! run as a runtime runs it, with CNI's environment and the configuration on stdin.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

use crate::{
    Netns,
    agent_home::AgentHome,
    cni_network::{POD_ANNOTATIONS, injected, plugin_bin},
    unique_name,
};

/// Where the reference plugins are installed (Debian's `containernetworking-plugins`).
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A node for the runtime: its namespace (bridge, gateway), the network's configuration list,
/// and an IPAM data directory, all removed with it.
pub struct Node {
    pub netns: Netns,
    conflist: Value,
    ipam_dir: PathBuf,
    /// Where our plugin logs.
    pub log: PathBuf,
}

impl Node {
    pub fn new(agent: &AgentHome, subnet: u8) -> Self {
        let netns = Netns::new("cninode");
        // What the bridge's gateway would forward is refused right here: nothing leaves.
        netns.ip(&["route", "add", "local", "192.0.2.0/24", "dev", "lo"]);
        let name = unique_name("cni");
        let ipam_dir = std::env::temp_dir().join(&name);
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let bridge = format!("icb{}", subnet);
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": bridge,
                    "isGateway": true,
                    "isDefaultGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{ "subnet": format!("10.{subnet}.0.0/24") }]],
                        "dataDir": ipam_dir,
                    },
                },
                {
                    "type": "interceptor-cni",
                    "capabilities": { POD_ANNOTATIONS: true },
                    "agent_socket": agent.socket(),
                    "log_file": log,
                    "linkerd": {
                        "incoming-proxy-port": 4143,
                        "outgoing-proxy-port": 4140,
                        "proxy-uid": 2102,
                        "inbound-ports-to-ignore": ["4190", "4191"],
                        "ipv6": false,
                    },
                },
            ],
        });
        Self {
            netns,
            conflist,
            ipam_dir,
            log,
        }
    }

    /// One plugin of the list, as a runtime runs it: `(exit success, stdout JSON)`. Our plugin
    /// gets the annotations of an injected pod in `runtimeConfig`, as containerd passes them,
    /// unless `extra` brings a `runtimeConfig` of its own.
    pub fn plugin(
        &self,
        index: usize,
        command: &str,
        container: &str,
        netns: Option<&Path>,
        extra: Value,
    ) -> (bool, Value) {
        let mut conf = self.conflist["plugins"][index].clone();
        conf["cniVersion"] = self.conflist["cniVersion"].clone();
        conf["name"] = self.conflist["name"].clone();
        if conf["capabilities"][POD_ANNOTATIONS] == true {
            conf["runtimeConfig"] = json!({ POD_ANNOTATIONS: injected() });
        }
        if let (Value::Object(conf), Value::Object(extra)) = (&mut conf, extra) {
            conf.extend(extra);
        }
        let binary = match conf["type"].as_str() {
            Some("interceptor-cni") => plugin_bin(),
            Some(other) => Path::new(CNI_BIN_DIR).join(other),
            None => panic!("no type"),
        };
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.path().display()))
            .arg(binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container)
            .env("CNI_NETNS", netns.map(Path::to_owned).unwrap_or_default())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", CNI_BIN_DIR)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={container};K8S_POD_UID=uid-{container}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the plugin");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = if stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{command}: {e}: {stdout}"))
        };
        (out.status.success(), json)
    }

    /// ADD of an injected pod through the whole list, each plugin getting the previous one's
    /// result.
    pub fn add(&self, container: &str, netns: &Path) -> (bool, Value, Value) {
        self.add_with(container, netns, json!({ POD_ANNOTATIONS: injected() }))
    }

    /// ADD through the whole list, our plugin getting this `runtimeConfig`.
    pub fn add_with(
        &self,
        container: &str,
        netns: &Path,
        runtime_config: Value,
    ) -> (bool, Value, Value) {
        let (ok, bridge) = self.plugin(0, "ADD", container, Some(netns), json!({}));
        assert!(ok, "bridge ADD: {bridge}");
        let (ok, ours) = self.plugin(
            1,
            "ADD",
            container,
            Some(netns),
            json!({ "prevResult": bridge, "runtimeConfig": runtime_config }),
        );
        (ok, bridge, ours)
    }

    pub fn ours(
        &self,
        command: &str,
        container: &str,
        netns: Option<&Path>,
        extra: Value,
    ) -> (bool, Value) {
        self.plugin(1, command, container, netns, extra)
    }

    pub fn pod_address(result: &Value) -> String {
        let address = result["ips"][0]["address"].as_str().expect("an address");
        address.split('/').next().unwrap().to_owned()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.ipam_dir);
        let _ = std::fs::remove_file(&self.log);
    }
}
