//! A swap between linkerd2-cni's chart and this one, done as `helm upgrade linkerd2-cni` (and
//! undone by `helm rollback`), can stop halfway: Helm updates the other objects first, and a
//! refused DaemonSet update leaves the old DaemonSet's pods running against the new objects. So
//! each chart's DaemonSet must start against the other chart's ConfigMap, ServiceAccount and
//! ClusterRole. linkerd2-cni's side is the fixture in tests/src/chart/linkerd2_cni.rs (its chart
//! cannot be fetched in CI); ours is rendered. And a linkerd2-cni values file keeps its meaning
//! here, or is refused with what to do.
use std::collections::BTreeSet;

use interceptor_tests::chart::{
    NAMESPACE, Rendered, container,
    linkerd2_cni::{self, ApiUse, grants},
    render, try_render,
};
use serde_json::Value;

/// Linkerd's cni-plugin image, which a linkerd2-cni values file names, is refused by name
/// (deploy.rs `linkerds_cni_plugin_image_is_refused`): ours instead.
const OUR_IMAGE: &str = r#"{"image": {"name": "localhost/interceptor", "version": ""}}"#;

fn render_linkerd2_cni(values_file: &str) -> Rendered {
    render(&[values_file, OUR_IMAGE])
}

fn repair_controller(values_file: &str) -> bool {
    values_file == linkerd2_cni::EVERY_VALUE
}

/// The keys of a JSON object's text, in the order written.
fn keys_in_order(object: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for line in object.lines() {
        if let Some((key, _)) = line
            .trim()
            .strip_prefix('"')
            .and_then(|l| l.split_once("\":"))
        {
            keys.push(key.to_owned());
        }
    }
    keys
}

/// linkerd-cni's pods against our objects (a swap to this chart whose DaemonSet update is
/// refused): each ConfigMap key its installer reads, with the value linkerd2-cni's chart gives
/// it for the same values; the ServiceAccount it names, with its token mounted; every call its
/// plugin and repair controller make, granted to that account.
#[test]
fn linkerd_cnis_pods_run_against_our_objects() {
    for file in [linkerd2_cni::DEFAULT_VALUES, linkerd2_cni::EVERY_VALUE] {
        let ours = render_linkerd2_cni(file);
        let data = ours.config();
        for (key, optional) in linkerd2_cni::CONFIG_MAP_KEYS {
            assert!(optional || data.contains_key(key), "{file}: no {key}");
        }
        let (net_dir, bin_dir, network_config) = linkerd2_cni::config_map_data(file);
        assert_eq!(data["dest_cni_net_dir"], net_dir, "{file}");
        assert_eq!(data["dest_cni_bin_dir"], bin_dir, "{file}");
        let text = &data["cni_network_config"];
        let parsed: Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("{file}: cni_network_config is not JSON ({e}): {text}"));
        assert_eq!(parsed, network_config, "{file}");
        let block = text.split_once("\"linkerd\":").unwrap().1;
        let order: Vec<String> = linkerd2_cni::LINKERD_KEY_ORDER
            .iter()
            .filter(|k| network_config["linkerd"].get(**k).is_some())
            .map(|k| (*k).to_owned())
            .collect();
        assert_eq!(keys_in_order(block), order, "{file}");

        let account = ours.find("ServiceAccount", linkerd2_cni::SERVICE_ACCOUNT);
        if linkerd2_cni::NEEDS_TOKEN {
            assert_ne!(
                account["automountServiceAccountToken"], false,
                "{file}: linkerd-cni's installer needs the token"
            );
        }
        let role = ours.find("ClusterRole", "linkerd-cni");
        let binding = ours.find("ClusterRoleBinding", "linkerd-cni");
        assert_eq!(binding["roleRef"]["name"], "linkerd-cni");
        assert!(
            binding["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["kind"] == "ServiceAccount"
                    && s["name"] == linkerd2_cni::SERVICE_ACCOUNT
                    && s["namespace"] == NAMESPACE),
            "{file}: {binding}"
        );
        for use_ in linkerd2_cni::api_uses(repair_controller(file)) {
            assert!(
                grants(&role["rules"], &use_),
                "{file}: {use_:?} not granted"
            );
        }
    }
}

