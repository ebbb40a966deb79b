//! containerd with its CRI plugin, driven over the CRI gRPC API as the kubelet drives it
//! (`RunPodSandbox` with the pod's metadata and annotations, `PodSandboxStatus`,
//! `StopPodSandbox`, `RemovePodSandbox`), its CNI configuration chained by `interceptor cni
//! install` after the reference bridge and host-local plugins. containerd hands the plugin each
//! pod's annotations in `runtimeConfig["io.kubernetes.cri.pod-annotations"]` because the
//! installer declares that capability; the plugin meshes only the pods Linkerd injected, each
//! with its own `config.linkerd.io/*` annotations. Every case is checked by connecting from
//! inside the pod's network namespace.
//!
//! The node, all the test's own, is the kit's [`interceptor_tests::containerd::Node`]. The
//! repair tests run it as a kubelet with the cgroupfs driver lays it out, the node's pods in the
//! stand-in API server with the status the kubelet would report; their sandboxes are created
//! while our entry is not in the chain.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use interceptor_tests::{
    agent_home::{free_loopback_addr, http_get, metric},
    chart,
    cni_network::PRIMARY,
    containerd::{GATEWAY, NODE_NAME, Node, POD_NAMESPACE, Pod, pod_uid, to_node},
    fake_api::{self, FakeApi},
    linkerd_check::{Cluster, LINKERD_FLAGS, objects::healthy},
    node_image, privileged,
    scenario::APP_UID,
};
use serde_json::{Value, json};

const PROXY_VERSION: (&str, &str) = ("linkerd.io/proxy-version", "edge-24.11.8");
/// The init container Linkerd's CNI mode injects instead of `linkerd-init`.
const VALIDATOR: &str = "linkerd-network-validator";

#[test]
fn containerd_meshes_the_pods_linkerd_injected_and_passes_the_others_through() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdmesh");
    let _node_server = node.serve_on_node();
    let web = node
        .run_pod("web", &[PROXY_VERSION, ("app", "web")])
        .expect("RunPodSandbox of an injected pod");
    let plain = node
        .run_pod(
            "plain",
            &[("app", "plain"), ("linkerd.io/inject", "enabled")],
        )
        .expect("RunPodSandbox of a pod Linkerd did not inject");

    // Only the injected pod is registered, under its Kubernetes names and UID.
    let registered = node.assert_registered(&["web"]);
    let record = &registered[0].1;
    assert_eq!(record["meta"]["namespace"], POD_NAMESPACE);
    assert_eq!(record["meta"]["uid"], web.uid.as_str());
    assert_eq!(record["meta"]["container_id"], web.id.as_str());

    let _web = node.serve(&web, "web-app");
    let _plain = node.serve(&plain, "plain-app");
    // The injected pod: outbound and inbound on its proxy, from the first connect.
    node.assert_meshed(&web);
    // The other pod: untouched both ways.
    node.assert_outbound_passes(&plain);
    assert_eq!(
        node.on_node()
            .connect(&format!("{}:8080", plain.ip))
            .server_name(),
        "plain-app"
    );

    // The kubelet deletes the pods: the injected one leaves the agent.
    node.remove_pod(&web.id);
    node.remove_pod(&plain.id);
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
}

#[test]
fn containerd_pods_own_annotations_change_only_their_own_interception() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdannot");
    let _node_server = node.serve_on_node();
    let gateway_subnet = format!("{GATEWAY}/32");
    let pods: Vec<(&str, Pod)> = [
        ("plain-mesh", vec![PROXY_VERSION]),
        (
            "skip-out",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-outbound-ports", "1404"),
            ],
        ),
        (
            "skip-in",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-inbound-ports", "8080"),
            ],
        ),
        (
            "skip-subnet",
            vec![
                PROXY_VERSION,
                ("config.linkerd.io/skip-subnets", gateway_subnet.as_str()),
            ],
        ),
    ]
    .into_iter()
    .map(|(name, annotations)| {
        let pod = node
            .run_pod(name, &annotations)
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        (name, pod)
    })
    .collect();
    assert_eq!(node.registered().len(), 4);
    let _servers: Vec<_> = pods
        .iter()
        .map(|(name, pod)| node.serve(pod, name))
        .collect();

    let to_node = to_node();
    for (name, pod) in &pods {
        let app = node.in_pod(pod, APP_UID);
        let outbound = app.connect(&to_node);
        if *name == "skip-out" {
            assert_eq!(outbound.server_name(), "node-server", "{name}");
        } else {
            assert_eq!(outbound.proxy_orig().to_string(), to_node, "{name}");
        }
        for port in [8080, 9090] {
            let target = format!("{}:{port}", pod.ip);
            let inbound = node.on_node().connect(&target);
            // The node's client connects from the gateway's address.
            let direct = *name == "skip-subnet" || (*name == "skip-in" && port == 8080);
            if direct {
                assert_eq!(inbound.server_name(), *name, "{name} {port}");
            } else {
                assert_eq!(inbound.proxy_orig().to_string(), target, "{name} {port}");
            }
        }
    }
}

