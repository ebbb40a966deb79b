//! The Kubernetes API path: a runtime that passes no pod annotations (the plugin's conflist
//! entry without the `io.kubernetes.cri.pod-annotations` capability), a Kubernetes pod named in
//! `CNI_ARGS`, and the agent reading the pod from the API (`--kubeconfig`, `--node-name`): from
//! its watch of the node's pods, or with a GET for a pod the watch has not seen.
//!
//! The API server is the kit's stand-in (`interceptor_tests::fake_api`): a `PodList` for the
//! list, a chunked stream of watch events, the pod, the `kubernetes` Service or a `NotFound`
//! Status for a GET. It can end the watch stream (the agent watches again), stop answering
//! (the API is down) and fail every request with a 500.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use interceptor::agent::api::node_status::NODE_STATUS_ANNOTATION;
use interceptor_tests::{
    Landing, Netns, PodFixture, Probe,
    agent_home::{Agent, AgentHome, UNREACHABLE, free_loopback_addr, http_get, metric},
    cni_network::CniNetwork,
    fake_api::{self, FakeApi, Mode, WatchEvent},
    privileged,
    probe::Listener,
    scenario::{APP_UID, PROXY_UID, Servers},
};
use serde_json::{Value, json};

const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");
const NODE: &str = "node-a";

/// A pod as the API server returns it, on `node`, with `annotations`; its UID is the one the
/// test's CNI_ARGS name (`uid-<name>`).
fn pod(name: &str, node: &str, annotations: &[(&str, &str)]) -> Value {
    labelled_pod(name, node, annotations, &[])
}

fn labelled_pod(
    name: &str,
    node: &str,
    annotations: &[(&str, &str)],
    labels: &[(&str, &str)],
) -> Value {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": format!("uid-{name}"),
            "resourceVersion": "10",
            "annotations": annotations,
            "labels": labels,
        },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "app", "image": "app:1" }, { "name": "linkerd-proxy", "image": "proxy:1" }],
        },
    })
}

const INJECTED: (&str, &str) = ("linkerd.io/proxy-version", "edge-24.11.8");

/// The stand-in API server with `pods` (in namespace `shop`, without annotations) and the
/// `kubernetes` Service, as a cluster whose API server listens on 8443 behind the Service's 443.
fn api_with(pods: Vec<Value>) -> FakeApi {
    api_with_namespace(&[], pods)
}

/// [`api_with`], namespace `shop` with `annotations`.
fn api_with_namespace(annotations: &[(&str, &str)], pods: Vec<Value>) -> FakeApi {
    let mut objects = pods;
    objects.push(fake_api::namespace("shop", annotations));
    objects.push(fake_api::node(NODE, &[]));
    objects.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "kubernetes", "namespace": "default" },
        "spec": { "ports": [{ "name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443 }] },
    }));
    FakeApi::start(objects)
}

fn eventually(what: &str, done: impl FnMut() -> bool) {
    interceptor_tests::eventually(what, Duration::from_secs(20), done);
}

/// The Events posted with `reason` on pod `name`.
fn events_on(api: &FakeApi, reason: &str, name: &str) -> Vec<Value> {
    api.state()
        .events
        .iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == name)
        .cloned()
        .collect()
}

/// Waits for the one Event with `reason` on pod `name`, and checks what every Event of the
/// agent says: of a Pod in `shop`, reported by the agent of node `NODE`.
fn the_event(api: &FakeApi, reason: &str, name: &str) -> Value {
    eventually(&format!("a {reason} event on {name}"), || {
        !events_on(api, reason, name).is_empty()
    });
    let events = events_on(api, reason, name);
    assert_eq!(events.len(), 1, "one event per occurrence: {events:#?}");
    let event = events[0].clone();
    assert_eq!(event["apiVersion"], "events.k8s.io/v1", "{event:#}");
    assert_eq!(event["regarding"]["kind"], "Pod", "{event:#}");
    assert_eq!(event["regarding"]["namespace"], "shop", "{event:#}");
    assert_eq!(event["metadata"]["namespace"], "shop", "{event:#}");
    assert_eq!(
        event["reportingController"], "interceptor.linkerd.io/agent",
        "{event:#}"
    );
    assert_eq!(event["reportingInstance"], NODE, "{event:#}");
    event
}

/// The agent's status on node `NODE`'s annotation, as last written.
fn node_status(api: &FakeApi) -> Option<Value> {
    fake_api::node_annotation(&api.state(), NODE, NODE_STATUS_ANNOTATION)
}

/// Waits until the node's status satisfies `done`, and returns it.
fn status_when(api: &FakeApi, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    eventually(&format!("the node's status: {what}"), || {
        node_status(api).is_some_and(|s| done(&s))
    });
    node_status(api).unwrap()
}

/// A node's CNI network whose plugin entry does not declare the annotations capability: the
/// runtime passes no annotations, as a runtime without the capability does.
fn network_without_annotations(home: &AgentHome) -> CniNetwork {
    network(home, "kubeapi-cni", json!({}))
}

