//! The CNI plugin driven as a container runtime drives it: CNI environment variables, the
//! network configuration on stdin, chained after Debian's reference plugins (bridge with
//! host-local IPAM), whose result it must pass through. The "node" is a network namespace of
//! the test's own, with no route out: the bridge and the pods' gateway live there.
use std::{
    os::unix::net::{UnixListener, UnixStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use interceptor_tests::{
    Cgroup, Landing, Netns, PodFixture,
    agent_home::{AgentHome, free_loopback_addr, http_get},
    cni_network::{POD_ANNOTATIONS, chained},
    cni_node::Node,
    privileged,
    scenario::{APP_UID, PROXY_UID},
    unique_name,
};
use serde_json::{Value, json};

const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");
const UNREACHABLE: &str = "192.0.2.2:1404";

/// A pod as the runtime creates it: a network namespace; its processes run in the fixture's
/// cgroup, which the agent's programs are attached to.
fn pod_process(fixture: &PodFixture, netns: &Netns) -> interceptor_tests::Probe {
    interceptor_tests::Probe::new()
        .netns(&netns.path())
        .cgroup(&fixture.cgroup.path)
}

#[test]
fn pods_added_by_the_runtime_are_intercepted_from_their_first_connect() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cni");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let node = Node::new(&home, 91);
    let (web, db) = (Netns::new("cniweb"), Netns::new("cnidb"));

    let (ok, bridge, ours) = node.add("web", &web.path());
    assert!(ok, "ADD: {ours}");
    // Chained: the previous result, unchanged.
    assert_eq!(ours, bridge);
    let (ok, _, ours) = node.add("db", &db.path());
    assert!(ok, "ADD: {ours}");
    let db_addr = Node::pod_address(&ours);

    // The containers start after ADD: their very first connects are intercepted.
    let _web_proxy = pod_process(&fixture, &web).uid(PROXY_UID).listen(&[
        "proxy",
        "127.0.0.1:4140",
        "--name",
        "outbound",
    ]);
    let _db_proxy = pod_process(&fixture, &db).uid(PROXY_UID).listen(&[
        "proxy",
        "0.0.0.0:4143",
        "--name",
        "inbound",
    ]);
    let _db_app =
        pod_process(&fixture, &db).listen(&["server", "0.0.0.0:4190", "--name", "db-admin"]);
    let web_app = pod_process(&fixture, &web).uid(APP_UID);
    assert_eq!(
        web_app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    // From the node (a client of the pod): steered to db's proxy, the ignored port to the app.
    let node_client = interceptor_tests::Probe::new().netns(&node.netns.path());
    let target = format!("{db_addr}:80");
    match node_client.connect(&target) {
        Landing::Proxy {
            name,
            orig: Ok(orig),
            ..
        } => {
            assert_eq!(name, "inbound");
            assert_eq!(orig.to_string(), target);
        }
        other => panic!("expected db's inbound proxy, got {other:?}"),
    }
    assert_eq!(
        node_client
            .connect(&format!("{db_addr}:4190"))
            .server_name(),
        "db-admin"
    );

    let pods = home.pods();
    assert_eq!(pods.len(), 2);
    assert!(pods.iter().all(|p| p["meta"]["namespace"] == "shop"));

    // CHECK: registered with this configuration.
    let (ok, out) = node.ours(
        "CHECK",
        "web",
        Some(&web.path()),
        json!({ "prevResult": bridge }),
    );
    assert!(ok, "CHECK: {out}");
    // STATUS: the agent runs.
    let (ok, out) = node.ours("STATUS", "", None, json!({}));
    assert!(ok, "STATUS: {out}");

    // GC: only db is still a valid attachment, web goes.
    let (ok, out) = node.ours(
        "GC",
        "",
        None,
        json!({ "cni.dev/valid-attachments": [{ "containerID": "db", "ifname": "eth0" }] }),
    );
    assert!(ok, "GC: {out}");
    assert_eq!(home.pods().len(), 1);
    assert_eq!(
        web_app.connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into()),
        "a removed pod is no longer intercepted"
    );
    // CHECK of the removed pod fails with our code.
    let (ok, out) = node.ours(
        "CHECK",
        "web",
        Some(&web.path()),
        json!({ "prevResult": bridge }),
    );
    assert!(!ok);
    assert_eq!(out["code"], 101, "{out}");

    // DEL without a namespace (already gone): found by container id. Twice: idempotent.
    for _ in 0..2 {
        let (ok, out) = node.ours("DEL", "db", None, json!({}));
        assert!(ok, "DEL: {out}");
    }
    assert!(home.pods().is_empty());
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(log.contains("ADD: ok") && log.contains("DEL: ok"), "{log}");
}

#[test]
fn add_fails_with_try_again_later_when_the_agent_is_not_running() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cnidown");
    let home = AgentHome::new(&fixture.cgroup.path);
    let node = Node::new(&home, 92);
    let pod = Netns::new("cnidownpod");
    let (ok, _, out) = node.add("down", &pod.path());
    assert!(!ok, "ADD without an agent must fail");
    assert_eq!(out["code"], 11, "{out}");
    assert_eq!(out["cniVersion"], "1.0.0");
    // Nothing was meshed: the pod's connects go where they are sent.
    let _proxy = pod_process(&fixture, &pod).uid(PROXY_UID).listen(&[
        "proxy",
        "127.0.0.1:4140",
        "--name",
        "outbound",
    ]);
    assert_eq!(
        pod_process(&fixture, &pod)
            .uid(APP_UID)
            .connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    // DEL with the agent gone succeeds.
    let (ok, out) = node.ours("DEL", "down", Some(&pod.path()), json!({}));
    assert!(ok, "DEL: {out}");
}

#[test]
fn a_bad_linkerd_block_is_refused_with_the_invalid_configuration_code() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cnibad");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let node = Node::new(&home, 93);
    let pod = Netns::new("cnibadpod");
    for (linkerd, names) in [
        (
            json!({ "incoming-proxy-prot": 4143 }),
            "incoming-proxy-prot",
        ),
        (json!({ "outbound-ports-to-ignore": ["99999"] }), "99999"),
    ] {
        let (ok, out) = node.ours(
            "ADD",
            "bad",
            Some(&pod.path()),
            json!({ "linkerd": linkerd }),
        );
        assert!(!ok);
        assert_eq!(out["code"], 7, "{out}");
        assert!(out["details"].as_str().unwrap().contains(names), "{out}");
    }
    assert!(home.pods().is_empty());
    let (ok, out) = node.ours("VERSION", "", None, json!({}));
    assert!(ok);
    assert!(
        out["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("0.4.0")),
        "{out}"
    );
}

/// A pod's annotations as containerd passes them.
fn annotated(annotations: &[(&str, &str)]) -> Value {
    let map: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({ POD_ANNOTATIONS: map })
}

const PROXY_VERSION: (&str, &str) = ("linkerd.io/proxy-version", "edge-24.11.8");

#[test]
fn only_the_pods_linkerd_injected_are_meshed_each_with_its_own_annotations() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cnisel");
    let home = AgentHome::new(&fixture.cgroup.path);
    let metrics = free_loopback_addr();
    let _agent = home.agent().args(&["--metrics-addr", &metrics]).start();
    let node = Node::new(&home, 94);
    // A real destination on the node, which the pods reach through their gateway.
    let _node_server = interceptor_tests::Probe::new()
        .netns(&node.netns.path())
        .listen(&["server", "0.0.0.0:1404", "--name", "node-server"]);
    let (meshed, plain, skipper) = (
        Netns::new("cnimeshed"),
        Netns::new("cniplain"),
        Netns::new("cniskip"),
    );

    let (ok, _, out) = node.add_with("meshed", &meshed.path(), annotated(&[PROXY_VERSION]));
    assert!(ok, "ADD: {out}");
    // Not injected: annotations of its own, but not Linkerd's marker.
    let (ok, bridge, out) = node.add_with(
        "plain",
        &plain.path(),
        annotated(&[("app", "web"), ("linkerd.io/inject", "enabled")]),
    );
    assert!(ok, "ADD: {out}");
    assert_eq!(out, bridge, "a skipped pod gets the previous result as is");
    let (ok, _, out) = node.add_with(
        "skipper",
        &skipper.path(),
        annotated(&[
            PROXY_VERSION,
            ("config.linkerd.io/skip-outbound-ports", "1404"),
        ]),
    );
    assert!(ok, "ADD: {out}");

    let pods = home.pods();
    let mut names: Vec<&str> = pods
        .iter()
        .map(|p| p["meta"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["meshed", "skipper"],
        "the plain pod is not registered"
    );
    // ...but counted, by reason.
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(
        body.lines()
            .any(|l| l == "interceptor_cni_pods_skipped_total{reason=\"not_injected\"} 1"),
        "{body}"
    );
    let skipper_record = pods
        .iter()
        .find(|p| p["meta"]["name"] == "skipper")
        .unwrap();
    assert_eq!(skipper_record["meta"]["namespace"], "shop");
    assert_eq!(skipper_record["meta"]["uid"], "uid-skipper");
    assert_eq!(skipper_record["config"]["outbound_ports_to_ignore"], "1404");

    let gateway = "10.94.0.1";
    let (to_1404, to_80) = (format!("{gateway}:1404"), format!("{gateway}:80"));
    for pod in [&meshed, &skipper] {
        let _proxy = pod_process(&fixture, pod).uid(PROXY_UID).listen(&[
            "proxy",
            "127.0.0.1:4140",
            "--name",
            "outbound",
        ]);
        let app = pod_process(&fixture, pod).uid(APP_UID);
        // Both meshed from their first connect...
        assert_eq!(app.connect(&to_80).proxy_orig().to_string(), to_80);
        // ...and 1404 skipped for the pod whose annotation says so, and for it only.
        if std::ptr::eq(pod, &skipper) {
            assert_eq!(app.connect(&to_1404).server_name(), "node-server");
        } else {
            assert_eq!(app.connect(&to_1404).proxy_orig().to_string(), to_1404);
        }
    }
    // The plain pod reaches its real destination directly, from its first connect.
    let plain_app = pod_process(&fixture, &plain).uid(APP_UID);
    assert_eq!(plain_app.connect(&to_1404).server_name(), "node-server");

    // CHECK follows the same decision: the plain pod has nothing to check.
    let (ok, out) = node.ours(
        "CHECK",
        "plain",
        Some(&plain.path()),
        json!({ "prevResult": bridge, "runtimeConfig": annotated(&[("app", "web")]) }),
    );
    assert!(ok, "CHECK: {out}");
    let (ok, out) = node.ours("DEL", "plain", Some(&plain.path()), json!({}));
    assert!(ok, "DEL: {out}");
    assert_eq!(home.pods().len(), 2);
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("pod shop/plain not meshed: not injected by Linkerd (no linkerd.io/proxy-version annotation)"),
        "{log}"
    );
}

