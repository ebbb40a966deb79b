//! The node agent end to end, through its real binary: pods registered through the API, an agent
//! killed and restarted under load with no connection bypassing the proxy, pods whose namespace
//! disappears, bad input, and uninstall. Each test runs its own agent on its own state directory,
//! bpffs directory and cgroup.
use std::{
    os::fd::AsFd as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use interceptor_tests::{
    Landing, Netns, PodFixture,
    agent_home::{
        AgentHome, LINKERD_FLAGS, UNREACHABLE, all_reached_the_proxy, around_the_proxy, check_load,
        connections_while, free_loopback_addr, http_get, metric, stderr,
    },
    eventually,
    fixture::Namespaces,
    privileged,
    scenario::{APP_UID, Servers},
};
use serde_json::Value;

/// Pins, at `dir`/`name` (a map layout's directory), a map named as an agent of an earlier
/// layout named it: what an upgrade or an uninstall finds of a map that was renamed since.
fn pin_retired_map(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let map = interceptor_sys::map_create(
        interceptor_sys::bpf_map_type::BPF_MAP_TYPE_HASH,
        24,
        1,
        1,
        name,
    )
    .unwrap();
    interceptor_sys::obj_pin(std::os::fd::AsFd::as_fd(&map), &dir.join(name)).unwrap();
}

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");

/// How long a load runs that must outlast an agent's restart, takeover or migration: a time,
/// not a count, so that it does on fast machines too. A new agent's start (its programs through
/// the verifier) took most of 3 s on a 2-core machine busy with a build; 6 leaves room.
const LOAD_SECONDS: &str = "6";

fn counter(pod: &Value, name: &str) -> u64 {
    pod["counters"][name].as_u64().unwrap_or(0)
}

#[test]
fn pods_registered_through_the_api_are_intercepted_until_removed() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agent");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().start();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into())
    );

    home.mesh(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop"],
    );
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert_eq!(
        app.connect("[2001:db8::2]:1404").proxy_orig().to_string(),
        "[2001:db8::2]:1404"
    );
    let landing = fixture.on_remote().connect("10.77.0.1:80");
    assert!(
        matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
        "{landing:?}"
    );

    let pods = home.pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["meta"]["name"], "web");
    assert_eq!(pods[0]["meta"]["namespace"], "shop");
    assert_eq!(pods[0]["inbound_listener"], true);
    assert_eq!(home.pod(&fixture.pod.path())["inbound_listener"], true);
    assert_eq!(counter(&pods[0], "outbound_redirected"), 2);
    assert_eq!(counter(&pods[0], "inbound_steered"), 1);

    // Adding it again, same configuration: nothing changes.
    let again = home.add(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop"],
        &*LINKERD_FLAGS,
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(home.pods()[0]["slot"], pods[0]["slot"]);

    // A new configuration applied in place: 1404 becomes an ignored port.
    let mut flags = LINKERD_FLAGS.to_vec();
    flags.extend(["--outbound-ports-to-ignore", "1404"]);
    let updated = home.add(&fixture.pod.path(), &["--update"], &flags);
    assert!(updated.status.success(), "{}", stderr(&updated));
    assert_eq!(
        app.connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    assert_eq!(
        counter(&home.pods()[0], "outbound_redirected"),
        2,
        "counters kept"
    );

    let removed = home.cli(&[
        "pod",
        "remove",
        "--netns",
        &fixture.pod.path().display().to_string(),
    ]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(home.pods().is_empty());
    assert_eq!(
        app.connect("10.77.0.2:80").server_name(),
        "remote-80",
        "a removed pod is not intercepted"
    );
    agent.stop();
}

/// SIGKILL the agent while the app connects in a loop, start it again: every connection lands on
/// the proxy, the pod list is the same, the counters continue.
#[test]
fn a_killed_agent_leaves_pods_intercepted_and_the_next_one_takes_them_back() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentkill");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let before = home.pods();

    let app = fixture.in_pod().uid(APP_UID);
    let check = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(&app, LOAD_SECONDS));
        std::thread::sleep(Duration::from_millis(200));
        agent.kill();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!load.is_finished(), "the load outlasts the agent's absence");
        let agent = home.agent().start();
        let lines = load.join().expect("load");
        (lines, agent)
    });
    let (lines, agent) = check;
    let connections = all_reached_the_proxy(&lines);

    let after = home.pods();
    assert_eq!(after.len(), 1);
    for field in ["netns", "netns_cookie", "slot", "meta", "args"] {
        assert_eq!(after[0][field], before[0][field], "{field}");
    }
    assert_eq!(
        counter(&after[0], "outbound_redirected"),
        connections,
        "{after:#?}"
    );
    // The new agent serves the pod: a change made through it takes effect.
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert_eq!(
        counter(&home.pods()[0], "outbound_redirected"),
        connections + 1
    );
    agent.stop();
}

/// proxy-init's `-o lo -j RETURN` exempts whatever the pod delivers over lo: an AnyIP `local`
/// route added after the pod was meshed is applied at once (the agent hears the route), and the
/// app's connection to an address in it reaches the server listening there, not the proxy.
///
/// The range is one the remote namespace calls its own, so a connect that is neither
/// intercepted nor delivered locally (the route gone, the agent not yet told) is refused at
/// once rather than waiting out SYN retries, and `eventually` tries again.
#[test]
fn a_local_route_added_later_is_delivered_over_lo() {
    if !privileged() {
        return;
    }
    const ANYIP_ROUTE: &str = "198.51.100.64/26";
    const ANYIP: &str = "198.51.100.70:8080";
    let fixture = PodFixture::new("agentanyip");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let app = fixture.in_pod().uid(APP_UID);
    // The pod delivers nothing of 198.51.100.64/26 yet: the connect is the proxy's, as any
    // remote one.
    assert_eq!(app.connect(ANYIP).proxy_orig().to_string(), ANYIP);
    fixture
        .pod
        .ip(&["route", "add", "local", ANYIP_ROUTE, "dev", "lo"]);
    // IPv4 binds into a local route (AnyIP): the pod's own server on one of its addresses.
    let _anyip = fixture
        .in_pod()
        .listen(&["server", ANYIP, "--name", "anyip"]);
    eventually(
        "the local route is applied",
        Duration::from_secs(5),
        || matches!(app.connect(ANYIP), Landing::Server { ref name, .. } if name == "anyip"),
    );
    fixture
        .pod
        .ip(&["route", "del", "local", ANYIP_ROUTE, "dev", "lo"]);
    eventually(
        "the removed route is applied",
        Duration::from_secs(5),
        || matches!(app.connect(ANYIP), Landing::Proxy { .. }),
    );
    agent.stop();
}

