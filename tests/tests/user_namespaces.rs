//! Pods with a user namespace of their own (Kubernetes' `hostUsers: false`: the pod's ids
//! 0-65535 are the host's 200000-265535), intercepted as Linkerd's `linkerd-init` container
//! intercepts them from inside the pod: the proxy's UID and GID are the pod's ids. The rows of
//! the behaviour table that tell processes by their ids run in such a pod on every backend; the
//! owner match's own edges (a supplementary group, a socket made before a `setuid`) and an id
//! the pod does not map are tested beside them, and so are the paths a node meshes such a pod
//! by: the agent (registration through the CNI plugin's ADD, its record, a restart's restore)
//! and `interceptor run`, with both backends.
use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use interceptor::{config::InterceptionConfig, iptables::IptablesMode};
use interceptor_tests::{
    PodFixture,
    agent_home::{AgentHome, UNREACHABLE, stderr},
    cni_network::{CniNetwork, injected},
    ebpf_backend::Ebpf,
    fixture::POD_USERS_ON_HOST,
    iptables_backend::Iptables,
    meshed::{Meshed, run_args},
    privileged,
    probe::Landing,
    scenario::{self, APP_UID, Backend, Family, PROXY_GID, PROXY_UID, Servers, linkerd_config},
};
use serde_json::Value;

macro_rules! rows {
    ($backend:expr, $family:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if privileged() {
                scenario::run_in(
                    &$backend,
                    scenario::scenario(stringify!($name)),
                    $family,
                    PodFixture::with_own_users("uns"),
                );
            }
        }
    )*};
}

macro_rules! backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            mod ipv4 {
                use super::*;
                rows!($backend, Family::Ipv4;
                    redirects_to_a_remote_address,
                    proxy_uid_is_exempt,
                    proxy_uid_connects_to_the_real_address,
                    uid_0_is_never_the_proxy,
                    proxy_gid_is_exempt,
                    a_gid_is_only_exempt_when_configured,
                    inbound_is_steered_to_the_proxy,
                    the_proxy_forwarding_to_the_app_does_not_loop,
                );
            }

            mod ipv6 {
                use super::*;
                rows!($backend, Family::Ipv6;
                    proxy_uid_is_exempt,
                    proxy_uid_connects_to_the_real_address,
                    redirects_to_a_remote_address,
                );
            }

            #[test]
            fn a_supplementary_group_is_not_the_proxys_group() {
                if privileged() {
                    supplementary_group(&$backend);
                }
            }

            #[test]
            fn a_socket_keeps_the_ids_it_was_created_with() {
                if privileged() {
                    socket_created_before_setuid(&$backend);
                }
            }
        }
    };
}

backend!(ebpf, Ebpf);
backend!(iptables_legacy, Iptables(IptablesMode::Legacy));
backend!(iptables_nft, Iptables(IptablesMode::Nft));

fn with_proxy_gid() -> InterceptionConfig {
    InterceptionConfig {
        proxy_gid: Some(PROXY_GID),
        ..linkerd_config()
    }
}

/// proxy-init's owner match has no `--suppl-groups`: a process of the proxy's group only as a
/// supplementary one is redirected.
fn supplementary_group(backend: &dyn Backend) {
    let fixture = PodFixture::with_own_users("uns-groups");
    let _servers = Servers::start(&fixture);
    let _attached = backend.attach(&fixture, &with_proxy_gid());
    let app = fixture
        .in_pod()
        .uid(APP_UID)
        .gid(APP_UID)
        .groups(&[PROXY_GID]);
    let (landing, _) = app.connect_seen("10.77.0.2:80", &[]);
    assert!(
        matches!(&landing, Landing::Proxy { name, orig: Ok(orig), .. }
            if name == "outbound" && orig.to_string() == "10.77.0.2:80"),
        "{landing:?}"
    );
    // The same group as the process's own is the proxy's.
    let (landing, _) = fixture
        .in_pod()
        .uid(APP_UID)
        .gid(PROXY_GID)
        .connect_seen("10.77.0.2:80", &[]);
    assert!(
        matches!(&landing, Landing::Server { name, .. } if name == "remote-80"),
        "{landing:?}"
    );
}

/// The owner match reads the credentials a socket was created with: one made as the proxy
/// and connected after becoming the app is the proxy's, and the other way round the app's.
fn socket_created_before_setuid(backend: &dyn Backend) {
    let fixture = PodFixture::with_own_users("uns-setuid");
    let _servers = Servers::start(&fixture);
    let _attached = backend.attach(&fixture, &linkerd_config());
    let (proxy, app) = (
        format!("{PROXY_UID}:{PROXY_UID}:{PROXY_UID}:{PROXY_UID}"),
        format!("{APP_UID}:{APP_UID}:{APP_UID}:{APP_UID}"),
    );
    let lines = format!(
        "10.77.0.2:80 --socket-creds {proxy} --creds {app}\n\
         10.77.0.2:80 --socket-creds {app} --creds {proxy}\n"
    );
    let out = fixture.in_pod().run_with_input(&["probes"], &lines);
    let landings: Vec<Landing> = out.iter().map(|line| Landing::parse(line)).collect();
    assert!(
        matches!(&landings[0], Landing::Server { name, .. } if name == "remote-80"),
        "made as the proxy, connected as the app: {landings:?}"
    );
    assert!(
        matches!(&landings[1], Landing::Proxy { name, .. } if name == "outbound"),
        "made as the app, connected as the proxy: {landings:?}"
    );
}

