//! Outbound interception properties specific to the eBPF backend: per-pod identity, the original
//! destination under load and port reuse, bounded state, counters, and detaching.
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData};
use interceptor::{
    config::{PortRange, PortSet},
    ebpf::LoadOptions,
};
use interceptor_common::{
    CONNECT_SLOT_STALE_NS, CONNECT_SLOTS, ConnectSlot, CounterSlotTag, Ip6Addr, NetnsCookie,
    OrigDst, PENDING_SLOT_STALE_SECS, PENDING_SLOTS, PendingKey, PendingOrigDst, PendingSlot,
    counters::Decision, names, outbound_ports, pending_phase,
};
use interceptor_tests::{
    Landing, PodFixture,
    ebpf_backend::{attach, load, options, register},
    eventually_eq,
    fixture::REMOTE_ADDR,
    privileged,
    scenario::{APP_UID, OUTBOUND_PORT, PROXY_UID, Servers, linkerd_config},
};

#[test]
fn counters_count_each_decision_per_pod() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("count");
    let _servers = Servers::start(&fixture);
    let mut config = linkerd_config();
    config.outbound_ports_to_ignore = PortSet(vec![PortRange::single(443)]);
    config.outbound_subnets_to_ignore = vec!["198.51.100.0/24".parse().unwrap()];
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &config);
    attach(&mut node, &fixture.cgroup.path);

    let app = fixture.in_pod().uid(APP_UID);
    for _ in 0..3 {
        app.connect("192.0.2.2:1404").proxy_orig();
    }
    app.connect("127.0.0.1:8080").server_name();
    app.connect("10.77.0.1:8081").server_name();
    app.connect("10.77.0.2:443").server_name();
    app.connect_with("198.51.100.9:80", &[]);
    fixture
        .in_pod()
        .uid(PROXY_UID)
        .connect("10.77.0.2:80")
        .server_name();

    let counters = node.counters(cookie).unwrap().expect("pod registered");
    let expected = [
        (Decision::Redirected, 3),
        // netprobe's proxy asks twice per connection.
        (Decision::OrigDstServed, 6),
        (Decision::Loopback, 1),
        (Decision::PodAddress, 1),
        (Decision::IgnoredPort, 1),
        (Decision::IgnoredSubnet, 1),
        (Decision::ProxyUid, 1),
        (Decision::ProxyGid, 0),
        (Decision::OrigDstNotRecorded, 0),
    ];
    for (decision, want) in expected {
        assert_eq!(
            counters.get(decision),
            want,
            "{}: {counters:?}",
            decision.name()
        );
    }
}

/// getpeername4/6 leave before the pod's lookup for any socket whose peer port is in the node's
/// set of outbound ports (`ICPT_OUT_PORTS`): a pod whose proxy listens on another port than the
/// others gets its port in the set when registered, and its app still sees the address it
/// dialled; a port no pod has is not in it.
#[test]
fn an_app_sees_the_address_it_dialled_whatever_its_pods_outbound_port() {
    if !privileged() {
        return;
    }
    const OTHER_PORT: u16 = 5140;
    let a = PodFixture::new("outport-a");
    let b = PodFixture::new("outport-b").share_cgroup_with(&a);
    let config_a = linkerd_config();
    let mut config_b = linkerd_config();
    config_b.outgoing_proxy_port = OTHER_PORT;
    let options = options();
    let pin = options.pin_dir.join(names::MAP_OUTBOUND_PORTS);
    let mut node = load(options);
    register(&mut node, &a.pod, &config_a);
    register(&mut node, &b.pod, &config_b);
    attach(&mut node, &a.cgroup.path);
    let _proxy_a = a
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &format!("127.0.0.1:{OUTBOUND_PORT}")]);
    let _proxy_b = b
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &format!("127.0.0.1:{OTHER_PORT}")]);

    let set: Array<MapData, u64> = pinned_array(&pin);
    let in_set = |port: u16| {
        set.get(&outbound_ports::word(port), 0).unwrap() & outbound_ports::bit(port) != 0
    };
    assert!(in_set(OUTBOUND_PORT), "{OUTBOUND_PORT} not in the set");
    assert!(in_set(OTHER_PORT), "{OTHER_PORT} not in the set");
    assert!(!in_set(OTHER_PORT + 1), "a port no pod has is in the set");

    for (fixture, dialled) in [(&a, "192.0.2.5:80"), (&b, "192.0.2.6:81")] {
        let (landing, app_peer) = fixture.in_pod().uid(APP_UID).connect_seen(dialled, &[]);
        assert_eq!(landing.proxy_orig().to_string(), dialled, "{landing:?}");
        assert_eq!(app_peer.as_deref(), Some(dialled), "getpeername()");
    }
}

