//! A Kubernetes pod's own say in its interception: whether Linkerd injected it ([`decide`]) and
//! the `config.linkerd.io/*` annotations that change its configuration ([`apply`]).
//!
//! The rules are linkerd-cni's (`linkerd/linkerd2-proxy-init`, `cni-plugin/main.go`), read from
//! the pod's annotations, which is what a container runtime hands a CNI plugin:
//! - linkerd-cni meshes a pod with a `linkerd-proxy` container (or native-sidecar init
//!   container). The proxy injector marks every pod it gives one with `linkerd.io/proxy-version`,
//!   so that annotation stands for the container here.
//! - It skips a pod that still has a `linkerd-init` init container (that container writes the
//!   rules itself). The annotations do not show containers: the agent's view of the API does
//!   ([`SkipReason::LinkerdInit`]); without one, such a pod gets both, which is harmless
//!   (connect4 has already rewritten the destination to loopback, which the chains leave
//!   alone).
//! - It never reads `linkerd.io/inject`: the injector does not inject a pod whose
//!   `linkerd.io/inject` is `disabled`, and one injected by hand has a proxy to serve it.
//! - A `config.linkerd.io/*` annotation the pod does not have is taken from its namespace
//!   ([`with_namespace_defaults`]).
//! - Per-pod settings: `skip-outbound-ports` replaces the list, `skip-inbound-ports` adds to it
//!   (as linkerd-cni does since its 1.6.3, and the injector's `linkerd-init`),
//!   `skip-subnets` replaces the inbound subnets, `proxy-uid` and `proxy-gid` replace the IDs
//!   (0 or negative: none, as in proxy-init); an empty value is no value.
//! - A pod of Linkerd's control plane (label `linkerd.io/control-plane-component`) reaches the
//!   Kubernetes API around its proxy: the API server's ports (the `kubernetes` Service's port
//!   and target port, else 443 and 6443) are added to its outbound ignore list
//!   ([`skip_api_server`]). Its proxy cannot become ready before the controllers it serves
//!   have read the API. Runtimes pass no labels: the agent's view of the API gives them. The proxy's ports (`inbound-port`, `outbound-port`,
//!   `admin-port`, `control-port`) are applied as the injector's `linkerd-init` applies them,
//!   which linkerd-cni does not: a pod whose proxy listens elsewhere would otherwise be sent to
//!   a port where nothing listens.
use std::collections::BTreeMap;

use crate::{ConfigError, InterceptionConfig, PortSet, parse_id, ports, positive, subnets};

/// Set by the proxy injector on every pod it injects (its value is the proxy's version).
pub const PROXY_VERSION: &str = "linkerd.io/proxy-version";
pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
pub const SKIP_SUBNETS: &str = "config.linkerd.io/skip-subnets";
pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
pub const PROXY_GID: &str = "config.linkerd.io/proxy-gid";
pub const INBOUND_PORT: &str = "config.linkerd.io/inbound-port";
pub const OUTBOUND_PORT: &str = "config.linkerd.io/outbound-port";
pub const ADMIN_PORT: &str = "config.linkerd.io/admin-port";
pub const CONTROL_PORT: &str = "config.linkerd.io/control-port";

/// The label of Linkerd's control-plane pods (destination, identity, proxy-injector); its value
/// names the component.
pub const CONTROL_PLANE_COMPONENT: &str = "linkerd.io/control-plane-component";
/// linkerd-cni's API server ports when the `kubernetes` Service cannot be read.
pub const DEFAULT_API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// The prefix of Linkerd's configuration annotations: the only ones a namespace gives its pods
/// ([`with_namespace_defaults`]).
pub const CONFIG_PREFIX: &str = "config.linkerd.io/";