/// An id the pod's namespace does not map can be no process's: refused by name on both
/// backends (the kernel would refuse the owner match with a bare "Invalid argument").
#[test]
fn an_id_the_pod_does_not_map_is_refused() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::with_own_users("uns-unmapped");
    let config = InterceptionConfig {
        proxy_uid: Some(70000),
        ..linkerd_config()
    };
    let users = interceptor::netns::PodNetns::open(&fixture.pod.path())
        .and_then(|netns| netns.users())
        .expect("the pod's user namespace");
    let e = users.host_ids(&config).unwrap_err();
    assert!(
        e.to_string()
            .contains("does not map its proxy-uid 70000 (it maps 0-65535)"),
        "{e}"
    );
    let out = std::process::Command::new(BIN)
        .args(["run", "--mode", "iptables", "--netns"])
        .arg(fixture.pod.path())
        .args(["-p", "4143", "-o", "4140", "-u", "70000"])
        .output()
        .expect("interceptor run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("does not map its proxy-uid 70000"),
        "{stderr}"
    );
    let nat = interceptor::iptables::save_nat(
        &Iptables(IptablesMode::Legacy).options(&fixture, false),
        interceptor::iptables::Family::V4,
    )
    .expect("iptables-save");
    assert!(!nat.contains("PROXY_INIT"), "nothing written: {nat}");
}

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");
const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");

/// The pod's app lands on the proxy with its original destination, the proxy (2102 in the
/// pod) reaches its destination, and inbound reaches the inbound proxy.
fn assert_meshed(fixture: &PodFixture) {
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE,
        "the app lands on the proxy"
    );
    assert_eq!(
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .connect("10.77.0.2:80")
            .server_name(),
        "remote-80",
        "the proxy, 2102 in the pod, reaches its destination"
    );
    match fixture.on_remote().connect("10.77.0.1:80") {
        Landing::Proxy {
            name,
            orig: Ok(orig),
            ..
        } => assert_eq!(
            (name.as_str(), orig.to_string().as_str()),
            ("inbound", "10.77.0.1:80")
        ),
        other => panic!("expected the inbound proxy, got {other:?}"),
    }
}

/// The node agent meshes a user-namespaced pod through the CNI plugin's ADD (the plugin run as
/// a runtime runs it, with the pod's namespace path), records the proxy's ids as the host knows
/// them, and takes the pod back after a restart.
fn agent_meshes_through_the_plugin(mode: &str) {
    let fixture = PodFixture::with_own_users("uns-agent");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let args = ["--mode", mode, "-w"];
    let agent = home.agent().args(&args).start();
    let network = CniNetwork::new("uns-node");
    let installed = network
        .install(Path::new(BIN), Path::new(PLUGIN), &home.socket())
        .output()
        .unwrap();
    assert!(installed.status.success(), "{}", stderr(&installed));
    // As the kubelet does, an ADD that says "try again later" (11) is tried again: in the
    // kernel matrix's guests, iptables runs queued on the xtables lock can outlast its wait.
    let deadline = Instant::now() + Duration::from_secs(240);
    while let Err(e) = network.add("web", &fixture.pod.path(), &injected()) {
        assert!(
            e.contains(r#""code":11"#) && Instant::now() < deadline,
            "ADD: {e}"
        );
    }
    let pods = home.pods();
    assert_eq!(pods.len(), 1, "{pods:#?}");
    assert_meshed(&fixture);
    let record = std::fs::read_dir(home.state_dir.join("agent-pods"))
        .expect("the records")
        .filter_map(Result::ok)
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap())
        .next()
        .expect("a record");
    let record: Value = serde_json::from_str(&record).unwrap();
    assert_eq!(
        record["host_ids"]["proxy_uid"],
        POD_USERS_ON_HOST + PROXY_UID,
        "{record:#}"
    );
    assert_eq!(record["config"]["proxy_uid"], PROXY_UID, "{record:#}");

    agent.kill();
    let agent = home.agent().args(&args).start();
    assert_eq!(home.pods()[0]["netns_cookie"], pods[0]["netns_cookie"]);
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert_meshed(&fixture);
    network
        .del("web", &fixture.pod.path())
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert!(home.pods().is_empty());
    agent.stop();
}

#[test]
fn an_ebpf_agent_meshes_a_user_namespaced_pod_through_the_plugin() {
    if privileged() {
        agent_meshes_through_the_plugin("ebpf");
    }
}

#[test]
fn an_iptables_agent_meshes_a_user_namespaced_pod_through_the_plugin() {
    if privileged() {
        agent_meshes_through_the_plugin("iptables");
    }
}

/// `interceptor run` meshes a user-namespaced pod with either backend.
#[test]
fn run_meshes_a_user_namespaced_pod() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::with_own_users("uns-run");
    let _servers = Servers::start(&fixture);
    let proxy = ["-p", "4143", "-o", "4140", "-u", "2102", "--ipv6=false"].map(String::from);
    let instance = interceptor_tests::unique_name("uns-run");
    let mut args = run_args(&fixture, &instance);
    args.extend(proxy.iter().cloned());
    let meshed = Meshed::start(Path::new(BIN), &instance, &args, Stdio::inherit());
    assert_meshed(&fixture);
    drop(meshed);

    let out = std::process::Command::new(BIN)
        .args(["run", "--mode", "iptables", "-w", "--netns"])
        .arg(fixture.pod.path())
        .args(&proxy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_meshed(&fixture);
}
