//! `interceptor cni install|uninstall`: the plugin's binary and its entry in the node's CNI
//! configuration (see `interceptor_cni::install`), and the watch that keeps the entry there.
use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, bail};
use interceptor_cni::install::{self, Applied, Installer, PLUGIN_TYPE};
use nix::sys::{
    inotify::{AddWatchFlags, InitFlags, Inotify},
    signal::{SigSet, Signal},
};
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
            pods,
            watch,
        } => {
            let linkerd: Value = serde_json::from_str(&linkerd).context("--linkerd is not JSON")?;
            let mut settings = serde_json::Map::new();
            settings.insert("agent_socket".into(), json!(agent_socket));
            settings.insert("log_file".into(), json!(log_file));
            settings.insert("linkerd".into(), linkerd);
            if let Some(pods) = pods {
                settings.insert("pods".into(), json!(pods));
            }
            let entry = install::entry(settings);
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
            if !watch {
                report(installer.install()?);
                return Ok(());
            }
            // Blocked before the watch thread starts, so it inherits the mask and the signals
            // wait for `sigwait` here.
            let signals = termination_signals();
            signals
                .thread_block()
                .context("blocking SIGTERM and SIGINT")?;
            report(installer.install()?);
            // Held by the watch while it chains, and by the uninstall below, which marks it
            // stopped: an uninstall's own write must not be chained again.
            let stopped = Arc::new(Mutex::new(false));
            let (watcher, watch_stopped) = (installer.clone(), stopped.clone());
            std::thread::spawn(move || {
                if let Err(e) = keep_chained(&watcher, &watch_stopped) {
                    tracing::error!(error = %format!("{e:#}"), "watching the CNI configuration stopped");
                    std::process::exit(1);
                }
            });
            let signal = signals.wait().context("waiting for SIGTERM or SIGINT")?;
            // The DaemonSet deleted or this pod replaced: take the plugin out of the chain, so
            // no pod waits on an agent that may not come back. (A pod created before the next
            // installer chains it again is not meshed, as with linkerd-cni.)
            let mut stopped = stopped.lock().unwrap_or_else(|e| e.into_inner());
            *stopped = true;
            installer.uninstall()?;
            info!(%signal, "CNI plugin uninstalled on termination");
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

fn termination_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
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
fn keep_chained(installer: &Installer, stopped: &Mutex<bool>) -> anyhow::Result<()> {
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
        let stopped = stopped.lock().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return Ok(());
        }
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