#[test]
fn containerd_refuses_a_pod_with_a_malformed_annotation_with_the_plugins_message() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrdbad");
    let error = match node.run_pod(
        "bad",
        &[
            PROXY_VERSION,
            ("config.linkerd.io/skip-outbound-ports", "25,smtp"),
        ],
    ) {
        Ok(pod) => panic!("a pod with a malformed annotation started: {}", pod.id),
        Err(error) => error,
    };
    let message = error.message();
    for expected in ["config.linkerd.io/skip-outbound-ports", "25,smtp", "smtp"] {
        assert!(message.contains(expected), "{expected:?} not in {message}");
    }
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
}

/// The agent killed (a crash loop): the node's network stays ready, a pod Linkerd did not inject
/// starts at once, an injected one does not start (the plugin answers 11, the kubelet retries);
/// once an agent runs again the injected pod starts, meshed from its first connect.
#[test]
fn containerd_with_the_agent_down_starts_other_pods_at_once_and_injected_ones_once_it_is_back() {
    if !privileged() {
        return;
    }
    let mut node = Node::new("ctrddown");
    let _node_server = node.serve_on_node();
    node.agent.take().expect("the node's agent").kill();

    // STATUS: ready, as the runtime asks it, and as containerd reports the network.
    let (ok, out) = node.plugin_status();
    assert!(ok, "STATUS with the agent down: {out}");
    assert!(node.network_ready(), "containerd's NetworkReady");
    let log = std::fs::read_to_string(node.dir.join("cni.log")).unwrap();
    assert!(
        log.contains("STATUS: ready, but the agent does not answer"),
        "{log}"
    );

    // A pod Linkerd did not inject does not wait for the agent.
    let started = Instant::now();
    let plain = node
        .run_pod("plain", &[("app", "plain")])
        .expect("RunPodSandbox of a pod Linkerd did not inject, with the agent down");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the pod took {took:?} to start"
    );

    // An injected pod does not start unmeshed: the plugin's 11, for the kubelet to retry.
    let error = match node.run_pod("web", &[PROXY_VERSION, ("app", "web")]) {
        Ok(pod) => panic!("an injected pod started with the agent down: {}", pod.id),
        Err(error) => error,
    };
    assert!(
        error
            .message()
            .contains("the interceptor agent is not reachable; try again later"),
        "{}",
        error.message()
    );

    // The agent back: the retried sandbox starts, meshed; the pod started without it is not.
    node.agent = Some(node.home.agent().start());
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
    let web = node
        .run_pod("web", &[PROXY_VERSION, ("app", "web")])
        .expect("RunPodSandbox of the injected pod, retried once the agent answers");
    node.assert_registered(&["web"]);
    let _web = node.serve(&web, "web-app");
    let _plain = node.serve(&plain, "plain-app");
    node.assert_meshed(&web);
    node.assert_outbound_passes(&plain);
}

/// A node whose agent repairs pods (see [`Node::repairing`]) and exposes its metrics, in a
/// cluster whose stand-in API server has namespace `shop` and no pods yet: the API server, the
/// metrics' address, the node.
fn repairing_node(tag: &str) -> (FakeApi, String, Node) {
    let api = FakeApi::start(vec![fake_api::namespace(POD_NAMESPACE, &[])]);
    let metrics = free_loopback_addr();
    let node = Node::repairing(tag, &api, &["--metrics-addr", &metrics]);
    (api, metrics, node)
}

/// Pod `name` of the node as the API server has it once created, before the kubelet reported
/// anything: `annotations`, `init_containers`.
fn api_pod(name: &str, annotations: &[(&str, &str)], init_containers: &[&str]) -> Value {
    fake_api::pod(
        POD_NAMESPACE,
        name,
        &pod_uid(name),
        NODE_NAME,
        annotations,
        init_containers,
    )
}

