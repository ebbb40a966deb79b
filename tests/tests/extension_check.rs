//! `linkerd-interceptor check` as `linkerd check` runs it, and `interceptor check` and
//! `interceptor namespace-metadata`: the real binaries against the kit's stand-in API server
//! (`interceptor_tests::linkerd_check`), holding a cluster of two nodes, `node-a` and `node-b`,
//! interceptor's DaemonSet `linkerd-cni` and its pods, and pods Linkerd injected.
//!
//! The JSON is read as Linkerd reads it (`interceptor_tests::linkerd_check::output`): a check
//! failed if its `error` is not empty, and is a warning if its `result` is `warning`.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use interceptor_tests::{
    agent_home::interceptor_bin,
    fake_api::{self, Mode},
    linkerd_check::{
        Cluster, linkerd_interceptor_bin,
        objects::{
            NAMESPACE, STATUS, agent, daemonset, good_status, healthy, injected,
            labelled_namespace, node,
        },
        output::{assert_linkerd_shape, check, error},
    },
};
use serde_json::{Value, json};

const DAEMONSET_READY: &str = "agent pod is ready on every node";
const CAN_MESH: &str = "every node's agent can mesh pods";
const CHAINED: &str = "CNI plugin is chained on every node";
const MESHED: &str = "every injected pod is meshed";
const DRIFTED: &str = "no meshed pod's interception has drifted";

#[test]
fn a_healthy_cluster_passes_in_linkerds_json_and_in_the_table() {
    let cluster = Cluster::start(healthy());
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(0));
    assert_linkerd_shape(&json);
    assert_eq!(json["success"], true);
    let categories = json["categories"].as_array().unwrap();
    assert_eq!(categories.len(), 1);
    assert_eq!(categories[0]["categoryName"], "linkerd-interceptor");
    let checks = categories[0]["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 7, "{json:#}");
    assert!(checks.iter().all(|c| c["result"] == "success"), "{json:#}");
    // The nodes' backend and variants are shown.
    let can_mesh = check(&json, CAN_MESH)["description"].as_str().unwrap();
    assert!(
        can_mesh.contains(
            "node-a, node-b: ebpf (connect4=icpt_connect4, sock_ops=icpt_sockops), interceptor 0.1.0"
        ),
        "{can_mesh}"
    );
    // What it read: the DaemonSet's pods by its selector, the pods Linkerd injected by label.
    assert!(cluster.api.requests_with("/api/v1/nodes") > 0);
    assert!(
        cluster
            .api
            .requests_with("labelSelector=k8s-app%3Dlinkerd-cni")
            > 0
    );
    assert!(
        cluster
            .api
            .requests_with("labelSelector=linkerd.io%2Fcontrol-plane-ns")
            > 0
    );

    // `interceptor check`, the same checks, as a person reads them.
    let output = cluster.run(&interceptor_bin(), &["check"]);
    assert_eq!(output.status.code(), Some(0));
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(
        table.starts_with(
            "linkerd-interceptor\n-------------------\n\u{221A} interceptor's DaemonSet (linkerd-cni) exists\n"
        ),
        "{table}"
    );
    assert!(table.contains("\u{221A} every node's agent can mesh pods\n\t* node-a, node-b: ebpf"));
    assert!(
        table.ends_with("\nStatus check results are \u{221A}\n"),
        "{table}"
    );
}

#[test]
fn a_node_whose_agent_is_down_is_named_and_fails_the_check() {
    let mut objects = healthy();
    objects.retain(|o| o["metadata"]["name"] != "linkerd-cni-node-b");
    objects.push(agent("node-b", false));
    objects[1] = daemonset(1);
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&["--wait=0s"]);
    assert_eq!(output.status.code(), Some(1));
    assert_linkerd_shape(&json);
    assert_eq!(json["success"], false);
    let ready = check(&json, DAEMONSET_READY);
    assert_eq!(ready["result"], "error");
    assert_eq!(
        error(ready),
        "1 of 2 nodes without a ready agent: pods Linkerd injects there wait until one is\n\t* \
         node-b: pod linkerd-cni-node-b is not ready (container agent: CrashLoopBackOff)"
    );
    // The hint is the fix in words, with our namespace, not a path into docs.
    assert!(
        ready["hint"]
            .as_str()
            .unwrap()
            .contains(&format!("kubectl -n {NAMESPACE} logs <pod> -c agent")),
        "{}",
        ready["hint"]
    );
    // Its status still says it can mesh: not trusted.
    let can_mesh = check(&json, CAN_MESH);
    assert_eq!(can_mesh["result"], "error");
    assert!(
        error(can_mesh).contains(
            "node-b: its agent is not ready, so its last status is not trusted; it last said at \
             2026-11-28T10:00:00Z: can mesh, ebpf"
        ),
        "{}",
        error(can_mesh)
    );
    assert!(!error(can_mesh).contains("node-a"));
    // What only its agent could tell is unknown there, not wrong.
    let chained = check(&json, CHAINED);
    assert_eq!(chained["result"], "warning");
    assert!(error(chained).contains("node-b: not known, its agent is not ready"));
    assert_eq!(check(&json, DRIFTED)["result"], "warning");
    // The injected pod on node-a is fine; nothing runs on node-b.
    assert_eq!(check(&json, MESHED)["result"], "success");

    // A pod Linkerd injected running there cannot be verified.
    cluster.api.put(injected("app", "api-1", "node-b", 0));
    let (_, json) = cluster.linkerd_check(&["--wait=0s"]);
    let meshed = check(&json, MESHED);
    assert_eq!(meshed["result"], "warning");
    assert!(
        error(meshed).contains(
            "app/api-1 on node-b: running while the node's agent is not ready: not verified"
        ),
        "{}",
        error(meshed)
    );
}

