//! Dual-stack pods: one app using both families at once, a proxy on dual-stack `[::]` sockets,
//! apps listening on `[::]`, and `--ipv6=false` leaving native IPv6 alone but never IPv4 on an
//! IPv6 socket. The per-family behaviour of every rule is in the behaviour table.
use interceptor::config::{InterceptionConfig, PortRange, PortSet};
use interceptor_common::counters::Decision;
use interceptor_tests::{
    Landing, PodFixture,
    ebpf_backend::{attach, load, options, register},
    fixture::{POD_ADDR, POD_ADDR6, REMOTE_ADDR, REMOTE_ADDR6},
    iptables_backend::Iptables,
    privileged,
    probe::Listener,
    scenario::{self, APP_UID, Backend, INBOUND_PORT, OUTBOUND_PORT, PROXY_UID, linkerd_config},
};

fn dual_stack_config() -> InterceptionConfig {
    InterceptionConfig {
        ipv6: true,
        outbound_ports_to_ignore: PortSet(vec![PortRange::single(443)]),
        ..linkerd_config()
    }
}

/// The proxy as one process with dual-stack `[::]` sockets for both ports: IPv4 reaches it as
/// `::ffff:a.b.c.d`.
fn start_dual_stack_proxy(fixture: &PodFixture) -> Listener {
    let (outbound, inbound) = (
        format!("[::]:{OUTBOUND_PORT}"),
        format!("[::]:{INBOUND_PORT}"),
    );
    fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &outbound, &inbound, "--name", "proxy"])
}

/// The pod's app on dual-stack `[::]` sockets, and the remote's servers on both families.
fn start_servers(fixture: &PodFixture) -> Vec<Listener> {
    let mut servers =
        vec![
            fixture
                .in_pod()
                .listen(&["server", "[::]:80", "[::]:4190", "--name", "app"]),
        ];
    for port in [80, 443] {
        let (v4, v6) = (
            format!("{REMOTE_ADDR}:{port}"),
            format!("[{REMOTE_ADDR6}]:{port}"),
        );
        servers.push(fixture.on_remote().listen(&[
            "server",
            &v4,
            &v6,
            "--name",
            &format!("remote-{port}"),
        ]));
    }
    servers
}

fn ok_count(lines: &[String]) -> usize {
    let summary = lines
        .iter()
        .find(|l| l.starts_with("ok="))
        .unwrap_or_else(|| panic!("no summary in {lines:?}"));
    assert!(summary.ends_with(" bad=0"), "{lines:#?}");
    summary["ok=".len()..]
        .split_once(' ')
        .and_then(|(n, _)| n.parse().ok())
        .expect("ok=N")
}

