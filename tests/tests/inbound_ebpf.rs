//! Inbound steering properties specific to the eBPF backend: how the proxy's listener is found,
//! failing closed without one, proxy restarts, counters, and pods sharing addresses.
use std::{
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use interceptor::config::{PortRange, PortSet};
use interceptor_common::{counters::Decision, names};
use interceptor_tests::{
    Landing, PodFixture,
    ebpf_backend::{attach, load, options, register},
    privileged,
    scenario::{APP_UID, PROXY_UID, Servers, linkerd_config, start_inbound_proxy},
};

fn assert_steered(landing: &Landing, target: &str) {
    match landing {
        Landing::Proxy {
            name,
            orig: Ok(orig),
            local,
            ..
        } if name == "inbound" && orig.to_string() == target && local == target => {}
        other => panic!("expected {target} steered to the inbound proxy, got {other:?}"),
    }
}

/// Retries for a short bounded time: a proxy's listen() reaches the map asynchronously to us.
fn eventually(mut f: impl FnMut() -> Landing, ok: impl Fn(&Landing) -> bool) -> Landing {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let landing = f();
        if ok(&landing) || Instant::now() > deadline {
            return landing;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn without_a_listening_proxy_inbound_fails_closed_then_steers_once_it_listens() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("nolisten");
    let _servers = Servers::without_inbound_proxy(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let client = fixture.on_remote();

    // The app listens on 80, but a meshed pod's inbound traffic must not reach it around the proxy.
    assert_eq!(
        client.connect("10.77.0.1:80"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    // Exempt traffic is not affected.
    assert_eq!(client.connect("10.77.0.1:4190").server_name(), "app-4190");
    assert!(!node.has_listener(cookie));

    let _proxy = start_inbound_proxy(&fixture);
    assert_steered(&client.connect("10.77.0.1:80"), "10.77.0.1:80");
    assert!(node.has_listener(cookie));
    let counters = node.counters(cookie).unwrap().unwrap();
    // A lookup per SYN: one the client sent again before the refusal reached it is counted
    // again (2 was seen once, on 6.1 under QEMU).
    let refused = counters.get(Decision::InboundNoListener);
    assert!(
        (1..=2).contains(&refused),
        "{refused} lookups without a listener"
    );
    assert_eq!(counters.get(Decision::Steered), 1);
    assert_eq!(counters.get(Decision::InboundIgnoredPort), 1);
}

#[test]
fn a_restarted_proxy_listener_replaces_the_old_one() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("restart");
    let _servers = Servers::without_inbound_proxy(&fixture);
    let mut node = load(options());
    register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let client = fixture.on_remote();

    let proxy = start_inbound_proxy(&fixture);
    assert_steered(&client.connect("10.77.0.1:80"), "10.77.0.1:80");
    drop(proxy);
    // Closed: the kernel dropped the socket from the map, so the pod fails closed again.
    let landing = eventually(
        || client.connect("10.77.0.1:80"),
        |l| matches!(l, Landing::Failed(_)),
    );
    assert_eq!(landing, Landing::Failed("connect:ECONNREFUSED".into()));
    let _proxy = start_inbound_proxy(&fixture);
    assert_steered(&client.connect("10.77.0.1:80"), "10.77.0.1:80");
}

#[test]
fn a_proxy_listening_before_the_pod_is_meshed_is_found() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("early");
    let _servers = Servers::start(&fixture);
    // The inbound proxy has been listening since before the programs were attached.
    let mut node = load(options());
    attach(&mut node, &fixture.cgroup.path);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    assert!(node.has_listener(cookie));
    assert_steered(&fixture.on_remote().connect("10.77.0.1:80"), "10.77.0.1:80");
}

#[test]
fn a_listener_on_another_port_is_not_taken_for_the_proxy() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("otherport");
    let _servers = Servers::without_inbound_proxy(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    // The app (and the proxy's other ports) listening must not become the inbound target.
    let _other =
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .listen(&["proxy", "0.0.0.0:4191", "--name", "admin"]);
    assert!(!node.has_listener(cookie));
    assert_eq!(
        fixture.on_remote().connect("10.77.0.1:80"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
}

#[test]
fn inbound_counters_count_each_decision() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("incount");
    let _servers = Servers::start(&fixture);
    let mut config = linkerd_config();
    config.subnets_to_ignore = vec!["10.77.0.2/32".parse().unwrap()];
    config.inbound_ports_to_ignore = PortSet(vec![PortRange::single(4190)]);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &config);
    attach(&mut node, &fixture.cgroup.path);

    fixture.on_remote().connect("10.77.0.1:4190").server_name();
    fixture.on_remote().connect("10.77.0.1:80").server_name();
    fixture
        .in_pod()
        .uid(APP_UID)
        .connect("10.77.0.1:80")
        .server_name();
    let counters = node.counters(cookie).unwrap().unwrap();
    assert_eq!(
        counters.get(Decision::InboundIgnoredPort),
        1,
        "{counters:?}"
    );
    assert_eq!(
        counters.get(Decision::InboundIgnoredSubnet),
        1,
        "{counters:?}"
    );
    assert!(counters.get(Decision::InboundFromPod) >= 1, "{counters:?}");
    assert_eq!(counters.get(Decision::Steered), 0, "{counters:?}");
}

#[test]
fn two_pods_with_identical_addresses_each_steer_to_their_own_proxy() {
    if !privileged() {
        return;
    }
    let a = PodFixture::new("in-twin-a");
    let b = PodFixture::new("in-twin-b").share_cgroup_with(&a);
    let _servers_a = Servers::start(&a);
    let _servers_b = Servers::without_inbound_proxy(&b);
    let mut config_a = linkerd_config();
    config_a.ports_to_redirect = vec![9090];
    let mut node = load(options());
    register(&mut node, &a.pod, &config_a);
    register(&mut node, &b.pod, &linkerd_config());
    attach(&mut node, &a.cgroup.path);

    // Same addresses, own rules: A steers only 9090, B steers everything but has no proxy yet.
    assert_eq!(
        a.on_remote().connect("10.77.0.1:80").server_name(),
        "app-80"
    );
    assert_steered(&a.on_remote().connect("10.77.0.1:9090"), "10.77.0.1:9090");
    assert_eq!(
        b.on_remote().connect("10.77.0.1:9090"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    // B's proxy starting does not affect A, and A's listener never served B.
    let _proxy_b = start_inbound_proxy(&b);
    assert_steered(&b.on_remote().connect("10.77.0.1:80"), "10.77.0.1:80");
    assert_eq!(
        a.on_remote().connect("10.77.0.1:80").server_name(),
        "app-80"
    );
}

#[test]
fn unregistering_a_pod_stops_steering() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("inremove");
    let _servers = Servers::start(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    assert_steered(&fixture.on_remote().connect("10.77.0.1:80"), "10.77.0.1:80");
    node.remove(cookie).unwrap();
    assert_eq!(
        fixture.on_remote().connect("10.77.0.1:80").server_name(),
        "app-80"
    );
}

#[test]
fn loopback_is_decided_by_the_pods_own_program_and_counted_there() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("lo-own");
    let _servers = Servers::start(&fixture);
    let options = options();
    let pin_dir = options.pin_dir.clone();
    let mut node = load(options);
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    assert_steered(&fixture.on_remote().connect("10.77.0.1:80"), "10.77.0.1:80");

    // Take the shared program out of the tail-call slot (this test's own maps): every lookup the
    // pod's program hands on now fails closed...
    let programs = interceptor_sys::obj_get(&pin_dir.join(names::MAP_SK_LOOKUP_PROG))
        .expect("opening the pinned program array")
        .expect("the program array is pinned");
    interceptor_sys::map_delete_elem(programs.as_fd(), &0u32.to_ne_bytes())
        .expect("removing the shared sk_lookup program");
    assert_eq!(
        fixture.on_remote().connect("10.77.0.1:80"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );

    // Without `ingress_ifindex` (kernels before 5.17, or taken away) the pod's program is the tail
    // call alone: loopback fails closed with everything else, never around the proxy.
    let features = interceptor::ebpf::features::KernelFeatures::get();
    if !features.has(interceptor::ebpf::features::Feature::IngressIfindex) {
        let app = fixture.in_pod().uid(APP_UID);
        assert_eq!(
            app.connect("127.0.0.1:80"),
            Landing::Failed("connect:ECONNREFUSED".into())
        );
        return;
    }
    // ...but loopback never reaches the tail call: the pod still talks to itself, and the
    // lookups are counted in the pod's slot all the same.
    let from_pod = || {
        node.counters(cookie)
            .unwrap()
            .unwrap()
            .get(Decision::InboundFromPod)
    };
    let before = from_pod();
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(app.connect("127.0.0.1:80").server_name(), "app-80");
    assert_eq!(app.connect("[::1]:80").server_name(), "app-80");
    // One lookup per connection, and one for a segment after the reset may add a few.
    let counted = from_pod() - before;
    assert!(
        (2..=6).contains(&counted),
        "{counted} loopback lookups counted"
    );
}