/// A `local` route added while a registration runs, after it read the pod's routes and before
/// the pod is watched, is applied within moments of the answer, not at the sweep (ten minutes
/// away here): the namespace is given its id and noted with the listener before the read. The
/// registration is held between its read and its write (`registration-after-read`) so the
/// route lands in that window every time.
#[test]
fn a_local_route_added_while_registering_is_applied_without_the_sweep() {
    if !privileged() {
        return;
    }
    const ANYIP_ROUTE: &str = "198.51.100.64/26";
    const ANYIP: &str = "198.51.100.70:8091";
    let fixture = PodFixture::new("agentwindow");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .args(&["--reconcile-ms", "600000"])
        .failpoints("registration-after-read=sleep(1500)")
        .start();
    // On every address: one in the route cannot be bound before the route is there.
    let _anyip = fixture
        .in_pod()
        .listen(&["server", "0.0.0.0:8091", "--name", "anyip"]);
    std::thread::scope(|s| {
        let registering = s.spawn(|| home.mesh(&fixture.pod.path(), &[]));
        std::thread::sleep(Duration::from_millis(500));
        assert!(!registering.is_finished(), "the registration is held");
        fixture
            .pod
            .ip(&["route", "add", "local", ANYIP_ROUTE, "dev", "lo"]);
        registering.join().expect("registering");
    });
    let app = fixture.in_pod().uid(APP_UID);
    eventually(
        "the route added during the registration is applied",
        Duration::from_secs(2),
        || matches!(app.connect(ANYIP), Landing::Server { ref name, .. } if name == "anyip"),
    );
    agent.stop();
}

/// Without `CAP_NET_BROADCAST` the kernel sends the agent nothing of the pods' namespaces: the
/// agent says so (its log and its health's notes, not as a problem) and checks those pods every
/// 2 s, so a `local` route added later is applied within seconds, not at the sweep (ten minutes
/// away here).
#[test]
fn without_net_broadcast_the_agent_says_so_and_checks_the_pods_often() {
    if !privileged() {
        return;
    }
    const ANYIP_ROUTE: &str = "198.51.100.64/26";
    const ANYIP: &str = "198.51.100.70:8091";
    let fixture = PodFixture::new("agentnobcast");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path).without_net_broadcast();
    let agent = home
        .agent()
        .args(&["--reconcile-ms", "600000"])
        .meshing(&fixture.pod.path(), &[])
        .log_to(&home.log_path())
        .start();
    let health = interceptor::agent::api::health(&home.socket()).expect("health");
    assert!(
        health.notes.iter().any(|n| n.contains("CAP_NET_BROADCAST")),
        "{health:?}"
    );
    assert!(
        health.problems.is_empty(),
        "a note, not a problem: {health:?}"
    );
    let log = std::fs::read_to_string(home.log_path()).unwrap_or_default();
    assert!(log.contains("CAP_NET_BROADCAST"), "said at start: {log}");
    let _anyip = fixture
        .in_pod()
        .listen(&["server", "0.0.0.0:8091", "--name", "anyip"]);
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(app.connect(ANYIP).proxy_orig().to_string(), ANYIP);
    fixture
        .pod
        .ip(&["route", "add", "local", ANYIP_ROUTE, "dev", "lo"]);
    eventually(
        "the local route is applied by the frequent check",
        Duration::from_secs(5),
        || matches!(app.connect(ANYIP), Landing::Server { ref name, .. } if name == "anyip"),
    );
    agent.stop();
}

