//! What linkerd-cni's DaemonSet needs from the objects it shares with this chart, and what
//! linkerd2-cni's chart gives, as read in linkerd/linkerd2 b24cd4059841f8cee2fb7a9c2ac23a693c583579
//! (edge-26.8.3-1: charts/linkerd2-cni/templates/cni-plugin.yaml, values.yaml) and
//! linkerd/linkerd2-proxy-init 183e791d99dc (cni-plugin v1.7.0-alpha.1: internal/cni/ for the
//! installer, cni-plugin/main.go for the plugin, cni-repair-controller/src/ for the repair
//! controller).
//!
//! A hand-written fixture, not a render of their chart: the chart cannot be fetched in CI
//! (helm.linkerd.io and GitHub are unreachable from the tests), and it is not ours to copy. Its
//! values files are in tests/fixtures/linkerd2-cni/.
use serde_json::{Value, json};

/// linkerd2-cni's default values.yaml.
pub const DEFAULT_VALUES: &str = "tests/fixtures/linkerd2-cni/values.yaml";
/// A linkerd2-cni values file setting every value.
pub const EVERY_VALUE: &str = "tests/fixtures/linkerd2-cni/every-value.yaml";
/// The extraInitContainers example its values.yaml carried (#5916 to #11699).
pub const EXTRA_INIT_CONTAINERS: &str = "tests/fixtures/linkerd2-cni/extra-init-containers.yaml";

/// Both DaemonSets' ServiceAccount and ConfigMap.
pub const SERVICE_ACCOUNT: &str = "linkerd-cni";
pub const CONFIG_MAP: &str = "linkerd-cni-config";

/// The ConfigMap keys linkerd-cni's install-cni container reads as environment
/// (DEST_CNI_NET_DIR, DEST_CNI_BIN_DIR, CNI_NETWORK_CONFIG): `configMapKeyRef`s without
/// `optional`, so a missing key keeps the container from starting.
pub const CONFIG_MAP_KEYS: [(&str, bool); 3] = [
    ("dest_cni_net_dir", false),
    ("dest_cni_bin_dir", false),
    ("cni_network_config", false),
];

/// Its installer reads the ServiceAccount token (/var/run/secrets/kubernetes.io/serviceaccount,
/// internal/cni/installer.go) and writes it into the plugin's kubeconfig; the pod spec does not
/// set `automountServiceAccountToken`, so the account's setting decides.
pub const NEEDS_TOKEN: bool = true;

/// Its volumes, which `extraInitContainers` mount by name: `cni-bin-dir` only where
/// destCNIBinDir and destCNINetDir differ.
pub const VOLUMES: [&str; 3] = ["cni-bin-dir", "cni-net-dir", "linkerd-tmp-dir"];

/// One call to the API: who makes it, and its group, resource, verb and object name (if one).
#[derive(Clone, Copy, Debug)]
pub struct ApiUse {
    pub who: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub verb: &'static str,
    pub name: Option<&'static str>,
}

const fn api(
    who: &'static str,
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    name: Option<&'static str>,
) -> ApiUse {
    ApiUse {
        who,
        group,
        resource,
        verb,
        name,
    }
}

/// Every call linkerd-cni's pods make with the account's token. The installer makes none (it
/// only hands the token on); the plugin, through that kubeconfig, gets the pod, its namespace
/// and the `kubernetes` Service (cni-plugin/main.go); the repair controller, with
/// `repairController.enabled`, watches pods, deletes them and posts events.k8s.io Events.
pub fn api_uses(repair_controller: bool) -> Vec<ApiUse> {
    let mut uses = vec![
        api("plugin", "", "pods", "get", None),
        api("plugin", "", "namespaces", "get", None),
        api("plugin", "", "services", "get", Some("kubernetes")),
    ];
    if repair_controller {
        uses.extend([
            api("repair-controller", "", "pods", "list", None),
            api("repair-controller", "", "pods", "watch", None),
            api("repair-controller", "", "pods", "delete", None),
            api(
                "repair-controller",
                "events.k8s.io",
                "events",
                "create",
                None,
            ),
        ]);
    }
    uses
}

/// linkerd2-cni's ClusterRole `linkerd-cni` rules, for `repairController.enabled`.
pub fn cluster_role_rules(repair_controller: bool) -> Value {
    let mut rules = vec![json!({
        "apiGroups": [""],
        "resources": ["pods", "nodes", "namespaces", "services"],
        "verbs": ["list", "get", "watch"],
    })];
    if repair_controller {
        rules.push(json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}));
        rules.push(
            json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}),
        );
    }
    Value::Array(rules)
}

/// The ConfigMap's data linkerd2-cni's chart renders for [`DEFAULT_VALUES`] or [`EVERY_VALUE`]:
/// the directories, and `cni_network_config` as JSON (its installer parses it; the `linkerd`
/// block's keys are in this order).
pub fn config_map_data(values_file: &str) -> (String, String, Value) {
    match values_file {
        DEFAULT_VALUES => (
            "/etc/cni/net.d".into(),
            "/opt/cni/bin".into(),
            json!({
                "name": "linkerd-cni",
                "type": "linkerd-cni",
                "log_level": "info",
                "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
                "linkerd": {
                    "incoming-proxy-port": 4143,
                    "outgoing-proxy-port": 4140,
                    "proxy-uid": 2102,
                    "ports-to-redirect": [],
                    "inbound-ports-to-ignore": ["4191", "4190"],
                    "simulate": false,
                    "use-wait-flag": false,
                    "iptables-mode": "nft",
                    "ipv6": false,
                },
            }),
        ),
        EVERY_VALUE => (
            "/etc/custom/net.d".into(),
            "/opt/custom/bin".into(),
            json!({
                "name": "linkerd-cni",
                "type": "linkerd-cni",
                "log_level": "debug",
                "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"},
                "linkerd": {
                    "incoming-proxy-port": 4243,
                    "outgoing-proxy-port": 4240,
                    "proxy-uid": 2103,
                    "proxy-gid": 2104,
                    "ports-to-redirect": [80, 443],
                    "inbound-ports-to-ignore": ["4291", "4290", "25", "8000-8080"],
                    "outbound-ports-to-ignore": ["3306"],
                    "simulate": false,
                    "use-wait-flag": true,
                    "iptables-mode": "legacy",
                    "ipv6": true,
                },
            }),
        ),
        other => panic!("no linkerd2-cni render described for {other}"),
    }
}

/// The `linkerd` block's keys in the order linkerd2-cni's chart writes them, of those present.
pub const LINKERD_KEY_ORDER: [&str; 11] = [
    "incoming-proxy-port",
    "outgoing-proxy-port",
    "proxy-uid",
    "proxy-gid",
    "ports-to-redirect",
    "inbound-ports-to-ignore",
    "outbound-ports-to-ignore",
    "simulate",
    "use-wait-flag",
    "iptables-mode",
    "ipv6",
];

/// Whether `rules` (a ClusterRole's) allow `use`.
pub fn grants(rules: &Value, use_: &ApiUse) -> bool {
    let has = |list: &Value, item: &str| {
        list.as_array()
            .is_some_and(|l| l.iter().any(|v| v == item || v == "*"))
    };
    rules.as_array().unwrap().iter().any(|rule| {
        has(&rule["apiGroups"], use_.group)
            && has(&rule["resources"], use_.resource)
            && has(&rule["verbs"], use_.verb)
            && match (&rule["resourceNames"], use_.name) {
                (Value::Null, _) => true,
                (names, Some(name)) => has(names, name),
                (_, None) => false,
            }
    })
}