#[test]
fn two_pods_with_identical_addresses_do_not_interfere() {
    if !privileged() {
        return;
    }
    // Both pods are 10.77.0.1 with a remote 10.77.0.2; one node attachment serves both.
    let a = PodFixture::new("twin-a");
    let b = PodFixture::new("twin-b").share_cgroup_with(&a);
    let _servers_a = Servers::start(&a);
    let _servers_b = Servers::start(&b);
    let mut config_a = linkerd_config();
    config_a.outbound_ports_to_ignore = PortSet(vec![PortRange::single(80)]);
    let config_b = linkerd_config();
    let mut node = load(options());
    register(&mut node, &a.pod, &config_a);
    register(&mut node, &b.pod, &config_b);
    attach(&mut node, &a.cgroup.path);
    let app_a = a.in_pod().uid(APP_UID);
    let app_b = b.in_pod().uid(APP_UID);

    // Each pod's own configuration applies to it alone.
    assert_eq!(app_a.connect("10.77.0.2:80").server_name(), "remote-80");
    assert_eq!(
        app_b.connect("10.77.0.2:80").proxy_orig().to_string(),
        "10.77.0.2:80"
    );

    // Same source address and port in both pods, different destinations, at the same time:
    // each pod's proxy gets its own answer.
    for round in 0..20 {
        let bind = format!("10.77.0.1:{}", 40000 + round);
        let (la, lb) = std::thread::scope(|s| {
            let ta =
                s.spawn(|| app_a.connect_with("192.0.2.1:1111", &["--bind", &bind, "--linger0"]));
            let tb =
                s.spawn(|| app_b.connect_with("192.0.2.2:2222", &["--bind", &bind, "--linger0"]));
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert_eq!(
            la.proxy_orig().to_string(),
            "192.0.2.1:1111",
            "round {round}: {la:?}"
        );
        assert_eq!(
            lb.proxy_orig().to_string(),
            "192.0.2.2:2222",
            "round {round}: {lb:?}"
        );
        for landing in [&la, &lb] {
            let Landing::Proxy { peer, .. } = landing else {
                unreachable!()
            };
            assert_eq!(peer, &bind, "the proxy sees the real client address");
        }
    }
}

#[test]
fn thousands_of_short_connections_all_get_their_original_destination() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("loop");
    let _servers = Servers::start(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);

    // Closed with RST, so client ports are reused at once: every reuse must get its own answer.
    let targets = [
        "192.0.2.1:80",
        "192.0.2.2:443",
        "192.0.2.3:8080",
        "198.51.100.7:5432",
        "10.77.0.2:80",
    ];
    let mut args = vec!["check", "--count", "3000", "--threads", "4"];
    args.extend_from_slice(&targets);
    let out = fixture.in_pod().uid(APP_UID).run(&args);
    assert_eq!(
        out.first().map(String::as_str),
        Some("ok=3000 bad=0"),
        "{out:#?}"
    );

    let counters = node.counters(cookie).unwrap().unwrap();
    assert_eq!(counters.get(Decision::Redirected), 3000);
    assert_eq!(counters.get(Decision::OrigDstServed), 2 * 3000);
    // Every proxy socket closed: nothing is left behind, once the kernel has processed the
    // last closes (the app's runs end before the proxy's side closes).
    eventually_eq("pending original destinations", 0, || {
        node.backend().pod_writer().pending_orig_dst_entries()
    });
}

#[test]
fn entries_go_when_the_proxy_socket_closes_read_or_not() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("closed");
    // A proxy that never asks SO_ORIGINAL_DST, and closes each connection after one line.
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", "127.0.0.1:4140", "--no-orig"]);
    let mut node = load(options());
    register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);

    let out = fixture
        .in_pod()
        .uid(APP_UID)
        .run(&["connect", "192.0.2.1:80", "--count", "300"]);
    assert_eq!(out.len(), 300);
    assert!(out.iter().all(|l| l.starts_with("who=proxy")), "{out:?}");
    // The app has its line before the proxy closes its side: wait for the last close.
    eventually_eq("pending original destinations", 0, || {
        node.backend().pod_writer().pending_orig_dst_entries()
    });
}