/// The window a `local` route leaves open: from the route added in the pod (`ip route add`
/// returned) to its entry in the agent's subnet map, polled from its pin without pause, over
/// 50 routes. The figures are in docs/how-it-works.md (run with `--nocapture` to see them).
#[test]
fn a_local_route_is_in_the_map_within_milliseconds_of_its_addition() {
    use aya::maps::{
        Map, MapData,
        lpm_trie::{Key, LpmTrie},
    };
    use interceptor_common::{
        IP4_MAPPED_PREFIX_BITS, Ip6Addr, MAP_LAYOUT_VERSION, SUBNET_KEY_FIXED_BITS, SubnetKey,
        addr::family, names, pod::direction,
    };
    if !privileged() {
        return;
    }
    const TRIALS: u8 = 50;
    let fixture = PodFixture::new("agentwindowtime");
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .args(&["--reconcile-ms", "600000"])
        .meshing(&fixture.pod.path(), &[])
        .start();
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let pin = home
        .bpffs
        .join(format!("maps-v{MAP_LAYOUT_VERSION}"))
        .join(names::MAP_SUBNETS);
    let data = MapData::from_pin(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    let subnets: LpmTrie<MapData, SubnetKey, u8> =
        LpmTrie::try_from(Map::from_map_data(data).expect("a map")).expect("an LPM trie");
    let windows: Vec<(Duration, Duration)> = (0..TRIALS)
        .map(|i| {
            let route = format!("10.201.{i}.0/24");
            let key = Key::new(
                SUBNET_KEY_FIXED_BITS + IP4_MAPPED_PREFIX_BITS + 24,
                SubnetKey {
                    netns_cookie: cookie,
                    direction: direction::LOCAL_ROUTE,
                    family: family::IPV4,
                    addr: Ip6Addr::from(std::net::IpAddr::from([10, 201, i, 0])),
                },
            );
            let asked = Instant::now();
            fixture
                .pod
                .ip(&["route", "add", "local", &route, "dev", "lo"]);
            let added = Instant::now();
            while subnets.get(&key, 0).is_err() {
                assert!(
                    added.elapsed() < Duration::from_secs(5),
                    "{route} never reached the map"
                );
            }
            // The route was added somewhere within `ip`'s run: the window lies between.
            let window = (added.elapsed(), asked.elapsed());
            fixture
                .pod
                .ip(&["route", "del", "local", &route, "dev", "lo"]);
            eventually(
                "the route's removal is applied",
                Duration::from_secs(5),
                || subnets.get(&key, 0).is_err(),
            );
            window
        })
        .collect();
    for (bound, pick) in [
        (
            "`ip` returned",
            (|w| w.0) as fn(&(Duration, Duration)) -> Duration,
        ),
        ("`ip` started", |w| w.1),
    ] {
        let mut sorted: Vec<Duration> = windows.iter().map(pick).collect();
        sorted.sort();
        eprintln!(
            "from {bound} to the map written, over {TRIALS} routes: median {:?}, 90th percentile {:?}, max {:?}",
            sorted[sorted.len() / 2],
            sorted[sorted.len() * 9 / 10],
            sorted[sorted.len() - 1]
        );
    }
    agent.stop();
}

/// At rest the agent checks no pod: an address change checks the one pod it happened in, a
/// removed namespace the pod it was, and the safety sweep (a pod every `--reconcile-ms / pods`)
/// the rest. Counted by the agent (`interceptor_pod_checks_total`), not timed.
#[test]
fn an_agent_at_rest_checks_only_the_pods_an_event_names() {
    if !privileged() {
        return;
    }
    const PODS: usize = 30;
    let fixture = PodFixture::new("agentrest");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    // A round of 10 minutes: the sweep's first pod is 20 s away.
    let _agent = home
        .agent()
        .args(&["--metrics-addr", &addr, "--reconcile-ms", "600000"])
        .start();
    let namespaces = Namespaces::new("rest", PODS);
    for netns in namespaces.paths() {
        home.mesh(&netns, &[]);
    }
    let changing = Netns::new("restaddr");
    let doomed = Netns::new("restgone");
    home.mesh(&changing.path(), &[]);
    home.mesh(&doomed.path(), &[]);
    // No proxy listens in these pods (the first test has one that does).
    assert_eq!(home.pod(&doomed.path())["inbound_listener"], false);
    let checks = |trigger: &str| {
        let series = format!("interceptor_pod_checks_total{{trigger=\"{trigger}\"}}");
        interceptor_tests::agent_home::metric(&addr, &series).unwrap_or(0.0) as u64
    };
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        (checks("event"), checks("sweep"), checks("lost")),
        (0, 0, 0),
        "{} pods at rest: none checked",
        PODS + 2
    );

    changing.ip(&["addr", "add", "192.0.2.77/32", "dev", "lo"]);
    let in_force = || {
        home.pods()
            .into_iter()
            .find(|p| p["netns"] == changing.path().display().to_string())
            .is_some_and(|p| {
                p["addresses"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a == "192.0.2.77")
            })
    };
    eventually(
        "the new address is applied",
        Duration::from_secs(5),
        in_force,
    );
    // An address comes with its `local` route, which could have been an AnyIP one: two
    // notifications, two checks of that one pod (its prefix route is no local one: none).
    assert_eq!((checks("event"), checks("sweep")), (2, 0));

    let doomed_path = doomed.path().display().to_string();
    drop(doomed);
    eventually("the gone pod is removed", Duration::from_secs(5), || {
        !home.pods().iter().any(|p| p["netns"] == doomed_path)
    });
    assert_eq!((checks("event"), checks("sweep")), (3, 0));
    assert_eq!(home.pods().len(), PODS + 1);
}

/// Deleting a pod's namespace (`ip netns del`, as a runtime does) removes the pod at once.
#[test]
fn a_pod_whose_network_namespace_disappears_is_removed() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentgone");
    let home = AgentHome::new(&fixture.cgroup.path);
    // The periodic check is a minute away: the watch on /run/netns must notice.
    let _agent = home.agent().args(&["--reconcile-ms", "60000"]).start();
    let doomed = Netns::new("doomed");
    home.mesh(&doomed.path(), &[]);
    home.mesh(&fixture.pod.path(), &[]);
    assert_eq!(home.pods().len(), 2);
    let doomed_path = doomed.path();
    drop(doomed);

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pods = home.pods();
        if pods.len() == 1 {
            assert_eq!(pods[0]["netns"], fixture.pod.path().display().to_string());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} is still registered: {pods:#?}",
            doomed_path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        home.pinned_pod_links(),
        1,
        "the gone pod's sk_lookup link is unpinned"
    );
}

