//! A node's CNI network as a container runtime uses it: a configuration directory holding a
//! primary network (loopback only, so nothing a pod sends can leave), a bin directory for what
//! `interceptor cni install` copies there, and the chain run as a runtime runs it: each plugin
//! with the network's name and version and the previous plugin's result, in order for ADD and
//! in reverse for DEL. Our plugin comes from the bin directory (what the installer put there),
//! the reference plugins from Debian's `/usr/lib/cni`, copied into the bin directory too, as a
//! node has its primary network's plugins there (the installer refuses to chain otherwise), or
//! stand-ins for a primary Debian has no plugins for (Cilium's), through which no pod is added.
//! Everything is removed on drop.
use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::{Value, json};

use crate::unique_name;

/// The reference plugins' directory (Debian's `containernetworking-plugins`).
pub const REFERENCE_PLUGINS: &str = "/usr/lib/cni";
/// The primary network's file, as a node's CNI would have written it.
pub const PRIMARY: &str = "10-lo.conflist";
/// The capability under which containerd's CRI passes a pod's annotations.
pub const POD_ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

/// The plugin built for the tests (`interceptor-cni-under-test`), next to the test binaries.
pub fn plugin_bin() -> PathBuf {
    crate::probe::sibling_binary("interceptor-cni-under-test")
}

/// The annotations of a pod Linkerd's proxy injector injected.
pub fn injected() -> Value {
    json!({ "linkerd.io/proxy-version": "edge-24.11.8", "linkerd.io/created-by": "linkerd/proxy-injector edge-24.11.8" })
}

pub struct CniNetwork {
    pub root: PathBuf,
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    /// The primary network's configuration file: [`PRIMARY`] in the conf directory, unless
    /// [`Self::with_stand_ins`] names another.
    pub primary_path: PathBuf,
}

impl CniNetwork {
    pub fn new(tag: &str) -> Self {
        Self::with_primary(tag, &Self::primary())
    }

    /// A network whose primary configuration is `primary` (e.g. a bridge), in [`PRIMARY`], with
    /// its plugins' binaries in the bin directory.
    pub fn with_primary(tag: &str, primary: &Value) -> Self {
        Self::create(tag, PRIMARY, primary, |kind, target| {
            std::fs::copy(Path::new(REFERENCE_PLUGINS).join(kind), target).map(drop)
        })
    }