#[test]
fn a_malformed_annotation_or_no_annotations_at_all_leave_the_pod_unregistered() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cniann");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let node = Node::new(&home, 95);
    let pod = Netns::new("cniannpod");
    for (annotation, value) in [
        ("config.linkerd.io/skip-outbound-ports", "25,smtp"),
        ("config.linkerd.io/skip-subnets", "10.0.0.0/33"),
        ("config.linkerd.io/proxy-uid", "linkerd"),
    ] {
        let (ok, out) = node.ours(
            "ADD",
            "bad",
            Some(&pod.path()),
            json!({ "runtimeConfig": annotated(&[PROXY_VERSION, (annotation, value)]) }),
        );
        assert!(!ok);
        assert_eq!(out["code"], 7, "{out}");
        let details = out["details"].as_str().unwrap();
        assert!(
            details.starts_with(&format!("invalid value '{value}' for '{annotation}': ")),
            "{out}"
        );
        assert!(home.pods().is_empty(), "{annotation}: nothing registered");
    }
    // A Kubernetes pod whose runtime passed no annotations may be one Linkerd injected: it must
    // not start unmeshed, so the runtime is told to try again.
    let (ok, out) = node.ours(
        "ADD",
        "bare",
        Some(&pod.path()),
        json!({ "runtimeConfig": {} }),
    );
    assert!(!ok);
    assert_eq!(out["code"], 11, "{out}");
    assert!(
        out["details"].as_str().unwrap().contains(POD_ANNOTATIONS),
        "{out}"
    );
    assert!(home.pods().is_empty());
    // Unless the conflist says every pod is meshed.
    let (ok, out) = node.ours(
        "ADD",
        "bare",
        Some(&pod.path()),
        json!({ "runtimeConfig": {}, "pods": "all" }),
    );
    assert!(ok, "ADD: {out}");
    assert_eq!(home.pods().len(), 1);
    let (ok, out) = node.ours("DEL", "bare", Some(&pod.path()), json!({}));
    assert!(ok, "DEL: {out}");
    assert!(home.pods().is_empty());
}

