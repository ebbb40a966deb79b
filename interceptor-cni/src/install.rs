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
#[path = "install_tests.rs"]
mod tests;
