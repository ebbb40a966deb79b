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
mod tests {
    use interceptor_config::InterceptionConfig;

    use super::*;

    fn conf(json: &str) -> NetConf {
        serde_json::from_str(json).expect("a network configuration")
    }

    #[test]
    fn linkerd_keys_set_the_configuration_over_linkerds_defaults() {
        let c = conf(
            r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"interceptor-cni",
            "log_level":"info","kubernetes":{"kubeconfig":"/etc/kubeconfig"},
            "linkerd":{"outbound-ports-to-ignore":["443","6443"],"ipv6":false,
                       "iptables-mode":"nft","use-wait-flag":true}}"#,
        );
        let settings = pod_settings(&c, &BTreeMap::new()).unwrap();
        assert!(!settings.simulate);
        let mut expected = InterceptionConfig::linkerd();
        expected
            .set("outbound-ports-to-ignore", "443,6443")
            .unwrap();
        expected.ipv6 = false;
        assert_eq!(settings.config, expected);
    }

    #[test]
    fn runtime_config_and_cni_args_override_per_pod() {
        let c = conf(
            r#"{"cniVersion":"0.4.0","name":"n","type":"interceptor-cni",
            "linkerd":{"proxy-uid":2102,"simulate":false},
            "runtimeConfig":{"linkerd":{"proxy-uid":"3000"}}}"#,
        );
        let args = parse_cni_args("K8S_POD_NAME=web;linkerd.simulate=true").unwrap();
        let settings = pod_settings(&c, &args).unwrap();
        assert!(settings.simulate);
        assert_eq!(settings.config.proxy_uid, Some(3000));
    }

    #[test]
    fn unknown_keys_wrong_types_and_bad_values_are_errors_naming_them() {
        for (linkerd, names) in [
            (r#"{"incoming-proxy-prot":4143}"#, "incoming-proxy-prot"),
            (r#"{"ipv6":"maybe"}"#, "ipv6"),
            (r#"{"iptables-mode":"fast"}"#, "iptables-mode"),
            (
                r#"{"inbound-ports-to-ignore":[{"port":1}]}"#,
                "inbound-ports-to-ignore",
            ),
            (r#"{"incoming-proxy-port":[1]}"#, "incoming-proxy-port"),
            // Values are checked here, before the agent is asked, in the configuration's words.
            (
                r#"{"outbound-ports-to-ignore":["99999"]}"#,
                "invalid value '99999' for 'outbound-ports-to-ignore': port 99999 is out of range",
            ),
            (
                r#"{"subnets-to-ignore":"10.0.0.0/33"}"#,
                "invalid value '10.0.0.0/33' for 'subnets-to-ignore'",
            ),
        ] {
            let c = conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"t","linkerd":{linkerd}}}"#
            ));
            let err = pod_settings(&c, &BTreeMap::new()).unwrap_err();
            assert!(err.contains(names), "{linkerd}: {err}");
        }
        assert!(parse_cni_args("K8S_POD_NAME").is_err());
    }

    #[test]
    fn kubernetes_pods_default_to_the_injected_ones_others_to_all() {
        let c = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#);
        let k8s =
            parse_cni_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web").unwrap();
        assert_eq!(pod_selection(&c, &k8s), Ok(Pods::Injected));
        // Podman names the container, never a namespace.
        let podman = parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=web").unwrap();
        assert_eq!(pod_selection(&c, &podman), Ok(Pods::All));
        assert_eq!(pod_selection(&c, &BTreeMap::new()), Ok(Pods::All));
        for (pods, expected) in [("injected", Pods::Injected), ("all", Pods::All)] {
            let c = conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"t","pods":"{pods}"}}"#
            ));
            assert_eq!(pod_selection(&c, &k8s), Ok(expected));
            assert_eq!(pod_selection(&c, &podman), Ok(expected));
        }
        let c = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"t","pods":"some"}"#);
        let e = pod_selection(&c, &k8s).unwrap_err();
        assert!(e.contains("\"some\"") && e.contains("injected, all"), "{e}");
    }

    #[test]
    fn pod_annotations_passed_none_and_null_are_told_apart() {
        let annotations = |runtime_config: &str| {
            conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"t","runtimeConfig":{runtime_config}}}"#
            ))
            .runtime_config
            .unwrap()
            .pod_annotations
        };
        assert_eq!(annotations(r#"{"portMappings":[]}"#), None);
        // A Go runtime writes a pod without annotations as null: passed, and empty.
        assert_eq!(
            annotations(r#"{"io.kubernetes.cri.pod-annotations":null}"#),
            Some(BTreeMap::new())
        );
        let passed = annotations(
            r#"{"io.kubernetes.cri.pod-annotations":{"linkerd.io/proxy-version":"v1"}}"#,
        )
        .unwrap();
        assert_eq!(passed["linkerd.io/proxy-version"], "v1");
    }

    /// linkerd-cni's default, not proxy-init's: Linkerd's proxy listens on IPv4 only unless
    /// `disableIPv6` is false, and then linkerd-cni writes `"ipv6": true`.
    #[test]
    fn ipv6_is_off_unless_the_configuration_turns_it_on() {
        for (linkerd, args, ipv6) in [
            ("{}", "", false),
            (r#"{"ipv6":false}"#, "", false),
            (r#"{"ipv6":true}"#, "", true),
            (r#"{"ipv6":"true"}"#, "", true),
            ("{}", "linkerd.ipv6=true", true),
        ] {
            let c = conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"t","linkerd":{linkerd}}}"#
            ));
            let settings = pod_settings(&c, &parse_cni_args(args).unwrap()).unwrap();
            assert_eq!(settings.config.ipv6, ipv6, "{linkerd} {args}");
        }
        // Everything else is Linkerd's default.
        let c = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#);
        let mut expected = InterceptionConfig::linkerd();
        expected.ipv6 = false;
        assert_eq!(pod_settings(&c, &BTreeMap::new()).unwrap().config, expected);
    }

    /// The one table of proxy-init's flag cases.
    use interceptor_test_cases::flag_cases;

    /// Each setting's value in proxy-init's flags as `InterceptionConfig::to_args` writes them.
    fn flag_values(args: &[String]) -> BTreeMap<String, String> {
        let mut values = BTreeMap::new();
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let flag = flag.trim_start_matches('-');
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name, value.to_owned()),
                None => (flag, args.next().cloned().unwrap_or_default()),
            };
            values.insert(name.to_owned(), value);
        }
        values
    }

    /// The table's cases written as `--name=value` only are the `linkerd` block's keys and values,
    /// and `CNI_ARGS`' `linkerd.<key>=<value>`: each such setting takes the value the flags give it
    /// (the others keep the plugin's defaults), or the error is the one the flags get.
    #[test]
    fn the_linkerd_block_reads_values_as_proxy_init_flags_are_read() {
        let mut checked = 0;
        for (flags, expected) in flag_cases::FLAG_CASES {
            let Some(settings) = flags
                .iter()
                .map(|flag| flag.strip_prefix("--")?.split_once('='))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let block: BTreeMap<&str, &str> = settings.iter().copied().collect();
            let cni_args = settings
                .iter()
                .map(|(name, value)| format!("linkerd.{name}={value}"))
                .collect::<Vec<_>>()
                .join(";");
            let in_block = conf(&format!(
                r#"{{"cniVersion":"1.0.0","name":"n","type":"t","linkerd":{}}}"#,
                serde_json::to_string(&block).unwrap()
            ));
            let plain = conf(r#"{"cniVersion":"1.0.0","name":"n","type":"t"}"#);
            for (how, got) in [
                ("block", pod_settings(&in_block, &BTreeMap::new())),
                (
                    "CNI_ARGS",
                    pod_settings(&plain, &parse_cni_args(&cni_args).unwrap()),
                ),
            ] {
                match (got, expected) {
                    (Ok(got), Ok(expected)) => {
                        let expected: Vec<String> =
                            expected.split(' ').map(str::to_owned).collect();
                        let (got, expected) =
                            (flag_values(&got.config.to_args()), flag_values(&expected));
                        for (name, _) in &settings {
                            assert_eq!(
                                got.get(*name),
                                expected.get(*name),
                                "{how} {flags:?}: {name}"
                            );
                        }
                    }
                    (Err(e), Err(needle)) => assert!(e.contains(needle), "{how} {flags:?}: {e}"),
                    (got, expected) => panic!("{how} {flags:?}: {got:?}, expected {expected:?}"),
                }
            }
            checked += 1;
        }
        assert!(
            checked >= 20,
            "only {checked} cases are in the linkerd block's form"
        );
    }
}