/// `interceptor cni install --watch` against a Calico-shaped configuration that Calico rewrites
/// while it watches; then `uninstall` gives back exactly the original.
#[test]
fn the_installer_keeps_the_plugin_chained_when_the_primary_cni_rewrites_its_file() {
    let root = std::env::temp_dir().join(unique_name("cniinstall"));
    let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let calico = json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
        {"type": "calico", "ipam": {"type": "calico-ipam"}},
        {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]});
    let primary = conf_dir.join("10-calico.conflist");
    let write_calico = || std::fs::write(&primary, calico.to_string()).unwrap();
    write_calico();
    primary_plugins(&bin_dir, &["calico", "portmap"]);
    let dirs = |cmd: &mut Command| {
        cmd.args(["--conf-dir", &conf_dir.display().to_string()])
            .args(["--bin-dir", &bin_dir.display().to_string()]);
    };
    let mut install = Command::new(env!("CARGO_BIN_EXE_interceptor-under-test"));
    install
        .args(["cni", "install", "--watch", "--plugin", PLUGIN])
        .args([
            "--linkerd",
            r#"{"proxy-uid": 2102, "outbound-ports-to-ignore": ["443"]}"#,
        ])
        // No agent there: the restores' counts are logged as not delivered, never sent to the
        // node's agent.
        .arg("--agent-socket")
        .arg(root.join("agent.sock"));
    dirs(&mut install);
    let mut watching = install.stderr(Stdio::null()).spawn().unwrap();
    let eventually = |what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while chained(&primary) != 1 {
            assert!(std::time::Instant::now() < deadline, "{what}: not chained");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    eventually("install");
    assert!(bin_dir.join("interceptor-cni").is_file());
    for round in 0..3 {
        write_calico();
        eventually(&format!("after Calico's rewrite {round}"));
    }
    // SIGTERM (the DaemonSet's pod stopping): it removes exactly what it added, then exits.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(watching.id() as i32, libc::SIGTERM) };
    assert!(watching.wait().unwrap().success());
    let back: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
    assert_eq!(back, calico);
    assert!(!bin_dir.join("interceptor-cni").exists());

    // Uninstalling again finds nothing of ours and changes nothing.
    let mut uninstall = Command::new(env!("CARGO_BIN_EXE_interceptor-under-test"));
    uninstall.args(["cni", "uninstall"]);
    dirs(&mut uninstall);
    assert!(uninstall.stderr(Stdio::null()).status().unwrap().success());
    let back: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
    assert_eq!(back, calico);
    let _ = std::fs::remove_dir_all(&root);
}