#[test]
fn bad_requests_get_a_clear_error_and_change_nothing() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentbad");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let before = home.pods();
    let socket = home.socket();
    // Sent as a line of JSON, as any client (an older one too) sends it.
    let refused = |request: Value| -> (String, String) {
        let mut raw = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        std::io::Write::write_all(&mut raw, format!("{request}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut raw, &mut answer).unwrap();
        match serde_json::from_str(&answer) {
            Ok(interceptor::agent::api::Response::Error { kind, message }) => {
                (format!("{kind:?}"), message)
            }
            other => panic!("expected a refusal, got {other:?} from {answer}"),
        }
    };

    let (kind, message) = refuse_add(&refused, "/run/netns/icpt-no-such-pod", &*LINKERD_FLAGS);
    assert_eq!(kind, "UnknownNetns");
    assert!(message.contains("/run/netns/icpt-no-such-pod"), "{message}");

    let pod = fixture.pod.path().display().to_string();
    // (flags, kind, what the message must name)
    let cases: [(&[&str], &str, &str); 4] = [
        (
            &["-p", "0", "-o", "4140"],
            "InvalidConfig",
            "'0' for '--incoming-proxy-port",
        ),
        (
            &[
                "-p",
                "4143",
                "-o",
                "4140",
                "--inbound-ports-to-ignore",
                "90-80",
            ],
            "InvalidConfig",
            "90-80",
        ),
        (
            &[
                "-p",
                "4143",
                "-o",
                "4140",
                "--subnets-to-ignore",
                "10.0.0.0/33",
            ],
            "InvalidConfig",
            "10.0.0.0/33",
        ),
        (&["-p", "4143", "-o", "4141"], "Conflict", "--update"),
    ];
    for (args, want_kind, names) in cases {
        let (kind, message) = refuse_add(&refused, &pod, args);
        assert_eq!(kind, want_kind, "{args:?}: {message}");
        assert!(message.contains(names), "{args:?}: {message}");
    }

    // A configuration sent as data is checked as it is read, in the same words.
    let request = serde_json::json!({
        "op": "add",
        "netns": pod,
        "config": {"incoming_proxy_port": 4143, "outgoing_proxy_port": 4140,
                   "outbound_ports_to_ignore": "25,smtp"},
    });
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::io::Write::write_all(&mut raw, format!("{request}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut raw, &mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["kind"], "invalid_config", "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("invalid value '25,smtp' for 'outbound-ports-to-ignore'"),
        "{answer}"
    );

    // Not JSON of the API.
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    std::io::Write::write_all(&mut raw, b"{\"op\":\"explode\"}\n").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut raw, &mut answer).unwrap();
    assert!(answer.contains("bad_request"), "{answer}");

    // Not root: the socket itself is root-only.
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "1000",
            "--regid",
            "1000",
            "--clear-groups",
            BIN,
            "pod",
            "list",
        ])
        .args(home.location())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );

    // The CLI refuses a malformed configuration itself, with exit code 2, as `run` does.
    let out = home.add(&fixture.pod.path(), &[], &["-p", "4143", "-o", "70000"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("70000"), "{}", stderr(&out));

    let after = home.pods();
    assert_eq!(after.len(), before.len());
    assert_eq!(after[0]["args"], before[0]["args"]);
    assert_eq!(after[0]["slot"], before[0]["slot"]);
}

fn refuse_add(
    refused: &dyn Fn(Value) -> (String, String),
    netns: &str,
    args: &[&str],
) -> (String, String) {
    refused(serde_json::json!({"op": "add", "netns": netns, "args": args}))
}

