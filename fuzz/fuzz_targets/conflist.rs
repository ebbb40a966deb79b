//! The CNI installer on a node's conf directory: read the primary configuration, chain our
//! entry, keep the chain (applying again changes nothing), and unchain it, on a scratch
//! directory holding the input as the primary configuration.
//!
//! Input: the first byte picks the file (even: `10-primary.conflist`, odd: `10-primary.conf`),
//! the rest is its content. The bin directory holds every plugin the content names that is a
//! plain file name; the others are missing binaries.
#![no_main]

use std::{
    fs,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use interceptor_cni::install::{self, Applied, InstallError, Installer, PLUGIN_TYPE};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// A directory of this process's, in memory where the machine has /dev/shm.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_owned()
        } else {
            std::env::temp_dir()
        };
        base.join(format!("interceptor-fuzz-conflist-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, content)) = data.split_first() else {
        return;
    };
    let dir = scratch();
    let _ = fs::remove_dir_all(dir);
    let (conf_dir, bin_dir) = (dir.join("net.d"), dir.join("bin"));
    fs::create_dir_all(&conf_dir).unwrap();
    fs::create_dir_all(&bin_dir).unwrap();
    let plugin = dir.join("interceptor-cni");
    fs::write(&plugin, b"plugin").unwrap();
    let name = if pick % 2 == 0 {
        "10-primary.conflist"
    } else {
        "10-primary.conf"
    };
    fs::write(conf_dir.join(name), content).unwrap();
    let original: Option<Value> = serde_json::from_slice(content).ok();
    for kind in original.iter().flat_map(plugin_types) {
        // A name the kernel takes (at most NAME_MAX bytes): no node has a plugin binary by any
        // other, and the installer then finds the plugin missing, as the input's other cases do.
        if !kind.is_empty()
            && kind.len() <= 255
            && kind != "."
            && kind != ".."
            && !kind.contains(['/', '\0'])
        {
            fs::write(bin_dir.join(kind), b"").unwrap();
        }
    }
    let installer = Installer {
        bin_dir,
        conf_dir: conf_dir.clone(),
        plugin,
        entry: install::entry(
            json!({ "linkerd": { "incoming-proxy-port": 4143 } })
                .as_object()
                .expect("an object")
                .clone(),
        ),
    };
    let before = snapshot(&conf_dir);
    match installer.install() {
        Ok(applied) => {
            let conf = match &applied {
                Applied::Unchanged(conf) | Applied::Updated(conf) => conf.clone(),
                Applied::Chained { conf, .. } => conf.clone(),
            };
            let list: Value = serde_json::from_slice(&fs::read(&conf).unwrap()).unwrap();
            let ours = list["plugins"]
                .as_array()
                .expect("a chained configuration is a list")
                .iter()
                .filter(|p| p["type"] == PLUGIN_TYPE)
                .count();
            assert_eq!(ours, 1, "our entry is chained once: {list}");
            assert_eq!(
                installer.apply().expect("applying again works"),
                Applied::Unchanged(conf),
                "applying again keeps the chain as it is"
            );
            installer
                .uninstall()
                .expect("uninstalling what was installed");
            let had_ours = original
                .as_ref()
                .is_some_and(|o| plugin_types(o).contains(&PLUGIN_TYPE));
            if !had_ours {
                let after = snapshot(&conf_dir);
                assert_eq!(
                    after.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    before.iter().map(|(n, _)| n).collect::<Vec<_>>(),
                    "uninstalling leaves the files there were"
                );
                let restored: Value = serde_json::from_slice(&after[0].1).unwrap();
                assert_eq!(
                    Some(restored),
                    original,
                    "uninstalling restores the configuration"
                );
            }
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    InstallError::BadConfig { .. } | InstallError::MissingPlugins { .. }
                ),
                "{e}"
            );
            assert_eq!(snapshot(&conf_dir), before, "a refusal writes nothing: {e}");
        }
    }
});

/// The plugin types a configuration names, as a list or a lone plugin.
fn plugin_types(conf: &Value) -> Vec<&str> {
    match conf.get("plugins").and_then(Value::as_array) {
        Some(plugins) => plugins.iter().filter_map(|p| p["type"].as_str()).collect(),
        None => conf["type"].as_str().into_iter().collect(),
    }
}

/// The directory's files (not ours: the installer's state file), by name.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}
