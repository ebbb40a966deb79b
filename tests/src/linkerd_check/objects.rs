//! The objects of a cluster as `linkerd-interceptor check` reads it: two nodes, `node-a` and
//! `node-b`, interceptor's DaemonSet `linkerd-cni` and its pods, and pods Linkerd injected, for
//! the kit's stand-in API server.
use serde_json::{Value, json};

use crate::fake_api;

/// The namespace interceptor's DaemonSet runs in (linkerd-cni's).
pub const NAMESPACE: &str = "linkerd-cni";
/// The Node annotation an agent publishes its status in.
pub const STATUS: &str = "interceptor.linkerd.io/status";

/// A node's status as an agent publishes it: can mesh, chained, nothing wrong.
pub fn good_status() -> Value {
    json!({
        "version": "0.1.0",
        "backend": "ebpf",
        "variants": ["connect4=icpt_connect4", "sock_ops=icpt_sockops"],
        "can_mesh": true,
        "chained": true,
        "meshed": 3,
        "not_meshed": [],
        "not_meshed_total": 0,
        "drifted": [],
        "drifted_total": 0,
        "updated": "2026-11-28T10:00:00Z",
    })
}

/// A Node, ready, with `status` as its agent's annotation (none when `Null`).
pub fn node(name: &str, status: &Value) -> Value {
    let mut node = fake_api::node(name, &[]);
    if !status.is_null() {
        node["metadata"]["annotations"] = json!({ STATUS: status.to_string() });
    }
    node
}

/// The DaemonSet as the chart renders it: our label, linkerd-cni's name and selector, on Linux
/// nodes, `ready` of 2 pods ready.
pub fn daemonset(ready: u32) -> Value {
    let mut daemonset = fake_api::daemonset(NAMESPACE, "linkerd-cni");
    daemonset["metadata"]["labels"] =
        json!({ "app.kubernetes.io/name": "interceptor", "k8s-app": "linkerd-cni" });
    daemonset["spec"]["selector"] = json!({ "matchLabels": { "k8s-app": "linkerd-cni" } });
    daemonset["spec"]["template"]["metadata"]["labels"] = json!({ "k8s-app": "linkerd-cni" });
    daemonset["spec"]["template"]["spec"]["nodeSelector"] = json!({ "kubernetes.io/os": "linux" });
    daemonset["spec"]["template"]["spec"]["tolerations"] = json!([{ "operator": "Exists" }]);
    daemonset["status"]["desiredNumberScheduled"] = json!(2);
    daemonset["status"]["currentNumberScheduled"] = json!(2);
    daemonset["status"]["numberReady"] = json!(ready);
    daemonset
}

/// The DaemonSet's pod on `node`, ready or crash-looping.
pub fn agent(node: &str, ready: bool) -> Value {
    let state = if ready {
        json!({ "running": { "startedAt": "2026-11-28T09:00:00Z" } })
    } else {
        json!({ "waiting": { "reason": "CrashLoopBackOff" } })
    };
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("linkerd-cni-{node}"),
            "namespace": NAMESPACE,
            "uid": format!("uid-agent-{node}"),
            "labels": { "k8s-app": "linkerd-cni" },
        },
        "spec": { "nodeName": node, "containers": [{ "name": "agent", "image": "interceptor" }] },
        "status": {
            "phase": "Running",
            "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
            "containerStatuses": [{
                "name": "agent", "image": "interceptor", "imageID": "", "ready": ready,
                "restartCount": if ready { 0 } else { 4 }, "state": state,
            }],
        },
    })
}

/// A pod Linkerd injected on `node`, running, its validator passed (`validator_exit` 0) or
/// crash-looping after exiting with that code.
pub fn injected(namespace: &str, name: &str, node: &str, validator_exit: i32) -> Value {
    let mut pod = fake_api::pod(
        namespace,
        name,
        &format!("uid-{name}"),
        node,
        &[],
        &["linkerd-network-validator"],
    );
    pod["metadata"]["labels"] = json!({ "linkerd.io/control-plane-ns": "linkerd" });
    let validator = if validator_exit == 0 {
        json!({ "state": { "terminated": { "exitCode": 0, "reason": "Completed" } }, "ready": true })
    } else {
        json!({
            "state": { "waiting": { "reason": "CrashLoopBackOff" } },
            "lastState": { "terminated": { "exitCode": validator_exit, "reason": "Error" } },
            "ready": false,
        })
    };
    let mut validator = validator;
    validator["name"] = json!("linkerd-network-validator");
    validator["image"] = json!("proxy:1");
    validator["imageID"] = json!("");
    validator["restartCount"] = json!(if validator_exit == 0 { 0 } else { 3 });
    pod["status"] = json!({
        "phase": if validator_exit == 0 { "Running" } else { "Pending" },
        "initContainerStatuses": [validator],
    });
    pod
}

/// The namespace as `namespace-metadata` leaves it.
pub fn labelled_namespace(name: &str) -> Value {
    let mut namespace = fake_api::namespace(name, &[("linkerd.io/inject", "disabled")]);
    namespace["metadata"]["labels"] = json!({
        "kubernetes.io/metadata.name": name,
        "linkerd.io/extension": "interceptor",
        "linkerd.io/cni-resource": "true",
        "config.linkerd.io/admission-webhooks": "disabled",
        "pod-security.kubernetes.io/enforce": "privileged",
    });
    namespace
}

/// A healthy cluster: both agents ready and able to mesh, one injected pod meshed.
pub fn healthy() -> Vec<Value> {
    vec![
        labelled_namespace(NAMESPACE),
        daemonset(2),
        node("node-a", &good_status()),
        node("node-b", &good_status()),
        agent("node-a", true),
        agent("node-b", true),
        injected("app", "web-1", "node-a", 0),
    ]
}
