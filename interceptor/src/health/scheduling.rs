//! Which nodes a DaemonSet should run a pod on, as its controller decides: the pod template's
//! node selector and required node affinity match the node, and its tolerations (with those the
//! controller adds to every DaemonSet pod) tolerate the node's `NoSchedule` and `NoExecute`
//! taints. The `status` of the DaemonSet counts them; this names them, so that a node without
//! an agent can be named.
use k8s_openapi::api::core::v1::{
    Node, NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};

/// The tolerations the DaemonSet controller adds to every pod it creates
/// (`AddOrUpdateDaemonPodTolerations` in kubernetes `pkg/controller/daemon/util`), as
/// `(key, effect)`; the last only for `hostNetwork` pods.
const CONTROLLER_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ("node.kubernetes.io/network-unavailable", "NoSchedule"),
];

/// Whether a pod with `spec` (the DaemonSet's template) belongs on `node`.
pub fn should_run(spec: &PodSpec, node: &Node) -> bool {
    selector_matches(spec, node) && affinity_matches(spec, node) && taints_tolerated(spec, node)
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(key))
        .map(String::as_str)
}

fn selector_matches(spec: &PodSpec, node: &Node) -> bool {
    spec.node_selector
        .iter()
        .flatten()
        .all(|(key, value)| label(node, key) == Some(value))
}

fn affinity_matches(spec: &PodSpec, node: &Node) -> bool {
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    // The terms are ORed; no term matches no node.
    required
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // A term without requirements matches nothing.
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, label(node, &r.key)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name")
                .then_some(node.metadata.name.as_deref())
                .flatten();
            // Only metadata.name is a node field a selector may name.
            r.key == "metadata.name" && requirement_matches(r, value)
        })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|b| number(b)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if toleration
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            // An empty key is only valid with Exists.
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

fn taints_tolerated(spec: &PodSpec, node: &Node) -> bool {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let host_network = spec.host_network == Some(true);
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| {
            spec.tolerations
                .iter()
                .flatten()
                .any(|t| tolerates(t, taint))
                || CONTROLLER_TOLERATIONS.iter().any(|(key, effect)| {
                    *key == taint.key
                        && *effect == taint.effect
                        && (host_network || *key != "node.kubernetes.io/network-unavailable")
                })
        })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(labels: serde_json::Value, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": { "name": "node-a", "labels": labels },
            "spec": { "taints": taints },
        }))
        .unwrap()
    }

    fn spec(spec: serde_json::Value) -> PodSpec {
        let mut spec = spec;
        spec["containers"] = json!([{ "name": "agent" }]);
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn node_selector_and_affinity_pick_nodes() {
        let linux = node(
            json!({ "kubernetes.io/os": "linux", "pool": "7" }),
            json!([]),
        );
        let windows = node(json!({ "kubernetes.io/os": "windows" }), json!([]));
        let by_selector = spec(json!({ "nodeSelector": { "kubernetes.io/os": "linux" } }));
        assert!(should_run(&by_selector, &linux));
        assert!(!should_run(&by_selector, &windows));

        let affinity = |expressions: serde_json::Value| {
            spec(json!({ "affinity": { "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{ "matchExpressions": expressions }],
                },
            }}}))
        };
        let not_windows = affinity(
            json!([{ "key": "kubernetes.io/os", "operator": "NotIn", "values": ["windows"] }]),
        );
        assert!(should_run(&not_windows, &linux));
        assert!(!should_run(&not_windows, &windows));
        let pool_above_5 = affinity(json!([{ "key": "pool", "operator": "Gt", "values": ["5"] }]));
        assert!(should_run(&pool_above_5, &linux));
        assert!(!should_run(&pool_above_5, &windows));
        let by_name = spec(json!({ "affinity": { "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": ["node-b"] },
                ]}],
            },
        }}}));
        assert!(!should_run(&by_name, &linux));
    }

    #[test]
    fn taints_need_a_toleration_but_the_controller_tolerates_its_own() {
        let tainted = node(
            json!({}),
            json!([{ "key": "dedicated", "value": "gpu", "effect": "NoSchedule" }]),
        );
        let cordoned = node(
            json!({}),
            json!([{ "key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule" }]),
        );
        let preferred = node(
            json!({}),
            json!([{ "key": "dedicated", "effect": "PreferNoSchedule" }]),
        );
        let none = spec(json!({}));
        assert!(!should_run(&none, &tainted));
        assert!(should_run(&none, &cordoned));
        assert!(should_run(&none, &preferred));
        assert!(should_run(
            &spec(json!({ "tolerations": [{ "operator": "Exists" }] })),
            &tainted
        ));
        let gpu = json!({ "tolerations": [{ "key": "dedicated", "value": "gpu", "effect": "NoSchedule" }] });
        assert!(should_run(&spec(gpu), &tainted));
        let cpu = json!({ "tolerations": [{ "key": "dedicated", "value": "cpu" }] });
        assert!(!should_run(&spec(cpu), &tainted));
    }
}
