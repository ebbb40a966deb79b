//! The node agent fails closed when the kernel's answers fail (issue 47): faults armed with the
//! `fail` crate's `FAILPOINTS` (`interceptor::crash_points::FAULTS`, compiled into the test
//! builds only) make the netlink dumps of a pod's namespace fail, or carry a message of an
//! unknown kind. For each: no connection bypasses the proxy, no pod whose namespace is there is
//! forgotten, no record is lost, and a metric or an error names what failed. Each test runs its
//! own agent on its own state directory, bpffs directory, namespaces and cgroup.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use interceptor_tests::{
    Landing, PodFixture,
    agent_home::{
        AgentHome, UNREACHABLE, all_reached_the_proxy, check_load, free_loopback_addr, metric,
        stderr,
    },
    cni_network::{CniNetwork, injected},
    privileged,
    scenario::{APP_UID, Servers},
};

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");
const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");
const LOAD_SECONDS: &str = "8";
const BOTH_DUMPS_FAIL: &str = "netns-address-dump-fails=return;netns-route-dump-fails=return";
/// An AnyIP range the pod delivers over lo, so a restore that lost its local destinations
/// would send the app's connection there to the proxy.
const ANYIP_ROUTE: &str = "198.51.100.64/26";
const ANYIP: &str = "198.51.100.70:8080";

fn dump_failures(addr: &str, what: &str) -> f64 {
    metric(
        addr,
        &format!("interceptor_netlink_dump_failures_total{{what=\"{what}\"}}"),
    )
    .unwrap_or_else(|| panic!("no dump failure series for {what} at {addr}"))
}

/// Issue 47: a restart whose dumps of a live pod's namespace failed took the pod for gone,
/// purged its entries and deleted its record. Now the pod is restored with the local
/// destinations in force: the load running across the restart never bypasses the proxy, the
/// AnyIP range stays delivered over lo, the record stays, and the failure is counted and logged.
#[test]
fn a_restart_whose_dumps_fail_keeps_the_live_pod_meshed_with_its_record() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultrestore");
    let _servers = Servers::start(&fixture);
    fixture
        .pod
        .ip(&["route", "add", "local", ANYIP_ROUTE, "dev", "lo"]);
    let _anyip = fixture
        .in_pod()
        .listen(&["server", ANYIP, "--name", "anyip"]);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let before = home.pods();
    let app = fixture.in_pod().uid(APP_UID);
    assert!(matches!(app.connect(ANYIP), Landing::Server { ref name, .. } if name == "anyip"));

    let addr = free_loopback_addr();
    let log = home.log_path();
    let (lines, agent) = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(&app, LOAD_SECONDS));
        std::thread::sleep(Duration::from_millis(200));
        agent.kill();
        let agent = home
            .agent()
            .args(&["--metrics-addr", &addr])
            .failpoints(BOTH_DUMPS_FAIL)
            .log_to(&log)
            .start();
        assert!(!load.is_finished(), "the load outlasts the restart");
        (load.join().expect("load"), agent)
    });
    all_reached_the_proxy(&lines);

    let after = home.pods();
    assert_eq!(after.len(), 1, "the pod is kept: {after:#?}");
    for field in ["netns", "netns_cookie", "slot", "meta", "addresses"] {
        assert_eq!(after[0][field], before[0][field], "{field}");
    }
    assert_eq!(home.records(), 1, "its record is kept");
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert!(
        matches!(app.connect(ANYIP), Landing::Server { ref name, .. } if name == "anyip"),
        "the AnyIP range in force before the restart is still delivered over lo"
    );
    assert!(dump_failures(&addr, "addresses") >= 1.0);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("its network namespace is there but could not be read")
            && logged.contains(&*fixture.pod.path().to_string_lossy()),
        "a warning names the pod and the failure:\n{logged}"
    );
    assert!(
        !logged.contains("not restoring pod"),
        "nothing forgotten:\n{logged}"
    );
    agent.stop();
}

/// A message of a kind this agent does not know, in every dump: skipped and counted, and the
/// pod registers, is intercepted with its addresses, and is restored by the next agent.
#[test]
fn an_unknown_netlink_message_is_skipped_and_counted() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultunknown");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr])
        .failpoints("netns-dump-unknown-message=return")
        .meshing(&fixture.pod.path(), &[])
        .start();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    let pod = home.pod(&fixture.pod.path());
    let addresses = pod["addresses"].as_array().expect("addresses").clone();
    assert!(
        addresses.iter().any(|a| a == "10.77.0.1"),
        "the pod's own address was read past the unknown message: {pod:#}"
    );
    let skipped = metric(&addr, "interceptor_netlink_messages_skipped_total").unwrap();
    assert!(skipped >= 2.0, "one per dump: {skipped}");
    assert_eq!(dump_failures(&addr, "addresses"), 0.0);
    assert_eq!(dump_failures(&addr, "routes"), 0.0);
    agent.kill();

    let agent = home
        .agent()
        .failpoints("netns-dump-unknown-message=return")
        .start();
    assert_eq!(home.pods()[0]["addresses"], pod["addresses"]);
    assert_eq!(home.records(), 1);
    agent.stop();
}

