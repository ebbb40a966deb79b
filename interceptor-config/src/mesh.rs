//! Whether a pod is meshed and how: Linkerd's CNI `linkerd` block (proxy-init's flag names,
//! the conflist's and the agent's `--linkerd`) read into [`PodSettings`], and [`pod_plan`], the
//! one decision the CNI plugin's ADD and CHECK and the agent's repair of a pod started without
//! the plugin take, from the pod's annotations, its namespace's, and linkerd-cni's rules.
use std::collections::BTreeMap;

use serde_json::Value;

use crate::{
    ConfigError, InterceptionConfig,
    annotations::{self, Decision, SkipReason},
    kube::KubePod,
};

/// Which pods are meshed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pods {
    /// Kubernetes' rule, linkerd-cni's: the pods Linkerd injected, each with its own
    /// `config.linkerd.io/*` annotations.
    Injected,
    /// Every pod the runtime adds, with the `linkerd` block's configuration.
    All,
}

/// The keys of Linkerd's CNI `linkerd` block, and what becomes of each.
#[derive(Clone, Copy)]
enum Key {
    /// A proxy-init flag of the same name: a number or a string.
    Value,
    /// A list flag: an array of strings or numbers (or one comma-separated string).
    List,
    /// `ipv6`: a boolean flag.
    Bool,
    /// iptables-only settings (the eBPF backend has no use for them): checked, not passed on.
    IptablesOnly,
    /// `simulate`: the plugin registers nothing and says what it would do.
    Simulate,
}

fn key(name: &str) -> Option<Key> {
    Some(match name {
        "incoming-proxy-port" | "outgoing-proxy-port" | "proxy-uid" | "proxy-gid" => Key::Value,
        "ports-to-redirect"
        | "inbound-ports-to-ignore"
        | "outbound-ports-to-ignore"
        | "subnets-to-ignore"
        | "outbound-subnets-to-ignore" => Key::List,
        "ipv6" => Key::Bool,
        "use-wait-flag" | "iptables-mode" => Key::IptablesOnly,
        "simulate" => Key::Simulate,
        _ => return None,
    })
}

/// A pod's interception settings: its configuration, and whether to only simulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSettings {
    pub config: InterceptionConfig,
    pub simulate: bool,
}