/// Stopping the agent keeps interception; uninstall removes everything it pinned and wrote.
#[test]
fn uninstall_removes_everything_the_agent_pinned() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentuninst");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let app = fixture.in_pod().uid(APP_UID);

    // An older layout's directory left behind, holding a map of a name no longer used.
    for retired in interceptor_common::names::RETIRED_MAPS {
        pin_retired_map(&home.bpffs.join("maps-v1"), retired);
    }

    let refused = home.cli(&["uninstall"]);
    assert!(
        !refused.status.success(),
        "uninstall refuses while the agent runs"
    );
    agent.stop();
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE,
        "a stopped agent leaves its pods intercepted"
    );

    let out = home.cli(&["uninstall"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A forked child of another test holds copies of link fds until it execs.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match app.connect(UNREACHABLE) {
            Landing::Failed(e) if e == "connect:ECONNREFUSED" => break,
            other => assert!(Instant::now() < deadline, "still intercepted: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!home.bpffs.exists(), "the bpffs directory is gone");
    assert!(
        std::fs::read_dir(&home.state_dir).unwrap().next().is_none(),
        "the state directory is empty"
    );
}

/// Another product's cgroup program on the same hook (Cilium, Calico and others attach there):
/// one attached with `BPF_F_ALLOW_MULTI` before the agent, one with a link after it. Both keep
/// running beside ours through an agent restart and after uninstall; ours never replaces them.
#[test]
fn programs_other_software_attached_to_the_same_hooks_keep_running() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentforeign");
    let _servers = Servers::start(&fixture);
    let cgroup = std::fs::File::open(&fixture.cgroup.path).unwrap();
    let before = foreign::deny_port(&cgroup, 9999, foreign::Attach::AllowMulti);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let after = foreign::deny_port(&cgroup, 9998, foreign::Attach::Link);

    let app = fixture.in_pod().uid(APP_UID);
    // The proxy's UID is never redirected: its connects show the foreign programs at work.
    let proxy = fixture.in_pod().uid(interceptor_tests::scenario::PROXY_UID);
    let denied =
        |landing: Landing| matches!(&landing, Landing::Failed(e) if e.contains("os_error_1"));
    let check = |when: &str| {
        assert_eq!(
            app.connect(UNREACHABLE).proxy_orig().to_string(),
            UNREACHABLE,
            "{when}: ours intercepts"
        );
        assert!(
            denied(proxy.connect("10.77.0.2:9999")),
            "{when}: the first foreign program runs"
        );
        assert!(
            denied(proxy.connect("10.77.0.2:9998")),
            "{when}: the second foreign program runs"
        );
        let attached = foreign::attached_ids(&cgroup);
        assert!(
            attached.contains(&before.id) && attached.contains(&after.id),
            "{when}: both foreign programs stay attached: {attached:?}"
        );
    };
    check("with the agent");
    agent.kill();
    let agent = home.agent().start();
    check("after an agent restart");
    agent.stop();
    let out = home.cli(&["uninstall"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(denied(proxy.connect("10.77.0.2:9999")), "after uninstall");
    assert!(denied(proxy.connect("10.77.0.2:9998")), "after uninstall");
    let attached = foreign::attached_ids(&cgroup);
    assert!(attached.contains(&before.id) && attached.contains(&after.id));
}

/// A minimal foreign cgroup/connect4 program, loaded and attached with raw bpf(2) calls as
/// another product would: it refuses connects to one port.
mod foreign {
    use std::os::fd::{AsFd as _, OwnedFd};

    use interceptor_sys::{
        BPF_F_ALLOW_MULTI, ProgLoad, bpf_attach_type::BPF_CGROUP_INET4_CONNECT,
        bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR, insn,
    };

    pub enum Attach {
        AllowMulti,
        Link,
    }

    /// The program and its attachment; both stay for the test's life (the cgroup's removal
    /// detaches them).
    pub struct Foreign {
        pub id: u32,
        _prog: OwnedFd,
        _link: Option<OwnedFd>,
    }

    pub fn deny_port(cgroup: &std::fs::File, port: u16, how: Attach) -> Foreign {
        // r2 = ctx->user_port; r0 = 1; if r2 != port (network order) goto +1; r0 = 0; exit
        let port_be = i32::from(u16::from_ne_bytes(port.to_be_bytes()));
        let insns = [
            insn(0x61, 2, 1, 24, 0),
            insn(0xb7, 0, 0, 0, 1),
            insn(0x55, 2, 0, 1, port_be),
            insn(0xb7, 0, 0, 0, 0),
            insn(0x95, 0, 0, 0, 0),
        ];
        let prog = interceptor_sys::prog_load(&ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            expected_attach_type: Some(BPF_CGROUP_INET4_CONNECT),
            name: "foreign_deny",
            insns: &insns,
            license: c"GPL",
        })
        .expect("load");
        let link = match how {
            Attach::AllowMulti => {
                interceptor_sys::prog_attach(
                    prog.as_fd(),
                    cgroup.as_fd(),
                    BPF_CGROUP_INET4_CONNECT,
                    BPF_F_ALLOW_MULTI,
                )
                .expect("attach");
                None
            }
            Attach::Link => Some(
                interceptor_sys::link_create(
                    prog.as_fd(),
                    cgroup.as_fd(),
                    BPF_CGROUP_INET4_CONNECT,
                )
                .expect("link"),
            ),
        };
        Foreign {
            id: interceptor_sys::prog_info(prog.as_fd()).unwrap().id,
            _prog: prog,
            _link: link,
        }
    }

    /// The ids of the connect4 programs attached directly to the cgroup.
    pub fn attached_ids(cgroup: &std::fs::File) -> Vec<u32> {
        interceptor_sys::prog_query(cgroup.as_fd(), BPF_CGROUP_INET4_CONNECT).expect("query")
    }
}

/// With an agent running, `interceptor run` is a thin client: it registers its pod with the
/// agent and removes it on SIGTERM, loading no programs of its own.
#[test]
fn run_registers_its_pod_with_a_running_agent() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentrun");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().start();
    let socket = home.socket();
    let mut run = Command::new(BIN)
        .args(["run", "--netns", &fixture.pod.path().display().to_string()])
        .args(["--agent-socket", &socket.display().to_string()])
        .args(*LINKERD_FLAGS)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while home.pods().is_empty() {
        assert!(run.try_wait().unwrap().is_none(), "run exited early");
        assert!(Instant::now() < deadline, "run did not register its pod");
        std::thread::sleep(Duration::from_millis(50));
    }
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    let pods = home.pods();
    assert_eq!(pods[0]["netns"], fixture.pod.path().display().to_string());
    let holds_programs = std::fs::read_dir(format!("/proc/{}/fdinfo", run.id()))
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|i| i.contains("prog_id:")));
    assert!(!holds_programs, "run holds no programs of its own");

    // SAFETY: signalling our own child.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    assert!(run.wait().unwrap().success());
    assert!(home.pods().is_empty(), "run removed its pod on SIGTERM");
    assert_eq!(app.connect("10.77.0.2:80").server_name(), "remote-80");
    agent.stop();
}

#[test]
fn metrics_count_decisions_per_pod_and_ready_answers() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentmetrics");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let _agent = home.agent().args(&["--metrics-addr", &addr]).start();
    let (status, _) = http_get(&addr, "/ready");
    assert!(status.contains(" 200 "), "{status}");

    home.mesh(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop"],
    );
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    let landing = fixture.on_remote().connect("10.77.0.1:4190");
    assert_eq!(landing.server_name(), "app-4190");

    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    for line in [
        r#"interceptor_decisions_total{namespace="shop",pod="web",direction="outbound",reason="redirected"} 1"#,
        r#"interceptor_decisions_total{namespace="shop",pod="web",direction="inbound",reason="exempt_ignored_port"} 1"#,
        r#"interceptor_pods_registered{backend="ebpf"} 1"#,
        r#"interceptor_pod_registration_seconds_count{backend="ebpf"} 1"#,
        r#"interceptor_backend_info{backend="ebpf"} 1"#,
        r#"interceptor_map_entries{map="pending_orig_dst"} 0"#,
        r#"interceptor_map_entries{map="listeners"} 2"#,
        format!(
            r#"interceptor_build_info{{version="{}",map_layout="{}"}} 1"#,
            env!("CARGO_PKG_VERSION"),
            interceptor_common::MAP_LAYOUT_VERSION
        )
        .as_str(),
    ] {
        assert!(body.contains(line), "{line} not in:\n{body}");
    }
}

/// The program a pinned link runs.
fn linked_program(pin: &Path) -> u32 {
    let link = interceptor_sys::obj_get(pin)
        .and_then(|fd| fd.ok_or_else(|| std::io::ErrorKind::NotFound.into()))
        .unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    interceptor_sys::link_info(std::os::fd::AsFd::as_fd(&link))
        .unwrap()
        .prog_id
}