/// A node's CNI network whose plugin entry declares the annotations capability: the runtime
/// passes each pod's annotations, as containerd does.
fn network_with_annotations(home: &AgentHome, tag: &str) -> CniNetwork {
    network(
        home,
        tag,
        json!({ "io.kubernetes.cri.pod-annotations": true }),
    )
}

/// Loopback, then the plugin (declaring `capabilities`) talking to `home`'s agent.
fn network(home: &AgentHome, tag: &str, capabilities: Value) -> CniNetwork {
    let network = CniNetwork::with_primary(
        tag,
        &json!({
            "cniVersion": "1.0.0",
            "name": "lo-net",
            "plugins": [
                { "type": "loopback" },
                {
                    "type": "interceptor-cni", "agent_socket": home.socket(), "log_file": "/dev/null",
                    "capabilities": capabilities,
                },
            ],
        }),
    );
    std::fs::copy(PLUGIN, network.bin_dir.join("interceptor-cni")).unwrap();
    network
}

/// The agent of `home` reading `api` as node `NODE`'s agent (its kubeconfig, `--node-name`),
/// with `extra` arguments, its log in [`AgentHome::log_path`] and its metrics on the returned
/// address, once it lists this node's pods and watches them.
fn agent_watching(api: &FakeApi, home: &AgentHome, extra: &[&str]) -> (Agent, String) {
    let kubeconfig = api.kubeconfig(&home.state_dir).display().to_string();
    let metrics = free_loopback_addr();
    let mut args = vec![
        "--kubeconfig",
        &kubeconfig,
        "--node-name",
        NODE,
        "--metrics-addr",
        &metrics,
    ];
    args.extend(extra);
    let agent = home.agent().args(&args).log_to(&home.log_path()).start();
    eventually("the agent watches the node's pods", || {
        api.requests_with("watch=true") > 0
    });
    (agent, metrics)
}

/// Asserts that the agent of `home` has not registered pod `name`.
fn assert_not_registered(home: &AgentHome, name: &str) {
    assert!(
        home.pods().iter().all(|p| p["meta"]["name"] != name),
        "{:?}",
        home.pods()
    );
}

fn registered(home: &AgentHome) -> Vec<String> {
    let mut names: Vec<String> = home
        .pods()
        .iter()
        .map(|p| p["meta"]["name"].as_str().unwrap_or("-").to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_agent_reads_a_pods_annotations_from_the_kubernetes_api_when_the_runtime_passes_none() {
    if !privileged() {
        return;
    }
    let api = api_with(vec![
        pod("web", NODE, &[INJECTED]),
        pod("plain", NODE, &[("app", "plain")]),
        pod("elsewhere", "node-b", &[INJECTED]),
    ]);
    let fixture = PodFixture::new("kubeapi");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, metrics) = agent_watching(&api, &home, &[]);
    assert!(
        api.state()
            .requests
            .iter()
            .all(|r| !r.starts_with("/api/v1/pods") || r.contains("spec.nodeName%3Dnode-a")),
        "{:?}",
        api.state().requests
    );
    let network = network_without_annotations(&home);

    // In the cache: meshed without a request to the API, from the first connect.
    network
        .add("web", &fixture.pod.path(), &json!(null))
        .expect("ADD of an injected pod the watch has seen");
    assert_eq!(api.requests_with("/pods/web"), 0, "answered from the cache");
    assert_eq!(registered(&home), ["web"]);
    let _proxy =
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    assert_eq!(
        fixture
            .in_pod()
            .uid(APP_UID)
            .connect("192.0.2.2:1404")
            .proxy_orig()
            .to_string(),
        "192.0.2.2:1404"
    );
    // Not injected, in the cache: passed through, not registered.
    let plain = Netns::new("kubeapi-plain");
    network
        .add("plain", &plain.path(), &json!(null))
        .expect("ADD of a pod Linkerd did not inject");
    assert_eq!(registered(&home), ["web"]);

    // Not yet in the cache (the API has it, the watch has not said so): a GET.
    api.state().objects.push(pod("late", NODE, &[INJECTED]));
    let late = Netns::new("kubeapi-late");
    network
        .add("late", &late.path(), &json!(null))
        .expect("ADD of a pod the watch has not seen yet");
    assert_eq!(api.requests_with("/api/v1/namespaces/shop/pods/late"), 1);
    assert_eq!(registered(&home), ["late", "web"]);

    // A watch event puts a pod in the cache.
    api.state().objects.push(pod("evented", NODE, &[INJECTED]));
    api.broadcast(|| WatchEvent::Added(pod("evented", NODE, &[INJECTED])));
    let evented = Netns::new("kubeapi-evented");
    std::thread::sleep(Duration::from_millis(500));
    network
        .add("evented", &evented.path(), &json!(null))
        .expect("ADD of a pod the watch announced");
    assert_eq!(
        api.requests_with("/pods/evented"),
        0,
        "answered from the cache"
    );

    // The watch ends, as API servers end watches: the agent watches again (from where it
    // was), and a pod announced on the new watch is in its cache.
    let watches = api.requests_with("watch=true");
    api.broadcast(|| WatchEvent::End);
    eventually("the agent watches again", || {
        api.requests_with("watch=true") > watches
    });
    api.state().objects.push(pod("after", NODE, &[INJECTED]));
    api.broadcast(|| WatchEvent::Added(pod("after", NODE, &[INJECTED])));
    std::thread::sleep(Duration::from_millis(500));
    let after = Netns::new("kubeapi-after");
    network
        .add("after", &after.path(), &json!(null))
        .expect("ADD after the watch reconnected");
    assert_eq!(
        api.requests_with("/pods/after"),
        0,
        "answered from the new list"
    );

    let (_, body) = http_get(&metrics, "/metrics");
    for line in [
        "interceptor_kubernetes_pod_lookups_total{source=\"cache\"} 4",
        "interceptor_kubernetes_pod_lookups_total{source=\"api\"} 1",
    ] {
        assert!(body.lines().any(|l| l == line), "{line} in {body}");
    }

    // The API down, a pod it never told about: error 11, nothing registered.
    api.state().mode = Mode::Down;
    let ghost = Netns::new("kubeapi-ghost");
    let error = network
        .add("ghost", &ghost.path(), &json!(null))
        .expect_err("a pod the API cannot tell about must not start");
    assert!(error.contains("\"code\":11"), "{error}");
    assert!(error.contains("Kubernetes API"), "{error}");
    assert_eq!(registered(&home), ["after", "evented", "late", "web"]);
}

#[test]
fn without_kubernetes_access_a_pod_without_annotations_is_told_to_try_again() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("kubenone");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let network = network_without_annotations(&home);
    let error = network
        .add("web", &fixture.pod.path(), &json!(null))
        .expect_err("no annotations and no API: the pod must not start");
    assert!(error.contains("\"code\":11"), "{error}");
    assert!(error.contains("--kubernetes"), "{error}");
    assert!(home.pods().is_empty());
}

