//! Installing the plugin on a node: its binary into the CNI bin directory, and an entry chained
//! into the node's primary network configuration (the first `*.conflist` or `*.conf` of the
//! conf directory, as runtimes pick it). A lone `.conf` becomes a `.conflist`. Every write is
//! atomic (a temp file renamed over), and the entry is never added twice. Watching the
//! directory re-applies it when the primary CNI rewrites its file (Cilium and Calico do), and
//! [`Restores`] tells a primary that keeps doing so. Uninstalling removes exactly what installing
//! added.
//!
//! The node's files are input written by other programs: one that is not a configuration we can
//! change (not JSON, empty, a plugin entry that is not an object, no `plugins` list) is refused
//! with [`InstallError::BadConfig`], naming the file and what is wrong, and left as it is.
//!
//! Nothing is written unless every plugin of the primary configuration has its binary in the
//! bin directory: a bin directory that is not the runtime's (GKE's and k3s's are not
//! `/opt/cni/bin`) would otherwise get our binary, and our entry would be chained where the
//! runtime cannot find it, failing every pod's ADD on the node, not only meshed ones.
use std::{
    collections::VecDeque,
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// Our plugin's `type`, as runtimes find its binary in the bin directory.
pub const PLUGIN_TYPE: &str = "interceptor-cni";
/// Remembers what installing changed beyond our entry (a `.conf` turned into a `.conflist`), so
/// uninstalling restores it. Not named `*.conf*`: runtimes never read it.
const STATE_FILE: &str = ".interceptor-cni-install.json";

/// Our entry in the list: `type`, the plugin's `settings` (`linkerd`, `agent_socket`, `pods`,
/// ...), and the capability under which containerd's CRI passes the pod's annotations in
/// `runtimeConfig` ([`crate::POD_ANNOTATIONS`]), which decide whether the pod is meshed.
pub fn entry(settings: serde_json::Map<String, Value>) -> Value {
    let mut entry = json!({
        "type": PLUGIN_TYPE,
        "capabilities": { crate::POD_ANNOTATIONS: true },
    });
    if let Value::Object(map) = &mut entry {
        map.extend(settings);
    }
    entry
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// The node's configuration is malformed; nothing was written.
    #[error("{path} is not a CNI network configuration: {reason}; it was left as it is")]
    BadConfig { path: PathBuf, reason: String },
    #[error(
        "no CNI network configuration (*.conflist, *.conf) in {0}: install the primary CNI first"
    )]
    NoPrimary(PathBuf),
    #[error(
        "{conflist} chains plugins whose binaries are not in {bin_dir}: {}; nothing was written. \
         The bin directory is probably not this distribution's (GKE uses /home/kubernetes/bin, \
         k3s and RKE2 keep theirs under /var/lib/rancher/...): set --bin-dir to the directory \
         the runtime takes its plugins from (the chart's destCNIBinDir sets it)",
        missing.join(", ")
    )]
    MissingPlugins {
        conflist: PathBuf,
        bin_dir: PathBuf,
        missing: Vec<String>,
    },
}

fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

#[derive(Clone, Debug)]
pub struct Installer {
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    /// The `interceptor-cni` binary to copy.
    pub plugin: PathBuf,
    /// Our entry in the list (see [`entry`]).
    pub entry: Value,
}

/// What [`Installer::apply`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The primary configuration already chains our entry as it should.
    Unchanged(PathBuf),
    /// Our entry was not in the primary configuration and is now chained: `conf` is the
    /// configuration list written, `primary_plugins` the plugin types it had (ours aside).
    Chained {
        conf: PathBuf,
        primary_plugins: Vec<String>,
    },
    /// Our entry was there with other settings, and is replaced (the path written).
    Updated(PathBuf),
}

impl Installer {
    /// Copies the binary (when it differs) and chains our entry into the primary configuration,
    /// or, when the primary's plugins are not all in the bin directory, writes nothing.
    pub fn install(&self) -> Result<Applied, InstallError> {
        let primary = primary(&self.conf_dir)?;
        self.require_plugins(&primary, &read_conf(&primary)?)?;
        self.copy_plugin()?;
        self.apply()
    }