#[test]
fn one_app_uses_both_families_at_once_through_one_proxy_on_dual_stack_sockets() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("dual");
    let _servers = start_servers(&fixture);
    let _proxy = start_dual_stack_proxy(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &dual_stack_config());
    attach(&mut node, &fixture.cgroup.path);

    // Outbound over AF_INET, AF_INET6 to IPv4-mapped, and native IPv6, interleaved, while
    // clients of both families connect to the pod: every connection must land on the proxy
    // with its own original destination.
    let outbound = [
        format!("{REMOTE_ADDR}:80"),
        format!("[::ffff:{REMOTE_ADDR}]:80"),
        format!("[{REMOTE_ADDR6}]:80"),
        "[2001:db8::2]:1404".to_owned(),
    ];
    let inbound = [format!("{POD_ADDR}:80"), format!("[{POD_ADDR6}]:80")];
    let app = fixture.in_pod().uid(APP_UID);
    let client = fixture.on_remote();
    let (outbound_ok, inbound_ok) = std::thread::scope(|s| {
        let out = s.spawn(|| {
            let mut args = vec!["check", "--count", "400", "--threads", "4"];
            args.extend(outbound.iter().map(String::as_str));
            ok_count(&app.run(&args))
        });
        let mut args = vec!["check", "--count", "200", "--threads", "2"];
        args.extend(inbound.iter().map(String::as_str));
        let inbound_ok = ok_count(&client.run(&args));
        (out.join().expect("outbound check"), inbound_ok)
    });
    assert_eq!((outbound_ok, inbound_ok), (400, 200));

    // Exempt, in both families: an ignored port, the pod's own [::] app from inside the pod, and
    // an ignored inbound port reaching the app on [::] as it would reach one on 0.0.0.0.
    for target in [
        format!("{REMOTE_ADDR}:443"),
        format!("[{REMOTE_ADDR6}]:443"),
    ] {
        assert_eq!(app.connect(&target).server_name(), "remote-443");
    }
    for target in [format!("{POD_ADDR}:80"), format!("[{POD_ADDR6}]:80")] {
        assert_eq!(app.connect(&target).server_name(), "app");
    }
    for target in [format!("{POD_ADDR}:4190"), format!("[{POD_ADDR6}]:4190")] {
        assert_eq!(client.connect(&target).server_name(), "app");
    }

    // Every connection is accounted for. Each redirected connection also reaches the proxy over
    // lo, which sk_lookup sees as the pod talking to itself, as do the app's two connections to
    // its own addresses; sk_lookup also runs for a segment that finds no socket any more (the
    // proxy's FIN after the app closed with RST), so that counter may be a little higher.
    let counters = node.counters(cookie).unwrap().unwrap();
    assert_eq!(counters.get(Decision::Redirected), 400);
    // netprobe's proxy asks twice per connection.
    assert_eq!(counters.get(Decision::OrigDstServed), 800);
    assert_eq!(counters.get(Decision::IgnoredPort), 2);
    assert_eq!(counters.get(Decision::PodAddress), 2);
    // Once per connection, and again for a SYN retransmitted before the proxy accepted (a
    // busy emulated guest in the kernel matrix).
    let steered = counters.get(Decision::Steered);
    assert!((200..=400).contains(&steered), "steered {steered}");
    assert_eq!(counters.get(Decision::InboundIgnoredPort), 2);
    let from_pod = counters.get(Decision::InboundFromPod);
    // At least one lookup per connection; segments after a reset add at most a few each.
    assert!(
        (400 + 2..=400 + 2 + 3 * 400).contains(&from_pod),
        "{counters:?}"
    );
    let outbound_total: u64 = [
        Decision::Redirected,
        Decision::ProxyUid,
        Decision::ProxyGid,
        Decision::Loopback,
        Decision::PodAddress,
        Decision::IgnoredPort,
        Decision::IgnoredSubnet,
        Decision::Ipv6NotIntercepted,
    ]
    .iter()
    .map(|d| counters.get(*d))
    .sum();
    assert_eq!(outbound_total, 400 + 2 + 2, "{counters:?}");
    assert_eq!(counters.get(Decision::OrigDstNotRecorded), 0);
    assert_eq!(counters.get(Decision::InboundNoListener), 0);
}

/// `--ipv6=false`, on both backends: native IPv6 goes where it was sent, IPv4 does not escape
/// through an IPv6 socket.
#[test]
fn without_ipv6_native_ipv6_is_left_alone_but_ipv4_on_ipv6_sockets_is_not() {
    if !privileged() {
        return;
    }
    let config = InterceptionConfig {
        ipv6: false,
        ..linkerd_config()
    };
    let backends: [(&str, &dyn Backend); 2] = [
        ("ebpf", &interceptor_tests::ebpf_backend::Ebpf),
        (
            "iptables-nft",
            &Iptables(interceptor::iptables::IptablesMode::Nft),
        ),
    ];
    for (name, backend) in backends {
        let fixture = PodFixture::new("noip6");
        let _servers = scenario::Servers::start(&fixture);
        let _attached = backend.attach(&fixture, &config);
        let app = fixture.in_pod().uid(APP_UID);
        let client = fixture.on_remote();

        let native = format!("[{REMOTE_ADDR6}]:80");
        assert_eq!(app.connect(&native).server_name(), "remote-80", "{name}");
        let mapped = format!("[::ffff:{REMOTE_ADDR}]:80");
        assert_eq!(
            app.connect(&mapped).proxy_orig().to_string(),
            format!("{REMOTE_ADDR}:80"),
            "{name}"
        );
        let native_in = format!("[{POD_ADDR6}]:80");
        assert_eq!(client.connect(&native_in).server_name(), "app-80", "{name}");
        let mapped_in = format!("[::ffff:{POD_ADDR}]:80");
        assert!(
            matches!(client.connect(&mapped_in), Landing::Proxy { ref name, .. } if name == "inbound"),
            "{name}"
        );
    }
}

