//! The node agent fails closed when the kernel's answers fail (issue 47): faults armed with the
//! `fail` crate's `FAILPOINTS` (`interceptor::crash_points::FAULTS`, compiled into the test
//! builds only) make the netlink dumps of a pod's namespace fail, or carry a message of an
//! unknown kind, make the kernel refuse a write of the pod map, or the records directory refuse
//! a pod's record. For each: no connection bypasses the proxy, no pod whose namespace is there
//! is forgotten, no record is lost, and a metric or an error names what failed. Each test runs
//! its own agent on its own state directory, bpffs directory, namespaces and cgroup.
use std::{
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use interceptor_tests::{
    Landing, Netns, PodFixture, Probe,
    agent_home::{
        AgentHome, LINKERD_FLAGS, StopOnDrop, UNREACHABLE, all_reached_the_proxy, around_the_proxy,
        check_load, free_loopback_addr, metric, stderr,
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

/// The app's connection to [`UNREACHABLE`] reaches the proxy, with its original destination.
fn assert_intercepted(app: &Probe) {
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
}

/// `interceptor_pod_registrations_refused_total` of `kind`.
fn refused(addr: &str, kind: &str) -> f64 {
    metric(
        addr,
        &format!("interceptor_pod_registrations_refused_total{{kind=\"{kind}\"}}"),
    )
    .unwrap_or(0.0)
}

/// Every file of the records directory (temp files too), with its bytes.
fn record_files(home: &AgentHome) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(home.state_dir.join("agent-pods"))
        .expect("the records")
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// The CNI network of a node whose plugin talks to `home`'s agent.
fn plugin_network(home: &AgentHome, tag: &str) -> CniNetwork {
    let network = CniNetwork::new(tag);
    let installed = network
        .install(Path::new(BIN), Path::new(PLUGIN), &home.socket())
        .output()
        .unwrap();
    assert!(installed.status.success(), "{}", stderr(&installed));
    network
}

/// While the app of `fixture` connects without pause, an update of its pod (one more port to
/// ignore) and the registration of `other`: both refused, no connection around the proxy.
fn refused_under_load(home: &AgentHome, fixture: &PodFixture, other: &Netns) -> [String; 2] {
    let app = fixture.in_pod().uid(APP_UID);
    let (lines, answers) = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(&app, "2"));
        std::thread::sleep(Duration::from_millis(200));
        let mut flags = LINKERD_FLAGS.to_vec();
        flags.extend(["--outbound-ports-to-ignore", "25"]);
        let answers = [
            home.add(&fixture.pod.path(), &["--update"], &flags),
            home.add(&other.path(), &[], &*LINKERD_FLAGS),
        ];
        (load.join().expect("load"), answers)
    });
    all_reached_the_proxy(&lines);
    answers.map(|out| {
        assert!(!out.status.success(), "refused");
        stderr(&out)
    })
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
    assert_intercepted(&app);
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
    assert_intercepted(&app);
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
    assert_eq!(refused(&addr, "unavailable"), 1.0);

    let network = plugin_network(&home, "faultregister-node");
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
    assert_intercepted(&app);
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
    assert_intercepted(&app);
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
    assert_intercepted(&app);
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

/// The pod map refusing a write as the kernel refuses it: full (`E2BIG`, a hash map's answer to
/// a new key when full) while a pod is meshed, then short of memory (`ENOMEM`) at a restart.
/// Full: an update of the meshed pod and a new pod's registration are refused as `table_full`,
/// naming the map and the kernel's error; nothing is written (the meshed pod keeps its
/// configuration, record and interception, under load; the new one has no entry, link or
/// record), and each refusal is logged with its pod and counted. Short of memory at a restart:
/// the pod keeps what was in force, its record and its interception, with a problem naming the
/// map; the plugin's ADD of a new pod is tried again within its deadline, then fails with "try
/// again later" (11). The next agent, with room, takes the pod back as recorded.
#[test]
fn a_pod_map_write_the_kernel_refuses_changes_nothing() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultmapfull");
    let _servers = Servers::start(&fixture);
    let other = Netns::new("faultmapnew");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let log = home.log_path();
    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr])
        .failpoints("pod-map-update-fails=1*off->return(E2BIG)")
        .log_to(&log)
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let before = home.pods();
    let records = record_files(&home);

    for said in refused_under_load(&home, &fixture, &other) {
        assert!(
            said.contains("TableFull")
                && said.contains("map ICPT_PODS: `bpf_map_update_elem` failed")
                && said.contains("Argument list too long")
                && said.contains("nothing of the change was written"),
            "{said}"
        );
    }
    let after = home.pods();
    assert_eq!(after.len(), 1, "{after:#?}");
    assert_eq!(
        after[0]["args"], before[0]["args"],
        "the configuration in force"
    );
    assert_eq!(record_files(&home), records, "the records as they were");
    assert_eq!(home.pinned_pod_links(), 1, "no link for the refused pod");
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert_eq!(refused(&addr, "table_full"), 2.0);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("pod registration refused")
            && logged.contains(&*other.path().to_string_lossy()),
        "a warning names the pod:\n{logged}"
    );
    agent.kill();

    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr])
        .failpoints("pod-map-update-fails=return(ENOMEM)")
        .start();
    let pods = home.pods();
    assert_eq!(pods.len(), 1, "the pod is kept: {pods:#?}");
    assert_eq!(pods[0]["args"], before[0]["args"]);
    assert_eq!(record_files(&home), records, "its record is kept");
    let app = fixture.in_pod().uid(APP_UID);
    assert_intercepted(&app);
    let problems = home.problems();
    assert!(
        problems.iter().any(
            |p| p.contains("in force before the agent restarted is kept")
                && p.contains("Cannot allocate memory")
        ),
        "{problems:?}"
    );
    let network = plugin_network(&home, "faultmapfull-node");
    let error = network
        .add("web2", &other.path(), &injected())
        .expect_err("ADD fails while the map cannot be written");
    assert!(
        error.contains(r#""code":11"#)
            && error.contains("ICPT_PODS")
            && error.contains("Cannot allocate memory"),
        "{error}"
    );
    assert!(refused(&addr, "unavailable") >= 2.0, "tried again");
    assert_eq!(home.pods().len(), 1);
    assert_eq!(home.pinned_pod_links(), 1);
    agent.kill();

    let agent = home.agent().start();
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert_eq!(home.pods()[0]["args"], before[0]["args"]);
    assert_eq!(home.records(), 1);
    agent.stop();
}