    /// Refuses a primary configuration with a plugin whose binary is not a file of the bin
    /// directory (ours aside: it is ours to put there).
    fn require_plugins(&self, primary: &Path, conf: &Value) -> Result<(), InstallError> {
        let mut missing: Vec<String> = Vec::new();
        for kind in plugin_types(conf) {
            // Joined as the runtime (Go's filepath.Join) joins it: never an absolute path.
            let binary = self.bin_dir.join(kind.trim_start_matches('/'));
            if kind != PLUGIN_TYPE && !binary.is_file() && !missing.iter().any(|m| m == kind) {
                missing.push(kind.to_owned());
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(InstallError::MissingPlugins {
            conflist: primary.to_owned(),
            bin_dir: self.bin_dir.clone(),
            missing,
        })
    }

    fn copy_plugin(&self) -> Result<(), InstallError> {
        let target = self.bin_dir.join(PLUGIN_TYPE);
        let bytes = fs::read(&self.plugin).map_err(io_error("reading", &self.plugin))?;
        if fs::read(&target).is_ok_and(|existing| existing == bytes) {
            return Ok(());
        }
        fs::create_dir_all(&self.bin_dir).map_err(io_error("creating", &self.bin_dir))?;
        write_atomically(&target, &bytes, 0o755)
    }

    /// Chains our entry into the primary configuration if it is not there as it should be. Call
    /// again whenever the directory changes: an unchanged file is not rewritten.
    pub fn apply(&self) -> Result<Applied, InstallError> {
        let primary = primary(&self.conf_dir)?;
        let mut list = read_conf(&primary)?;
        self.require_plugins(&primary, &list)?;
        let converted = !is_list(&primary);
        let target = if converted {
            list = conf_to_conflist(list);
            primary.with_extension("conflist")
        } else {
            primary.clone()
        };
        let primary_plugins: Vec<String> = plugin_types(&list)
            .into_iter()
            .filter(|kind| *kind != PLUGIN_TYPE)
            .map(str::to_owned)
            .collect();
        let plugins = plugins_mut(&mut list, &primary)?;
        let ours: Vec<usize> = (0..plugins.len())
            .filter(|&i| plugins[i]["type"] == PLUGIN_TYPE)
            .collect();
        let applied = match ours.as_slice() {
            [i] if plugins[*i] == self.entry && target == primary => {
                return Ok(Applied::Unchanged(primary));
            }
            // Ours more than once (written by hand, or by another installer): the runtime would
            // run the plugin once per entry. The first stays, as this entry.
            [first, rest @ ..] => {
                plugins[*first] = self.entry.clone();
                for &i in rest.iter().rev() {
                    plugins.remove(i);
                }
                Applied::Updated(target.clone())
            }
            [] => {
                plugins.push(self.entry.clone());
                Applied::Chained {
                    conf: target.clone(),
                    primary_plugins,
                }
            }
        };
        if converted {
            let state = json!({ "converted_from": primary.file_name().map(|n| n.to_string_lossy().into_owned()) });
            write_atomically(
                &self.conf_dir.join(STATE_FILE),
                state.to_string().as_bytes(),
                0o644,
            )?;
        }
        write_json(&target, &list)?;
        if target != primary {
            fs::remove_file(&primary).map_err(io_error("removing", &primary))?;
        }
        Ok(applied)
    }

    /// Removes our entry (and restores a `.conf` we converted) and our binary.
    pub fn uninstall(&self) -> Result<(), InstallError> {
        // A lone `.conf` never holds our entry: installing converts it.
        if let Ok(primary) = primary(&self.conf_dir)
            && let mut list = read_conf(&primary)?
            && is_list(&primary)
        {
            let plugins = plugins_mut(&mut list, &primary)?;
            let before = plugins.len();
            plugins.retain(|p| p["type"] != PLUGIN_TYPE);
            let state_path = self.conf_dir.join(STATE_FILE);
            let converted = fs::read(&state_path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|s| s["converted_from"].as_str().map(str::to_owned))
                // Only a file of the conf directory, as installing wrote it.
                .filter(|name| Path::new(name).file_name() == Some(name.as_ref()));
            match (converted, plugins.as_slice()) {
                (Some(conf_name), [Value::Object(conf)]) => {
                    let mut conf = conf.clone();
                    // A key the `.conf` lacked is null in the list made of it: not restored.
                    for key in ["cniVersion", "name"] {
                        if !list[key].is_null() {
                            conf.insert(key.into(), list[key].clone());
                        }
                    }
                    write_json(&self.conf_dir.join(conf_name), &Value::Object(conf))?;
                    fs::remove_file(&primary).map_err(io_error("removing", &primary))?;
                }
                _ if plugins.len() != before => write_json(&primary, &list)?,
                _ => {}
            }
            let _ = fs::remove_file(&state_path);
        }
        let binary = self.bin_dir.join(PLUGIN_TYPE);
        match fs::remove_file(&binary) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error("removing", &binary)(e)),
            _ => Ok(()),
        }
    }
}