/// `interceptor cni install` declares the capability under which containerd passes the pod's
/// annotations, and writes `--pods` when given; a value other than injected or all is refused.
#[test]
fn the_installer_declares_the_pod_annotations_capability() {
    let root = std::env::temp_dir().join(unique_name("cnicap"));
    let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let primary = conf_dir.join("10-flannel.conflist");
    primary_plugins(&bin_dir, &["flannel"]);
    std::fs::write(
        &primary,
        json!({"name": "cbr0", "cniVersion": "0.3.1", "plugins": [
            {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}}]})
        .to_string(),
    )
    .unwrap();
    let install = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_interceptor-under-test"))
            .args(["cni", "install", "--plugin", PLUGIN])
            .args(["--conf-dir", &conf_dir.display().to_string()])
            .args(["--bin-dir", &bin_dir.display().to_string()])
            .args(extra)
            .stderr(Stdio::null())
            .status()
            .unwrap()
    };
    let ours = || -> Value {
        let list: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
        list["plugins"][1].clone()
    };
    assert!(install(&[]).success());
    assert_eq!(ours()["type"], "interceptor-cni");
    assert_eq!(ours()["capabilities"], json!({ POD_ANNOTATIONS: true }));
    assert!(ours().get("pods").is_none(), "the plugin's default applies");
    assert!(install(&["--pods", "all"]).success());
    assert_eq!(ours()["pods"], "all");
    assert_eq!(ours()["capabilities"], json!({ POD_ANNOTATIONS: true }));
    assert_eq!(install(&["--pods", "some"]).code(), Some(2));
    assert_eq!(ours()["pods"], "all", "a refused install changes nothing");
    let _ = std::fs::remove_dir_all(&root);
}

