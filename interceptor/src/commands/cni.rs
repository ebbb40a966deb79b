//! `interceptor cni install|uninstall`: the flags made into the installer's options; the
//! installer itself is `crate::installer`.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use interceptor_cni::install::{self, Installer, PLUGIN_TYPE};
use serde_json::{Value, json};
use tracing::info;

use crate::{
    cli::{CniArgs, CniCommand},
    installer::InstallOptions,
};

pub fn cni(args: CniArgs) -> anyhow::Result<()> {
    match args.command {
        CniCommand::Install {
            plugin,
            linkerd,
            agent_socket,
            log_file,
            pods,
            watch,
            check_ms,
            daemonset,
            kubeconfig,
            chain_report,
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
            crate::installer::install(InstallOptions {
                installer,
                chain_report,
                watch: watch.then(|| Duration::from_millis(check_ms)),
                agent_socket,
                daemonset,
                kubeconfig,
            })
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