/// A pod's record that cannot be written (the records directory full, `ENOSPC`, or read-only,
/// `EROFS`): the change is undone, so the maps and the records agree. A new pod is not left
/// meshed without a record, which a restart would take for the leftovers of a registration cut
/// short and remove, unmeshing a running pod: it is refused, and the CNI plugin's ADD fails, so
/// the runtime retries the sandbox and the pod never runs unmeshed. An update leaves the
/// configuration in force as it was. The error names the record's file; no temp file is left.
#[test]
fn a_record_that_cannot_be_written_undoes_the_registration() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultrecord");
    let _servers = Servers::start(&fixture);
    let other = Netns::new("faultrecnew");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr])
        .failpoints("pod-record-write-fails=1*off->return(ENOSPC)")
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let before = home.pods();
    let records = record_files(&home);
    let dir = home.state_dir.join("agent-pods");

    for said in refused_under_load(&home, &fixture, &other) {
        assert!(
            said.contains("saving the pod record: writing")
                && said.contains(&*dir.to_string_lossy())
                && said.contains("No space left on device"),
            "{said}"
        );
    }
    let after = home.pods();
    assert_eq!(after.len(), 1, "{after:#?}");
    assert_eq!(
        after[0]["args"], before[0]["args"],
        "the configuration in force"
    );
    assert_eq!(record_files(&home), records, "the records as they were");
    assert_eq!(home.pinned_pod_links(), 1, "no link for the refused pod");
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert_eq!(refused(&addr, "internal"), 2.0);
    agent.kill();

    // Read-only at a restart: the restore writes no record, and takes the pod back.
    let agent = home
        .agent()
        .failpoints("pod-record-write-fails=return(EROFS)")
        .start();
    assert_eq!(home.pods()[0]["args"], before[0]["args"]);
    let network = plugin_network(&home, "faultrecord-node");
    let error = network
        .add("web2", &other.path(), &injected())
        .expect_err("ADD fails while no record can be written");
    assert!(
        error.contains(r#""code":100"#)
            && error.contains(&*dir.to_string_lossy())
            && error.contains("Read-only file system"),
        "{error}"
    );
    assert_eq!(home.pods().len(), 1);
    assert_eq!(record_files(&home), records);
    assert_eq!(home.pinned_pod_links(), 1);
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    let app = fixture.in_pod().uid(APP_UID);
    assert_intercepted(&app);
    agent.stop();
}