#[test]
fn a_node_without_an_agent_pod_is_named() {
    let mut objects = healthy();
    objects.retain(|o| o["metadata"]["name"] != "linkerd-cni-node-b");
    objects.push(node("node-c", &Value::Null));
    // Not Linux: the DaemonSet does not belong there.
    objects.last_mut().unwrap()["metadata"]["labels"]["kubernetes.io/os"] = json!("windows");
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&["--wait=0s"]);
    assert_eq!(output.status.code(), Some(1));
    let ready = check(&json, DAEMONSET_READY);
    assert!(
        error(ready).contains("\n\t* node-b: no agent pod"),
        "{}",
        error(ready)
    );
    assert!(!error(ready).contains("node-c"), "{}", error(ready));
}

#[test]
fn the_check_waits_for_an_agent_becoming_ready() {
    let mut objects = healthy();
    objects.retain(|o| o["metadata"]["name"] != "linkerd-cni-node-b");
    objects.push(agent("node-b", false));
    let cluster = Cluster::start(objects);
    let start = Instant::now();
    let api = &cluster.api;
    let (output, json) = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs(1));
            api.put(agent("node-b", true));
        });
        cluster.linkerd_check(&["--wait=30s"])
    });
    assert_eq!(output.status.code(), Some(0), "{json:#}");
    assert_eq!(check(&json, DAEMONSET_READY)["result"], "success");
    // Read again after Linkerd's retry window (5 s), not before.
    assert!(start.elapsed() >= Duration::from_secs(5));
    assert!(api.requests_with("labelSelector=k8s-app%3Dlinkerd-cni") >= 2);
}

#[test]
fn injected_pods_not_meshed_are_named_from_the_status_and_the_validator() {
    let mut objects = healthy();
    let mut status = good_status();
    status["not_meshed"] = json!([
        { "namespace": "app", "name": "web-2", "reason": "repair gave up: no network namespace" },
    ]);
    status["not_meshed_total"] = json!(3);
    objects[2] = node("node-a", &status);
    // Only the API tells of this one: its validator found its traffic not redirected.
    objects.push(injected("shop", "cart-1", "node-b", 95));
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(1));
    assert_linkerd_shape(&json);
    let meshed = check(&json, MESHED);
    assert_eq!(meshed["result"], "error");
    assert_eq!(
        error(meshed),
        "4 pods Linkerd injected not meshed\n\t* app/web-2 on node-a: repair gave up: no network \
         namespace\n\t* shop/cart-1 on node-b: linkerd-network-validator exited 95 (its traffic \
         is not redirected to the proxy)\n\t* and 2 more"
    );
    assert!(
        meshed["hint"]
            .as_str()
            .unwrap()
            .contains("deleting the pod starts it again through the plugin"),
        "{}",
        meshed["hint"]
    );
    // The rest of the cluster is fine.
    assert_eq!(check(&json, CAN_MESH)["result"], "success");

    // `linkerd check -n shop` passes the namespace on: only its pods are named.
    let (_, json) = cluster.linkerd_check(&["--namespace=shop"]);
    assert_eq!(
        error(check(&json, MESHED)),
        "1 pod Linkerd injected not meshed\n\t* shop/cart-1 on node-b: linkerd-network-validator \
         exited 95 (its traffic is not redirected to the proxy)"
    );
}