/// Each call the agent and the installer make with the account's token (interceptor/src), and
/// whether the pod needs it to start and mesh pods. The others are logged and tried again
/// (kube_node.rs: the node's status annotation and startup taint; events.rs: Events), or, for
/// the DaemonSet's own get on SIGTERM, an unanswered question that keeps interception in force.
const OUR_API_USES: [(ApiUse, bool); 10] = [
    (use_of("agent", "", "pods", "list", None), true),
    (use_of("agent", "", "pods", "watch", None), true),
    (use_of("agent", "", "pods", "get", None), true),
    (use_of("agent", "", "namespaces", "get", None), true),
    (
        use_of("agent", "", "services", "get", Some("kubernetes")),
        true,
    ),
    (use_of("agent", "", "nodes", "get", None), true),
    (use_of("agent", "", "nodes", "patch", None), false),
    (
        use_of("agent", "events.k8s.io", "events", "create", None),
        false,
    ),
    (
        use_of("agent", "events.k8s.io", "events", "patch", None),
        false,
    ),
    (
        use_of(
            "installer",
            "apps",
            "daemonsets",
            "get",
            Some("linkerd-cni"),
        ),
        false,
    ),
];

const fn use_of(
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

/// Our pods against linkerd-cni's objects (a `helm rollback` to linkerd2-cni whose DaemonSet
/// update is refused): no ConfigMap key linkerd2-cni's ConfigMap lacks (ours take their settings
/// from their own arguments), the same ServiceAccount, no volume that needs an object of ours,
/// and every call the pod needs to start and mesh granted by linkerd2-cni's ClusterRole. Our own
/// ClusterRole and Role grant every call.
#[test]
fn our_pods_run_against_linkerd_cnis_objects() {
    for file in [linkerd2_cni::DEFAULT_VALUES, linkerd2_cni::EVERY_VALUE] {
        let ours = render_linkerd2_cni(file);
        let pod = &ours.daemonset()["spec"]["template"]["spec"];
        let theirs: BTreeSet<&str> = linkerd2_cni::CONFIG_MAP_KEYS.iter().map(|k| k.0).collect();
        let containers = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(pod["initContainers"].as_array().unwrap());
        for c in containers {
            for env in c["env"].as_array().into_iter().flatten() {
                let r = &env["valueFrom"]["configMapKeyRef"];
                if r.is_object() && r["optional"] != true {
                    assert!(
                        r["name"] == linkerd2_cni::CONFIG_MAP
                            && theirs.contains(r["key"].as_str().unwrap()),
                        "{file}: {} reads {r}, which linkerd2-cni's objects lack",
                        c["name"]
                    );
                }
            }
            assert!(c["envFrom"].is_null(), "{file}: {}", c["name"]);
        }
        assert_eq!(pod["serviceAccountName"], linkerd2_cni::SERVICE_ACCOUNT);
        for volume in pod["volumes"].as_array().unwrap() {
            assert!(
                volume["hostPath"].is_object() || volume["emptyDir"].is_object(),
                "{file}: {volume} needs an object"
            );
        }

        let their_rules = linkerd2_cni::cluster_role_rules(repair_controller(file));
        let our_rules = ours.find("ClusterRole", "linkerd-cni")["rules"].clone();
        let own_daemonset = ours.find("Role", "linkerd-cni-own-daemonset")["rules"].clone();
        for (use_, needed) in OUR_API_USES {
            if needed {
                assert!(grants(&their_rules, &use_), "{file}: {use_:?}");
            }
            assert!(
                grants(&our_rules, &use_) || grants(&own_daemonset, &use_),
                "{file}: our chart does not grant {use_:?}"
            );
        }
    }
}

/// linkerd2-cni's default values and a file setting every value render here, with linkerd-cni's
/// meaning: `resources` and `privileged` on install-cni (our agent's are agent.resources), its
/// volume names, its pod-level seccomp profile.
#[test]
fn linkerd2_cni_values_keep_their_meaning() {
    let defaults = render_linkerd2_cni(linkerd2_cni::DEFAULT_VALUES);
    let every = render_linkerd2_cni(linkerd2_cni::EVERY_VALUE);
    for rendered in [&defaults, &every] {
        let pod = &rendered.daemonset()["spec"]["template"]["spec"];
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let volumes: BTreeSet<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        for name in linkerd2_cni::VOLUMES {
            assert!(volumes.contains(name), "{name}: {volumes:?}");
        }
        // The agent keeps its own resources whatever linkerd2-cni's `resources` say.
        assert_eq!(
            container(rendered.daemonset(), "agent")["resources"],
            serde_json::json!({"limits": {"memory": "256Mi"}, "requests": {"cpu": "20m", "memory": "32Mi"}})
        );
    }
    let installer = container(defaults.daemonset(), "install-cni");
    assert_eq!(installer["securityContext"]["privileged"], false);
    assert_eq!(
        installer["securityContext"]["capabilities"]["add"],
        serde_json::json!(["DAC_OVERRIDE", "FOWNER"])
    );
    // linkerd2-cni's empty resources: none.
    assert_eq!(installer["resources"], serde_json::json!({}));

    let pod = &every.daemonset()["spec"]["template"]["spec"];
    let installer = container(every.daemonset(), "install-cni");
    assert_eq!(installer["securityContext"]["privileged"], true);
    assert_eq!(
        installer["resources"],
        serde_json::json!({
            "limits": {"cpu": "200m", "memory": "96Mi", "ephemeral-storage": "1Gi"},
            "requests": {"cpu": "20m", "memory": "24Mi", "ephemeral-storage": "100Mi"},
        })
    );
    let host_path = |name: &str| {
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()["hostPath"]["path"]
            .clone()
    };
    assert_eq!(host_path("cni-net-dir"), "/etc/custom/net.d");
    assert_eq!(host_path("cni-bin-dir"), "/opt/custom/bin");
    for note in ["privileged=true runs install-cni privileged", "mount-bpffs"] {
        assert!(every.notes.contains(note), "{note}: {}", every.notes);
    }
}

/// The extraInitContainers example linkerd2-cni's values.yaml carried mounts `cni-net-dir`: every
/// volume any container mounts is one of the pod's.
#[test]
fn linkerd2_cnis_extra_init_containers_mount_what_they_name() {
    for file in [
        linkerd2_cni::EXTRA_INIT_CONTAINERS,
        linkerd2_cni::EVERY_VALUE,
    ] {
        let rendered = render(&[file, OUR_IMAGE]);
        let pod = &rendered.daemonset()["spec"]["template"]["spec"];
        let volumes: BTreeSet<&str> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        let init = pod["initContainers"].as_array().unwrap();
        assert!(init.len() > 1, "{file}: the extra init container is there");
        for c in init.iter().chain(pod["containers"].as_array().unwrap()) {
            for mount in c["volumeMounts"].as_array().into_iter().flatten() {
                let name = mount["name"].as_str().unwrap();
                assert!(
                    volumes.contains(name),
                    "{file}: {} mounts {name}, which the pod does not have: {volumes:?}",
                    c["name"]
                );
            }
        }
    }
}

/// What linkerd-cni would read only in part, and a maxSurge that would stall, are refused with
/// the value, the part, and what to do; what linkerd-cni reads whole is accepted.
#[test]
fn values_linkerd_cni_reads_in_part_and_a_surge_are_refused() {
    for (values, said) in [
        (
            r#"{"ignoreInboundPorts": "25, 26"}"#,
            r#"ignoreInboundPorts="25, 26": linkerd-cni would skip the part " 26""#,
        ),
        (
            r#"{"ignoreOutboundPorts": "3306,mysql"}"#,
            r#"ignoreOutboundPorts="3306,mysql": linkerd-cni would skip the part "mysql""#,
        ),
        (
            r#"{"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}"#,
            "updateStrategy.rollingUpdate.maxSurge=1: two agents cannot run on one node",
        ),
        (
            r#"{"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}}}"#,
            "updateStrategy.rollingUpdate.maxSurge=25%: two agents cannot run on one node",
        ),
    ] {
        let refused = try_render(&[values], None)
            .err()
            .unwrap_or_else(|| panic!("{values} was rendered"));
        assert!(refused.contains(said), "{values}: {refused}");
        assert!(
            refused.contains("commas only") || refused.contains("unset maxSurge or set it to 0"),
            "{values}: says what to do: {refused}"
        );
    }
    for values in [
        r#"{"ignoreInboundPorts": 25, "ignoreOutboundPorts": "3306,5432-5433"}"#,
        r#"{"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}}"#,
        r#"{"proxyUID": "2102", "inboundProxyPort": "4143", "proxyGID": "-1"}"#,
    ] {
        try_render(&[values], None).unwrap_or_else(|e| panic!("{values}: {e}"));
    }
}