/// An upgrade: a new agent started while the old one runs waits for it, and once it stops puts
/// its own programs into the pinned links (BPF_LINK_UPDATE), under load, with no connection
/// bypassing the proxy.
#[test]
fn a_new_agent_takes_over_from_the_running_one_under_load() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentupgrade");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let old = home.agent().meshing(&fixture.pod.path(), &[]).start();
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let pins = [
        home.bpffs.join("link_icpt_connect4"),
        home.bpffs.join("link_icpt_sockops"),
        home.bpffs.join(format!("link_icpt_sk_lookup_{cookie}")),
    ];
    let before: Vec<u32> = pins.iter().map(|p| linked_program(p)).collect();

    let app = fixture.in_pod().uid(APP_UID);
    let (lines, new) = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(&app, LOAD_SECONDS));
        // The new agent waits for the old one's lock.
        let mut new = home.agent().spawn();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            new.child.try_wait().unwrap().is_none(),
            "the new agent waits"
        );
        old.stop();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !home.cli(&["pod", "list"]).status.success() {
            assert!(Instant::now() < deadline, "the new agent did not take over");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!load.is_finished(), "the load outlasts the takeover");
        (load.join().expect("load"), new)
    });
    all_reached_the_proxy(&lines);
    let after: Vec<u32> = pins.iter().map(|p| linked_program(p)).collect();
    for ((pin, old_id), new_id) in pins.iter().zip(&before).zip(&after) {
        assert_ne!(
            old_id,
            new_id,
            "{} runs the new agent's program",
            pin.display()
        );
    }
    assert_eq!(home.pods().len(), 1);
    new.stop();
}

/// A pod meshed by proxy-init's iptables chains moves to eBPF under load: registered with
/// `--takeover-iptables`, it is intercepted by the programs, then its chains are removed, and no
/// connection reaches its destination around the proxy meanwhile.
#[test]
fn a_pod_meshed_with_iptables_is_taken_over_without_a_gap() {
    if !privileged() {
        return;
    }
    use interceptor::iptables::IptablesMode;
    use interceptor_tests::{iptables_backend::Iptables, scenario::Backend as _};
    let fixture = PodFixture::new("agentipt");
    let _servers = Servers::start(&fixture);
    let mut config = interceptor_tests::scenario::linkerd_config();
    config.ipv6 = true;
    let iptables = Iptables(IptablesMode::Legacy);
    let installed = iptables.attach(&fixture, &config);
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().start();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );

    let lines = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(&app, LOAD_SECONDS));
        std::thread::sleep(Duration::from_millis(100));
        home.mesh(&fixture.pod.path(), &["--takeover-iptables"]);
        assert!(!load.is_finished(), "the load outlasts the takeover");
        load.join().expect("load")
    });
    all_reached_the_proxy(&lines);
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", fixture.pod.path().display()))
            .args([save, "-t", "nat"])
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(!listing.contains("PROXY_INIT"), "{save}: {listing}");
    }
    let before = counter(&home.pods()[0], "outbound_redirected");
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert_eq!(
        counter(&home.pods()[0], "outbound_redirected"),
        before + 1,
        "now the programs intercept"
    );
    drop(installed);
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Many pods added and removed in a loop: every map entry and pin goes with its pod, and the
/// agent's memory does not grow from one round to the next. Registration times are printed
/// (`--nocapture`), never asserted: these machines are shared.
#[test]
fn hundreds_of_pods_come_and_go_without_leaving_anything_behind() {
    if !privileged() {
        return;
    }
    const PODS: usize = 300;
    let fixture = PodFixture::new("agentmany");
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let agent = home.agent().args(&["--metrics-addr", &addr]).start();
    let namespaces = Namespaces::new("many", PODS);
    let socket = home.socket();
    let args: Vec<String> = LINKERD_FLAGS.iter().map(|s| s.to_string()).collect();
    let config = interceptor::config::InterceptionConfig::from_proxy_init_args(&args).unwrap();
    let mut rss = Vec::new();
    let idle_rss = agent.rss_kib();
    for round in 0..3 {
        let mut times: Vec<Duration> = namespaces
            .paths()
            .map(|netns| home.register(&netns, &config))
            .collect();
        assert_eq!(home.pods().len(), PODS);
        // What the agent keeps per pod is small: its configuration, addresses and links, not
        // the 24 KiB the pod map's entry takes (three port bitmaps). Measured on the first
        // round, which also grows the allocator's pools.
        let registered_rss = agent.rss_kib();
        assert!(
            round > 0 || registered_rss < idle_rss + 20 * PODS as u64,
            "{PODS} pods take {} KiB of the agent's memory",
            registered_rss.saturating_sub(idle_rss)
        );
        for netns in namespaces.paths() {
            let request = interceptor::agent::api::Request::Remove { netns };
            interceptor::agent::api::call(&socket, &request).expect("remove");
        }
        times.sort();
        println!(
            "round {round}: registration p50 {:?} p99 {:?} max {:?}; agent RSS {} KiB",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times[times.len() - 1],
            agent.rss_kib()
        );
        rss.push(agent.rss_kib());

        let (_, metrics) = http_get(&addr, "/metrics");
        for line in [
            r#"interceptor_pods_registered{backend="ebpf"} 0"#,
            r#"interceptor_map_entries{map="listeners"} 0"#,
            r#"interceptor_map_entries{map="pending_orig_dst"} 0"#,
        ] {
            assert!(
                metrics.contains(line),
                "round {round}: {line} not in\n{metrics}"
            );
        }
        assert_eq!(home.pinned_pod_links(), 0, "round {round}");
    }
    // The first round grows the allocator's pools; later rounds must reuse them.
    assert!(
        rss[2] <= rss[1] + rss[1] / 10 + 1024,
        "the agent's memory grows round after round: {rss:?} KiB"
    );
}