/// An agent that cannot read the API at all (no `--kubernetes`, or credentials that do not
/// work) cannot tell a control-plane pod or one with `linkerd-init`: an injected pod whose
/// runtime passed its annotations is meshed as they say; one whose runtime passed none waits.
#[test]
fn without_a_kubernetes_client_an_injected_pod_is_meshed_by_its_annotations() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("kubebad");
    let home = AgentHome::new(&fixture.cgroup.path);
    let kubeconfig = home.state_dir.join("kubeconfig");
    std::fs::create_dir_all(&home.state_dir).unwrap();
    std::fs::write(&kubeconfig, "not: [a kubeconfig").unwrap();
    let _agent = home
        .agent()
        .args(&["--kubeconfig", &kubeconfig.display().to_string()])
        .start();
    network_with_annotations(&home, "kubebad-cni")
        .add(
            "web",
            &fixture.pod.path(),
            &json!({ INJECTED.0: INJECTED.1 }),
        )
        .expect("ADD of an injected pod whose annotations the runtime passed");
    assert_eq!(registered(&home), ["web"]);
    let other = Netns::new("kubebad-other");
    let error = network_without_annotations(&home)
        .add("other", &other.path(), &json!(null))
        .expect_err("no annotations and no API: the pod must not start");
    assert!(error.contains("\"code\":11"), "{error}");
    assert!(error.contains("no Kubernetes client"), "{error}");
}

/// linkerd-cni's rules that need more than annotations: Linkerd's control plane, whose pods
/// carry the label `linkerd.io/control-plane-component` (labels no runtime passes), reaches the
/// API server's ports, read from the `kubernetes` Service, around its proxy, whether the runtime
/// passed the annotations or not; a pod with a `linkerd-init` init container is left to it.
#[test]
fn a_control_plane_pod_reaches_the_api_server_around_its_proxy() {
    if !privileged() {
        return;
    }
    let control_plane = |name: &str| {
        labelled_pod(
            name,
            NODE,
            &[INJECTED],
            &[("linkerd.io/control-plane-component", "destination")],
        )
    };
    // Injected the iptables way, with the init container that writes proxy-init's rules.
    let mut legacy = pod("legacy", NODE, &[INJECTED]);
    legacy["spec"]["initContainers"] = json!([{ "name": "linkerd-init", "image": "proxy-init:1" }]);
    let api = api_with(vec![
        control_plane("destination"),
        control_plane("identity"),
        pod("web", NODE, &[INJECTED]),
        legacy,
    ]);
    let fixture = PodFixture::new("kubecp");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, metrics) = agent_watching(&api, &home, &[]);
    // The runtime passed no annotations: the agent's view gives them and the label.
    let network = network_without_annotations(&home);
    network
        .add("destination", &fixture.pod.path(), &json!(null))
        .expect("ADD of a control-plane pod");
    assert_eq!(outbound_ignored(&home, "destination"), "443,8443");
    assert_eq!(api.requests_with("/services/kubernetes"), 1);
    let _proxy =
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    let app = fixture.in_pod().uid(APP_UID);
    // The API server's port is not redirected (nothing listens there: refused); others are.
    assert!(
        !matches!(app.connect("192.0.2.2:8443"), Landing::Proxy { .. }),
        "a control-plane pod's connection to the API server went to its proxy"
    );
    assert_eq!(
        app.connect("192.0.2.2:1404").proxy_orig().to_string(),
        "192.0.2.2:1404"
    );

    // The runtime passed the annotations (containerd): the label still comes from the agent.
    let runtime = Netns::new("kubecp-runtime");
    let annotated = network_with_annotations(&home, "kubecp-cni");
    annotated
        .add(
            "identity",
            &runtime.path(),
            &json!({ INJECTED.0: INJECTED.1 }),
        )
        .expect("ADD of a control-plane pod whose annotations the runtime passed");
    assert_eq!(outbound_ignored(&home, "identity"), "443,8443");
    // Any other injected pod keeps the conflist's list.
    let web = Netns::new("kubecp-web");
    annotated
        .add("web", &web.path(), &json!({ INJECTED.0: INJECTED.1 }))
        .expect("ADD of an injected pod");
    assert_eq!(outbound_ignored(&home, "web"), "");
    // A pod with a linkerd-init init container is left to it, as linkerd-cni leaves it.
    let legacy = Netns::new("kubecp-legacy");
    annotated
        .add("legacy", &legacy.path(), &json!({ INJECTED.0: INJECTED.1 }))
        .expect("ADD of a pod with linkerd-init passes through");
    assert_not_registered(&home, "legacy");
    let (_, body) = http_get(&metrics, "/metrics");
    let skipped = "interceptor_cni_pods_skipped_total{reason=\"linkerd_init\"} 1";
    assert!(body.lines().any(|l| l == skipped), "{skipped} in {body}");

    // The API down and the pod not in the agent's view: it may be a control-plane pod, so it
    // waits (11) rather than start with its API connections sent to a proxy not yet ready.
    api.state().mode = Mode::Down;
    let ghost = Netns::new("kubecp-ghost");
    let error = annotated
        .add("ghost", &ghost.path(), &json!({ INJECTED.0: INJECTED.1 }))
        .expect_err("an injected pod the API cannot tell about must wait");
    assert!(error.contains("\"code\":11"), "{error}");
    assert!(error.contains("control"), "{error}");
}

