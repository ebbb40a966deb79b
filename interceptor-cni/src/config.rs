//! The network configuration a runtime hands the plugin on stdin, and the pod's interception
//! configuration derived from its `linkerd` block (Linkerd's CNI keys, which are proxy-init's
//! flag names) with per-pod overrides from `runtimeConfig` and `CNI_ARGS`, validated here, before
//! the agent is asked, by the configuration crate the agent and the CLI use
//! (`interceptor_config::mesh`, which also decides which pods are meshed).
use std::{collections::BTreeMap, path::PathBuf};

use interceptor_config::mesh::{PodSettings, Pods, linkerd_settings};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The CNI versions this plugin speaks.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.4.0", "1.0.0", "1.1.0", "0.3.1", "0.3.0"];
pub const DEFAULT_AGENT_SOCKET: &str = "/run/interceptor/agent.sock";
pub const DEFAULT_LOG_FILE: &str = "/var/log/interceptor-cni.log";
/// The capability under which containerd's CRI (and other runtimes that support it) passes the
/// pod's annotations in `runtimeConfig`, to a plugin whose conflist entry declares it.
pub const POD_ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    /// The previous plugin's result, passed through unchanged.
    #[serde(default)]
    pub prev_result: Option<Value>,
    #[serde(default)]
    pub runtime_config: Option<RuntimeConfig>,
    #[serde(default)]
    pub linkerd: BTreeMap<String, Value>,
    /// Which pods are meshed: `"injected"` or `"all"` (see [`pod_selection`]).
    #[serde(default)]
    pub pods: Option<String>,
    /// The agent's API socket.
    #[serde(default, rename = "agent_socket")]
    pub agent_socket: Option<PathBuf>,
    /// Where the plugin logs (stdout belongs to the runtime).
    #[serde(default, rename = "log_file")]
    pub log_file: Option<PathBuf>,
    /// GC: the attachments the runtime still has.
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<Attachment>>,
    /// Every other key: CNI's own (`args`, `capabilities`, ...) and Linkerd's plugin keys that
    /// do not concern interception (`log_level`, `kubernetes`, `policy`) are accepted as is.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RuntimeConfig {
    /// Per-pod overrides of the `linkerd` block, for runtimes configured with a `linkerd`
    /// capability.
    #[serde(default)]
    pub linkerd: BTreeMap<String, Value>,
    /// The pod's annotations, from a runtime that passes them ([`POD_ANNOTATIONS`]). `None`
    /// when it passed nothing; `null` (how a Go runtime writes a pod without annotations) is
    /// a pod without annotations.
    #[serde(
        default,
        rename = "io.kubernetes.cri.pod-annotations",
        deserialize_with = "present"
    )]
    pub pod_annotations: Option<BTreeMap<String, String>>,
}

/// A key that is present is `Some`, even when its value is `null`.
fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    Option::<BTreeMap<String, String>>::deserialize(deserializer)
        .map(|a| Some(a.unwrap_or_default()))
}

/// The conflist's `"pods"`; without it, `injected` when `CNI_ARGS` names a Kubernetes pod
/// (`K8S_POD_NAMESPACE` and `K8S_POD_NAME`, as linkerd-cni requires both), else `all` (podman
/// names no namespace).
pub fn pod_selection(conf: &NetConf, cni_args: &BTreeMap<String, String>) -> Result<Pods, String> {
    match conf.pods.as_deref() {
        Some("injected") => Ok(Pods::Injected),
        Some("all") => Ok(Pods::All),
        Some(other) => Err(format!("pods: {other:?} is not one of injected, all")),
        None => {
            let named = |key: &str| cni_args.get(key).is_some_and(|v| !v.is_empty());
            Ok(if named("K8S_POD_NAMESPACE") && named("K8S_POD_NAME") {
                Pods::Injected
            } else {
                Pods::All
            })
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
}

/// Builds the pod's configuration from Linkerd's defaults, the `linkerd` block,
/// `runtimeConfig.linkerd` and `CNI_ARGS` entries `linkerd.<key>=<value>`, later ones overriding
/// earlier ones. Unknown keys, values of the wrong type and values that are not valid are errors
/// naming them.
///
/// `ipv6` is false unless set, as linkerd-cni writes it unless Linkerd's `disableIPv6` is
/// false: Linkerd's proxy then listens on IPv4 only, and a pod's IPv6 connections sent to it
/// would find no listener. (proxy-init's `--ipv6`, and so `interceptor run`, default to true.)
pub fn pod_settings(
    conf: &NetConf,
    cni_args: &BTreeMap<String, String>,
) -> Result<PodSettings, String> {
    let mut merged: BTreeMap<String, Value> = conf.linkerd.clone();
    if let Some(runtime) = &conf.runtime_config {
        merged.extend(runtime.linkerd.clone());
    }
    for (k, v) in cni_args {
        if let Some(name) = k.strip_prefix("linkerd.") {
            merged.insert(name.to_owned(), Value::String(v.clone()));
        }
    }
    linkerd_settings(&merged)
}

/// `CNI_ARGS`: `K1=V1;K2=V2`.
pub fn parse_cni_args(raw: &str) -> Result<BTreeMap<String, String>, String> {
    raw.split(';')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("CNI_ARGS: {kv:?} is not KEY=VALUE"))
        })
        .collect()
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
