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

/// `KubePod::complete`, with lookups that answer at once: one poll.
fn complete(
    facts: PodFacts,
    namespace: Result<BTreeMap<String, String>, String>,
    service: Result<Vec<u16>, String>,
) -> (Result<KubePod, String>, [bool; 2], Option<String>) {
    use std::task::{Context, Poll, Waker};
    let (mut asked_namespace, mut asked_service, mut fell_back) = (false, false, None);
    let answer = KubePod::complete(
        facts,
        || {
            asked_namespace = true;
            std::future::ready(namespace)
        },
        || {
            asked_service = true;
            std::future::ready(service)
        },
        |why: &str| fell_back = Some(why.to_owned()),
    );
    let Poll::Ready(answer) = std::pin::pin!(answer).poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("the lookups answered at once");
    };
    (answer, [asked_namespace, asked_service], fell_back)
}

/// The answer about a pod asks only what its facts need: the namespace for a pod Linkerd
/// injected (its error fails the answer), the Service for a control-plane pod (443 and 6443
/// when it cannot be read, saying why).
#[test]
fn a_pod_is_completed_with_only_the_lookups_it_needs() {
    let injected = PodFacts {
        annotations: BTreeMap::from([(PROXY_VERSION.to_owned(), "stable".to_owned())]),
        ..PodFacts::default()
    };
    let annotations = BTreeMap::from([(
        format!("{CONFIG_PREFIX}skip-outbound-ports"),
        "25".to_owned(),
    )]);
    let (answer, asked, _) = complete(injected.clone(), Ok(annotations.clone()), Ok(vec![]));
    assert_eq!(asked, [true, false]);
    assert_eq!(answer.unwrap().namespace_annotations, annotations);
    let (answer, _, _) = complete(injected.clone(), Err("no answer".into()), Ok(vec![]));
    assert_eq!(answer, Err("no answer".into()));

    let control_plane = PodFacts {
        control_plane_component: Some("destination".into()),
        ..injected
    };
    let (answer, asked, fell_back) =
        complete(control_plane.clone(), Ok(BTreeMap::new()), Ok(vec![8443]));
    assert_eq!(asked, [true, true]);
    assert_eq!(
        (answer.unwrap().api_server_ports, fell_back),
        (vec![8443], None)
    );
    let (answer, _, fell_back) = complete(control_plane, Ok(BTreeMap::new()), Err("403".into()));
    assert_eq!(
        answer.unwrap().api_server_ports,
        annotations::DEFAULT_API_SERVER_PORTS
    );
    assert_eq!(fell_back.as_deref(), Some("403"));

    let (answer, asked, _) = complete(PodFacts::default(), Err("x".into()), Err("x".into()));
    assert_eq!(asked, [false, false], "a pod not meshed is never held up");
    assert!(answer.is_ok());
}