#[test]
fn drifted_pods_are_named() {
    let mut objects = healthy();
    let mut status = good_status();
    status["drifted"] = json!([
        { "namespace": "app", "name": "web-1", "reason": "its proxy's outbound port changed" },
    ]);
    status["drifted_total"] = json!(1);
    objects[3] = node("node-b", &status);
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(1));
    let drifted = check(&json, DRIFTED);
    assert_eq!(drifted["result"], "error");
    assert_eq!(
        error(drifted),
        "1 pod whose interception is not as configured (the agent could not repair it)\n\t* \
         app/web-1 on node-b: its proxy's outbound port changed"
    );
}

#[test]
fn missing_or_unreadable_statuses_of_ready_agents_are_warnings() {
    let mut objects = healthy();
    objects[2] = node("node-a", &Value::Null);
    objects[3]["metadata"]["annotations"][STATUS] = json!("{not json");
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&[]);
    // Ready agents can mesh (that is what their readiness says): only what they show is missing.
    assert_eq!(output.status.code(), Some(0), "{json:#}");
    assert_linkerd_shape(&json);
    assert_eq!(json["success"], true);
    let can_mesh = check(&json, CAN_MESH);
    assert_eq!(can_mesh["result"], "warning");
    assert!(error(can_mesh).contains("node-a: its agent is ready but publishes no status"));
    assert!(
        error(can_mesh).contains(
            "node-b: its status (annotation interceptor.linkerd.io/status) does not parse"
        )
    );

    // A ready agent that says it cannot mesh is believed.
    let mut status = good_status();
    status["can_mesh"] = json!(false);
    status["chained"] = json!(false);
    status["problems"] = json!(["the CNI plugin is not chained"]);
    cluster.api.put(node("node-a", &status));
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        error(check(&json, CAN_MESH))
            .contains("node-a: its agent cannot mesh pods: the CNI plugin is not chained")
    );
    let chained = check(&json, CHAINED);
    assert_eq!(chained["result"], "error");
    assert!(error(chained).contains("node-a: the CNI plugin is not in the node's primary network"));
}

#[test]
fn a_missing_daemonset_is_fatal() {
    let cluster = Cluster::start(vec![labelled_namespace(NAMESPACE)]);
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(1));
    assert_linkerd_shape(&json);
    let checks = json["categories"][0]["checks"].as_array().unwrap();
    assert_eq!(
        checks.len(),
        1,
        "nothing runs after a fatal failure: {json:#}"
    );
    assert_eq!(checks[0]["result"], "error");
    assert_eq!(
        checks[0]["error"],
        "missing DaemonSet: linkerd-cni (namespace linkerd-cni)"
    );

    // linkerd-cni's own DaemonSet, left with our namespace label, is not taken for ours.
    let mut theirs = daemonset(2);
    theirs["metadata"]["labels"] = json!({ "k8s-app": "linkerd-cni" });
    cluster.api.put(theirs);
    let (_, json) = cluster.linkerd_check(&[]);
    assert!(
        json["categories"][0]["checks"][0]["error"]
            .as_str()
            .unwrap()
            .contains("is not interceptor's")
    );
}

#[test]
fn the_namespace_labelled_for_the_extension_is_found() {
    let mut objects = healthy();
    let elsewhere = "icpt-elsewhere";
    for object in &mut objects {
        if object["metadata"]["namespace"] == NAMESPACE {
            object["metadata"]["namespace"] = json!(elsewhere);
        }
    }
    objects[0] = labelled_namespace(elsewhere);
    let cluster = Cluster::start(objects);
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(0), "{json:#}");
    assert!(
        cluster.api.requests_with(&format!(
            "/apis/apps/v1/namespaces/{elsewhere}/daemonsets/linkerd-cni"
        )) > 0
    );
    // Without its labels, the namespace check warns (linkerd check would not run us).
    let mut bare = fake_api::namespace(elsewhere, &[]);
    bare["metadata"]["labels"] = json!({});
    let mut state = cluster.api.state();
    state.objects.retain(|o| o["kind"] != "Namespace");
    state.objects.push(bare);
    drop(state);
    let (output, json) = cluster.linkerd_check(&[&format!("--cni-namespace={elsewhere}")]);
    assert_eq!(output.status.code(), Some(0));
    let labelled = check(&json, "interceptor's namespace is labelled for Linkerd");
    assert_eq!(labelled["result"], "warning");
    assert!(error(labelled).contains("label linkerd.io/cni-resource=true is missing"));
    // The extension label is asked for (linkerdExtension), never expected.
    assert!(
        !error(labelled).contains("linkerd.io/extension"),
        "{}",
        error(labelled)
    );
}