/// A proxy whose sockets the programs do not see (listening in the pod's namespace but outside
/// the attached cgroup): nothing ever removes the entries of its connections.
fn proxy_outside_the_cgroup(fixture: &PodFixture) -> interceptor_tests::probe::Listener {
    interceptor_tests::Probe::new()
        .netns(&fixture.pod.path())
        .uid(PROXY_UID)
        .listen(&["proxy", "127.0.0.1:4140", "--no-orig"])
}

#[test]
fn entries_nobody_removes_are_bounded() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("bound");
    let _proxy = proxy_outside_the_cgroup(&fixture);
    let options = LoadOptions {
        orig_dst_capacity: 64,
        ..options()
    };
    let pending_slots = PendingSlots::open(&options);
    let mut node = load(options);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    // Every slot held by a connection of just now: they all go to the LRU map, whose capacity
    // is what bounds them (the slots are bounded by their number, and taken over by age).
    pending_slots.fill(cookie, pending_phase::RECORDED, coarse_secs_now());

    let out = fixture.in_pod().uid(APP_UID).run(&[
        "connect",
        "192.0.2.1:80",
        "--count",
        "300",
        "--linger0",
    ]);
    assert!(out.iter().all(|l| l.starts_with("who=proxy")), "{out:?}");
    let pending = node.backend().pod_writer().fill_levels().pending_in_lru;
    assert!(pending <= 64 && pending > 0, "pending entries: {pending}");
}

#[test]
fn a_stale_entry_never_answers_for_a_reused_tuple() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("stale");
    let mut node = load(options());
    register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let app = fixture.in_pod().uid(APP_UID);
    let proxy_addr = format!("127.0.0.1:{OUTBOUND_PORT}");

    // 1. A redirected connection whose entry nothing removes.
    {
        let _proxy = proxy_outside_the_cgroup(&fixture);
        let landing = app.connect_with("192.0.2.1:80", &["--bind", "127.0.0.1:41000", "--linger0"]);
        assert!(matches!(landing, Landing::Proxy { .. }), "{landing:?}");
        assert_eq!(node.backend().pod_writer().pending_orig_dst_entries(), 1);
    }
    // 2. A direct (loopback, not redirected) connection from the very same 4-tuple, to a proxy
    //    the programs see.
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &proxy_addr]);
    let landing = app.connect_with(&proxy_addr, &["--bind", "127.0.0.1:41000", "--linger0"]);
    // Answered like conntrack answers for a connection that was not NATed: its own destination.
    match landing {
        Landing::Proxy { orig: Ok(orig), .. } if orig.to_string() == proxy_addr => {}
        other => panic!("a stale original destination answered for another connection: {other:?}"),
    }
}

#[test]
fn udp_is_never_touched() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("udp");
    let mut node = load(options());
    register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let mut receiver = std::process::Command::new(interceptor_tests::probe::netprobe_path())
        .args([
            "--netns",
            &fixture.remote.path().display().to_string(),
            "udp-server",
            "10.77.0.2:5353",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(receiver.stdout.take().unwrap()));
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    fixture
        .in_pod()
        .uid(APP_UID)
        .run(&["udp-send", "10.77.0.2:5353", "hello"]);
    let got = lines.next().unwrap().unwrap();
    receiver.kill().ok();
    receiver.wait().ok();
    assert!(
        got.starts_with("udp from=10.77.0.1:") && got.ends_with("msg=hello"),
        "{got}"
    );
}