const SKIP_OUTBOUND: &str = "config.linkerd.io/skip-outbound-ports";

/// How many times the agent read namespace `shop`.
fn namespace_reads(api: &FakeApi) -> usize {
    api.state()
        .requests
        .iter()
        .filter(|r| *r == "/api/v1/namespaces/shop")
        .count()
}

fn outbound_ignored(home: &AgentHome, name: &str) -> Value {
    home.pods()
        .iter()
        .find(|p| p["meta"]["name"] == name)
        .map(|p| p["config"]["outbound_ports_to_ignore"].clone())
        .unwrap_or_else(|| panic!("{name} is not registered: {:?}", home.pods()))
}

/// linkerd-cni's fallback: a `config.linkerd.io/*` annotation a pod does not have is read from
/// its namespace, whether the runtime passed the pod's annotations or the agent read them; the
/// pod's own wins, key by key; nothing else comes from the namespace.
#[test]
fn a_namespaces_config_annotations_apply_to_its_pods_under_their_own() {
    if !privileged() {
        return;
    }
    let api = api_with_namespace(
        &[(SKIP_OUTBOUND, "1404"), ("linkerd.io/inject", "enabled")],
        vec![
            pod("web", NODE, &[INJECTED]),
            pod("own", NODE, &[INJECTED, (SKIP_OUTBOUND, "25")]),
            pod("passed", NODE, &[INJECTED]),
            pod("plain", NODE, &[]),
        ],
    );
    let fixture = PodFixture::new("kubens");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, _) = agent_watching(&api, &home, &[]);

    // The agent read the pod (the runtime passed no annotations): the namespace's value.
    network_without_annotations(&home)
        .add("web", &fixture.pod.path(), &json!(null))
        .expect("ADD of an injected pod");
    assert_eq!(outbound_ignored(&home, "web"), "1404");
    // The runtime passed them: the pod's own wins; without one, the namespace's.
    let annotated = network_with_annotations(&home, "kubens-cni");
    let own = Netns::new("kubens-own");
    annotated
        .add(
            "own",
            &own.path(),
            &json!({ INJECTED.0: INJECTED.1, SKIP_OUTBOUND: "25" }),
        )
        .expect("ADD of an injected pod with its own annotation");
    assert_eq!(outbound_ignored(&home, "own"), "25");
    let passed = Netns::new("kubens-passed");
    annotated
        .add("passed", &passed.path(), &json!({ INJECTED.0: INJECTED.1 }))
        .expect("ADD of an injected pod whose annotations the runtime passed");
    assert_eq!(outbound_ignored(&home, "passed"), "1404");
    // The namespace's linkerd.io/inject does not mesh a pod Linkerd did not inject.
    let plain = Netns::new("kubens-plain");
    annotated
        .add("plain", &plain.path(), &json!({}))
        .expect("ADD of a pod Linkerd did not inject");
    assert_not_registered(&home, "plain");
    assert_eq!(namespace_reads(&api), 1, "the namespace is kept a while");

    // In force: the namespace's ignored port goes around the proxy, others to it.
    let _proxy =
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect("192.0.2.2:1404"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    assert_eq!(
        app.connect("192.0.2.2:1405").proxy_orig().to_string(),
        "192.0.2.2:1405"
    );
}

