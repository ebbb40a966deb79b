//! `interceptor cni install|uninstall`: the plugin's binary and its entry in the node's CNI
//! configuration (see `interceptor_cni::install`), and the watch that keeps the entry there.
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use interceptor_cni::install::{Applied, Installer, PLUGIN_TYPE};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde_json::{Value, json};
use tracing::info;

use crate::cli::{CniArgs, CniCommand};

pub fn cni(args: CniArgs) -> anyhow::Result<()> {
    match args.command {
        CniCommand::Install {
            plugin,
            linkerd,
            agent_socket,
            log_file,
            watch,
        } => {
            let linkerd: Value = serde_json::from_str(&linkerd).context("--linkerd is not JSON")?;
            let entry = json!({
                "type": PLUGIN_TYPE,
                "agent_socket": agent_socket,
                "log_file": log_file,
                "linkerd": linkerd,
            });
            // Refused here, with the plugin's own message, rather than at every pod's ADD.
            let conf: interceptor_cni::NetConf = serde_json::from_value(json!({
                "cniVersion": "1.0.0", "name": "check", "type": PLUGIN_TYPE, "linkerd": entry["linkerd"],
            }))
            .context("--linkerd must be a JSON object")?;
            if let Err(e) = interceptor_cni::pod_settings(&conf, &Default::default()) {
                bail!("{e}");
            }
            let installer = Installer {
                bin_dir: args.bin_dir,
                conf_dir: args.conf_dir,
                plugin: plugin.map_or_else(default_plugin, Ok)?,
                entry,
            };
            report(installer.install()?);
            if watch {
                keep_chained(&installer)?;
            }
            Ok(())
        }
        CniCommand::Uninstall => {
            let installer = Installer {
                bin_dir: args.bin_dir,
                conf_dir: args.conf_dir,
                plugin: PathBuf::new(),
                entry: Value::Null,
            };
            installer.uninstall()?;
            info!("CNI plugin uninstalled");
            Ok(())
        }
    }
}

fn default_plugin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this binary")?;
    Ok(exe.with_file_name(PLUGIN_TYPE))
}

fn report(applied: Applied) {
    match applied {
        Applied::Written(path) => info!(conf = %path.display(), "CNI plugin chained"),
        Applied::Unchanged(path) => info!(conf = %path.display(), "CNI plugin already chained"),
    }
}

/// Re-applies whenever a file of the conf directory is written, created, moved or removed: the
/// primary CNI rewriting its configuration drops our entry. Applying is idempotent, so our own
/// write (one event) ends in "already chained".
fn keep_chained(installer: &Installer) -> anyhow::Result<()> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).context("inotify")?;
    inotify
        .add_watch(
            &installer.conf_dir,
            AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_FROM,
        )
        .with_context(|| format!("watching {}", installer.conf_dir.display()))?;
    info!(conf_dir = %installer.conf_dir.display(), "watching the CNI configuration");
    loop {
        inotify.read_events().context("reading inotify events")?;
        match installer.apply() {
            Ok(Applied::Unchanged(_)) => {}
            Ok(applied) => report(applied),
            // A primary configuration being replaced may be missing or half there for a moment.
            Err(e) => {
                tracing::warn!(error = %e, "chaining the CNI plugin; retrying on the next change")
            }
        }
    }
}