#[test]
fn namespaces_that_are_not_registered_are_untouched() {
    if !privileged() {
        return;
    }
    let meshed = PodFixture::new("meshed");
    let other = PodFixture::new("other").share_cgroup_with(&meshed);
    let _servers = Servers::start(&other);
    let mut node = load(options());
    register(&mut node, &meshed.pod, &linkerd_config());
    attach(&mut node, &meshed.cgroup.path);
    // In the attached cgroup, but in a namespace no pod registered.
    let app = other.in_pod().uid(APP_UID);
    assert_eq!(app.connect("10.77.0.2:80").server_name(), "remote-80");
    assert_eq!(
        app.connect("192.0.2.1:80"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
}

#[test]
fn detaching_restores_direct_connections() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("detach");
    let _servers = Servers::start(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let app = fixture.in_pod().uid(APP_UID);
    let remote: SocketAddr = format!("{REMOTE_ADDR}:80").parse().unwrap();
    assert_eq!(app.connect(&remote.to_string()).proxy_orig(), remote);

    // Unregistering the pod stops interception at once, programs still attached.
    node.remove(cookie).unwrap();
    assert_eq!(app.connect(&remote.to_string()).server_name(), "remote-80");

    // Registered again, then detached altogether by dropping the node.
    register(&mut node, &fixture.pod, &linkerd_config());
    assert_eq!(app.connect(&remote.to_string()).proxy_orig(), remote);
    drop(node);
    // A child forked by another test holds copies of the link fds until it execs.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match app.connect(&remote.to_string()) {
            Landing::Server { name, .. } if name == "remote-80" => break,
            other if Instant::now() > deadline => {
                panic!("still intercepted after detaching: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// connect4/6 hand the original destination to sock_ops in a slot of `ICPT_CONN_SLOTS` picked by
/// the socket's cookie. A slot still taken by a connect in flight sends the next connect with
/// its index to the LRU map (every slot taken here: every connect goes there, and the slots are
/// left alone); a slot taken long ago, by a connect that never completed, is taken over and
/// given back.
#[test]
fn a_taken_connect_slot_sends_the_connect_to_the_lru_map_and_a_stale_one_is_taken_over() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("slots");
    let options = options();
    let pin = options.pin_dir.join(names::MAP_CONNECT_SLOTS);
    let mut node = load(options);
    register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &format!("127.0.0.1:{OUTBOUND_PORT}")]);
    let app = fixture.in_pod().uid(APP_UID);
    let mut slots: Array<MapData, ConnectSlot> = pinned_array(&pin);
    let now = coarse_ns_now();
    let mut fill = |taken_ns: u64| {
        let orig = OrigDst {
            netns_cookie: 1,
            addr: Ip6Addr::from_ip4_be(u32::from_be_bytes([203, 0, 113, 9]).to_be()),
            port_be: 9u16.to_be(),
            counter_slot: CounterSlotTag::UNKNOWN,
            _pad2: 0,
        };
        for index in 0..CONNECT_SLOTS {
            let slot = ConnectSlot {
                socket_cookie: u64::MAX - u64::from(index),
                taken_ns,
                orig,
            };
            slots.set(index, slot, 0).expect("writing a slot");
        }
    };

    // Every slot taken just now.
    fill(now);
    twenty_connects_land_right(&app);
    let read_slots = || {
        pinned_array::<ConnectSlot>(&pin)
            .iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    };
    let held = read_slots();
    assert!(
        held.iter()
            .enumerate()
            .all(|(i, s)| s.socket_cookie == u64::MAX - i as u64),
        "a slot taken by a connect in flight was taken from it"
    );
    assert_eq!(
        node.backend().pod_writer().fill_levels().connecting,
        0,
        "moved on once established"
    );

    // Every slot taken long ago: taken over by the connects, then given back.
    fill(now.wrapping_sub(CONNECT_SLOT_STALE_NS + 1_000_000_000));
    twenty_connects_land_right(&app);
    let free = read_slots().iter().filter(|s| s.socket_cookie == 0).count();
    assert_eq!(
        free, 20,
        "each connect took a stale slot over and gave it back"
    );
}

/// The pinned `ICPT_PEND_SLOTS` of a test's own maps, to fill with other connections' entries.
struct PendingSlots {
    pin: std::path::PathBuf,
}

impl PendingSlots {
    fn open(options: &LoadOptions) -> Self {
        Self {
            pin: options.pin_dir.join(names::MAP_PENDING_SLOTS),
        }
    }

    fn array(&self) -> Array<MapData, PendingSlot> {
        pinned_array(&self.pin)
    }

    /// Every slot held, in `phase` since `secs`, by a connection of the pod that no app has.
    fn fill(&self, cookie: NetnsCookie, phase: u64, secs: u64) {
        let mut slots = self.array();
        for index in 0..PENDING_SLOTS {
            slots
                .set(index, other_connection(cookie, index, phase, secs), 0)
                .expect("writing a slot");
        }
    }

    fn read(&self) -> Vec<PendingSlot> {
        self.array().iter().map(Result::unwrap).collect()
    }
}

/// An entry for a connection from 127.0.0.2 (no test app uses it), held in `phase` since `secs`.
fn other_connection(cookie: NetnsCookie, index: u32, phase: u64, secs: u64) -> PendingSlot {
    PendingSlot {
        state: pending_phase::state(phase, secs, 0),
        key: PendingKey {
            netns_cookie: cookie.0,
            client: Ip6Addr::from(std::net::IpAddr::from([127, 0, 0, 2])),
            client_port: index,
            _pad: 0,
        },
        orig: PendingOrigDst {
            addr: Ip6Addr::from(std::net::IpAddr::from([203, 0, 113, 9])),
            port_be: 9u16.to_be(),
            counter_slot: CounterSlotTag::UNKNOWN,
            server_isn_next: index,
        },
    }
}

/// Now as the programs' `bpf_ktime_get_coarse_ns()` reads it (CLOCK_MONOTONIC_COARSE).
fn coarse_ns_now() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).unwrap();
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

/// Now in the pending slots' coarse seconds (`bpf_ktime_get_coarse_ns() >> 30`).
fn coarse_secs_now() -> u64 {
    coarse_ns_now() >> 30
}

/// An array map of this test's own maps, opened from its pin.
fn pinned_array<T: aya::Pod>(pin: &std::path::Path) -> Array<MapData, T> {
    let data = MapData::from_pin(pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    Array::try_from(Map::from_map_data(data).expect("a map")).expect("an array")
}

/// Twenty redirected connects from `app`, each reaching the proxy with its original destination.
fn twenty_connects_land_right(app: &interceptor_tests::Probe) {
    for _ in 0..20 {
        assert_eq!(
            app.connect("192.0.2.1:80").proxy_orig().to_string(),
            "192.0.2.1:80"
        );
    }
}

/// A pending slot held by a live connection sends the next connection with its index to the
/// LRU map; one held long ago by a connection that is not both established and open, or by
/// the same 4-tuple, is taken over.
#[test]
fn a_held_pending_slot_sends_the_connection_to_the_lru_map_and_a_stale_or_same_key_one_is_taken() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("pslots");
    let options = options();
    let pending_slots = PendingSlots::open(&options);
    let mut node = load(options);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &format!("127.0.0.1:{OUTBOUND_PORT}")]);
    let app = fixture.in_pod().uid(APP_UID);
    let untouched = |phase: u64, secs: u64| {
        pending_slots
            .read()
            .iter()
            .enumerate()
            .filter(|(i, s)| **s == other_connection(cookie, *i as u32, phase, secs))
            .count()
    };
    let now = coarse_secs_now();
    // Older than stale however long the machine has been up (a guest may be up less than
    // PENDING_SLOT_STALE_SECS): the programs compare ages with wrapping arithmetic.
    let stale = now.wrapping_sub(PENDING_SLOT_STALE_SECS + 10);

    // Held by connections of just now, or watched by their proxy however old: never taken, the
    // connections go to the LRU map, and their entries go when the proxy's sockets close.
    for (phase, secs) in [
        (pending_phase::RECORDED, now),
        (pending_phase::WATCHED, stale),
    ] {
        pending_slots.fill(cookie, phase, secs);
        twenty_connects_land_right(&app);
        assert_eq!(
            untouched(phase, secs),
            PENDING_SLOTS as usize,
            "phase {phase}"
        );
        eventually_eq(&format!("pending in the LRU map, phase {phase}"), 0, || {
            node.backend().pod_writer().fill_levels().pending_in_lru
        });
    }

    // Recorded long ago and never watched (the proxy side never got established), or half
    // closed long ago (the other side's close never reported): taken over, then freed when
    // the connection's sockets close.
    // Two phases a fill (a fill is 65,536 writes, slow in the matrix's guests), alternating
    // with the index's second bit: ephemeral ports are even, and their second bits vary.
    for phases in [
        [pending_phase::RECORDED, pending_phase::APP_CLOSED_EARLY],
        [pending_phase::PROXY_CLOSED, pending_phase::APP_CLOSED],
    ] {
        let stale_in = |i: usize| other_connection(cookie, i as u32, phases[(i >> 1) & 1], stale);
        let mut slots = pending_slots.array();
        for index in 0..PENDING_SLOTS {
            slots
                .set(index, stale_in(index as usize), 0)
                .expect("writing a slot");
        }
        twenty_connects_land_right(&app);
        let read = pending_slots.read();
        let taken: Vec<u64> = (0..read.len())
            .filter(|&i| read[i] != stale_in(i))
            .map(|i| phases[(i >> 1) & 1])
            .collect();
        assert_eq!(taken.len(), 20, "each connection took a stale slot over");
        for phase in phases {
            assert!(
                taken.contains(&phase),
                "none in phase {phase} taken: {taken:?}"
            );
        }
        eventually_eq(
            "slots freed: each connection took a stale slot over and freed it at close",
            20,
            || pending_slots.read().iter().filter(|s| s.state == 0).count(),
        );
    }

    // Held, watched, by an earlier connection with the very same 4-tuple (its proxy side is
    // over): the new connection takes it, and frees it at close.
    pending_slots.fill(cookie, pending_phase::WATCHED, now);
    let key = PendingKey {
        netns_cookie: cookie.0,
        client: Ip6Addr::from(std::net::IpAddr::from([127, 0, 0, 1])),
        client_port: 41001,
        _pad: 0,
    };
    let index = key.slot_index();
    let mut slots = pending_slots.array();
    slots
        .set(
            index,
            PendingSlot {
                key,
                ..other_connection(cookie, index, pending_phase::WATCHED, now)
            },
            0,
        )
        .unwrap();
    let landing = app.connect_with("192.0.2.1:80", &["--bind", "127.0.0.1:41001", "--linger0"]);
    assert_eq!(landing.proxy_orig().to_string(), "192.0.2.1:80");
    eventually_eq(
        "the slot taken by the same 4-tuple, freed at close",
        0,
        || pending_slots.read()[index as usize].state,
    );
    assert_eq!(
        untouched(pending_phase::WATCHED, now),
        PENDING_SLOTS as usize - 1
    );
}