#[test]
fn status_shows_the_agents_pods() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentstatus");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home
        .agent()
        .meshing(&fixture.pod.path(), &["--name", "web"])
        .start();
    let state_dir = home.state_dir.display().to_string();
    let bpffs = home.bpffs.display().to_string();
    let out = Command::new(BIN)
        .args(["status", "--json", "--agent-state-dir", &state_dir])
        .args(["--agent-bpffs", &bpffs])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).expect("status --json");
    let pods = json["agent"]["pods"].as_array().expect("the agent's pods");
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["meta"]["name"], "web");
    // What its pinned links run, hook by hook, read from the kernel: the variants this
    // kernel's features pick.
    let programs: Vec<(&str, &str)> = json["agent"]["programs"]
        .as_array()
        .expect("the agent's programs")
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["variant"].as_str().unwrap()))
        .collect();
    let chosen =
        interceptor::ebpf::variants::choose(interceptor::ebpf::features::KernelFeatures::get())
            .expect("the eBPF programs run here");
    let attached: Vec<(&str, &str)> = chosen
        .iter()
        .filter(|(hook, _, _)| hook.attach_type().is_some())
        .map(|(_, v, _)| (v.program, v.name))
        .collect();
    assert_eq!(programs, attached);
    let out = Command::new(BIN)
        .args([
            "status",
            "--agent-state-dir",
            &state_dir,
            "--agent-bpffs",
            &bpffs,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("node agent at") && text.contains("outbound_redirected"),
        "{text}"
    );
    assert!(text.contains("program icpt_connect4"), "{text}");
}

/// An upgrade whose maps have another layout: the new agent builds new maps from its pod
/// records, copies the original destinations of connections in flight, switches the links over,
/// and unpins the old maps, under load with no bypass. (The old agent here pins under layout 1
/// with the same code, plus a map of a name earlier layouts used: the switch is what is tested.)
#[test]
fn a_new_map_layout_is_migrated_to_without_a_gap() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentlayout");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let old = home.agent().args(&["--map-layout-version", "1"]).start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    assert!(home.bpffs.join("maps-v1").is_dir());
    for retired in interceptor_common::names::RETIRED_MAPS {
        pin_retired_map(&home.bpffs.join("maps-v1"), retired);
    }

    let app = fixture.in_pod().uid(APP_UID);
    let (lines, new) = connections_while(&app, &[UNREACHABLE, "[2001:db8::2]:1404"], || {
        old.kill();
        home.agent().start()
    });
    // No connection may reach its destination around the proxy. One whose connect was recorded
    // by the replaced programs in the moment the links switch over can miss its original
    // destination, which the proxy refuses (fails closed); there must be next to none.
    assert!(lines.len() > 100, "{} connections", lines.len());
    let bypassed = around_the_proxy(&lines);
    assert!(bypassed.is_empty(), "{bypassed:#?}");
    let unanswered = lines
        .iter()
        .filter(|l| {
            !l.contains(" orig=192.0.2.2:1404 ") && !l.contains(" orig=[2001:db8::2]:1404 ")
        })
        .count();
    // The window is the instant of the switch: a few connections at most, whatever the rate.
    assert!(
        unanswered * 100 <= lines.len(),
        "{unanswered} of {} connections missed their original destination",
        lines.len()
    );

    let version = interceptor_common::MAP_LAYOUT_VERSION;
    assert!(
        !home.bpffs.join("maps-v1").exists(),
        "the old maps are unpinned"
    );
    assert!(home.bpffs.join(format!("maps-v{version}")).is_dir());
    let pods = home.pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["meta"]["name"], "web");
    assert_eq!(
        pods[0]["inbound_listener"], true,
        "the proxy's listener was found again"
    );
    let landing = fixture.on_remote().connect("10.77.0.1:80");
    assert!(
        matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
        "{landing:?}"
    );
    new.stop();
}

#[test]
fn a_full_pod_table_refuses_clearly_and_changes_nothing() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentfull");
    let home = AgentHome::new(&fixture.cgroup.path);
    let _agent = home.agent().args(&["--max-pods", "1"]).start();
    home.mesh(&fixture.pod.path(), &[]);
    let second = Netns::new("full2");
    let out = home.add(&second.path(), &[], &*LINKERD_FLAGS);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("PodTableFull") && stderr(&out).contains("--max-pods"),
        "{}",
        stderr(&out)
    );
    let pods = home.pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["netns"], fixture.pod.path().display().to_string());
    assert_eq!(home.pinned_pod_links(), 1);
    assert_eq!(
        std::fs::read_dir(home.state_dir.join("agent-pods"))
            .unwrap()
            .count(),
        1,
        "no record is left for the refused pod"
    );
}

/// The agent makes room for a descriptor per pod (each pod's sk_lookup link) before it starts:
/// a soft open-files limit of 512 is raised as far as `--max-pods` needs, and the descriptor
/// table is grown once, so that no registration grows it (a growth in a process of several
/// threads waits for an RCU grace period: the registrations that crossed 256, 512 and 1,024
/// descriptors took 10 to 40 ms). A hard limit too low for `--max-pods` is said in the log,
/// and the agent serves anyway.
#[test]
fn the_agent_makes_room_for_a_descriptor_per_pod_before_it_starts() {
    if !privileged() {
        return;
    }
    let besides = u64::from(interceptor::agent::open_files::BESIDES_PODS);
    {
        let fixture = PodFixture::new("fdroom");
        let home = AgentHome::new(&fixture.cgroup.path).with_open_files_limit(512, 4096);
        let agent = home.agent().args(&["--max-pods", "1024"]).start();
        assert_eq!(agent.open_files_limit(), (1024 + besides, 4096));
        // The kernel rounds the table up (to a power of two times 128); a process that did not
        // grow it has 64 here.
        assert!(
            agent.fd_table_size() >= 1024 + besides,
            "{}",
            agent.fd_table_size()
        );
        home.mesh(&fixture.pod.path(), &[]);
    }
    let fixture = PodFixture::new("fdshort");
    let home = AgentHome::new(&fixture.cgroup.path).with_open_files_limit(300, 400);
    let log = home.log_path();
    let agent = home
        .agent()
        .args(&["--max-pods", "1024"])
        .log_to(&log)
        .start();
    assert_eq!(agent.open_files_limit(), (400, 400));
    assert!(agent.fd_table_size() >= 400, "{}", agent.fd_table_size());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains(&format!("room for about {} pods", 400 - besides)) && said.contains("nofile"),
        "{said}"
    );
    home.mesh(&fixture.pod.path(), &[]);
    assert_eq!(home.pods().len(), 1);
}