/// A restart that cannot write a pod into the maps for want of memory never forgets it: an
/// eBPF agent taking over a pod an iptables agent meshed leaves it under its chains with its
/// record (it was forgotten, its record deleted) and takes it over at the next start; a
/// map-layout migration that cannot write it into the new maps stops before switching anything
/// (it went on without the pod, which lost its interception at the switch), the old maps keep
/// it intercepted, and the next start migrates.
#[test]
fn a_restore_the_maps_refuse_keeps_the_pod_and_its_record() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultrestmap");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let app = fixture.in_pod().uid(APP_UID);
    home.agent()
        .args(&["--mode", "iptables", "-w"])
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start()
        .stop();
    let log = home.log_path();
    let agent = home
        .agent()
        .failpoints("pod-map-update-fails=return(ENOMEM)")
        .log_to(&log)
        .start();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("pod left as it was") && logged.contains("Cannot allocate memory"),
        "{logged}"
    );
    assert_eq!(home.records(), 1, "its record is kept");
    assert_intercepted(&app);
    agent.stop();
    let agent = home.agent().start();
    assert_eq!(
        home.pods()[0]["backend"],
        "ebpf",
        "taken over at the next start"
    );
    assert_intercepted(&app);
    agent.kill();

    let layout = (interceptor_common::MAP_LAYOUT_VERSION + 1).to_string();
    let mut migrating = home
        .agent()
        .args(&["--map-layout-version", &layout])
        .failpoints("pod-map-update-fails=return(ENOMEM)")
        .log_to(&log)
        .spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = migrating.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the migration stops");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("building the new maps") && logged.contains("Nothing was switched"),
        "{logged}"
    );
    assert_intercepted(&app);
    assert_eq!(home.records(), 1);
    let agent = home
        .agent()
        .args(&["--map-layout-version", &layout])
        .start();
    assert_eq!(home.pods().len(), 1);
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert_intercepted(&app);
    agent.stop();
}

/// What makes the agent pass a crash point, in [`the_agent_killed_at_each_crash_point_restarts_consistent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passed {
    /// The registration of the second pod.
    Registration,
    /// The removal of the second pod.
    Removal,
    /// An address added in the second pod, which the agent hears and writes.
    AddressChange,
    /// The start-up's restore of both pods.
    Restore,
    /// The start-up's migration of both pods to another map layout.
    Migration,
}

/// Where each crash point is passed, and how many times before the one that crashes. A restore
/// writes each pod as a registration does: the registration's points are passed once for the
/// meshed pod before the second pod's registration reaches them.
fn passed_at(point: &str) -> (Passed, u32) {
    match point {
        "pod-inbound-attached" | "pod-entries-written" | "pod-switched" => {
            (Passed::Registration, 1)
        }
        "agent-before-record" => (Passed::Registration, 0),
        "pod-config-removed" | "pod-inbound-detached" | "agent-before-record-removal" => {
            (Passed::Removal, 0)
        }
        "addresses-written" => (Passed::AddressChange, 0),
        // After the first of the two pods.
        "restore-pod" => (Passed::Restore, 0),
        "migration-built" | "migration-switched" => (Passed::Migration, 0),
        other => panic!("crash point {other} is not placed: say what passes it"),
    }
}