    /// A network whose primary configuration is `primary`, in `file_name`, with stand-ins for
    /// its plugins' binaries (scripts that fail): for a primary such as Cilium's, which the
    /// installer chains into but no pod is added through ([`Self::add`] would fail).
    pub fn with_stand_ins(tag: &str, file_name: &str, primary: &Value) -> Self {
        Self::create(tag, file_name, primary, |_, target| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::write(target, "#!/bin/false\n")?;
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o755))
        })
    }

    fn create(
        tag: &str,
        file_name: &str,
        primary: &Value,
        plugin: impl Fn(&str, &Path) -> std::io::Result<()>,
    ) -> Self {
        let root = std::env::temp_dir().join(unique_name(tag));
        let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
        for dir in [&conf_dir, &bin_dir] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        for plugin_conf in primary["plugins"].as_array().into_iter().flatten() {
            let kind = plugin_conf["type"].as_str().expect("a plugin type");
            // Ours is the installer's (or the test's) to put there.
            if kind == "interceptor-cni" {
                continue;
            }
            plugin(kind, &bin_dir.join(kind))
                .unwrap_or_else(|e| panic!("the primary's plugin {kind}: {e}"));
        }
        let primary_path = conf_dir.join(file_name);
        std::fs::write(&primary_path, primary.to_string()).expect("writing the primary network");
        Self {
            root,
            conf_dir,
            bin_dir,
            primary_path,
        }
    }

    /// The primary network before any installer touched it.
    pub fn primary() -> Value {
        json!({"cniVersion": "1.0.0", "name": "lo-net", "plugins": [{"type": "loopback"}]})
    }

    /// `interceptor cni install` of `plugin` into this network, for the agent at
    /// `agent_socket`: add the Linkerd settings, then run it.
    pub fn install(&self, interceptor: &Path, plugin: &Path, agent_socket: &Path) -> Command {
        let mut install = Command::new(interceptor);
        install
            .args(["cni", "install", "--plugin"])
            .arg(plugin)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .arg("--bin-dir")
            .arg(&self.bin_dir)
            .arg("--agent-socket")
            .arg(agent_socket);
        install
    }

    /// The primary network's configuration as it is now.
    pub fn conflist(&self) -> Value {
        let path = &self.primary_path;
        serde_json::from_slice(&std::fs::read(path).expect("the primary network"))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// How many times our plugin is in the chain (0 before the installer, 1 after).
    pub fn chained(&self) -> usize {
        chained(&self.primary_path)
    }

    /// ADD of the pod `name` (namespace `shop`) with `annotations` in `netns` through the whole
    /// chain: the last plugin's result, or the first failing plugin's error output. As
    /// containerd's CRI does, the annotations go in the `runtimeConfig` of the plugins that
    /// declare the capability [`POD_ANNOTATIONS`].
    pub fn add(&self, name: &str, netns: &Path, annotations: &Value) -> Result<Value, String> {
        let conflist = self.conflist();
        let mut previous = Value::Null;
        for plugin in conflist["plugins"].as_array().expect("plugins") {
            let mut extra = json!({});
            if !previous.is_null() {
                extra["prevResult"] = previous;
            }
            if plugin["capabilities"][POD_ANNOTATIONS] == true {
                extra["runtimeConfig"] = json!({ POD_ANNOTATIONS: annotations });
            }
            previous = self.plugin(&conflist, plugin, "ADD", name, netns, extra)?;
        }
        Ok(previous)
    }

    /// DEL of the pod through the chain, last plugin first.
    pub fn del(&self, name: &str, netns: &Path) -> Result<(), String> {
        let conflist = self.conflist();
        for plugin in conflist["plugins"]
            .as_array()
            .expect("plugins")
            .iter()
            .rev()
        {
            self.plugin(&conflist, plugin, "DEL", name, netns, json!({}))?;
        }
        Ok(())
    }

    fn plugin(
        &self,
        conflist: &Value,
        plugin: &Value,
        command: &str,
        name: &str,
        netns: &Path,
        extra: Value,
    ) -> Result<Value, String> {
        let mut conf = plugin.clone();
        conf["cniVersion"] = conflist["cniVersion"].clone();
        conf["name"] = conflist["name"].clone();
        // What the runtime adds: `prevResult`, `runtimeConfig`.
        if let (Value::Object(conf), Value::Object(extra)) = (&mut conf, extra) {
            conf.extend(extra);
        }
        let kind = conf["type"].as_str().expect("a plugin type");
        let binary = if kind == "interceptor-cni" {
            self.bin_dir.join(kind)
        } else {
            Path::new(REFERENCE_PLUGINS).join(kind)
        };
        let mut child = Command::new(&binary)
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", name)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", REFERENCE_PLUGINS)
            .env(
                "CNI_ARGS",
                format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(conf.to_string().as_bytes())
            .expect("writing the plugin's configuration");
        let out = child.wait_with_output().expect("the plugin's output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "{kind} {command}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if stdout.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout).map_err(|e| format!("{kind} {command}: {e}: {stdout}"))
    }
}

impl Drop for CniNetwork {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// How many times our plugin is chained in the conflist at `path` (0 where it cannot be read).
pub fn chained(path: &Path) -> usize {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|c| c["plugins"].as_array().cloned())
        .map_or(0, |p| {
            p.iter().filter(|p| p["type"] == "interceptor-cni").count()
        })
}