/// The configuration runtimes use: the first `*.conflist` or `*.conf` by name.
pub fn primary(conf_dir: &Path) -> Result<PathBuf, InstallError> {
    let mut candidates: Vec<PathBuf> = fs::read_dir(conf_dir)
        .map_err(io_error("reading", conf_dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "conflist" || e == "conf")
        })
        .collect();
    candidates.sort();
    candidates
        .into_iter()
        .next()
        .ok_or_else(|| InstallError::NoPrimary(conf_dir.to_owned()))
}

/// The plugin types a configuration chains, in order (a lone `.conf` is one plugin).
fn plugin_types(conf: &Value) -> Vec<&str> {
    match conf.get("plugins").and_then(Value::as_array) {
        Some(plugins) => plugins.iter().filter_map(|p| p["type"].as_str()).collect(),
        None => conf["type"].as_str().into_iter().collect(),
    }
}

/// The plugin type of Cilium's configuration.
const CILIUM: &str = "cilium-cni";

/// The times our entry had to be chained again, to tell a primary CNI that keeps rewriting its
/// configuration (Cilium with its default `cni.exclusive=true`, an installer in a crash loop)
/// from a one-off rewrite (its installer starting). Between each rewrite and its restore, pods
/// start without our plugin.
#[derive(Debug, Default)]
pub struct Restores {
    /// The latest restores, at most [`Self::PERSISTENT`].
    recent: VecDeque<Instant>,
    /// Whether the current episode was reported.
    reported: bool,
}

impl Restores {
    /// How many restores within [`Self::WINDOW`] make an episode.
    pub const PERSISTENT: usize = 3;
    pub const WINDOW: Duration = Duration::from_secs(600);

    /// Records a restore at `now`. True once per episode: for the restore that makes
    /// [`Self::PERSISTENT`] within [`Self::WINDOW`]. The episode ends when no restore was needed
    /// for a [`Self::WINDOW`].
    pub fn record(&mut self, now: Instant) -> bool {
        if self
            .recent
            .back()
            .is_some_and(|last| now.duration_since(*last) >= Self::WINDOW)
        {
            self.reported = false;
        }
        if self.recent.len() == Self::PERSISTENT {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        let persistent = self.recent.len() == Self::PERSISTENT
            && self
                .recent
                .front()
                .is_some_and(|first| now.duration_since(*first) < Self::WINDOW);
        persistent && !std::mem::replace(&mut self.reported, true)
    }
}

/// The likely cause of a primary CNI rewriting its configuration again and again, and the fix,
/// from its plugin types ([`Applied::Chained`]).
pub fn rewrite_cause(primary_plugins: &[String]) -> String {
    if primary_plugins.iter().any(|kind| kind == CILIUM) {
        return "Cilium rewrites its CNI configuration (cni.exclusive=true): install Cilium with \
                --set cni.exclusive=false"
            .to_owned();
    }
    format!(
        "the installer of the primary CNI (plugins: {}) keeps rewriting its configuration without \
         the interceptor plugin, and pods created before each restore start without it: find \
         what rewrites the file (the primary CNI's pods restarting, an operator reconciling it)",
        primary_plugins.join(", ")
    )
}

/// A lone plugin configuration as a list of one.
pub fn conf_to_conflist(conf: Value) -> Value {
    json!({
        "cniVersion": conf["cniVersion"].clone(),
        "name": conf["name"].clone(),
        "plugins": [conf],
    })
}

fn plugins_mut<'a>(list: &'a mut Value, path: &Path) -> Result<&'a mut Vec<Value>, InstallError> {
    list.get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| InstallError::BadConfig {
            path: path.to_owned(),
            reason: "no \"plugins\" list".into(),
        })
}

