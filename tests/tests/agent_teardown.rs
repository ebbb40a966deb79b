//! `interceptor daemon --daemonset NAMESPACE/NAME` on SIGTERM, as the DaemonSet's agent gets it
//! when its pod is stopped: the real agent meshing a pod of the test's own, against the kit's
//! stand-in API server (`interceptor_tests::fake_api`, through `--kubeconfig`).
//!
//! The DaemonSet gone (`helm uninstall`) or taken over by another chart (`helm upgrade` back to
//! linkerd2-cni, which keeps the name but drops our label): the agent detaches its programs and
//! removes its pins and records, so the node is left as before it was installed. The DaemonSet
//! still ours (a rolling update) or the API unable to tell: everything stays for the next agent.
use std::time::{Duration, Instant};

use interceptor_tests::{
    Landing, PodFixture,
    agent_home::{AgentHome, UNREACHABLE},
    fake_api::{self, FakeApi, Mode, daemonset},
    privileged,
    scenario::{APP_UID, Servers},
};
use serde_json::json;

const NAMESPACE: &str = "linkerd-cni";
const NAME: &str = "linkerd-cni";
const NODE: &str = "node-a";
const STATUS: &str = interceptor::agent::api::node_status::NODE_STATUS_ANNOTATION;

/// What the API says of the DaemonSet when the agent is stopped.
#[derive(Clone, Copy, Debug)]
enum AtTermination {
    Ours,
    Gone,
    TakenOver,
    Unreachable,
}

/// What is left once the agent stopped.
struct Left {
    intercepted: bool,
    pinned: bool,
    /// The agent's status annotation on its Node.
    node_status: bool,
    log: String,
}

/// An agent meshing a pod, told its DaemonSet; the API changed as `then` says; SIGTERM.
fn stopped_with(tag: &str, then: AtTermination) -> Left {
    let fixture = PodFixture::new(tag);
    let _servers = Servers::start(&fixture);
    let api = FakeApi::start(vec![daemonset(NAMESPACE, NAME), fake_api::node(NODE, &[])]);
    let home = AgentHome::new(&fixture.cgroup.path);
    let kubeconfig = api.kubeconfig(&home.state_dir).display().to_string();
    let log = home.log_path();
    let agent = home
        .agent()
        .args(&[
            "--kubeconfig",
            &kubeconfig,
            "--node-name",
            NODE,
            "--daemonset",
            &format!("{NAMESPACE}/{NAME}"),
            "--repair-interval",
            "0",
        ])
        .log_to(&log)
        .start();
    home.mesh(&fixture.pod.path(), &[]);
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    interceptor_tests::eventually(
        "the agent reads its DaemonSet",
        Duration::from_secs(20),
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("DaemonSet found")),
    );
    interceptor_tests::eventually("the agent's node status", Duration::from_secs(20), || {
        fake_api::node_annotation(&api.state(), NODE, STATUS)
            .is_some_and(|status| status["meshed"] == 1)
    });
    match then {
        AtTermination::Ours => {}
        AtTermination::Gone => api.state().remove("DaemonSet", NAMESPACE, NAME),
        AtTermination::TakenOver => {
            let mut state = api.state();
            let found = state.object_mut("DaemonSet", NAMESPACE, NAME).unwrap();
            found["metadata"]["labels"] =
                json!({ "k8s-app": NAME, "linkerd.io/cni-resource": "true" });
        }
        AtTermination::Unreachable => api.state().mode = Mode::Down,
    }
    let sent = Instant::now();
    agent.stop();
    assert!(
        sent.elapsed() < Duration::from_secs(8),
        "{then:?}: within the pod's 10 s grace period: {:?}",
        sent.elapsed()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    // A forked child of another test may hold copies of link fds until it execs.
    let deadline = Instant::now() + Duration::from_secs(2);
    let intercepted = loop {
        match app.connect(UNREACHABLE) {
            Landing::Failed(e) if e == "connect:ECONNREFUSED" => break false,
            Landing::Failed(e) => panic!("{then:?}: {e}"),
            _ if Instant::now() >= deadline => break true,
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let pinned = home.bpffs.exists();
    if pinned {
        // What a test leaves, the next agent would find: take it away.
        let out = home.cli(&["uninstall"]);
        assert!(out.status.success(), "{out:?}");
    }
    api.state().mode = Mode::Answer;
    let node_status = fake_api::node_annotation(&api.state(), NODE, STATUS).is_some();
    Left {
        intercepted,
        pinned,
        node_status,
        log: text,
    }
}

#[test]
fn an_agent_whose_daemonset_is_gone_or_taken_over_leaves_nothing_on_the_node() {
    if !privileged() {
        return;
    }
    for (tag, then, reason) in [
        ("tdgone", AtTermination::Gone, "the DaemonSet is gone"),
        (
            "tdtaken",
            AtTermination::TakenOver,
            "the DaemonSet is no longer ours",
        ),
    ] {
        let left = stopped_with(tag, then);
        let log = &left.log;
        assert!(
            !left.intercepted,
            "{then:?}: the pod is no longer intercepted"
        );
        assert!(!left.pinned, "{then:?}: no pin is left: {log}");
        assert!(!left.node_status, "{then:?}: no status on the node: {log}");
        assert!(log.contains(reason), "{then:?}: {log}");
        assert!(log.contains("programs detached"), "{then:?}: {log}");
    }
}

#[test]
fn an_agent_replaced_by_another_of_ours_or_unsure_keeps_interception_pinned() {
    if !privileged() {
        return;
    }
    for (tag, then, said) in [
        ("tdours", AtTermination::Ours, "this pod is being replaced"),
        (
            "tdunsure",
            AtTermination::Unreachable,
            "cannot tell whether the DaemonSet is being deleted",
        ),
    ] {
        let left = stopped_with(tag, then);
        let log = &left.log;
        assert!(
            left.intercepted,
            "{then:?}: the pod stays intercepted: {log}"
        );
        assert!(left.pinned, "{then:?}: {log}");
        assert!(
            left.node_status,
            "{then:?}: the next agent's status stays: {log}"
        );
        assert!(log.contains(said), "{then:?}: {log}");
        assert!(!log.contains("programs detached"), "{then:?}: {log}");
    }
}

#[test]
fn the_daemonset_option_needs_the_kubernetes_api() {
    let home = AgentHome::new(std::path::Path::new("/nonexistent"));
    let out = home.cli(&["daemon", "--daemonset", "linkerd-cni/linkerd-cni"]);
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("--daemonset needs the Kubernetes API"),
        "{error}"
    );
}
