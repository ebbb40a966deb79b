use serde_json::json;

use super::{
    Outcome, Severity,
    checks::{CHECKS, MAX_NAMED, validator_failure},
    cluster::Cluster,
};

fn pod(init_status: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": { "name": "web", "namespace": "app" },
        "status": { "initContainerStatuses": [init_status] },
    }))
    .unwrap()
}

#[test]
fn the_validator_failed_only_when_its_last_run_ended_non_zero_and_it_is_not_running() {
    let status = |state: serde_json::Value, last: serde_json::Value| {
        json!({
            "name": "linkerd-network-validator", "image": "proxy", "imageID": "", "ready": false,
            "restartCount": 1, "state": state, "lastState": last,
        })
    };
    let exited = |code: i32| json!({ "terminated": { "exitCode": code } });
    let waiting = json!({ "waiting": { "reason": "CrashLoopBackOff" } });
    let running = json!({ "running": {} });
    assert_eq!(
        validator_failure(&pod(status(waiting.clone(), exited(95)))),
        Some(95)
    );
    assert_eq!(
        validator_failure(&pod(status(exited(1), json!({})))),
        Some(1)
    );
    // Passed after failing once.
    assert_eq!(validator_failure(&pod(status(exited(0), exited(95)))), None);
    // Trying again now.
    assert_eq!(validator_failure(&pod(status(running, exited(95)))), None);
    assert_eq!(validator_failure(&pod(status(waiting, json!({})))), None);
}

/// A cluster of `nodes` ready nodes, each with a ready agent whose status names `drifted`
/// pods.
fn cluster(nodes: usize, drifted: usize) -> Cluster {
    let status = json!({
        "version": "0.1.0", "backend": "iptables", "can_mesh": true, "chained": true,
        "meshed": 1, "updated": "2026-11-28T10:00:00Z",
        "drifted": (0..drifted)
            .map(|i| json!({ "namespace": "app", "name": format!("web-{i}"), "reason": "x" }))
            .collect::<Vec<_>>(),
        "drifted_total": drifted,
    })
    .to_string();
    let nodes = (0..nodes)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {
                    "name": format!("node-{i}"),
                    "annotations": { "interceptor.linkerd.io/status": status },
                },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            }))
            .unwrap()
        })
        .collect::<Vec<_>>();
    let agents = (0..nodes.len())
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": { "name": format!("agent-{i}"), "namespace": "linkerd-cni" },
                "spec": { "nodeName": format!("node-{i}"), "containers": [] },
                "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
            }))
            .unwrap()
        })
        .collect();
    let daemonset = serde_json::from_value(json!({
        "metadata": {
            "name": "linkerd-cni",
            "labels": { "app.kubernetes.io/name": "interceptor" },
        },
        "spec": {
            "selector": { "matchLabels": { "k8s-app": "linkerd-cni" } },
            "template": { "spec": { "containers": [] } },
        },
    }))
    .unwrap();
    Cluster {
        namespace: "linkerd-cni".to_owned(),
        labelled_namespaces: vec![],
        namespace_object: Ok(None),
        daemonset: Ok(Some(daemonset)),
        nodes: Ok(nodes),
        agents: Ok(agents),
        injected: Ok(vec![]),
        pods_namespace: None,
    }
}

fn evaluate(description: &str, cluster: &Cluster) -> Outcome {
    CHECKS
        .iter()
        .find(|c| c.description == description)
        .unwrap()
        .evaluate(cluster)
        .outcome
}

#[test]
fn at_most_ten_problems_are_named_and_the_rest_counted() {
    let Outcome::Failure { severity, message } =
        evaluate("no meshed pod's interception has drifted", &cluster(3, 5))
    else {
        panic!("15 drifted pods pass");
    };
    assert_eq!(severity, Severity::Error);
    assert!(
        message.starts_with("15 pods whose interception"),
        "{message}"
    );
    assert_eq!(message.matches("\n\t* app/web-").count(), MAX_NAMED);
    assert!(message.ends_with("\n\t* and 5 more"), "{message}");
}

#[test]
fn many_nodes_of_one_kind_are_one_line() {
    let result = CHECKS
        .iter()
        .find(|c| c.description == "every node's agent can mesh pods")
        .unwrap()
        .evaluate(&cluster(12, 0));
    assert_eq!(result.outcome, Outcome::Success);
    assert_eq!(
        result.description,
        "every node's agent can mesh pods\n\t* node-0, node-1, node-2, node-3, node-4, node-5, \
         node-6, node-7, node-8, node-9 and 2 more: iptables, interceptor 0.1.0"
    );
}

#[test]
fn every_check_has_a_hint_that_stands_alone_and_fatal_ones_come_first() {
    let cluster = cluster(1, 0);
    for check in CHECKS {
        // Someone holding only the binary has no docs beside it: the hint says what to do.
        let hint = check.evaluate(&cluster).hint;
        assert!(hint.split_whitespace().count() >= 8, "{hint}");
        assert!(
            !hint.contains(".md") && !hint.contains("docs/") && !hint.contains("{namespace}"),
            "{hint}"
        );
    }
    assert!(CHECKS[0].fatal && CHECKS[1..].iter().all(|c| !c.fatal));
}