/// A namespace the agent may not read (its role without `get` on namespaces): its pods are
/// meshed by their own annotations. One the API does not answer for: the pod waits (11), as for
/// the pod itself, and is meshed with the namespace's annotations once the API answers.
#[test]
fn a_forbidden_namespace_leaves_pods_their_own_annotations_and_an_unanswered_one_waits() {
    if !privileged() {
        return;
    }
    let pods = || vec![pod("web", NODE, &[INJECTED])];
    let annotations = [(SKIP_OUTBOUND, "1404")];

    let api = api_with_namespace(&annotations, pods());
    api.state().forbidden.push("/api/v1/namespaces/shop".into());
    let fixture = PodFixture::new("kubensforbid");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (agent, _) = agent_watching(&api, &home, &[]);
    network_without_annotations(&home)
        .add("web", &fixture.pod.path(), &json!(null))
        .expect("ADD of an injected pod in a namespace the agent may not read");
    assert_eq!(outbound_ignored(&home, "web"), "");
    assert_eq!(namespace_reads(&api), 1);
    agent.kill();
    drop(home);

    let api = api_with_namespace(&annotations, pods());
    let fixture = PodFixture::new("kubensdown");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, _) = agent_watching(&api, &home, &[]);
    let network = network_without_annotations(&home);
    // The pod is in the watch's cache; the namespace has not been read.
    api.state().mode = Mode::Down;
    let error = network
        .add("web", &fixture.pod.path(), &json!(null))
        .expect_err("the namespace unanswered: the pod must wait");
    assert!(error.contains("\"code\":11"), "{error}");
    assert!(error.contains("namespace shop"), "{error}");
    assert!(home.pods().is_empty());
    api.state().mode = Mode::Answer;
    network
        .add("web", &fixture.pod.path(), &json!(null))
        .expect("ADD once the API answers");
    assert_eq!(outbound_ignored(&home, "web"), "1404");
}

/// A process of a pod (a stand-in proxy) in `netns`, in a container's cgroup of the pod with
/// `uid`, as the kubelet's systemd driver lays them out under `node_cgroup`; the pod's cgroup.
fn systemd_pod_process(node_cgroup: &Path, uid: &str, netns: &Path) -> (PathBuf, Listener) {
    let pod = node_cgroup.join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        uid.replace('-', "_")
    ));
    let container = pod.join("cri-containerd-0a1b2c.scope");
    std::fs::create_dir_all(&container).unwrap();
    let proxy = Probe::new()
        .netns(netns)
        .cgroup(&container)
        .uid(PROXY_UID)
        .listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]);
    (container, proxy)
}