#[test]
fn an_unreachable_api_fails_the_first_check_in_json() {
    let cluster = Cluster::start(vec![]);
    cluster.api.state().mode = Mode::Refuse(403);
    let (output, json) = cluster.linkerd_check(&[]);
    assert_eq!(output.status.code(), Some(1));
    assert_linkerd_shape(&json);
    let first = &json["categories"][0]["checks"][0];
    assert_eq!(first["result"], "error");
    assert!(
        first["error"]
            .as_str()
            .unwrap()
            .starts_with("reading DaemonSet linkerd-cni: 403 Forbidden"),
        "{first:#}"
    );
}

#[test]
fn flags_from_a_newer_linkerd_are_ignored_and_no_always_run_is_claimed() {
    let cluster = Cluster::start(healthy());
    let (output, json) = cluster.linkerd_check(&["--some-future-flag=1", "--another", "x"]);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(json["success"], true);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ignoring \"--some-future-flag=1\""),
        "{stderr}"
    );

    // `linkerd check` asks every linkerd-* binary on the PATH for its metadata, and runs those
    // answering `"checks": "always"` even without a labelled namespace: not this one.
    let metadata = Command::new(linkerd_interceptor_bin())
        .arg("_extension-metadata")
        .output()
        .unwrap();
    assert!(!metadata.status.success());
    assert!(serde_json::from_slice::<Value>(&metadata.stdout).is_err());
}

#[test]
fn namespace_metadata_labels_the_namespace_keeping_what_is_there() {
    let mut namespace = fake_api::namespace("icpt-meta", &[("team", "net")]);
    namespace["metadata"]["labels"] = json!({ "kubernetes.io/metadata.name": "icpt-meta" });
    let cluster = Cluster::start(vec![namespace]);
    // Down at first, as an API server being restarted: the hook keeps trying.
    cluster.api.state().mode = Mode::Down;
    let api = &cluster.api;
    let output = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs(2));
            api.state().mode = Mode::Answer;
        });
        cluster.run(
            &interceptor_bin(),
            &["namespace-metadata", "--namespace", "icpt-meta"],
        )
    });
    assert_eq!(output.status.code(), Some(0));
    let stored = api.state().objects[0].clone();
    let labels = json!({
        "kubernetes.io/metadata.name": "icpt-meta",
        "linkerd.io/cni-resource": "true",
        "config.linkerd.io/admission-webhooks": "disabled",
        "pod-security.kubernetes.io/enforce": "privileged",
    });
    assert_eq!(stored["metadata"]["labels"], labels);
    assert_eq!(
        stored["metadata"]["annotations"],
        json!({ "team": "net", "linkerd.io/inject": "disabled" })
    );
    // The extension label only when asked, and removed when no longer asked.
    let mut extension = labels.clone();
    extension["linkerd.io/extension"] = json!("interceptor");
    for (flag, expected) in [(Some("--linkerd-extension"), &extension), (None, &labels)] {
        let mut args = vec!["namespace-metadata", "--namespace", "icpt-meta"];
        args.extend(flag);
        assert_eq!(
            cluster.run(&interceptor_bin(), &args).status.code(),
            Some(0)
        );
        assert_eq!(
            api.state().objects[0]["metadata"]["labels"],
            *expected,
            "{flag:?}"
        );
    }

    // A namespace that does not exist is an error at once.
    let start = Instant::now();
    let output = cluster.run(
        &interceptor_bin(),
        &["namespace-metadata", "--namespace", "nowhere"],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(String::from_utf8_lossy(&output.stderr).contains("namespace nowhere not found"));

    // A refusal is tried again until the time given, then said with what is missing.
    api.state().mode = Mode::Refuse(403);
    let before = api.requests_with("/api/v1/namespaces/icpt-meta");
    let output = cluster.run(
        &interceptor_bin(),
        &[
            "namespace-metadata",
            "--namespace",
            "icpt-meta",
            "--timeout-ms",
            "1500",
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no success within 1500 ms"), "{stderr}");
    assert!(
        stderr.contains("needs patch on namespaces, for icpt-meta"),
        "{stderr}"
    );
    assert!(api.requests_with("/api/v1/namespaces/icpt-meta") >= before + 2);
}