/// The primary network's plugins in the bin directory, as a node has them (stand-ins: the
/// installer only looks for them).
fn primary_plugins(bin_dir: &Path, kinds: &[&str]) {
    std::fs::create_dir_all(bin_dir).unwrap();
    for kind in kinds {
        std::fs::write(bin_dir.join(kind), b"#!/bin/false\n").unwrap();
    }
}

/// Every file under `dir`, with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(snapshot(&path));
        } else {
            files.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    files.sort();
    files
}

/// A primary network whose plugins' binaries are not in `--bin-dir` (the DaemonSet's default
/// `/opt/cni/bin` on GKE, say): `interceptor cni install` refuses, names what is missing and
/// where, and writes nothing in either directory; with the binaries there it chains as before.
#[test]
fn the_installer_refuses_a_bin_dir_without_the_primarys_plugins_and_writes_nothing() {
    let root = std::env::temp_dir().join(unique_name("cnimissing"));
    let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    let primary = conf_dir.join("10-calico.conflist");
    std::fs::write(
        &primary,
        json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
            {"type": "calico", "ipam": {"type": "calico-ipam"}},
            {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        conf_dir.join("99-loopback.conf"),
        r#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#,
    )
    .unwrap();
    // portmap is there; calico, the primary plugin itself, is not.
    primary_plugins(&bin_dir, &["portmap"]);
    let install = || {
        Command::new(env!("CARGO_BIN_EXE_interceptor-under-test"))
            .args(["cni", "install", "--plugin", PLUGIN])
            .args(["--conf-dir", &conf_dir.display().to_string()])
            .args(["--bin-dir", &bin_dir.display().to_string()])
            .output()
            .unwrap()
    };
    let before = snapshot(&root);
    let out = install();
    assert!(!out.status.success(), "refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for expected in [
        primary.display().to_string(),
        bin_dir.display().to_string(),
        ": calico;".to_owned(),
        "--bin-dir".to_owned(),
        "/home/kubernetes/bin".to_owned(),
        "nothing was written".to_owned(),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} not in {stderr}");
    }
    assert!(!stderr.contains("portmap"), "{stderr}");
    assert_eq!(snapshot(&root), before, "both directories as they were");

    primary_plugins(&bin_dir, &["calico"]);
    let out = install();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(chained(&primary), 1);
    assert_eq!(
        std::fs::read(bin_dir.join("interceptor-cni")).unwrap(),
        std::fs::read(PLUGIN).unwrap()
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// `interceptor cni install --watch` started before the primary's plugins are in the bin
/// directory (the primary CNI's own installer still copying them) keeps running, writes nothing,
/// and chains as soon as they appear.
#[test]
fn the_watching_installer_chains_once_the_primarys_plugins_appear() {
    let root = std::env::temp_dir().join(unique_name("cniwatchbin"));
    let (conf_dir, bin_dir) = (root.join("net.d"), root.join("bin"));
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::create_dir_all(&bin_dir).unwrap();
    let calico = json!({"name": "k8s-pod-network", "cniVersion": "0.3.1", "plugins": [
        {"type": "calico", "ipam": {"type": "calico-ipam"}},
        {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}]});
    let primary = conf_dir.join("10-calico.conflist");
    std::fs::write(&primary, calico.to_string()).unwrap();
    let log = root.join("install.log");
    let mut watching = Command::new(env!("CARGO_BIN_EXE_interceptor-under-test"))
        .args(["cni", "install", "--watch", "--plugin", PLUGIN])
        .args(["--conf-dir", &conf_dir.display().to_string()])
        .args(["--bin-dir", &bin_dir.display().to_string()])
        .arg("--agent-socket")
        .arg(root.join("agent.sock"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let before = snapshot(&conf_dir);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        watching.try_wait().unwrap().is_none(),
        "the watching installer exited: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(snapshot(&conf_dir), before, "nothing chained");
    assert!(!bin_dir.join("interceptor-cni").exists());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("not chained") && logged.contains("calico, portmap"),
        "{logged}"
    );

    primary_plugins(&bin_dir, &["calico", "portmap"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while chained(&primary) != 1 {
        assert!(
            Instant::now() < deadline,
            "not chained once the plugins appeared: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(bin_dir.join("interceptor-cni").is_file());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(watching.id() as i32, libc::SIGTERM) };
    assert!(watching.wait().unwrap().success());
    let back: Value = serde_json::from_slice(&std::fs::read(&primary).unwrap()).unwrap();
    assert_eq!(back, calico);
    let _ = std::fs::remove_dir_all(&root);
}

/// STATUS is about the plugin, not the agent: ready with the agent down (which only delays the
/// pods Linkerd injected; a runtime polling STATUS must not take the node out of service for
/// it), and failing with the invalid-configuration code for a configuration the plugin cannot
/// work with, agent or not.
#[test]
fn status_is_ready_without_an_agent_and_fails_only_for_an_invalid_configuration() {
    if !privileged() {
        return;
    }
    let cgroup = Cgroup::new("cnistatus");
    let home = AgentHome::new(&cgroup.path);
    let node = Node::new(&home, 96);
    let invalid = [
        (
            json!({ "linkerd": { "incoming-proxy-prot": 4143 } }),
            "incoming-proxy-prot",
        ),
        (
            json!({ "linkerd": { "outbound-ports-to-ignore": ["99999"] } }),
            "99999",
        ),
        (json!({ "pods": "some" }), "\"some\""),
    ];
    let refused = |node: &Node| {
        for (conf, names) in &invalid {
            let (ok, out) = node.ours("STATUS", "", None, conf.clone());
            assert!(!ok, "STATUS of {conf}: {out}");
            assert_eq!(out["code"], 7, "{out}");
            assert!(out["details"].as_str().unwrap().contains(names), "{out}");
        }
    };

    let (ok, out) = node.ours("STATUS", "", None, json!({}));
    assert!(ok, "STATUS with the agent down: {out}");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("STATUS: ready, but the agent does not answer: pods Linkerd injected wait (ADD answers 11)"),
        "{log}"
    );
    refused(&node);

    let _agent = home.agent().start();
    let (ok, out) = node.ours("STATUS", "", None, json!({}));
    assert!(ok, "STATUS: {out}");
    let lines = |log: &str| log.matches("does not answer").count();
    assert_eq!(
        lines(&std::fs::read_to_string(&node.log).unwrap()),
        lines(&log),
        "nothing to say with the agent up"
    );
    refused(&node);
}

/// An agent that takes connections and never answers (hung): each connection is accepted and
/// held open, its request never read.
struct SilentAgent {
    dir: PathBuf,
    held: Arc<Mutex<Vec<UnixStream>>>,
}

impl SilentAgent {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(unique_name("cnisilent"));
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("agent.sock")).unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let holder = held.clone();
        // Blocked in accept once the test is done; the test process ends it.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                holder.lock().unwrap().push(stream);
            }
        });
        Self { dir, held }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    fn connections(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for SilentAgent {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pod Linkerd did not inject is never held up by the agent: its notice to a hung agent is
/// given up after its short deadline, and ADD succeeds.
#[test]
fn a_pod_not_injected_is_not_held_up_by_an_agent_that_never_answers() {
    if !privileged() {
        return;
    }
    let cgroup = Cgroup::new("cnisilentplain");
    let home = AgentHome::new(&cgroup.path);
    let node = Node::new(&home, 97);
    let agent = SilentAgent::start();
    let pod = Netns::new("cnisilentplain");
    let started = Instant::now();
    let (ok, out) = node.ours(
        "ADD",
        "plain",
        Some(&pod.path()),
        json!({
            "agent_socket": agent.socket(),
            "runtimeConfig": annotated(&[("app", "plain")]),
        }),
    );
    let took = started.elapsed();
    assert!(ok, "ADD: {out}");
    assert!(took < Duration::from_millis(1500), "ADD took {took:?}");
    assert_eq!(agent.connections(), 1, "the agent was asked");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(
        log.contains("ADD: the agent was not told: the interceptor agent at")
            && log.contains("did not answer within 250 ms"),
        "{log}"
    );
}

/// An injected pod against a hung agent: ADD answers 11 (try again later) within the plugin's
/// deadlines, whether it was waiting for the pod's labels or for its registration; it never
/// starts unmeshed, and never waits the runtime's own minutes.
#[test]
fn an_injected_pod_fails_with_try_again_later_when_the_agent_never_answers() {
    if !privileged() {
        return;
    }
    let cgroup = Cgroup::new("cnisilentweb");
    let home = AgentHome::new(&cgroup.path);
    let node = Node::new(&home, 98);
    let agent = SilentAgent::start();
    let pod = Netns::new("cnisilentweb");
    let add = |extra: Value| {
        let mut conf = json!({
            "agent_socket": agent.socket(),
            "runtimeConfig": annotated(&[PROXY_VERSION]),
        });
        if let (Value::Object(conf), Value::Object(extra)) = (&mut conf, extra) {
            conf.extend(extra);
        }
        let started = Instant::now();
        let (ok, out) = node.ours("ADD", "web", Some(&pod.path()), conf);
        (ok, out, started.elapsed())
    };
    // Side by side: the lookup of the pod's labels (10 s), and with "pods": "all" (no lookup)
    // the registration (15 s).
    let (lookup, registration) = std::thread::scope(|s| {
        let lookup = s.spawn(|| add(json!({})));
        let registration = s.spawn(|| add(json!({ "pods": "all" })));
        (lookup.join().unwrap(), registration.join().unwrap())
    });
    for ((ok, out, took), deadline) in [(lookup, 10), (registration, 15)] {
        assert!(!ok, "ADD against a silent agent: {out}");
        assert_eq!(out["code"], 11, "{out}");
        let details = out["details"].as_str().unwrap();
        assert!(
            details.contains(&format!("did not answer within {} ms", deadline * 1000)),
            "{out}"
        );
        let deadline = Duration::from_secs(deadline);
        assert!(
            took >= deadline && took < deadline + Duration::from_secs(3),
            "ADD took {took:?}, the deadline is {deadline:?}"
        );
    }
}
