use serde_json::json;

use super::*;
use crate::annotations::{PROXY_VERSION, SkipReason};

/// A pod as the API server returns it once the kubelet reported it (the test kit's
/// `fake_api::pod` and `reported`).
fn pod(annotations: serde_json::Value, init: &[&str], phase: &str, started: &[&str]) -> Pod {
    let init: Vec<_> = init
        .iter()
        .map(|n| json!({"name": n, "image": "i:1"}))
        .collect();
    let statuses: Vec<_> = started
        .iter()
        .map(|n| json!({"name": n, "containerID": format!("containerd://{n}"), "ready": false}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "uid-1",
            "resourceVersion": "11",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "node-1",
            "initContainers": init,
            "containers": [{"name": "app", "image": "app:1"}],
        },
        "status": {"phase": phase, "containerStatuses": statuses, "qosClass": "BestEffort"},
    }))
    .unwrap()
}

#[test]
fn an_injected_pod_whose_sandbox_runs_is_to_repair() {
    let facts = PodFacts::of(&pod(
        json!({PROXY_VERSION: "edge"}),
        &["linkerd-network-validator"],
        "Running",
        &["app"],
    ));
    assert_eq!(facts.uid, "uid-1");
    assert!(facts.sandbox_started && !facts.linkerd_init && !facts.host_network);
    assert!(facts.needs_namespace());
    assert!(facts.to_repair());
    assert_eq!(
        key(&pod(json!({}), &[], "Pending", &[])),
        Some(("shop".into(), "web".into()))
    );
}

#[test]
fn what_keeps_a_pod_from_repair() {
    let injected = json!({PROXY_VERSION: "edge"});
    // No container has an ID yet: its CNI ADD may be running.
    assert!(!PodFacts::of(&pod(injected.clone(), &[], "Pending", &[])).to_repair());
    // An empty ID is none.
    let mut empty = pod(injected.clone(), &[], "Pending", &[]);
    empty.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        container_id: Some(String::new()),
    }]);
    assert!(!PodFacts::of(&empty).sandbox_started);
    // Finished, or being deleted.
    for phase in ["Succeeded", "Failed"] {
        assert!(!PodFacts::of(&pod(injected.clone(), &[], phase, &["app"])).to_repair());
    }
    let mut deleted = pod(injected.clone(), &[], "Running", &["app"]);
    deleted.metadata.as_mut().unwrap().deletion_timestamp = Some(IgnoredAny);
    assert!(!PodFacts::of(&deleted).to_repair());
    // In the node's network namespace.
    let mut host = pod(injected.clone(), &[], "Running", &["app"]);
    host.spec.as_mut().unwrap().host_network = Some(true);
    assert!(!PodFacts::of(&host).to_repair());
    // Left to its linkerd-init, or not injected: and then its namespace is not read.
    let init = PodFacts::of(&pod(injected, &["linkerd-init"], "Running", &["app"]));
    assert_eq!(
        init.decision(),
        Decision::Skip {
            reason: SkipReason::LinkerdInit
        }
    );
    assert!(!init.to_repair() && !init.needs_namespace());
    let plain = PodFacts::of(&pod(json!({}), &[], "Running", &["app"]));
    assert!(!plain.to_repair() && !plain.needs_namespace());
}

#[test]
fn the_control_plane_label_counts_when_it_is_not_empty() {
    let mut p = pod(json!({}), &[], "Running", &[]);
    let labels = |value: &str| {
        Some(BTreeMap::from([(
            CONTROL_PLANE_COMPONENT.into(),
            value.into(),
        )]))
    };
    p.metadata.as_mut().unwrap().labels = labels("destination");
    let facts = PodFacts::of(&p);
    assert_eq!(
        facts.control_plane_component.as_deref(),
        Some("destination")
    );
    assert!(facts.needs_api_server_ports());
    p.metadata.as_mut().unwrap().labels = labels("");
    assert!(!PodFacts::of(&p).needs_api_server_ports());
}

#[test]
fn an_object_with_nulls_or_missing_parts_has_no_facts() {
    for object in [
        json!({}),
        json!({"metadata": null, "spec": null, "status": null}),
        json!({"metadata": {"annotations": null, "labels": null, "deletionTimestamp": null},
               "spec": {"initContainers": null, "hostNetwork": null},
               "status": {"containerStatuses": null, "phase": null}}),
    ] {
        let pod: Pod = serde_json::from_value(object.clone()).unwrap();
        assert_eq!(PodFacts::of(&pod), PodFacts::default(), "{object}");
        assert_eq!(key(&pod), None);
    }
}

#[test]
fn a_namespace_gives_only_its_config_annotations() {
    let namespace: Namespace = serde_json::from_value(json!({
        "metadata": {"name": "shop", "annotations": {
            "config.linkerd.io/skip-outbound-ports": "25",
            "linkerd.io/inject": "enabled",
        }},
        "spec": {"finalizers": ["kubernetes"]},
    }))
    .unwrap();
    assert_eq!(
        namespace.config_annotations(),
        BTreeMap::from([("config.linkerd.io/skip-outbound-ports".into(), "25".into())])
    );
    assert!(Namespace::default().config_annotations().is_empty());
}

#[test]
fn the_api_servers_ports_are_its_ports_and_numeric_target_ports() {
    let service: Service = serde_json::from_value(json!({
        "spec": {"ports": [
            {"name": "https", "port": 443, "targetPort": 6443},
            {"port": 8443, "targetPort": "https"},
            {"port": 70000, "targetPort": -1},
        ]}
    }))
    .unwrap();
    assert_eq!(service.api_server_ports(), [443, 6443, 8443]);
    assert!(Service::default().api_server_ports().is_empty());
}