/// The repair finds a pod's namespace from its UID, whatever names the runtime gives it: here
/// the kubelet's systemd layout and a namespace bind-mounted in /run/netns, which the record
/// keeps (it outlives the pod's processes). The pod gets the configuration the plugin would
/// give it, its namespace's annotations included, and a `MeshedInPlace` Event. A pod the API
/// reports as started that the node does not have yet (no cgroup) is reported once after its
/// retries (a `NotMeshed` Event, `interceptor_pods_not_meshed`, the node's status names it),
/// and repaired once it is there.
#[test]
fn repair_finds_a_pods_namespace_by_its_uid_and_reports_one_it_cannot_find_yet() {
    if !privileged() {
        return;
    }
    let uid = |name: &str| format!("{}-{name}", std::process::id());
    let started = |name: &str| {
        fake_api::reported(
            &fake_api::pod("shop", name, &uid(name), NODE, &[INJECTED], &[]),
            "Running",
            &["app", "linkerd-proxy"],
        )
    };
    let api = api_with_namespace(
        &[(SKIP_OUTBOUND, "1405")],
        vec![started("named"), started("late")],
    );
    let fixture = PodFixture::new("repairuid");
    let (container, _proxy) =
        systemd_pod_process(&fixture.cgroup.path, &uid("named"), &fixture.pod.path());
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, metrics) = agent_watching(
        &api,
        &home,
        &[
            "--kubepods-under",
            &fixture.cgroup.path.display().to_string(),
            "--repair-interval",
            "1",
        ],
    );
    let log = home.log_path();

    eventually("the pod is repaired", || registered(&home) == ["named"]);
    let record = home.pods().remove(0);
    assert_eq!(record["netns"], fixture.pod.path().display().to_string());
    assert_eq!(record["meta"]["uid"], uid("named"));
    assert_eq!(record["config"]["outbound_ports_to_ignore"], "1405");
    let app = Probe::new()
        .netns(&fixture.pod.path())
        .cgroup(&container)
        .uid(APP_UID);
    assert_eq!(
        app.connect("192.0.2.2:1404").proxy_orig().to_string(),
        "192.0.2.2:1404"
    );
    assert_eq!(
        app.connect("192.0.2.2:1405"),
        Landing::Failed("connect:ECONNREFUSED".into()),
        "the namespace's skipped port"
    );
    // `kubectl describe pod` says so.
    let event = the_event(&api, "MeshedInPlace", "named");
    assert_eq!(event["type"], "Normal", "{event:#}");
    assert_eq!(event["regarding"]["uid"], uid("named"), "{event:#}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("before the CNI plugin was chained") && note.contains("opened before"),
        "{note}"
    );

    // The other pod has no cgroup on this node yet: reported once, after its retries.
    let failed = r#"interceptor_pods_repair_failed_total{reason="no_cgroup"}"#;
    eventually("the pod that cannot be repaired is reported", || {
        metric(&metrics, failed) == Some(1.0)
    });
    let warnings = |log: &str| {
        log.lines()
            .filter(|l| l.contains("cannot be repaired") && l.contains(&uid("late")))
            .count()
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(warnings(&text), 1, "{text}");
    assert!(text.contains("no cgroup of the pod under"), "{text}");
    let event = the_event(&api, "NotMeshed", "late");
    assert_eq!(event["type"], "Warning", "{event:#}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains("no cgroup of the pod under"), "{note}");
    assert_eq!(metric(&metrics, "interceptor_pods_not_meshed"), Some(1.0));
    let status = status_when(&api, "it names the pod not meshed", |s| {
        s["not_meshed_total"] == 1
    });
    assert_eq!(status["not_meshed"][0]["namespace"], "shop", "{status:#}");
    assert_eq!(status["not_meshed"][0]["name"], "late", "{status:#}");
    let reason = status["not_meshed"][0]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("no cgroup of the pod under"), "{status:#}");
    assert_eq!(status["meshed"], 1, "{status:#}");
    // Not meshing one pod is that pod's problem: the node meshes new pods.
    assert_eq!(status["can_mesh"], true, "{status:#}");
    assert!(http_get(&metrics, "/ready").0.contains(" 200 "));

    // Its sandbox appears: repaired at the next pass, reported no more.
    let late = Netns::new("repairuid-late");
    let (_, _late_proxy) = systemd_pod_process(&fixture.cgroup.path, &uid("late"), &late.path());
    eventually("the late pod is repaired", || {
        registered(&home) == ["late", "named"]
    });
    assert_eq!(
        metric(&metrics, "interceptor_pods_repaired_total"),
        Some(2.0)
    );
    assert_eq!(metric(&metrics, failed), Some(1.0));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(warnings(&text), 1, "{text}");
    the_event(&api, "MeshedInPlace", "late");
    status_when(&api, "the pod is meshed, no longer named", |s| {
        s["not_meshed_total"] == 0 && s["meshed"] == 2
    });
    assert_eq!(metric(&metrics, "interceptor_pods_not_meshed"), Some(0.0));
    assert_eq!(events_on(&api, "NotMeshed", "late").len(), 1);
    assert_eq!(
        metric(
            &metrics,
            r#"interceptor_events_posted_total{reason="MeshedInPlace"}"#
        ),
        Some(2.0)
    );
}

/// Without the Kubernetes API, or without a watch of the node's pods, or with
/// `--repair-interval 0`, there is no repair, and the agent says so once at start; a `--linkerd`
/// block the plugin would refuse, or a `--startup-taint` without the API or a node name, stops
/// the agent before it starts.
#[test]
fn without_the_api_repair_is_off_and_the_agent_says_so_once() {
    if !privileged() {
        return;
    }
    let api = api_with(Vec::new());
    let fixture = PodFixture::new("repairoff");
    let home = AgentHome::new(&fixture.cgroup.path);
    let kubeconfig = api.kubeconfig(&home.state_dir).display().to_string();
    for (args, why) in [
        (
            &[][..],
            "pod repair is off (the agent does not read the Kubernetes API: no --kubernetes)",
        ),
        (
            &["--kubeconfig", &kubeconfig][..],
            "pod repair is off (no node name (--node-name, NODE_NAME)",
        ),
        (
            &[
                "--kubeconfig",
                &kubeconfig,
                "--node-name",
                NODE,
                "--repair-interval",
                "0",
            ][..],
            "pod repair is off (--repair-interval is 0)",
        ),
    ] {
        let log = home.log_path();
        home.agent().args(args).log_to(&log).start().stop();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.matches("pod repair is off").count(), 1, "{text}");
        assert!(text.contains(why), "{why}: {text}");
        assert!(!text.contains("repaired in place"), "{text}");
    }

    let out = std::process::Command::new(&home.binary)
        .arg("daemon")
        .args(home.location())
        .args(["--cgroup", &fixture.cgroup.path.display().to_string()])
        .args(["--linkerd", r#"{"proxy-uid": "x"}"#])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains(r#"--linkerd="{\"proxy-uid\": \"x\"}" is not valid"#)
            && error.contains("proxy-uid"),
        "{error}"
    );

    // Only an agent that reads the API as its node's can remove the startup taint.
    for (args, why) in [
        (&[][..], "needs the Kubernetes API"),
        (&["--kubeconfig", &kubeconfig][..], "needs this node's name"),
    ] {
        let out = std::process::Command::new(&home.binary)
            .arg("daemon")
            .args(home.location())
            .args(["--cgroup", &fixture.cgroup.path.display().to_string()])
            .args(["--startup-taint", STARTUP_TAINT])
            .args(args)
            .env_remove("NODE_NAME")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(
            error.contains(&format!("--startup-taint {STARTUP_TAINT} {why}")),
            "{error}"
        );
    }
}