/// A pod Linkerd injected whose sandbox was created while our entry was not in the chain runs
/// unmeshed: its `linkerd-network-validator` exits 95. Once the kubelet reports the validator's
/// container (crash-looping), the agent registers the pod in place, as the plugin would have:
/// the validator passes at its next run, and its app's connections land on its proxy with
/// their original destination. A pod Linkerd did not inject, one with `linkerd-init` and a
/// `hostNetwork` one are left alone.
#[test]
fn containerd_repair_meshes_an_injected_pod_that_started_unchained_and_leaves_the_others_alone() {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrepair");
    let _node_server = node.serve_on_node();
    node.unchain();

    // As the kubelet starts each pod: in the API first, then its sandbox.
    let injected = [PROXY_VERSION];
    let cases = [
        ("web", api_pod("web", &injected, &[VALIDATOR]), false),
        ("plain", api_pod("plain", &[("app", "plain")], &[]), false),
        (
            "old-style",
            api_pod("old-style", &injected, &["linkerd-init"]),
            false,
        ),
        (
            "on-host",
            fake_api::host_network(api_pod("on-host", &injected, &[])),
            true,
        ),
    ];
    let mut pods = HashMap::new();
    for (name, object, host_network) in &cases {
        api.put(object.clone());
        let annotations: Vec<(&str, &str)> = object["metadata"]["annotations"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
            .collect();
        let pod = node
            .run_pod_with(name, &annotations, *host_network)
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        pods.insert(*name, pod);
    }
    let web = &pods["web"];
    assert!(node.registered().is_empty(), "{:#?}", node.registered());
    let (code, line) = node.validate(web);
    assert_eq!(code, Some(95), "the validator before the repair: {line}");

    // The kubelet reports what runs: the validator's container, crash-looping, for the
    // injected pod; every container for the others.
    api.put(fake_api::reported(&cases[0].1, "Pending", &[VALIDATOR]));
    for (_, object, _) in &cases[1..] {
        let mut started = vec!["app", "linkerd-proxy"];
        if object["spec"]["initContainers"][0]["name"] == "linkerd-init" {
            started.push("linkerd-init");
        }
        api.put(fake_api::reported(object, "Running", &started));
    }
    let registered = node.wait_registered(&["web"]);
    let record = &registered[0].1;
    assert_eq!(record["meta"]["namespace"], POD_NAMESPACE);
    assert_eq!(record["meta"]["uid"], web.uid.as_str());
    assert_eq!(
        record["meta"]["container_id"],
        Value::Null,
        "the sandbox's ID is not guessed"
    );
    // containerd keeps this node's namespaces under its state directory, not in /run/netns:
    // the pod is registered by its sandbox's process, which lives as long as it.
    assert_eq!(
        record["netns"],
        format!("/proc/{}/ns/net", web.pid),
        "{record:#}"
    );
    assert_eq!(
        record["args"],
        json!([
            "--incoming-proxy-port",
            "4143",
            "--outgoing-proxy-port",
            "4140",
            "--proxy-uid",
            "2102",
            "--inbound-ports-to-ignore",
            "4190,4191",
            "--ipv6=false"
        ]),
        "the linkerd block's configuration, as the plugin's ADD gives it"
    );

    // The validator's next run passes; the app's connections land on the proxy both ways.
    let (code, line) = node.validate(web);
    assert_eq!(code, Some(0), "the validator after the repair: {line}");
    let _web = node.serve(web, "web-app");
    node.assert_meshed(web);
    // The pod Linkerd did not inject: untouched.
    let plain = &pods["plain"];
    let _plain = node.serve(plain, "plain-app");
    node.assert_outbound_passes(plain);

    // Later passes change nothing, and nothing failed.
    std::thread::sleep(Duration::from_millis(2500));
    node.wait_registered(&["web"]);
    assert_eq!(
        metric(&metrics, "interceptor_pods_repaired_total"),
        Some(1.0)
    );
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(
        !body.contains("interceptor_pods_repair_failed_total{"),
        "{body}"
    );
    let log = std::fs::read_to_string(node.agent_log(0)).unwrap();
    let repaired: Vec<&str> = log.lines().filter(|l| l.contains("pod repaired")).collect();
    assert_eq!(repaired.len(), 1, "{log}");
    for expected in [web.uid.as_str(), "web", POD_NAMESPACE, "/ns/net"] {
        assert!(
            repaired[0].contains(expected),
            "{expected}: {}",
            repaired[0]
        );
    }
    assert_eq!(
        log.matches("pods started without the CNI plugin are repaired")
            .count(),
        1,
        "{log}"
    );
}

/// The agent killed in the middle of a repair (between the maps and the pod's record), and a
/// pod started unchained while no agent runs: the next agent takes back the pods repaired
/// before, removes what the cut-short registration left, and repairs the two that are left,
/// each registered once.
#[test]
fn containerd_an_agent_restarted_midway_repairs_what_is_left_and_registers_nothing_twice() {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrestart");
    let _node_server = node.serve_on_node();
    // Two registrations go through, the third is cut short before its record.
    node.restart_agent("agent-before-record=2*off->return");
    node.unchain();

    let start = |node: &mut Node, name: &str| {
        let object = api_pod(name, &[PROXY_VERSION], &[VALIDATOR]);
        api.put(object.clone());
        let pod = node
            .run_pod(name, &[PROXY_VERSION])
            .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
        api.put(fake_api::reported(&object, "Pending", &[VALIDATOR]));
        pod
    };
    let _a = start(&mut node, "a");
    node.wait_registered(&["a"]);
    let _b = start(&mut node, "b");
    node.wait_registered(&["a", "b"]);
    let c = start(&mut node, "c");
    let deadline = Instant::now() + Duration::from_secs(20);
    let agent = node.agent.as_mut().expect("the armed agent");
    while agent.child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the agent never crashed registering c"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(node.agent_log(1)).unwrap();
    assert!(log.contains("crash point agent-before-record"), "{log}");
    let d = start(&mut node, "d");

    node.restart_agent("");
    let registered = node.wait_registered(&["a", "b", "c", "d"]);
    let uids: std::collections::BTreeSet<&str> = registered
        .iter()
        .map(|(_, r)| r["meta"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids.len(), 4, "{registered:#?}");
    assert_eq!(node.home.records(), 4);
    assert_eq!(node.home.problems(), Vec::<String>::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics, "interceptor_pods_repaired_total") != Some(2.0) {
        assert!(
            Instant::now() < deadline,
            "the second agent repaired c and d only: {:?}",
            metric(&metrics, "interceptor_pods_repaired_total")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(node.agent_log(2)).unwrap();
    assert!(
        log.contains("removing what the maps and pins hold for a pod without a record"),
        "the cut-short registration of c is undone: {log}"
    );
    assert_eq!(log.matches("pod repaired").count(), 2, "{log}");
    for pod in [&c, &d] {
        let _served = node.serve(pod, "app");
        node.assert_outbound_on_proxy(pod);
    }
}

/// A primary CNI that writes its configuration again without our entry, three times, while the
/// kubelet starts injected pods right after each rewrite (Cilium with `cni.exclusive=true`
/// does this on every change): the watching installer puts the entry back each time and
/// reports it, and every injected pod ends up meshed exactly once, whether its ADD ran through
/// our plugin or its sandbox was created in between and the agent repaired it.
#[test]
fn containerd_a_primary_rewriting_its_conflist_while_pods_start_ends_with_every_injected_pod_meshed()
 {
    if !privileged() {
        return;
    }
    let (api, metrics, mut node) = repairing_node("ctrdrewrite");
    let installer_log = node.dir.join("installer.log");
    let mut installer = node
        .cni_install()
        .args(["--watch", "--check-ms", "200"])
        .stderr(std::fs::File::create(&installer_log).unwrap())
        .spawn()
        .unwrap();
    let installer_says = || std::fs::read_to_string(&installer_log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !installer_says().contains("watching the CNI configuration") {
        assert!(Instant::now() < deadline, "{}", installer_says());
        std::thread::sleep(Duration::from_millis(50));
    }
    let primary = node.cni.conf_dir.join(PRIMARY);
    let chained = || {
        let list: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
        list["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["type"] == "interceptor-cni")
    };

    let injected = [PROXY_VERSION];
    let mut names = Vec::new();
    let mut objects = Vec::new();
    let installer_pid = nix::unistd::Pid::from_raw(installer.id() as i32);
    for round in 0..3 {
        // Written again without our entry, by rename-over as Cilium writes it. In the first two
        // rounds the installer is held (SIGSTOP) until containerd has loaded the network
        // without it, so the pods started then miss our plugin; in the last it runs, and the
        // pods get it or not as the race goes.
        let held = round < 2;
        if held {
            nix::sys::signal::kill(installer_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
            // kill() returns before the installer has stopped: until it has, it may still act
            // on an event queued from the last round, see our rewrite and chain the plugin again.
            wait_stopped(installer_pid);
            node.unchain();
        } else {
            let mut list: Value =
                serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
            list["plugins"]
                .as_array_mut()
                .unwrap()
                .retain(|p| p["type"] != "interceptor-cni");
            let staged = primary.with_extension("rewrite");
            std::fs::write(&staged, list.to_string()).unwrap();
            std::fs::rename(&staged, &primary).unwrap();
        }
        // The kubelet starts pods at once: each gets our plugin or not, as the race goes.
        for n in 0..2 {
            let name = format!("web-{round}-{n}");
            let object = api_pod(&name, &injected, &[VALIDATOR]);
            api.put(object.clone());
            node.run_pod_with(&name, &[PROXY_VERSION], false)
                .unwrap_or_else(|e| panic!("RunPodSandbox of {name}: {e}"));
            names.push(name);
            objects.push(object);
        }
        if held {
            nix::sys::signal::kill(installer_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !chained() {
            assert!(Instant::now() < deadline, "{}", installer_says());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The kubelet reports the pods' containers; each is meshed once, by its ADD or repaired.
    for object in &objects {
        api.put(fake_api::reported(
            object,
            "Running",
            &["app", "linkerd-proxy"],
        ));
    }
    let expected: Vec<&str> = names.iter().map(String::as_str).collect();
    node.wait_registered(&expected);
    let added = std::fs::read_to_string(node.dir.join("cni.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("ADD: ") && l.ends_with(" registered"))
        .count();
    eprintln!("{added} of {} pods registered by their ADD", names.len());
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics, "interceptor_cni_chain_restored_total") != Some(3.0) {
        assert!(
            Instant::now() < deadline,
            "restores counted: {:?}; {}",
            metric(&metrics, "interceptor_cni_chain_restored_total"),
            installer_says()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        added <= 2,
        "the pods started while the installer was held had no ADD of ours"
    );
    assert_eq!(
        metric(&metrics, "interceptor_pods_repaired_total"),
        Some((names.len() - added) as f64),
        "{added} of {} pods registered by their ADD, the others repaired",
        names.len()
    );
    node.wait_registered(&expected);
    let _ = installer.kill();
    let _ = installer.wait();
}

/// Waits until process `pid` is stopped (state `T` in `/proc/PID/stat`).
fn wait_stopped(pid: nix::unistd::Pid) {
    let path = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(&path).unwrap_or_default();
        // The state follows the command name, which may hold spaces and parentheses.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("T") {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} never stopped: {stat:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The chart's default image is the one `ctr -n k8s.io images import` of `cargo xtask image`'s
/// archive names: the CRI finds it under the rendered reference, so the kubelet, with the
/// rendered pull policy, pulls nothing, and the default chart needs no registry. A container of
/// it then starts through the CRI as the kubelet starts the DaemonSet's. `linkerd-interceptor`
/// comes out of it with `ctr images mount`, as the docs say, and runs here as `linkerd check`
/// runs it.
#[test]
fn the_charts_default_image_imported_with_ctr_runs_through_cri_without_a_registry() {
    if !privileged() {
        return;
    }
    let Some(archive) = node_image::archive() else {
        return;
    };
    let rendered = chart::render(&[]);
    let agent = chart::container(rendered.daemonset(), "agent");
    let image = agent["image"].as_str().expect("an image").to_owned();
    let policy = &agent["imagePullPolicy"];
    assert!(
        policy == "IfNotPresent" || policy == "Never",
        "{policy}: the kubelet would pull"
    );
    let mut node = Node::new("ctrdimage");
    assert!(!node.image_present(&image), "{image} before the import");
    node.import_image(&archive);
    assert!(
        node.image_present(&image),
        "the CRI does not find {image} after `ctr -n k8s.io images import`"
    );

    let pod = node.run_pod("linkerd-cni", &[]).expect("RunPodSandbox");
    let exited = node.run_to_exit(&pod, "agent", &image, &["--version"]);
    let tag = image.rsplit(':').next().unwrap();
    assert_eq!(exited.exit_code, 0, "{}", exited.output);
    assert_eq!(exited.output.trim(), format!("interceptor {tag}"));

    // linkerd-interceptor, copied out of the image (it has no shell for `kubectl cp`).
    let mount = node.dir.join("image-mount");
    std::fs::create_dir_all(&mount).unwrap();
    let out = node
        .ctr(&["images", "mount", &image])
        .arg(&mount)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copied = node.dir.join("linkerd-interceptor");
    let copy = std::fs::copy(mount.join("usr/local/bin/linkerd-interceptor"), &copied);
    let out = node
        .ctr(&["images", "unmount", "--rm"])
        .arg(&mount)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    copy.expect("linkerd-interceptor in the image");
    let cluster = Cluster::start(healthy());
    let args: Vec<&str> = ["check"].iter().chain(LINKERD_FLAGS).copied().collect();
    let output = cluster.run(&copied, &args);
    assert_eq!(output.status.code(), Some(0));
    let json: Value = serde_json::from_slice(&output.stdout).expect("Linkerd's JSON");
    assert_eq!(json["success"], true, "{json:#}");
}