/// A slot whose connection's closes were never reported (its programs detached meanwhile,
/// say) holds that connection's 4-tuple: another socket of the same 4-tuple, one that was not
/// redirected, must not get that connection's destination from `getpeername()`.
#[test]
fn a_slot_left_behind_answers_no_other_sockets_getpeername() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("leftslot");
    let options = options();
    let pending_slots = PendingSlots::open(&options);
    let mut node = load(options);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let proxy_addr = format!("127.0.0.1:{OUTBOUND_PORT}");
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &proxy_addr]);
    let key = PendingKey {
        netns_cookie: cookie.0,
        client: Ip6Addr::from(std::net::IpAddr::from([127, 0, 0, 1])),
        client_port: 41002,
        _pad: 0,
    };
    // Left half closed by an app socket (tag 7) that is gone, in every phase an app may ask in.
    for phase in [pending_phase::WATCHED, pending_phase::PROXY_CLOSED] {
        let index = key.slot_index();
        pending_slots
            .array()
            .set(
                index,
                PendingSlot {
                    state: pending_phase::state(phase, coarse_secs_now(), 7),
                    key,
                    ..other_connection(cookie, index, phase, 0)
                },
                0,
            )
            .unwrap();
        // A direct connection from that very 4-tuple: its peer is the proxy's address.
        let (landing, app_peer) = fixture
            .in_pod()
            .uid(APP_UID)
            .connect_seen(&proxy_addr, &["--bind", "127.0.0.1:41002", "--linger0"]);
        assert!(matches!(landing, Landing::Proxy { .. }), "{landing:?}");
        assert_eq!(
            app_peer.as_deref(),
            Some(proxy_addr.as_str()),
            "phase {phase}: the app saw another socket's destination"
        );
    }
}