#[test]
fn ipv6_decisions_are_counted_when_ipv6_is_off() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("noip6cnt");
    let _servers = scenario::Servers::start(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &linkerd_config());
    attach(&mut node, &fixture.cgroup.path);
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(&format!("[{REMOTE_ADDR6}]:80")).server_name(),
        "remote-80"
    );
    assert_eq!(
        fixture
            .on_remote()
            .connect(&format!("[{POD_ADDR6}]:80"))
            .server_name(),
        "app-80"
    );
    let counters = node.counters(cookie).unwrap().unwrap();
    assert_eq!(counters.get(Decision::Ipv6NotIntercepted), 1);
    assert_eq!(counters.get(Decision::InboundIpv6NotIntercepted), 1);
}

#[test]
fn a_dual_stack_proxy_listening_before_registration_takes_both_families() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("dualadopt");
    let _servers = start_servers(&fixture);
    // Listening before the programs exist: no listen() callback, found by registration.
    let _proxy = start_dual_stack_proxy(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &dual_stack_config());
    attach(&mut node, &fixture.cgroup.path);
    assert!(node.has_listener(cookie));
    let client = fixture.on_remote();
    for target in [format!("{POD_ADDR}:80"), format!("[{POD_ADDR6}]:80")] {
        match client.connect(&target) {
            Landing::Proxy {
                name,
                orig: Ok(orig),
                local,
                ..
            } => {
                assert_eq!(name, "proxy");
                assert_eq!(orig.to_string(), target);
                // An IPv4 connection on the [::] socket shows its addresses mapped.
                let mapped = format!("[::ffff:{POD_ADDR}]:80");
                assert!(local == target || local == mapped, "{local}");
            }
            other => panic!("{target}: expected the proxy, got {other:?}"),
        }
    }
}

#[test]
fn an_ipv6_only_proxy_listener_never_takes_ipv4_which_fails_closed() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("v6only");
    let _servers = start_servers(&fixture);
    let mut node = load(options());
    let cookie = register(&mut node, &fixture.pod, &dual_stack_config());
    attach(&mut node, &fixture.cgroup.path);
    let inbound6 = format!("[::]:{INBOUND_PORT}");
    let _proxy = fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &inbound6, "--v6only", "--name", "inbound"]);
    let client = fixture.on_remote();
    let target6 = format!("[{POD_ADDR6}]:80");
    assert_eq!(
        client.connect(&target6).proxy_orig().to_string(),
        target6,
        "IPv6 reaches the IPv6 listener"
    );
    // The kernel refuses to hand an IPv4 connection to an IPV6_V6ONLY socket: with no IPv4
    // listener the connection is refused, never delivered to the app around the proxy.
    assert_eq!(
        client.connect(&format!("{POD_ADDR}:80")),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    let counters = node.counters(cookie).unwrap().unwrap();
    assert_eq!(counters.get(Decision::Steered), 1);
    assert_eq!(counters.get(Decision::InboundNoListener), 1);
}

/// As conntrack: `SOL_IP`/`SO_ORIGINAL_DST` answers an IPv4 connection on a dual-stack proxy
/// socket (the other tests), `SOL_IPV6`/`IP6T_SO_ORIGINAL_DST` does not, on both backends.
#[test]
fn an_ipv6_original_destination_is_not_made_up_for_an_ipv4_connection() {
    if !privileged() {
        return;
    }
    let backends: [(&str, &dyn Backend); 2] = [
        ("ebpf", &interceptor_tests::ebpf_backend::Ebpf),
        (
            "iptables-nft",
            &Iptables(interceptor::iptables::IptablesMode::Nft),
        ),
    ];
    for (name, backend) in backends {
        let fixture = PodFixture::new("askv6");
        let _attached = backend.attach(&fixture, &dual_stack_config());
        let outbound = format!("[::]:{OUTBOUND_PORT}");
        let _proxy = fixture.in_pod().uid(PROXY_UID).listen(&[
            "proxy",
            &outbound,
            "--ask-ipv6",
            "--name",
            "outbound",
        ]);
        let app = fixture.in_pod().uid(APP_UID);
        match app.connect(&format!("{REMOTE_ADDR}:80")) {
            Landing::Proxy {
                orig: Err(errno), ..
            } => assert_ne!(errno, 0, "{name}"),
            other => panic!("{name}: expected the proxy, with an error for SOL_IPV6: {other:?}"),
        }
        // Native IPv6 on the same socket is answered.
        let target = format!("[{REMOTE_ADDR6}]:80");
        assert_eq!(
            app.connect(&target).proxy_orig().to_string(),
            target,
            "{name}"
        );
    }
}