/// Linkerd's defaults (`ipv6` false) with the keys of a `linkerd` block applied: what
/// the CNI plugin builds once the block and its per-pod overrides are merged, and what the
/// agent's repair starts from (its `--linkerd`, the installer's value).
pub fn linkerd_settings(merged: &BTreeMap<String, Value>) -> Result<PodSettings, String> {
    let mut config = InterceptionConfig::linkerd();
    config.ipv6 = false;
    let mut simulate = false;
    for (name, value) in merged {
        let kind = key(name).ok_or_else(|| {
            format!("linkerd: unknown key {name:?} (known: the flags of proxy-init, e.g. \"incoming-proxy-port\")")
        })?;
        let text = match (kind, value) {
            (Key::Value, Value::Number(n)) => n.to_string(),
            (Key::Value, Value::String(s)) => s.clone(),
            (Key::List, Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(n) => Ok(n.to_string()),
                    other => Err(format!(
                        "linkerd.{name}: {other} is not a port, range or CIDR"
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            (Key::List, Value::String(s)) => s.clone(),
            (Key::Bool | Key::Simulate | Key::IptablesOnly, Value::Bool(b)) => b.to_string(),
            (Key::Bool | Key::Simulate | Key::IptablesOnly, Value::String(s)) => s.clone(),
            (_, other) => return Err(format!("linkerd.{name}: {other} is not a valid value")),
        };
        let allowed: &[&str] = match name.as_str() {
            "iptables-mode" => &["legacy", "nft", "plain"],
            "simulate" | "use-wait-flag" => &["true", "false"],
            _ => &[],
        };
        if !allowed.is_empty() && !allowed.contains(&text.as_str()) {
            return Err(format!(
                "linkerd.{name}: {text:?} is not one of {}",
                allowed.join(", ")
            ));
        }
        match kind {
            Key::Simulate => simulate = text == "true",
            Key::IptablesOnly => {}
            Key::Value | Key::List | Key::Bool => config
                .set(name, &text)
                .map_err(|e| format!("linkerd: {e}"))?,
        }
    }
    Ok(PodSettings { config, simulate })
}

/// What becomes of a pod.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    Mesh(PodSettings),
    /// Not meshed, and why.
    Skip(SkipReason),
}

/// Whether a pod is meshed and with which settings: `settings` (the `linkerd` block's, with the
/// per-pod overrides) with the pod's `config.linkerd.io/*` annotations applied, its
/// namespace's under them, and linkerd-cni's rules: with [`Pods::Injected`], only a pod Linkerd
/// injected and that has no `linkerd-init` container; for a control-plane pod, the API
/// server's ports not redirected. The plugin's ADD and CHECK and the agent's repair of a pod
/// started without the plugin decide with this one function. A malformed annotation is an
/// error naming it.
pub fn pod_plan(mut settings: PodSettings, pods: Pods, pod: &KubePod) -> Result<Plan, ConfigError> {
    if pods == Pods::Injected
        && let Decision::Skip { reason } =
            annotations::decide_with_containers(&pod.annotations, pod.linkerd_init)
    {
        return Ok(Plan::Skip(reason));
    }
    let annotations =
        annotations::with_namespace_defaults(&pod.annotations, &pod.namespace_annotations);
    settings.config = annotations::apply(&settings.config, &annotations)?;
    if pod.control_plane_component.is_some() {
        annotations::skip_api_server(&mut settings.config, &pod.api_server_ports);
    }
    Ok(Plan::Mesh(settings))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_pods_plan_follows_linkerd_cnis_rules() {
        let settings = || linkerd_settings(&BTreeMap::new()).unwrap();
        let injected = |extra: &[(&str, &str)]| KubePod {
            annotations: [("linkerd.io/proxy-version", "edge-24.11.8")]
                .iter()
                .chain(extra)
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..KubePod::default()
        };
        let mesh = |plan: Plan| match plan {
            Plan::Mesh(settings) => settings.config,
            Plan::Skip(reason) => panic!("skipped: {reason}"),
        };

        // Not injected, or with linkerd-init: left alone, unless every pod is meshed.
        assert_eq!(
            pod_plan(settings(), Pods::Injected, &KubePod::default()).unwrap(),
            Plan::Skip(SkipReason::NotInjected)
        );
        let with_init = KubePod {
            linkerd_init: true,
            ..injected(&[])
        };
        assert_eq!(
            pod_plan(settings(), Pods::Injected, &with_init).unwrap(),
            Plan::Skip(SkipReason::LinkerdInit)
        );
        assert_eq!(
            mesh(pod_plan(settings(), Pods::All, &KubePod::default()).unwrap()),
            settings().config
        );

        // The pod's annotations over its namespace's; a control-plane pod skips the API server.
        let pod = KubePod {
            namespace_annotations: [
                ("config.linkerd.io/skip-outbound-ports", "25"),
                ("config.linkerd.io/proxy-uid", "3000"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
            control_plane_component: Some("destination".into()),
            api_server_ports: vec![443, 8443],
            ..injected(&[("config.linkerd.io/proxy-uid", "4000")])
        };
        let config = mesh(pod_plan(settings(), Pods::Injected, &pod).unwrap());
        assert_eq!(config.proxy_uid, Some(4000));
        assert_eq!(config.outbound_ports_to_ignore.to_string(), "25,443,8443");

        let bad = injected(&[("config.linkerd.io/skip-outbound-ports", "smtp")]);
        let error = pod_plan(settings(), Pods::Injected, &bad).unwrap_err();
        assert!(error.to_string().contains("smtp"), "{error}");
    }
}