/// Rounds of churned connections (`churn`, a binary of the test kit) with every close order:
/// app first, proxy first, both at once, app reset, never accepted, proxy killed. Four live
/// connections fold to each slot a round uses (one in it, three in the LRU map); before the
/// churn, a third of those slots are held by a live connection of another client (all four go
/// to the LRU map) and two thirds are left half closed long ago (taken over). Every answer must
/// be right, and once every socket is closed every slot and LRU entry must be free.
#[test]
fn churned_connections_in_every_close_order_leave_every_slot_free() {
    if !privileged() {
        return;
    }
    // As `churn` uses them: 20 slot indices a round, from 0.
    const ROUNDS: u32 = 10;
    const INDICES: u32 = ROUNDS * 20;
    let fixture = PodFixture::new("churn");
    let options = options();
    let pending_slots = PendingSlots::open(&options);
    let connect_slots = options.pin_dir.join(names::MAP_CONNECT_SLOTS);
    let mut node = load(options);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);

    let now = coarse_secs_now();
    let stale = now.wrapping_sub(PENDING_SLOT_STALE_SECS + 10);
    let prepared = |index: u32| match index % 3 {
        0 => other_connection(cookie, index, pending_phase::WATCHED, now),
        1 => other_connection(cookie, index, pending_phase::PROXY_CLOSED, stale),
        _ => other_connection(cookie, index, pending_phase::APP_CLOSED, stale),
    };
    let mut slots = pending_slots.array();
    for index in 0..INDICES {
        slots
            .set(index, prepared(index), 0)
            .expect("writing a slot");
    }

    let churn = std::process::Command::new(interceptor_tests::probe::sibling_binary("churn"))
        .args([
            "--netns",
            &fixture.pod.path().display().to_string(),
            "--cgroup",
            &fixture.cgroup.path.display().to_string(),
            "--uid",
            &APP_UID.to_string(),
            "--netns-cookie",
            &cookie.0.to_string(),
            "--rounds",
            &ROUNDS.to_string(),
        ])
        .output()
        .expect("run churn");
    let out = String::from_utf8_lossy(&churn.stdout);
    assert!(
        churn.status.success(),
        "churn: {}{out}",
        String::from_utf8_lossy(&churn.stderr)
    );
    let summary = out.lines().next().unwrap_or_default();
    assert!(summary.ends_with(" wrong=0"), "{out}");
    let connections: usize = summary
        .split_once("connections=")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // Four a slot, 20 slots a round, less the few ports that are privileged.
    assert!(connections > 700, "{out}");

    // The live connection of another client kept its slots; every stale one was taken over.
    let read = pending_slots.read();
    for index in 0..INDICES {
        let slot = read[index as usize];
        if index % 3 == 0 {
            assert_eq!(slot, prepared(index), "slot {index}: a live one was taken");
            let free = other_connection(cookie, index, pending_phase::FREE, 0);
            slots.set(index, free, 0).unwrap();
        } else {
            assert_ne!(
                slot,
                prepared(index),
                "slot {index}: a stale one was not taken over"
            );
        }
    }
    eventually_eq("pending slots held", Vec::<usize>::new(), || {
        pending_slots
            .read()
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state != pending_phase::FREE)
            .map(|(i, _)| i)
            .collect()
    });
    eventually_eq("LRU entries of connections and connects", (0, 0), || {
        let levels = node.backend().pod_writer().fill_levels();
        (levels.pending_in_lru, levels.connecting)
    });
    let taken = pinned_array::<ConnectSlot>(&connect_slots)
        .iter()
        .filter(|s| s.as_ref().unwrap().socket_cookie != 0)
        .count();
    assert_eq!(taken, 0, "connect slots still taken");
}