/// The annotations [`apply`] reads.
pub const CONFIG_ANNOTATIONS: [&str; 9] = [
    SKIP_INBOUND_PORTS,
    SKIP_OUTBOUND_PORTS,
    SKIP_SUBNETS,
    PROXY_UID,
    PROXY_GID,
    INBOUND_PORT,
    OUTBOUND_PORT,
    ADMIN_PORT,
    CONTROL_PORT,
];

/// Whether a pod is meshed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Mesh,
    Skip { reason: SkipReason },
}

/// Why a pod is not meshed: a stable label for metrics ([`SkipReason::label`]) and a sentence
/// for logs (`Display`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    NotInjected,
    /// Injected with a `linkerd-init` init container, which writes proxy-init's iptables
    /// rules itself (the injector without Linkerd's CNI mode).
    LinkerdInit,
}

/// linkerd-cni leaves a pod with an init container of this name to it.
pub const LINKERD_INIT_CONTAINER: &str = "linkerd-init";

impl SkipReason {
    pub const ALL: [SkipReason; 2] = [SkipReason::NotInjected, SkipReason::LinkerdInit];

    pub fn label(self) -> &'static str {
        match self {
            SkipReason::NotInjected => "not_injected",
            SkipReason::LinkerdInit => "linkerd_init",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::NotInjected => {
                write!(f, "not injected by Linkerd (no {PROXY_VERSION} annotation)")
            }
            SkipReason::LinkerdInit => write!(
                f,
                "its {LINKERD_INIT_CONTAINER} init container writes iptables rules for its proxy"
            ),
        }
    }
}

/// linkerd-cni's decision, from the pod's annotations: meshed when Linkerd injected it.
pub fn decide(annotations: &BTreeMap<String, String>) -> Decision {
    if annotations.contains_key(PROXY_VERSION) {
        Decision::Mesh
    } else {
        Decision::Skip {
            reason: SkipReason::NotInjected,
        }
    }
}

/// [`decide`], where the pod's init containers are known (`linkerd_init`: one is named
/// [`LINKERD_INIT_CONTAINER`]): such a pod is left to its `linkerd-init`, as linkerd-cni does.
pub fn decide_with_containers(
    annotations: &BTreeMap<String, String>,
    linkerd_init: bool,
) -> Decision {
    match decide(annotations) {
        Decision::Mesh if linkerd_init => Decision::Skip {
            reason: SkipReason::LinkerdInit,
        },
        decision => decision,
    }
}

/// The pod's configuration: `base` (the conflist's) with the pod's `config.linkerd.io/*`
/// annotations applied. A malformed value is an error naming the annotation and the value;
/// other annotations are not read.
pub fn apply(
    base: &InterceptionConfig,
    annotations: &BTreeMap<String, String>,
) -> Result<InterceptionConfig, ConfigError> {
    let mut config = base.clone();
    for name in CONFIG_ANNOTATIONS {
        // linkerd-cni takes an empty value as no value.
        let Some(value) = annotations.get(name).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        let invalid = |reason: String| ConfigError::Invalid {
            setting: name.to_owned(),
            value: value.clone(),
            reason,
        };
        match name {
            SKIP_OUTBOUND_PORTS => {
                config.outbound_ports_to_ignore = value.parse().map_err(invalid)?;
            }
            SKIP_INBOUND_PORTS | ADMIN_PORT | CONTROL_PORT => {
                let more: PortSet = if name == SKIP_INBOUND_PORTS {
                    value.parse().map_err(invalid)?
                } else {
                    value
                        .parse::<ports::PortRange>()
                        .map_err(invalid)
                        .and_then(|r| {
                            if r.is_single() {
                                Ok(PortSet(vec![r]))
                            } else {
                                Err(invalid(format!("{value:?} is not a single port")))
                            }
                        })?
                };
                for range in more.0 {
                    if !config.inbound_ports_to_ignore.0.contains(&range) {
                        config.inbound_ports_to_ignore.0.push(range);
                    }
                }
            }
            SKIP_SUBNETS => {
                config.subnets_to_ignore = subnets::parse_cidr_list(value).map_err(invalid)?;
            }
            PROXY_UID => config.proxy_uid = positive(parse_id(value).map_err(invalid)?),
            PROXY_GID => config.proxy_gid = positive(parse_id(value).map_err(invalid)?),
            INBOUND_PORT => {
                config.incoming_proxy_port = ports::parse_port(value).map_err(invalid)?
            }
            OUTBOUND_PORT => {
                config.outgoing_proxy_port = ports::parse_port(value).map_err(invalid)?;
            }
            _ => unreachable!("every annotation of CONFIG_ANNOTATIONS is applied"),
        }
    }
    Ok(config)
}