/// Whether `path` is a configuration list (`*.conflist`) rather than a lone plugin (`*.conf`).
fn is_list(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

/// The node's configuration at `path`, checked to be one we can change (see [`check_conf`]).
fn read_conf(path: &Path) -> Result<Value, InstallError> {
    let bytes = fs::read(path).map_err(io_error("reading", path))?;
    let bad = |reason: String| InstallError::BadConfig {
        path: path.to_owned(),
        reason,
    };
    if bytes.trim_ascii().is_empty() {
        return Err(bad("the file is empty".into()));
    }
    let conf = serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON ({e})")))?;
    check_conf(&conf, is_list(path)).map_err(bad)?;
    Ok(conf)
}

/// What is wrong with a configuration list (`list`) or a lone plugin's configuration, as far as
/// installing and uninstalling read and change it: an object, each plugin an object with a
/// `type`, a list with at least one.
fn check_conf(conf: &Value, list: bool) -> Result<(), String> {
    let Value::Object(conf) = conf else {
        return Err(format!("{} where a JSON object belongs", kind(conf)));
    };
    if !list {
        return check_plugin(conf).map_err(|e| format!("the plugin {e}"));
    }
    let plugins = match conf.get("plugins") {
        Some(Value::Array(plugins)) => plugins,
        Some(other) => return Err(format!("\"plugins\" is {}, not a list", kind(other))),
        None => return Err("no \"plugins\" list".into()),
    };
    if plugins.is_empty() {
        return Err("the \"plugins\" list is empty".into());
    }
    for (i, plugin) in plugins.iter().enumerate() {
        let Value::Object(plugin) = plugin else {
            return Err(format!(
                "plugin {i} of \"plugins\" is {} where an object belongs",
                kind(plugin)
            ));
        };
        check_plugin(plugin).map_err(|e| format!("plugin {i} of \"plugins\" {e}"))?;
    }
    Ok(())
}

fn check_plugin(plugin: &serde_json::Map<String, Value>) -> Result<(), String> {
    match plugin.get("type") {
        Some(Value::String(_)) => Ok(()),
        Some(other) => Err(format!(
            "has a \"type\" that is {}, not a string",
            kind(other)
        )),
        None => Err("has no \"type\"".into()),
    }
}

/// A JSON value's kind, for a message.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn write_json(path: &Path, value: &Value) -> Result<(), InstallError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    write_atomically(path, text.as_bytes(), 0o644)
}