/// Map layout 8 keeps a `PendingSlot` in `ICPT_PENDING`, where layout 7 kept a bare
/// `PendingOrigDst`, and dates and tags states: an upgrade copies layout 7's LRU entries as
/// recorded entries, and its slots' entries with their phase alone, into the new LRU map.
#[test]
fn layout_7s_entries_in_flight_are_copied_as_pending_slots() {
    if !privileged() {
        return;
    }
    let options = options();
    let new_lru = options.pin_dir.join(names::MAP_PENDING);
    // The older layout's directory, in this test's own (which the node creates).
    let old = options.pin_dir.join("layout7");
    let mut node = load(options);
    std::fs::create_dir(&old).unwrap();
    let pin = |map_type, key_size, value_size, name: &str| {
        let map = interceptor_sys::map_create(map_type, key_size, value_size, 4, name).unwrap();
        interceptor_sys::obj_pin(std::os::fd::AsFd::as_fd(&map), &old.join(name)).unwrap();
        let data = MapData::from_pin(old.join(name)).unwrap();
        Map::from_map_data(data).unwrap()
    };
    let cookie = NetnsCookie(7);
    let in_lru = other_connection(cookie, 1, pending_phase::FREE, 0);
    let mut lru: aya::maps::HashMap<MapData, PendingKey, PendingOrigDst> = pin(
        interceptor_sys::bpf_map_type::BPF_MAP_TYPE_LRU_HASH,
        32,
        24,
        names::MAP_PENDING,
    )
    .try_into()
    .unwrap();
    lru.insert(in_lru.key, in_lru.orig, 0).unwrap();
    // Layout 7 dated a slot with every bit above the phase.
    let mut in_slot = other_connection(cookie, 2, pending_phase::WATCHED, 0);
    in_slot.state = (u64::MAX << 8) | pending_phase::WATCHED;
    let mut slots: Array<MapData, PendingSlot> = pin(
        interceptor_sys::bpf_map_type::BPF_MAP_TYPE_ARRAY,
        4,
        64,
        names::MAP_PENDING_SLOTS,
    )
    .try_into()
    .unwrap();
    slots.set(2, in_slot, 0).unwrap();

    assert_eq!(
        node.backend_mut().pod_writer_mut().import_in_flight(&old),
        2
    );
    std::fs::remove_dir_all(&old).unwrap();
    let copied: aya::maps::HashMap<MapData, PendingKey, PendingSlot> =
        Map::from_map_data(MapData::from_pin(&new_lru).unwrap())
            .unwrap()
            .try_into()
            .unwrap();
    assert_eq!(
        copied.get(&in_lru.key, 0).unwrap(),
        PendingSlot {
            state: pending_phase::state(pending_phase::RECORDED, 0, 0),
            ..in_lru
        }
    );
    assert_eq!(
        copied.get(&in_slot.key, 0).unwrap(),
        PendingSlot {
            state: pending_phase::state(pending_phase::WATCHED, 0, 0),
            ..in_slot
        }
    );
}

#[test]
fn a_load_that_fails_leaves_no_pins_behind() {
    if !privileged() {
        return;
    }
    // A map of no entries: the kernel refuses to create it, after the maps before it were
    // created and pinned.
    let options = LoadOptions {
        orig_dst_capacity: 0,
        ..options()
    };
    let pin_dir = options.pin_dir.clone();
    assert!(interceptor::ebpf::EbpfNode::load(options).is_err());
    assert!(!pin_dir.exists(), "{} is left", pin_dir.display());
}