/// The agent killed at every crash point of a registration, a removal, an address change, a
/// restore and a map-layout migration, one after another (the kill test picks them at random):
/// each time the next agent starts into a state the API could have produced (the second pod
/// fully registered or fully absent, nothing in the maps, pins or records without its pod, a
/// record and a link per pod), the meshed pod is registered with its record, and its app, which
/// connects all along, never reaches its destination around the proxy.
#[test]
fn the_agent_killed_at_each_crash_point_restarts_consistent() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultcrash");
    let _servers = Servers::start(&fixture);
    let second = Netns::new("faultcrash2");
    let home = AgentHome::new(&fixture.cgroup.path);
    let log_path = home.log_path();
    let log = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("the agent's log file")
    };
    let mut layout = interceptor_common::MAP_LAYOUT_VERSION;
    let mut agent = home
        .agent()
        .log(log())
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let app = fixture.in_pod().uid(APP_UID);
    let stop = AtomicBool::new(false);
    let (lines, agent) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let load = s.spawn(|| {
            let mut lines = Vec::new();
            while !stop.load(Ordering::Acquire) {
                lines.extend(app.run(&["connect", UNREACHABLE, "--seconds", "1", "--linger0"]));
            }
            lines
        });
        for (round, point) in interceptor::crash_points::POINTS.iter().enumerate() {
            let (passed, passes) = passed_at(point);
            let second_path = second.path();
            let second_arg = second_path.display().to_string();
            if passed == Passed::Registration {
                let out = home.cli(&["pod", "remove", "--netns", &second_arg]);
                assert!(out.status.success(), "{}", stderr(&out));
            } else {
                home.mesh(&second_path, &[]);
            }
            agent.kill();
            if passed == Passed::Migration {
                layout += 1;
            }
            let layout_arg = layout.to_string();
            let armed = format!("{point}={passes}*off->return");
            let armed = home
                .agent()
                .args(&["--map-layout-version", &layout_arg])
                .failpoints(&armed)
                .log(log());
            let mut crashing = match passed {
                Passed::Restore | Passed::Migration => armed.spawn(),
                _ => armed.start(),
            };
            match passed {
                Passed::Registration => drop(home.add(&second_path, &[], &*LINKERD_FLAGS)),
                Passed::Removal => drop(home.cli(&["pod", "remove", "--netns", &second_arg])),
                Passed::AddressChange => second.ip(&[
                    "addr",
                    "add",
                    &format!("10.79.0.{}/32", round + 1),
                    "dev",
                    "lo",
                ]),
                Passed::Restore | Passed::Migration => {}
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while crashing.child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "{point} was not reached");
                std::thread::sleep(Duration::from_millis(10));
            }
            let logged = std::fs::read_to_string(&log_path).unwrap();
            assert!(
                logged.contains(&format!("crash point {point}: killing the agent")),
                "the agent crashed at {point}:\n{logged}"
            );
            agent = home
                .agent()
                .args(&["--map-layout-version", &layout_arg])
                .log(log())
                .start();
            home.assert_consistent();
            let pods = home.pods();
            assert!(
                pods.iter()
                    .any(|p| p["netns"] == fixture.pod.path().display().to_string()),
                "after {point}, the meshed pod is registered: {pods:#?}"
            );
            assert_eq!(
                app.connect(UNREACHABLE).proxy_orig().to_string(),
                UNREACHABLE,
                "after {point}"
            );
        }
        stop.store(true, Ordering::Release);
        (load.join().expect("load"), agent)
    });
    agent.stop();
    assert!(lines.len() > 20, "{} connections", lines.len());
    assert_eq!(around_the_proxy(&lines), Vec::<&String>::new());
}