/// A temp file in the same directory, renamed over the target: readers see the old file or the
/// new one, never a part of it.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt as _;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A dot-name without a .conf/.conflist extension: a runtime never reads it half-written.
    let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
    fs::write(&tmp, bytes).map_err(io_error("writing", &tmp))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(io_error("setting the mode of", &tmp))?;
    fs::rename(&tmp, path).map_err(io_error("renaming to", path))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A conf directory and a bin directory of the test's own.
    struct Dirs {
        root: PathBuf,
    }

    impl Dirs {
        fn new(tag: &str) -> Self {
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let root =
                std::env::temp_dir().join(format!("icpt-install-{tag}-{}-{n}", std::process::id()));
            fs::create_dir_all(root.join("net.d")).unwrap();
            fs::create_dir_all(root.join("plugin")).unwrap();
            fs::write(root.join("plugin/interceptor-cni"), b"#!plugin").unwrap();
            Self { root }
        }

        fn conf(&self, name: &str) -> PathBuf {
            self.root.join("net.d").join(name)
        }

        fn installer(&self) -> Installer {
            Installer {
                bin_dir: self.root.join("bin"),
                conf_dir: self.root.join("net.d"),
                plugin: self.root.join("plugin/interceptor-cni"),
                entry: entry(
                    json!({ "linkerd": { "proxy-uid": 2102 } })
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            }
        }

        /// The primary network's plugins, where the runtime finds them.
        fn binaries(&self, kinds: &[&str]) {
            fs::create_dir_all(self.root.join("bin")).unwrap();
            for kind in kinds {
                fs::write(self.root.join("bin").join(kind), b"#!primary").unwrap();
            }
        }

        /// Every file under the test's directories, with its bytes.
        fn snapshot(&self) -> Vec<(PathBuf, Vec<u8>)> {
            fn walk(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
                for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        walk(&path, out);
                    } else {
                        out.push((path.clone(), fs::read(&path).unwrap()));
                    }
                }
            }
            let mut out = Vec::new();
            walk(&self.root, &mut out);
            out.sort();
            out
        }

        fn files(&self) -> Vec<String> {
            let mut names: Vec<String> = fs::read_dir(self.root.join("net.d"))
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for Dirs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn calico() -> Value {
        json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
        {"type": "calico", "datastore_type": "kubernetes", "ipam": {"type": "calico-ipam"},
         "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}},
        {"type": "bandwidth", "capabilities": {"bandwidth": true}},
        {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]})
    }

    fn flannel() -> Value {
        json!({"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
        {"type": "portmap", "capabilities": {"portMappings": true}}]})
    }

    fn cilium_conf() -> Value {
        json!({"cniVersion": "0.3.1", "name": "cilium", "type": "cilium-cni",
           "enable-debug": false, "log-file": "/var/run/cilium/cilium-cni.log"})
    }

    fn read(path: &Path) -> Value {
        serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn chains_after_calico_and_flannel_lists_once_and_uninstalls_exactly() {
        for (name, original) in [
            ("10-calico.conflist", calico()),
            ("10-flannel.conflist", flannel()),
        ] {
            let dirs = Dirs::new("list");
            dirs.binaries(&["calico", "bandwidth", "portmap", "flannel"]);
            fs::write(
                dirs.conf(name),
                serde_json::to_vec_pretty(&original).unwrap(),
            )
            .unwrap();
            // Another configuration later in the directory is not the primary one.
            fs::write(
                dirs.conf("99-loopback.conf"),
                br#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
            )
            .unwrap();
            let installer = dirs.installer();
            let primary_plugins = original["plugins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["type"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(
                installer.install().unwrap(),
                Applied::Chained {
                    conf: dirs.conf(name),
                    primary_plugins
                }
            );
            assert_eq!(
                installer.install().unwrap(),
                Applied::Unchanged(dirs.conf(name))
            );
            let chained = read(&dirs.conf(name));
            let plugins = chained["plugins"].as_array().unwrap();
            assert_eq!(
                plugins.len(),
                original["plugins"].as_array().unwrap().len() + 1
            );
            assert_eq!(plugins.last().unwrap()["type"], PLUGIN_TYPE);
            // containerd passes the pod's annotations to a plugin that declares the capability.
            assert_eq!(
                plugins.last().unwrap()["capabilities"],
                json!({ "io.kubernetes.cri.pod-annotations": true })
            );
            assert_eq!(plugins.last().unwrap()["linkerd"]["proxy-uid"], 2102);
            assert_eq!(
                plugins[0], original["plugins"][0],
                "the primary plugin is untouched"
            );
            assert_eq!(
                fs::read(dirs.root.join("bin/interceptor-cni")).unwrap(),
                b"#!plugin"
            );

            installer.uninstall().unwrap();
            assert_eq!(read(&dirs.conf(name)), original, "{name}");
            assert!(!dirs.root.join("bin/interceptor-cni").exists());
            assert_eq!(dirs.files(), [name, "99-loopback.conf"]);
        }
    }

    #[test]
    fn a_lone_conf_becomes_a_conflist_and_comes_back_on_uninstall() {
        let dirs = Dirs::new("conf");
        dirs.binaries(&["cilium-cni"]);
        fs::write(
            dirs.conf("05-cilium.conf"),
            serde_json::to_vec(&cilium_conf()).unwrap(),
        )
        .unwrap();
        let installer = dirs.installer();
        assert_eq!(
            installer.install().unwrap(),
            Applied::Chained {
                conf: dirs.conf("05-cilium.conflist"),
                primary_plugins: vec!["cilium-cni".into()]
            }
        );
        assert_eq!(
            dirs.files(),
            [".interceptor-cni-install.json", "05-cilium.conflist"]
        );
        let list = read(&dirs.conf("05-cilium.conflist"));
        assert_eq!(list["name"], "cilium");
        assert_eq!(list["plugins"][0], cilium_conf());
        assert_eq!(list["plugins"][1]["type"], PLUGIN_TYPE);

        installer.uninstall().unwrap();
        assert_eq!(dirs.files(), ["05-cilium.conf"]);
        assert_eq!(read(&dirs.conf("05-cilium.conf")), cilium_conf());
    }

    #[test]
    fn a_rewrite_by_the_primary_cni_is_chained_again_and_our_entry_is_updated_in_place() {
        let dirs = Dirs::new("rewrite");
        dirs.binaries(&["calico", "bandwidth", "portmap"]);
        let path = dirs.conf("10-calico.conflist");
        fs::write(&path, serde_json::to_vec(&calico()).unwrap()).unwrap();
        let mut installer = dirs.installer();
        installer.install().unwrap();
        // Calico rewrites its file, dropping our entry.
        fs::write(&path, serde_json::to_vec(&calico()).unwrap()).unwrap();
        assert_eq!(
            installer.apply().unwrap(),
            Applied::Chained {
                conf: path.clone(),
                primary_plugins: vec!["calico".into(), "bandwidth".into(), "portmap".into()]
            }
        );
        assert_eq!(read(&path)["plugins"].as_array().unwrap().len(), 4);
        // A new configuration of ours replaces the entry, never adds a second.
        installer.entry = json!({ "type": PLUGIN_TYPE, "linkerd": { "proxy-uid": 3000 } });
        assert_eq!(installer.apply().unwrap(), Applied::Updated(path.clone()));
        let plugins = read(&path)["plugins"].as_array().unwrap().clone();
        assert_eq!(
            plugins.iter().filter(|p| p["type"] == PLUGIN_TYPE).count(),
            1
        );
        assert_eq!(plugins[3]["linkerd"]["proxy-uid"], 3000);
    }

    #[test]
    fn no_primary_configuration_is_a_clear_error() {
        let dirs = Dirs::new("empty");
        let err = dirs.installer().install().unwrap_err();
        assert!(
            err.to_string().contains("install the primary CNI first"),
            "{err}"
        );
        fs::write(dirs.conf("10-bad.conflist"), b"{ not json").unwrap();
        let err = dirs.installer().install().unwrap_err();
        assert!(err.to_string().contains("10-bad.conflist"), "{err}");
    }

    /// The node files no installer can change.
    use interceptor_test_cases::malformed_cases;

    /// Every malformed file is refused by install, the watch's apply and uninstall alike, with an
    /// error naming the file and what is wrong, and nothing is changed: not the file, not the state
    /// file, not a binary (as if an earlier install had converted a `.conf`).
    #[test]
    fn a_malformed_node_configuration_is_refused_and_left_as_it_is() {
        for (name, text, reason) in malformed_cases::MALFORMED {
            let dirs = Dirs::new("malformed");
            dirs.binaries(&["loopback", PLUGIN_TYPE]);
            fs::write(dirs.conf(name), text).unwrap();
            fs::write(
                dirs.conf(STATE_FILE),
                json!({ "converted_from": "10-net.conf" }).to_string(),
            )
            .unwrap();
            let before = dirs.snapshot();
            let installer = dirs.installer();
            for (action, result) in [
                ("install", installer.install().map(drop)),
                ("apply", installer.apply().map(drop)),
                ("uninstall", installer.uninstall()),
            ] {
                let err = result.expect_err(&format!("{action} of {name} {text:?}"));
                assert!(
                    matches!(&err, InstallError::BadConfig { path, .. } if *path == dirs.conf(name)),
                    "{action} of {text:?}: {err:?}"
                );
                let message = err.to_string();
                assert!(
                    message.contains(&dirs.conf(name).display().to_string())
                        && message.contains(reason)
                        && message.contains("left as it is"),
                    "{action} of {text:?}: {reason:?} not in {message}"
                );
                assert_eq!(dirs.snapshot(), before, "{action} of {text:?} wrote");
            }
        }
    }

    /// Uninstalling where the primary is a lone `.conf` (never converted: nothing of ours in it)
    /// removes only the binary.
    /// Found by the `conflist` fuzz target: a conflist holding our entry twice kept both, so the
    /// runtime ran the plugin twice for each pod.
    #[test]
    fn our_entry_found_twice_is_chained_once() {
        let dirs = Dirs::new("twice");
        dirs.binaries(&["flannel", "portmap"]);
        let installer = dirs.installer();
        let mut list = flannel();
        let plugins = list["plugins"].as_array_mut().unwrap();
        plugins.insert(1, installer.entry.clone());
        plugins.push(json!({"type": PLUGIN_TYPE, "linkerd": {"proxy-uid": 1}}));
        fs::write(
            dirs.conf("10-flannel.conflist"),
            serde_json::to_vec(&list).unwrap(),
        )
        .unwrap();
        assert_eq!(
            installer.install().unwrap(),
            Applied::Updated(dirs.conf("10-flannel.conflist"))
        );
        let types: Vec<Value> = read(&dirs.conf("10-flannel.conflist"))["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].clone())
            .collect();
        assert_eq!(
            types,
            [json!("flannel"), json!(PLUGIN_TYPE), json!("portmap")]
        );
        assert_eq!(
            installer.apply().unwrap(),
            Applied::Unchanged(dirs.conf("10-flannel.conflist"))
        );
    }

    /// Found by the `conflist` fuzz target: a `.conf` without `name` came back from uninstalling
    /// with `"name": null`, which the list made of it had.
    #[test]
    fn a_lone_conf_without_a_name_comes_back_without_one() {
        let dirs = Dirs::new("conf-no-name");
        dirs.binaries(&["cilium-cni"]);
        let mut conf = cilium_conf();
        conf.as_object_mut().unwrap().remove("name");
        fs::write(
            dirs.conf("05-cilium.conf"),
            serde_json::to_vec(&conf).unwrap(),
        )
        .unwrap();
        let installer = dirs.installer();
        installer.install().unwrap();
        installer.uninstall().unwrap();
        assert_eq!(dirs.files(), ["05-cilium.conf"]);
        assert_eq!(read(&dirs.conf("05-cilium.conf")), conf);
    }

    #[test]
    fn uninstall_leaves_a_lone_conf_it_never_converted() {
        let dirs = Dirs::new("loneconf");
        dirs.binaries(&[PLUGIN_TYPE]);
        let path = dirs.conf("05-cilium.conf");
        let text = serde_json::to_vec(&cilium_conf()).unwrap();
        fs::write(&path, &text).unwrap();
        dirs.installer().uninstall().unwrap();
        assert_eq!(fs::read(&path).unwrap(), text);
        assert!(!dirs.root.join("bin").join(PLUGIN_TYPE).exists());
    }

    #[test]
    fn a_primary_whose_plugins_are_not_in_the_bin_dir_is_refused_and_nothing_is_written() {
        let dirs = Dirs::new("missing");
        let path = dirs.conf("10-calico.conflist");
        fs::write(&path, serde_json::to_vec_pretty(&calico()).unwrap()).unwrap();
        let installer = dirs.installer();
        let before = dirs.snapshot();
        let err = installer.install().unwrap_err();
        let text = err.to_string();
        for expected in [
            path.display().to_string(),
            dirs.root.join("bin").display().to_string(),
            "calico, bandwidth, portmap".to_owned(),
            "--bin-dir".to_owned(),
            "/home/kubernetes/bin".to_owned(),
        ] {
            assert!(text.contains(&expected), "{expected:?} not in {text}");
        }
        assert_eq!(dirs.snapshot(), before, "nothing written");
        assert!(!dirs.root.join("bin").exists());
        // The watch's re-apply refuses the same way.
        assert!(matches!(
            installer.apply(),
            Err(InstallError::MissingPlugins { .. })
        ));
        assert_eq!(dirs.snapshot(), before);

        // One still missing is named alone.
        dirs.binaries(&["calico", "bandwidth"]);
        match installer.install() {
            Err(InstallError::MissingPlugins { missing, .. }) => assert_eq!(missing, ["portmap"]),
            other => panic!("{other:?}"),
        }
        assert!(!dirs.root.join("bin/interceptor-cni").exists());
        assert_eq!(read(&path), calico());
        dirs.binaries(&["portmap"]);
        assert!(
            matches!(installer.install().unwrap(), Applied::Chained { conf, .. } if conf == path)
        );
        assert!(dirs.root.join("bin/interceptor-cni").is_file());
    }

    #[test]
    fn a_lone_conf_whose_plugin_is_not_in_the_bin_dir_is_refused_and_nothing_is_written() {
        let dirs = Dirs::new("missingconf");
        fs::write(
            dirs.conf("05-cilium.conf"),
            serde_json::to_vec(&cilium_conf()).unwrap(),
        )
        .unwrap();
        let before = dirs.snapshot();
        let err = dirs.installer().install().unwrap_err();
        assert!(err.to_string().contains("cilium-cni"), "{err}");
        assert_eq!(dirs.snapshot(), before);
        assert_eq!(dirs.files(), ["05-cilium.conf"], "no state file either");
    }

    /// Three restores within ten minutes start an episode, reported once however long it lasts; it
    /// ends when no restore was needed for ten minutes, and the next one is reported again.
    #[test]
    fn restores_are_reported_once_per_episode_of_three_within_ten_minutes() {
        let start = Instant::now();
        let at = |minutes: u64| start + Duration::from_secs(minutes * 60);
        let mut restores = Restores::default();
        assert!(!restores.record(at(0)));
        assert!(!restores.record(at(1)));
        assert!(restores.record(at(2)), "the third within ten minutes");
        assert!(!restores.record(at(3)), "once per episode");
        // Slower now, but never ten quiet minutes: the same episode.
        for minutes in [9, 16, 23, 24, 25] {
            assert!(!restores.record(at(minutes)), "at {minutes} min");
        }
        // Then a quiet half hour: the episode is over, and a new one is reported on its third.
        assert!(!restores.record(at(55)));
        assert!(!restores.record(at(56)));
        assert!(restores.record(at(57)));
        // Three spread over more than ten minutes are no episode.
        let mut spread = Restores::default();
        for minutes in [0, 6, 12, 18, 24] {
            assert!(!spread.record(at(minutes)), "at {minutes} min");
        }
    }

    #[test]
    fn the_cause_of_rewrites_names_ciliums_setting_or_the_primarys_plugins() {
        let cilium = rewrite_cause(&["cilium-cni".into()]);
        assert!(
            cilium.contains("cni.exclusive=true")
                && cilium.contains("install Cilium with --set cni.exclusive=false"),
            "{cilium}"
        );
        let calico = rewrite_cause(&["calico".into(), "portmap".into()]);
        assert!(
            calico.contains("(plugins: calico, portmap) keeps rewriting"),
            "{calico}"
        );
        assert!(!calico.contains("Cilium"), "{calico}");
    }
}