/// A request whose handling panics inside the agent gets an answer (an `internal` refusal, not a
/// connection closed unanswered), and the agent serves the next ones.
#[test]
fn a_request_that_panics_inside_the_agent_is_answered_and_the_agent_serves_on() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agentpanic");
    let home = AgentHome::new(&fixture.cgroup.path);
    // The first registration panics after its maps are written, before its record is.
    let _agent = home
        .agent()
        .failpoints("agent-before-record=1*panic")
        .start();
    let out = home.add(&fixture.pod.path(), &[], &*LINKERD_FLAGS);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Internal") && stderr(&out).contains("failed while handling"),
        "{}",
        stderr(&out)
    );
    let second = Netns::new("panic2");
    home.mesh(&second.path(), &[]);
    assert!(
        home.pods()
            .iter()
            .any(|p| p["netns"] == second.path().display().to_string()),
        "{:?}",
        home.pods()
    );
    // The first pod is in force, but its record was never written: the CNI plugin's retry of
    // the refused `pod add` writes it, so a restarted agent would restore the pod.
    home.mesh(&fixture.pod.path(), &[]);
    let cookie = home.pod(&fixture.pod.path())["netns_cookie"].clone();
    let record = home.state_dir.join(format!("agent-pods/{cookie}.json"));
    assert!(record.exists(), "{} is missing", record.display());
}

/// `status` says when interception is not in force as configured (a pod's sk_lookup link or a
/// node link no longer pinned), and what; `/ready` says so for the node's links only (a pod's
/// drift does not keep the node from meshing new pods); a new `pod add` or a restart repairs
/// it.
#[test]
fn status_and_ready_say_when_interception_is_not_as_configured() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("agenthealth");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let agent = home.agent().args(&["--metrics-addr", &addr]).start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    let state_dir = home.state_dir.display().to_string();
    let status = || {
        let out = Command::new(BIN)
            .args(["status", "--agent-state-dir", &state_dir])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(http_get(&addr, "/ready").0.contains(" 200 "));
    assert!(
        status().contains("interception in force as configured"),
        "{}",
        status()
    );

    // A removed pin is pinned again at once (tested in agent_pins.rs): the drift here is one the
    // agent cannot undo, someone else's program pinned where its link was.
    let foreign = interceptor_tests::ebpf_backend::foreign_program();
    let displace = |pin: &Path| {
        for _ in 0..50 {
            let _ = std::fs::remove_file(pin);
            match interceptor_sys::obj_pin(foreign.as_fd(), pin) {
                Ok(()) => return,
                // The agent pinned its link again first.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => panic!("pinning at {}: {e}", pin.display()),
            }
        }
        panic!("{} was pinned again 50 times in a row", pin.display());
    };
    let cookie = home.pods()[0]["netns_cookie"].as_u64().unwrap();
    let pod_link = home.bpffs.join(format!("link_icpt_sk_lookup_{cookie}"));
    displace(&pod_link);
    // The pin's removal asked for the pod's check, which the gauge shows.
    eventually("the pod counts as drifted", Duration::from_secs(5), || {
        metric(&addr, "interceptor_pods_drifted") == Some(1.0)
    });
    let problem = format!("its sk_lookup link: {}", pod_link.display());
    let text = status();
    assert!(
        text.contains("DEGRADED") && text.contains(&format!("problem: {problem}")),
        "{text}"
    );
    // The pod's problem, not the node's: it still meshes new pods.
    let (ready, body) = http_get(&addr, "/ready");
    assert!(
        ready.contains(" 200 ") && body == "ready\n",
        "{ready} {body}"
    );
    // Once the foreign pin goes, the agent pins its link again, steering all along.
    std::fs::remove_file(&pod_link).unwrap();
    eventually(
        "the pod's link is pinned again",
        Duration::from_secs(5),
        || metric(&addr, "interceptor_pods_drifted") == Some(0.0),
    );
    assert!(status().contains("interception in force as configured"));
    let landing = fixture.on_remote().connect("10.77.0.1:80");
    assert!(
        matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
        "{landing:?}"
    );

    let node_link = home.bpffs.join("link_icpt_connect4");
    displace(&node_link);
    let (ready, body) = http_get(&addr, "/ready");
    assert!(ready.contains(" 503 "), "{ready}");
    assert!(body.contains("link_icpt_connect4"), "{body}");
    // Not ready is not dead: the liveness probe does not restart an agent for it.
    let (live, body) = http_get(&addr, "/live");
    assert!(live.contains(" 200 ") && body == "live\n", "{live} {body}");
    assert!(status().contains("DEGRADED"), "{}", status());
    // The agent still holds the link: connects are still intercepted.
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    std::fs::remove_file(&node_link).unwrap();
    eventually(
        "the node's link is pinned again",
        Duration::from_secs(5),
        || http_get(&addr, "/ready").0.contains(" 200 "),
    );
    agent.stop();
    let _agent = home.agent().args(&["--metrics-addr", &addr]).start();
    assert!(http_get(&addr, "/ready").0.contains(" 200 "));
    assert!(status().contains("interception in force as configured"));
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
}