const STARTUP_TAINT: &str = "interceptor.linkerd.io/agent-not-ready";
const OTHER_TAINT: &str = "example.com/maintenance";

/// The keys of node `NODE`'s taints.
fn taints(api: &FakeApi) -> Vec<String> {
    let state = api.state();
    let node = state
        .objects
        .iter()
        .find(|o| o["kind"] == "Node" && o["metadata"]["name"] == NODE)
        .expect("the node");
    node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["key"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The startup taint (`--startup-taint`) goes once the agent can mesh new pods, and not
/// before: while the CNI installer's report (`--cni-chain-report`) says the plugin is not
/// chained, `/ready` says why with a 503, the node's status says the node cannot mesh, and the
/// taint stays. Once the report says chained, every taint with that key goes (a Node changed
/// meanwhile is read again: a conflict), the Node's other taints stay, and the status says what
/// the agent runs. A report gone later makes the node unready again; the taint is not put back.
#[test]
fn the_startup_taint_goes_once_the_node_can_mesh_pods() {
    use interceptor::agent::api::node_status::ChainReport;
    if !privileged() {
        return;
    }
    let api = api_with(Vec::new());
    {
        let mut state = api.state();
        state.objects.retain(|o| o["kind"] != "Node");
        let tainted = fake_api::node(
            NODE,
            &[
                (STARTUP_TAINT, "NoSchedule"),
                (OTHER_TAINT, "NoExecute"),
                (STARTUP_TAINT, "NoExecute"),
            ],
        );
        state.objects.push(tainted);
        state.node_conflicts = 1;
    }
    let fixture = PodFixture::new("taint");
    let home = AgentHome::new(&fixture.cgroup.path);
    let report = home.state_dir.join("cni-chain.json");
    ChainReport::not_chained("no primary network configuration in /etc/cni/net.d")
        .write(&report)
        .unwrap();
    let report_arg = report.display().to_string();
    let (_agent, metrics) = agent_watching(
        &api,
        &home,
        &[
            "--startup-taint",
            STARTUP_TAINT,
            "--cni-chain-report",
            &report_arg,
        ],
    );

    let (ready, body) = http_get(&metrics, "/ready");
    assert!(ready.contains(" 503 "), "{ready}");
    let problem =
        "the CNI plugin is not chained: no primary network configuration in /etc/cni/net.d";
    assert!(body.contains(problem), "{body}");
    let status = status_when(&api, "it cannot mesh", |s| s["can_mesh"] == false);
    assert_eq!(status["chained"], false, "{status:#}");
    assert_eq!(status["problems"], json!([problem]), "{status:#}");
    // However long it waits: the pods the taint keeps away would start unmeshed.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(taints(&api), [STARTUP_TAINT, OTHER_TAINT, STARTUP_TAINT]);

    ChainReport::chained(Path::new("/etc/cni/net.d/10-lo.conflist"))
        .write(&report)
        .unwrap();
    // As the kubelet's probe asks.
    eventually("/ready says 200", || {
        http_get(&metrics, "/ready").0.contains(" 200 ")
    });
    eventually("the startup taint is removed", || {
        taints(&api) == [OTHER_TAINT]
    });
    assert_eq!(api.state().node_conflicts, 0, "the conflict was met");
    let status = status_when(&api, "it can mesh", |s| s["can_mesh"] == true);
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"), "{status:#}");
    assert_eq!(status["backend"], "ebpf", "{status:#}");
    assert_eq!(status["chained"], true, "{status:#}");
    assert!(status.get("problems").is_none(), "{status:#}");
    assert_eq!(status["meshed"], 0, "{status:#}");
    let variants: Vec<&str> = status["variants"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(variants.len(), 7, "a variant per hook: {status:#}");
    for hook in [
        "cgroup/connect4=",
        "sock_ops=",
        "cgroup/getsockopt=",
        "sk_lookup=",
    ] {
        assert!(
            variants.iter().any(|v| v.starts_with(hook)),
            "{hook}: {variants:?}"
        );
    }
    let updated = status["updated"].as_str().unwrap();
    assert!(updated.ends_with('Z') && updated.len() == 20, "{updated}");
    let log = std::fs::read_to_string(home.log_path()).unwrap();
    assert_eq!(
        log.matches("its startup taint is removed").count(),
        1,
        "{log}"
    );

    home.mesh(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop"],
    );
    status_when(&api, "it counts the pod", |s| s["meshed"] == 1);

    std::fs::remove_file(&report).unwrap();
    let (ready, body) = http_get(&metrics, "/ready");
    assert!(ready.contains(" 503 "), "{ready}");
    assert!(body.contains("has not reported"), "{body}");
    let status = status_when(&api, "it cannot mesh again", |s| s["can_mesh"] == false);
    assert!(status.get("chained").is_none(), "not reported: {status:#}");
    assert_eq!(taints(&api), [OTHER_TAINT]);
}

/// One pod's interception drifting (here its sk_lookup link's pin taken by someone else's
/// program, which the agent cannot undo) is that pod's problem, not the node's: `/ready` stays
/// 200 (the DaemonSet's readiness, which `linkerd check` waits on), while
/// `interceptor_pods_drifted`, an `InterceptionDrifted` Event, the node's status and the API's
/// health say which pod and why; all of them clear once it is in force again.
#[test]
fn a_pods_drift_leaves_the_node_ready_and_is_told_elsewhere() {
    use std::os::fd::AsFd as _;
    if !privileged() {
        return;
    }
    let api = api_with(Vec::new());
    let fixture = PodFixture::new("drift");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, metrics) = agent_watching(&api, &home, &["--repair-interval", "0"]);
    home.mesh(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop", "--uid", "uid-web"],
    );
    status_when(&api, "it meshes the pod", |s| {
        s["meshed"] == 1 && s["drifted_total"] == 0
    });
    assert_eq!(metric(&metrics, "interceptor_pods_drifted"), Some(0.0));

    let foreign = interceptor_tests::ebpf_backend::foreign_program();
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let pod_link = home.bpffs.join(format!("link_icpt_sk_lookup_{cookie}"));
    // The agent pins a removed pin again at once: retried until the foreign one is there.
    let mut displaced = false;
    for _ in 0..50 {
        let _ = std::fs::remove_file(&pod_link);
        match interceptor_sys::obj_pin(foreign.as_fd(), &pod_link) {
            Ok(()) => {
                displaced = true;
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => panic!("pinning at {}: {e}", pod_link.display()),
        }
    }
    assert!(
        displaced,
        "{} was pinned again 50 times",
        pod_link.display()
    );

    eventually("the gauge counts the drifted pod", || {
        metric(&metrics, "interceptor_pods_drifted") == Some(1.0)
    });
    let (ready, body) = http_get(&metrics, "/ready");
    assert!(
        ready.contains(" 200 ") && body == "ready\n",
        "{ready} {body}"
    );
    let problem = format!("its sk_lookup link: {}", pod_link.display());
    let event = the_event(&api, "InterceptionDrifted", "web");
    assert_eq!(event["type"], "Warning", "{event:#}");
    assert_eq!(event["regarding"]["uid"], "uid-web", "{event:#}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains(&problem), "{note}");
    let status = status_when(&api, "it names the drifted pod", |s| {
        s["drifted_total"] == 1
    });
    assert_eq!(status["can_mesh"], true, "{status:#}");
    assert_eq!(status["drifted"][0]["namespace"], "shop", "{status:#}");
    assert_eq!(status["drifted"][0]["name"], "web", "{status:#}");
    let reason = status["drifted"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&problem), "{status:#}");
    let health = interceptor::agent::api::health(&home.socket()).unwrap();
    assert!(
        health.problems.iter().any(|p| p.contains(&problem)),
        "{health:?}"
    );
    assert_eq!(health.node_problems, Some(Vec::new()), "{health:?}");

    // Once the foreign pin goes, the agent pins its link again: in force, told as such.
    std::fs::remove_file(&pod_link).unwrap();
    eventually("the gauge clears", || {
        metric(&metrics, "interceptor_pods_drifted") == Some(0.0)
    });
    status_when(&api, "it names no drifted pod", |s| s["drifted_total"] == 0);
    assert_eq!(events_on(&api, "InterceptionDrifted", "web").len(), 1);
}

/// The API server failing (500 to every request) then hanging (requests read and never
/// answered): the agent never waits for it to mesh a pod. Each registration answers at once and
/// the pod is intercepted; the node status it could not write is logged and counted
/// (`interceptor_node_status_writes_total{result="failed"}`) and tried again, and once the API
/// answers the status counts both pods.
#[test]
fn an_api_server_failing_or_hanging_never_holds_up_a_registration() {
    if !privileged() {
        return;
    }
    let api = api_with(Vec::new());
    let fixture = PodFixture::new("kubeapi500");
    let _servers = Servers::start(&fixture);
    let second = Netns::new("kubeapi500b");
    let home = AgentHome::new(&fixture.cgroup.path);
    let (_agent, metrics) = agent_watching(&api, &home, &[]);
    status_when(&api, "written at start", |s| s["meshed"] == 0);
    let failed = || {
        metric(
            &metrics,
            "interceptor_node_status_writes_total{result=\"failed\"}",
        )
        .unwrap_or(0.0)
    };
    let registered_at_once = |netns: &Path, name: &str| {
        let started = Instant::now();
        home.mesh(netns, &["--name", name, "--namespace", "shop"]);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{name}: {took:?}");
    };

    api.state().mode = Mode::Refuse(500);
    registered_at_once(&fixture.pod.path(), "web");
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    eventually("a failed status write is counted", || failed() >= 1.0);
    let log = std::fs::read_to_string(home.log_path()).unwrap();
    assert!(
        log.contains("writing this node's status annotation") && log.contains("500"),
        "{log}"
    );

    api.state().mode = Mode::Silent;
    registered_at_once(&second.path(), "web2");
    eventually("a status write that timed out is counted", || {
        failed() >= 2.0
    });
    assert_eq!(registered(&home), ["web", "web2"]);

    api.state().mode = Mode::Answer;
    status_when(&api, "written again, with both pods", |s| s["meshed"] == 2);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
}