/// A registration whose dump fails writes nothing (no entry, no link, no record) and is
/// refused as unavailable, with the reason; the CNI plugin tries again within its deadline,
/// then fails ADD with "try again later" (11), not "refused" (100), so the runtime retries the
/// sandbox and the pod never starts unmeshed.
#[test]
fn a_registration_whose_dump_fails_writes_nothing_and_the_plugin_says_try_again() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultregister");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr])
        .failpoints("netns-route-dump-fails=return")
        .start();
    let out = home.add(
        &fixture.pod.path(),
        &[],
        &*interceptor_tests::agent_home::LINKERD_FLAGS,
    );
    let said = stderr(&out);
    assert!(!out.status.success(), "refused");
    assert!(
        said.contains("Unavailable") && said.contains("RTM_GETROUTE") && said.contains("try again"),
        "{said}"
    );
    assert!(home.pods().is_empty());
    assert_eq!(home.records(), 0);
    assert_eq!(home.pinned_pod_links(), 0);
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert!(dump_failures(&addr, "routes") >= 1.0);

    let network = CniNetwork::new("faultregister-node");
    let installed = network
        .install(Path::new(BIN), Path::new(PLUGIN), &home.socket())
        .output()
        .unwrap();
    assert!(installed.status.success(), "{}", stderr(&installed));
    let started = Instant::now();
    let added = network.add("web", &fixture.pod.path(), &injected());
    let took = started.elapsed();
    let error = added.expect_err("ADD fails while the namespace cannot be read");
    assert!(
        error.contains(r#""code":11"#) && error.contains("RTM_GETROUTE"),
        "{error}"
    );
    assert!(
        took < interceptor_cni::deadline::REGISTER,
        "within the plugin's deadline: {took:?}"
    );
    assert!(home.pods().is_empty());
    assert_eq!(home.records(), 0);
    agent.stop();
}

/// The iptables backend dumps no route (its `-o lo` covers whatever the pod delivers over lo):
/// with the route dump failing, a pod registers, is intercepted and is restored, and no route
/// dump was even tried.
#[test]
fn an_iptables_pod_needs_no_route_dump() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultiptroute");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let args = ["--mode", "iptables", "-w", "--metrics-addr", &addr];
    let agent = home
        .agent()
        .args(&args)
        .failpoints("netns-route-dump-fails=return")
        .meshing(&fixture.pod.path(), &[])
        .start();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    agent.stop();
    let agent = home
        .agent()
        .args(&args)
        .failpoints("netns-route-dump-fails=return")
        .start();
    let pods = home.pods();
    assert_eq!(pods.len(), 1, "{pods:#?}");
    assert_eq!(pods[0]["backend"], "iptables");
    assert_eq!(dump_failures(&addr, "routes"), 0.0, "no route dump tried");
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    agent.stop();
}

/// A pod the restore leaves as it was (here an older agent's record, without the proxy's ids as
/// the host knows them, of a pod with a user namespace of its own whose id maps cannot be read
/// at the restart) keeps its record and is not registered. What the maps and the pins hold of it
/// is what keeps it intercepted: they were once removed as the leftovers of a pod without a
/// record, unmeshing it. Now they stay, and the health names the pod.
#[test]
fn a_pod_left_as_it_was_at_a_restart_stays_intercepted() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::with_own_users("faultkept");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    agent.kill();
    // As an agent before issue 45 wrote it: no `host_ids`.
    for entry in std::fs::read_dir(home.state_dir.join("agent-pods")).expect("the records") {
        let path = entry.unwrap().path();
        let mut record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            record.as_object_mut().unwrap().remove("host_ids").is_some(),
            "{record:#}"
        );
        std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    }

    let log = home.log_path();
    let agent = home
        .agent()
        .failpoints("userns-id-maps-unreadable=return")
        .log_to(&log)
        .start();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("pod left as it was"),
        "the restore leaves the pod as it was:\n{logged}"
    );
    assert!(
        !logged.contains("removing what the maps and pins hold"),
        "nothing of it removed:\n{logged}"
    );
    assert!(home.pods().is_empty(), "not registered: {:#?}", home.pods());
    assert_eq!(home.records(), 1, "its record is kept");
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE,
        "still intercepted"
    );
    let problems = home.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("has a pod record but is not registered")),
        "{problems:?}"
    );
    agent.stop();
}