/// A burst of route changes in one pod that overflows the agent's notification socket (ENOBUFS:
/// the agent stopped with SIGSTOP through 1,200 notifications), after which another pod's
/// routes change: the agent hears that notifications were lost, checks every pod
/// (`interceptor_pod_checks_total{trigger="lost"}`), and the other pod ends with the state it
/// was left in, a `local` route added and one added then removed.
#[test]
fn notifications_lost_to_a_full_socket_check_every_pod() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultburst");
    let _servers = Servers::start(&fixture);
    let _anyip = fixture
        .in_pod()
        .listen(&["server", "0.0.0.0:8091", "--name", "anyip"]);
    let noisy = Netns::new("faultburst2");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    // No sweep in the test's time: only the lost notifications can make the agent look.
    let agent = home
        .agent()
        .args(&["--metrics-addr", &addr, "--reconcile-ms", "600000"])
        .meshing(&fixture.pod.path(), &[])
        .start();
    home.mesh(&noisy.path(), &[]);
    let routes: Vec<String> = (0..600)
        .map(|i| format!("local 10.200.{}.{}/32 dev lo", i / 250, i % 250))
        .collect();
    let mut burst: String = routes.iter().map(|r| format!("route add {r}\n")).collect();
    burst.extend(routes.iter().map(|r| format!("route del {r}\n")));
    let pid = nix::unistd::Pid::from_raw(agent.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP the agent");
    noisy.ip_batch(&burst);
    fixture.pod.ip_batch(
        "route add local 198.51.100.64/26 dev lo\n\
         route add local 198.51.100.128/26 dev lo\n\
         route del local 198.51.100.128/26 dev lo\n",
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT the agent");
    let app = fixture.in_pod().uid(APP_UID);
    interceptor_tests::eventually(
        "the route added while the socket was full is applied",
        Duration::from_secs(10),
        || matches!(app.connect("198.51.100.70:8091"), Landing::Server { ref name, .. } if name == "anyip"),
    );
    assert!(
        matches!(app.connect("198.51.100.130:8091"), Landing::Proxy { .. }),
        "the route removed while the socket was full is not applied"
    );
    let lost = metric(&addr, "interceptor_pod_checks_total{trigger=\"lost\"}").unwrap_or(0.0);
    assert!(
        lost >= 2.0,
        "the burst overflowed the socket, both pods checked: {lost}"
    );
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    agent.stop();
}

/// The map pins removed from the agent's bpffs directory while it runs (by hand, by a cleanup
/// script): the programs hold the maps, so the pod stays intercepted. The next agent finds the
/// links pinned without their maps: it builds new maps from the records before it switches the
/// links, as a migration does (it switched first, then registered the pods: connections went
/// around the proxy in between), and the pod stays intercepted all along.
#[test]
fn map_pins_removed_under_a_running_agent_lose_no_pod() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("faultmappins");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let maps = home
        .bpffs
        .join(format!("maps-v{}", interceptor_common::MAP_LAYOUT_VERSION));
    for entry in std::fs::read_dir(&maps).expect("the pinned maps") {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    std::fs::remove_dir(&maps).unwrap();
    let app = fixture.in_pod().uid(APP_UID);
    assert_intercepted(&app);

    let log = home.log_path();
    let (lines, agent) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            app.run(&[
                "connect",
                UNREACHABLE,
                "--seconds",
                LOAD_SECONDS,
                "--linger0",
            ])
        });
        std::thread::sleep(Duration::from_millis(300));
        agent.kill();
        let agent = home.agent().log_to(&log).start();
        assert!(!load.is_finished(), "the load outlasts the restart");
        (load.join().expect("load"), agent)
    });
    assert!(lines.len() > 50, "{} connections", lines.len());
    assert_eq!(around_the_proxy(&lines), Vec::<&String>::new());
    // As at a migration's switch: a connect the replaced programs recorded in that instant
    // misses its original destination, and its proxy refuses it (fails closed). A few at most.
    let unanswered = lines.iter().filter(|l| l.contains(" orig=errno:")).count();
    assert!(
        unanswered * 100 <= lines.len(),
        "{unanswered} of {}",
        lines.len()
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("the node's links are pinned but not their maps"),
        "{logged}"
    );
    home.assert_consistent();
    assert_eq!(home.pods().len(), 1);
    assert!(maps.exists(), "pinned again");
    assert_intercepted(&app);
    agent.stop();
}