/// What [`apply`] reads for a pod: its own annotations, and its namespace's
/// `config.linkerd.io/*` ones where the pod has no value of its own (none, or an empty one), as
/// linkerd-cni falls back to them key by key. Nothing else comes from the namespace (never
/// `linkerd.io/inject` or the like): whether a pod is meshed is its own.
pub fn with_namespace_defaults(
    pod: &BTreeMap<String, String>,
    namespace: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut annotations = pod.clone();
    for (name, value) in namespace {
        if name.starts_with(CONFIG_PREFIX) && pod.get(name).is_none_or(|v| v.trim().is_empty()) {
            annotations.insert(name.clone(), value.clone());
        }
    }
    annotations
}

/// linkerd-cni's rule for a control-plane pod: its connections to the Kubernetes API server's
/// `ports` are not redirected. Added to the outbound ignore list after the pod's own
/// `skip-outbound-ports` (which replaces the list), as linkerd-cni orders them. Port 0 (a
/// Service's `targetPort` of 0, as the API or the agent's answer may carry it) is no port: kept,
/// it would make a configuration the agent refuses.
pub fn skip_api_server(config: &mut InterceptionConfig, ports: &[u16]) {
    for &port in ports {
        if port != 0 && !config.outbound_ports_to_ignore.contains(port) {
            config
                .outbound_ports_to_ignore
                .0
                .push(ports::PortRange::single(port));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> BTreeMap<String, String> {
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn applied(annotations: &[(&str, &str)]) -> InterceptionConfig {
        apply(&InterceptionConfig::linkerd(), &pod(annotations)).unwrap()
    }

    #[test]
    fn an_injected_pod_is_meshed() {
        assert_eq!(
            decide(&pod(&[(PROXY_VERSION, "edge-24.11.8")])),
            Decision::Mesh
        );
        // A pod injected by hand carries the annotation whatever linkerd.io/inject says.
        assert_eq!(
            decide(&pod(&[
                (PROXY_VERSION, "stable-2.14.10"),
                ("linkerd.io/inject", "disabled"),
            ])),
            Decision::Mesh
        );
    }

    #[test]
    fn a_pod_linkerd_did_not_inject_is_skipped_with_the_reason() {
        for annotations in [
            pod(&[]),
            pod(&[("linkerd.io/inject", "enabled")]),
            pod(&[(SKIP_OUTBOUND_PORTS, "1404")]),
            pod(&[("config.linkerd.io/proxy-version", "stable-2.14.10")]),
        ] {
            let Decision::Skip { reason } = decide(&annotations) else {
                panic!("{annotations:?} is meshed");
            };
            assert_eq!(reason, SkipReason::NotInjected);
            assert_eq!(reason.label(), "not_injected");
            assert!(reason.to_string().contains(PROXY_VERSION), "{reason}");
        }
    }

    #[test]
    fn no_annotation_keeps_the_base_configuration() {
        let base = InterceptionConfig::linkerd();
        assert_eq!(applied(&[(PROXY_VERSION, "v1"), ("app", "web")]), base);
        // An empty value is no value, as in linkerd-cni.
        assert_eq!(
            applied(&[(SKIP_OUTBOUND_PORTS, ""), (PROXY_UID, " ")]),
            base
        );
    }

    #[test]
    fn skip_outbound_ports_replaces_the_list() {
        let mut base = InterceptionConfig::linkerd();
        base.outbound_ports_to_ignore = "443".parse().unwrap();
        let config = apply(&base, &pod(&[(SKIP_OUTBOUND_PORTS, "25,587,3306-3307")])).unwrap();
        assert_eq!(
            config.outbound_ports_to_ignore.to_string(),
            "25,587,3306-3307"
        );
        assert!(!config.outbound_ports_to_ignore.contains(443));
    }

    #[test]
    fn skip_inbound_ports_adds_to_the_list() {
        let config = applied(&[(SKIP_INBOUND_PORTS, "4222,6222,4320-4325")]);
        assert_eq!(
            config.inbound_ports_to_ignore.to_string(),
            "4190,4191,4222,6222,4320-4325"
        );
    }

    #[test]
    fn skip_subnets_replaces_the_inbound_subnets() {
        let mut base = InterceptionConfig::linkerd();
        base.set("subnets-to-ignore", "10.0.0.0/8").unwrap();
        let config = apply(&base, &pod(&[(SKIP_SUBNETS, "172.17.0.0/16,fd00::/8")])).unwrap();
        assert_eq!(
            config
                .subnets_to_ignore
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["172.17.0.0/16", "fd00::/8"]
        );
        assert!(config.outbound_subnets_to_ignore.is_empty());
    }

    #[test]
    fn proxy_ids_and_ports() {
        let config = applied(&[
            (PROXY_UID, "2103"),
            (PROXY_GID, "2104"),
            (INBOUND_PORT, "5143"),
            (OUTBOUND_PORT, "5140"),
            (ADMIN_PORT, "5191"),
            (CONTROL_PORT, "5190"),
        ]);
        assert_eq!(config.proxy_uid, Some(2103));
        assert_eq!(config.proxy_gid, Some(2104));
        assert_eq!(config.incoming_proxy_port, 5143);
        assert_eq!(config.outgoing_proxy_port, 5140);
        // Applied in the order of CONFIG_ANNOTATIONS; a port already ignored is not repeated.
        assert_eq!(
            config.inbound_ports_to_ignore.to_string(),
            "4190,4191,5191,5190"
        );
        assert_eq!(
            applied(&[(ADMIN_PORT, "4191")])
                .inbound_ports_to_ignore
                .to_string(),
            "4190,4191"
        );
    }

    #[test]
    fn a_malformed_value_names_the_annotation_and_the_value() {
        for (name, value, reason) in [
            (
                SKIP_OUTBOUND_PORTS,
                "25,smtp",
                "\"smtp\" is not a port number",
            ),
            (
                SKIP_OUTBOUND_PORTS,
                "3307-3306",
                "low end above its high end",
            ),
            (SKIP_INBOUND_PORTS, "70000", "out of range"),
            (SKIP_SUBNETS, "172.17.0.0/33", "CIDR"),
            (PROXY_UID, "linkerd", "not a numeric id"),
            (PROXY_GID, "2102.5", "not a numeric id"),
            (INBOUND_PORT, "0", "out of range"),
            (OUTBOUND_PORT, "4140,4141", "not a port number"),
            (ADMIN_PORT, "4190-4191", "not a single port"),
            (CONTROL_PORT, "x", "not a port number"),
        ] {
            let e = apply(&InterceptionConfig::linkerd(), &pod(&[(name, value)])).unwrap_err();
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("invalid value '{value}' for '{name}': ")),
                "{message}"
            );
            assert!(message.contains(reason), "{message}");
        }
    }

    #[test]
    fn a_negative_proxy_id_is_none_as_in_proxy_init() {
        // Linkerd's chart spells an unset GID -1; proxy-init writes no rule for 0 or below.
        let config = applied(&[(PROXY_UID, "-1"), (PROXY_GID, "-1")]);
        assert_eq!(config.proxy_uid, None);
        assert_eq!(config.proxy_gid, None);
        assert_eq!(applied(&[(PROXY_GID, "0")]).proxy_gid, None);
    }

    #[test]
    fn a_control_plane_pod_reaches_the_api_server_around_its_proxy() {
        // After the pod's own skip-outbound-ports, which replaces the list, as linkerd-cni does.
        let mut config = applied(&[(SKIP_OUTBOUND_PORTS, "25,443")]);
        skip_api_server(&mut config, &DEFAULT_API_SERVER_PORTS);
        assert_eq!(config.outbound_ports_to_ignore.to_string(), "25,443,6443");
        // The `kubernetes` Service's port and target port, as linkerd-cni reads them.
        let mut config = InterceptionConfig::linkerd();
        skip_api_server(&mut config, &[443, 8443]);
        assert_eq!(config.outbound_ports_to_ignore.to_string(), "443,8443");
    }

    /// Found by the `annotations` fuzz target (`!control-plane=0`): port 0 went into the ignore
    /// list, a configuration its own JSON form refuses, so the agent refused the pod.
    #[test]
    fn an_api_server_port_of_0_is_not_skipped() {
        let mut config = InterceptionConfig::linkerd();
        skip_api_server(&mut config, &[0, 443]);
        assert_eq!(config.outbound_ports_to_ignore.to_string(), "443");
        let json = serde_json::to_string(&config).unwrap();
        assert_eq!(
            serde_json::from_str::<InterceptionConfig>(&json).unwrap(),
            config
        );
    }

    #[test]
    fn a_pod_with_a_linkerd_init_container_is_left_to_it() {
        let injected = pod(&[(PROXY_VERSION, "stable-2.14.10")]);
        assert_eq!(decide_with_containers(&injected, false), Decision::Mesh);
        let Decision::Skip { reason } = decide_with_containers(&injected, true) else {
            panic!("a pod with linkerd-init is meshed");
        };
        assert_eq!(reason.label(), "linkerd_init");
        assert!(reason.to_string().contains("linkerd-init"), "{reason}");
        // Not injected stays the reason when both hold.
        assert_eq!(
            decide_with_containers(&pod(&[]), true),
            Decision::Skip {
                reason: SkipReason::NotInjected
            }
        );
    }

    #[test]
    fn a_namespaces_config_annotations_apply_where_the_pod_has_none_of_its_own() {
        let namespace = pod(&[
            (SKIP_OUTBOUND_PORTS, "3306"),
            (PROXY_UID, "2103"),
            (SKIP_SUBNETS, "10.0.0.0/8"),
            ("linkerd.io/inject", "enabled"),
            (PROXY_VERSION, "edge-24.11.8"),
            (
                "config.alpha.linkerd.io/proxy-wait-before-exit-seconds",
                "5",
            ),
        ]);
        let own = pod(&[
            (PROXY_VERSION, "stable-2.14.10"),
            (SKIP_OUTBOUND_PORTS, "25"),
            (PROXY_UID, " "),
        ]);
        let merged = with_namespace_defaults(&own, &namespace);
        assert_eq!(
            merged,
            pod(&[
                (PROXY_VERSION, "stable-2.14.10"),
                // The pod's own value wins, key by key; an empty one is no value.
                (SKIP_OUTBOUND_PORTS, "25"),
                (PROXY_UID, "2103"),
                (SKIP_SUBNETS, "10.0.0.0/8"),
            ])
        );
        let config = apply(&InterceptionConfig::linkerd(), &merged).unwrap();
        assert_eq!(config.outbound_ports_to_ignore.to_string(), "25");
        assert_eq!(config.proxy_uid, Some(2103));
        // Only config.linkerd.io/* comes from the namespace: it never decides whether a pod is
        // meshed.
        assert_eq!(
            decide(&with_namespace_defaults(&pod(&[]), &namespace)),
            Decision::Skip {
                reason: SkipReason::NotInjected
            }
        );
    }
}
