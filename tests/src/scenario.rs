//! The behaviour contract (the outbound and inbound rules of proxy-init's chains) as one table of
//! scenarios, run the same way against every backend and for every address family an app can use: who connects, from
//! where, to what, under which configuration, and where it must land.
//!
//! Rows are written with IPv4 addresses; [`Family`] turns them into the connection a test makes:
//! from an `AF_INET` socket, from an `AF_INET6` socket to the IPv4-mapped address
//! (`[::ffff:10.77.0.2]:80`, an IPv4 connection), or native IPv6 to the counterpart address of
//! the dual-stack fixture (`[fd77::2]:80`).
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use interceptor::config::{InterceptionConfig, PortRange, PortSet, linkerd};

use crate::{
    PodFixture,
    agent_home::UNREACHABLE,
    fixture::{POD_ADDR, POD_ADDR6, REMOTE_ADDR, REMOTE_ADDR6},
    probe::{Landing, Listener},
};

pub const INBOUND_PORT: u16 = linkerd::INBOUND_PORT;
pub const OUTBOUND_PORT: u16 = linkerd::OUTBOUND_PORT;
pub const PROXY_UID: u32 = linkerd::PROXY_UID;
/// The app runs as an ordinary user, as in a pod.
pub const APP_UID: u32 = 1000;
/// A group the app can be put in for the proxy-GID rules.
pub const PROXY_GID: u32 = 2103;

/// Linkerd's defaults for a meshed pod (its proxy injector's values), IPv4 only as linkerd-cni
/// writes them.
pub fn linkerd_config() -> InterceptionConfig {
    InterceptionConfig {
        ipv6: false,
        ..InterceptionConfig::linkerd()
    }
}

/// How the connecting process reaches its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// An `AF_INET` socket.
    Ipv4,
    /// An `AF_INET6` socket connecting to the IPv4-mapped address: an IPv4 connection that
    /// only the IPv6 hooks see (Java and other dual-stack runtimes connect this way).
    Ipv4MappedOnIpv6,
    /// Native IPv6.
    Ipv6,
}

/// The IPv6 counterpart of each IPv4 address the rows use.
const IPV6_COUNTERPARTS: [(&str, &str); 5] = [
    (POD_ADDR, POD_ADDR6),
    (REMOTE_ADDR, REMOTE_ADDR6),
    ("192.0.2.2", "2001:db8::2"),
    ("127.0.0.1", "::1"),
    ("0.0.0.0", "::"),
];

impl Family {
    /// The address a process of this family connects to for a row's IPv4 `target`.
    pub fn target(self, target: &str) -> String {
        let (ip, port) = target.rsplit_once(':').expect("IP:PORT");
        match self {
            Family::Ipv4 => target.to_owned(),
            Family::Ipv4MappedOnIpv6 => format!("[::ffff:{ip}]:{port}"),
            Family::Ipv6 => format!("[{}]:{port}", ipv6_counterpart(ip)),
        }
    }

    /// The peer address a pod's socket sees for a remote client of this family.
    pub fn remote_addr(self) -> &'static str {
        match self {
            Family::Ipv6 => REMOTE_ADDR6,
            _ => REMOTE_ADDR,
        }
    }

    /// The configuration a row runs under: native IPv6 is intercepted only in the IPv6 runs, so
    /// the IPv4 runs also show that `--ipv6=false` never lets IPv4 on an IPv6 socket through.
    pub fn configure(self, config: &mut InterceptionConfig) {
        config.ipv6 = self == Family::Ipv6;
    }
}

pub fn ipv6_counterpart(ipv4: &str) -> &'static str {
    IPV6_COUNTERPARTS
        .iter()
        .find(|(v4, _)| *v4 == ipv4)
        .unwrap_or_else(|| panic!("{ipv4} has no IPv6 counterpart in the fixture"))
        .1
}

/// A row's IPv4 subnet and its IPv6 counterpart in one list: each family's run exercises its own.
fn both_families(v4: &str) -> Vec<ipnet::IpNet> {
    let v6 = match v4 {
        "10.77.0.0/24" => "fd77::/64",
        "192.0.2.0/24" => "2001:db8::/64",
        _ => panic!("{v4} has no IPv6 counterpart in the fixture"),
    };
    vec![
        v4.parse().expect("IPv4 CIDR"),
        v6.parse().expect("IPv6 CIDR"),
    ]
}

/// Where a connection must end up.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// On the outbound proxy, whose SO_ORIGINAL_DST returns the connect's target.
    ProxyWithOrigDst,
    /// On the inbound proxy, whose SO_ORIGINAL_DST returns the connect's target.
    InboundProxyWithOrigDst,
    /// On the named real server (see [`Servers`]).
    Server(&'static str),
    /// Failing with this error (e.g. `connect:ECONNREFUSED` from the real destination).
    Failed(&'static str),
}

/// Where the connecting process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum From {
    /// Inside the pod (its namespace and cgroup), as `app_uid`.
    Pod,
    /// On the remote host (10.77.0.2), a client of the pod.
    Remote,
}

pub struct Scenario {
    pub name: &'static str,
    /// Set up interception twice (a re-run of the setup) before connecting.
    pub twice: bool,
    pub from: From,
    pub configure: fn(&mut InterceptionConfig),
    pub app_uid: u32,
    pub app_gid: Option<u32>,
    /// IPv4 form; see [`Family::target`].
    pub target: &'static str,
    pub expect: Expect,
    /// Only meaningful for IPv4 (e.g. 127.0.0.0/8): not run for native IPv6.
    pub ipv4_only: bool,
}

fn unchanged(_: &mut InterceptionConfig) {}

const fn app(name: &'static str, target: &'static str, expect: Expect) -> Scenario {
    Scenario {
        name,
        twice: false,
        from: From::Pod,
        configure: unchanged,
        app_uid: APP_UID,
        app_gid: None,
        target,
        expect,
        ipv4_only: false,
    }
}

const fn client(name: &'static str, target: &'static str, expect: Expect) -> Scenario {
    Scenario {
        from: From::Remote,
        ..app(name, target, expect)
    }
}

/// The outbound rules (proxy-init's PROXY_INIT_OUTPUT chain), rule by rule, each with the side
/// that is intercepted and the side that is not.
pub const OUTBOUND: &[Scenario] = &[
    app(
        "redirects_to_a_remote_address",
        "10.77.0.2:80",
        Expect::ProxyWithOrigDst,
    ),
    app(
        "redirects_an_unreachable_address",
        "192.0.2.2:1404",
        Expect::ProxyWithOrigDst,
    ),
    Scenario {
        app_uid: PROXY_UID,
        ..app(
            "proxy_uid_is_exempt",
            "10.77.0.2:80",
            Expect::Server("remote-80"),
        )
    },
    Scenario {
        app_uid: PROXY_UID,
        // 192.0.2.2 is the remote host, which refuses: the proxy's own connect went there.
        ..app(
            "proxy_uid_connects_to_the_real_address",
            "192.0.2.2:1404",
            Expect::Failed("connect:ECONNREFUSED"),
        )
    },
    Scenario {
        app_uid: 0,
        configure: |c| c.proxy_uid = None,
        ..app(
            "uid_0_is_never_the_proxy",
            "10.77.0.2:80",
            Expect::ProxyWithOrigDst,
        )
    },
    Scenario {
        app_gid: Some(PROXY_GID),
        configure: |c| c.proxy_gid = Some(PROXY_GID),
        ..app(
            "proxy_gid_is_exempt",
            "10.77.0.2:80",
            Expect::Server("remote-80"),
        )
    },
    Scenario {
        app_gid: Some(PROXY_GID),
        ..app(
            "a_gid_is_only_exempt_when_configured",
            "10.77.0.2:80",
            Expect::ProxyWithOrigDst,
        )
    },
    app(
        "loopback_is_exempt",
        "127.0.0.1:8080",
        Expect::Server("pod-lo"),
    ),
    Scenario {
        ipv4_only: true,
        ..app(
            "all_of_127_8_is_loopback",
            "127.0.0.2:8080",
            Expect::Server("pod-lo2"),
        )
    },
    // The kernel connects an unspecified destination to the loopback address.
    app(
        "the_unspecified_address_is_loopback",
        "0.0.0.0:8080",
        Expect::Server("pod-lo"),
    ),
    app(
        "the_pods_own_address_is_exempt",
        "10.77.0.1:8081",
        Expect::Server("pod-own"),
    ),
    Scenario {
        configure: |c| {
            c.outbound_ports_to_ignore =
                PortSet(vec![PortRange::single(443), PortRange::single(6443)])
        },
        ..app(
            "an_ignored_port_is_exempt",
            "10.77.0.2:443",
            Expect::Server("remote-443"),
        )
    },
    Scenario {
        configure: |c| {
            c.outbound_ports_to_ignore =
                PortSet(vec![PortRange::single(443), PortRange::single(6443)])
        },
        ..app(
            "ports_not_ignored_are_redirected",
            "10.77.0.2:80",
            Expect::ProxyWithOrigDst,
        )
    },
    Scenario {
        configure: |c| {
            c.outbound_ports_to_ignore = PortSet(vec![PortRange {
                low: 8000,
                high: 8010,
            }])
        },
        ..app(
            "a_port_in_an_ignored_range_is_exempt",
            "10.77.0.2:8005",
            Expect::Server("remote-8005"),
        )
    },
    Scenario {
        configure: |c| c.outbound_subnets_to_ignore = both_families("10.77.0.0/24"),
        ..app(
            "an_ignored_outbound_subnet_is_exempt",
            "10.77.0.2:80",
            Expect::Server("remote-80"),
        )
    },
    Scenario {
        configure: |c| c.outbound_subnets_to_ignore = both_families("10.77.0.0/24"),
        ..app(
            "other_subnets_are_still_redirected",
            "192.0.2.2:1404",
            Expect::ProxyWithOrigDst,
        )
    },
    Scenario {
        twice: true,
        ..app(
            "running_the_setup_twice_redirects_once",
            "10.77.0.2:80",
            Expect::ProxyWithOrigDst,
        )
    },
];

/// The inbound rules (proxy-init's PROXY_INIT_REDIRECT chain), rule by rule. The pod is 10.77.0.1; its app serves 80, 4190 and 9090 on all
/// addresses; clients connect from the remote host 10.77.0.2 unless the row says otherwise.
pub const INBOUND: &[Scenario] = &[
    client(
        "inbound_is_steered_to_the_proxy",
        "10.77.0.1:80",
        Expect::InboundProxyWithOrigDst,
    ),
    client(
        "an_ignored_inbound_port_reaches_the_app",
        "10.77.0.1:4190",
        Expect::Server("app-4190"),
    ),
    Scenario {
        configure: |c| {
            c.inbound_ports_to_ignore = PortSet(vec![PortRange {
                low: 9000,
                high: 9200,
            }])
        },
        ..client(
            "a_port_in_an_ignored_inbound_range_reaches_the_app",
            "10.77.0.1:9090",
            Expect::Server("app-9090"),
        )
    },
    Scenario {
        configure: |c| c.subnets_to_ignore = both_families("10.77.0.0/24"),
        ..client(
            "a_client_in_an_ignored_subnet_reaches_the_app",
            "10.77.0.1:80",
            Expect::Server("app-80"),
        )
    },
    Scenario {
        configure: |c| c.subnets_to_ignore = both_families("192.0.2.0/24"),
        ..client(
            "clients_outside_ignored_subnets_are_steered",
            "10.77.0.1:80",
            Expect::InboundProxyWithOrigDst,
        )
    },
    Scenario {
        configure: |c| c.ports_to_redirect = vec![9090],
        ..client(
            "ports_to_redirect_steers_listed_ports",
            "10.77.0.1:9090",
            Expect::InboundProxyWithOrigDst,
        )
    },
    Scenario {
        configure: |c| c.ports_to_redirect = vec![9090],
        ..client(
            "ports_to_redirect_leaves_other_ports_alone",
            "10.77.0.1:80",
            Expect::Server("app-80"),
        )
    },
    client(
        "the_proxy_port_itself_reaches_the_proxy",
        "10.77.0.1:4143",
        Expect::InboundProxyWithOrigDst,
    ),
    // proxy-init's PREROUTING exempts only the ignored ports: the proxy's outbound port, on the
    // pod's address, reaches the inbound proxy like any other port.
    client(
        "the_proxy_outbound_port_reaches_the_inbound_proxy",
        "10.77.0.1:4140",
        Expect::InboundProxyWithOrigDst,
    ),
    app(
        "the_pod_reaching_its_own_address_is_not_steered",
        "10.77.0.1:80",
        Expect::Server("app-80"),
    ),
    app(
        "the_pod_over_loopback_is_not_steered",
        "127.0.0.1:80",
        Expect::Server("app-80"),
    ),
    Scenario {
        twice: true,
        ..client(
            "running_the_setup_twice_steers_once",
            "10.77.0.1:80",
            Expect::InboundProxyWithOrigDst,
        )
    },
    Scenario {
        app_uid: PROXY_UID,
        ..app(
            "the_proxy_forwarding_to_the_app_does_not_loop",
            "10.77.0.1:80",
            Expect::Server("app-80"),
        )
    },
];

pub fn scenario(name: &str) -> &'static Scenario {
    OUTBOUND
        .iter()
        .chain(INBOUND)
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"))
}

/// The processes every scenario runs against: the proxy's outbound and inbound listeners (as the
/// proxy UID), servers of the pod itself, and servers on the remote host; each listens on its
/// IPv4 address and on the IPv6 counterpart.
pub struct Servers {
    _listeners: BTreeMap<&'static str, Listener>,
}

impl Servers {
    pub fn start(fixture: &PodFixture) -> Self {
        let mut servers = Self::without_inbound_proxy(fixture);
        servers
            ._listeners
            .insert("inbound", start_inbound_proxy(fixture));
        servers
    }

    /// Everything but the inbound proxy (tests of a proxy that is not listening yet).
    pub fn without_inbound_proxy(fixture: &PodFixture) -> Self {
        let mut listeners = BTreeMap::new();
        listeners.insert(
            "proxy",
            fixture.in_pod().uid(PROXY_UID).listen(&[
                "proxy",
                &format!("127.0.0.1:{OUTBOUND_PORT}"),
                &format!("[::1]:{OUTBOUND_PORT}"),
                "--name",
                "outbound",
            ]),
        );
        // Separate sockets per family ([::] with IPV6_V6ONLY), as Linkerd's proxy and most
        // servers listen; dual-stack sockets have tests of their own.
        for (name, port) in [("app-80", 80), ("app-4190", 4190), ("app-9090", 9090)] {
            let (v4, v6) = (format!("0.0.0.0:{port}"), format!("[::]:{port}"));
            listeners.insert(
                name,
                fixture
                    .in_pod()
                    .listen(&["server", &v4, &v6, "--v6only", "--name", name]),
            );
        }
        for (name, addrs) in [
            ("pod-lo", ["127.0.0.1:8080", "[::1]:8080"].as_slice()),
            ("pod-lo2", ["127.0.0.2:8080"].as_slice()),
        ] {
            let mut args = vec!["server"];
            args.extend_from_slice(addrs);
            args.extend_from_slice(&["--name", name]);
            listeners.insert(name, fixture.in_pod().listen(&args));
        }
        let (own, own6) = (format!("{POD_ADDR}:8081"), format!("[{POD_ADDR6}]:8081"));
        listeners.insert(
            "pod-own",
            fixture
                .in_pod()
                .listen(&["server", &own, &own6, "--name", "pod-own"]),
        );
        for (name, port) in [
            ("remote-80", 80),
            ("remote-443", 443),
            ("remote-8005", 8005),
        ] {
            let addr = format!("{REMOTE_ADDR}:{port}");
            let addr6 = format!("[{REMOTE_ADDR6}]:{port}");
            listeners.insert(
                name,
                fixture
                    .on_remote()
                    .listen(&["server", &addr, &addr6, "--name", name]),
            );
        }
        Self {
            _listeners: listeners,
        }
    }
}

/// The proxy's inbound listeners, on all addresses of both families as Linkerd's proxy listens
/// (`0.0.0.0:4143` and `[::]:4143` with `IPV6_V6ONLY`).
pub fn start_inbound_proxy(fixture: &PodFixture) -> Listener {
    let inbound = format!("0.0.0.0:{INBOUND_PORT}");
    let inbound6 = format!("[::]:{INBOUND_PORT}");
    fixture.in_pod().uid(PROXY_UID).listen(&[
        "proxy", &inbound, &inbound6, "--v6only", "--name", "inbound",
    ])
}

/// A backend under test: attaches interception for the fixture's pod; dropping the returned
/// guard detaches it.
pub trait Backend {
    fn attach(&self, fixture: &PodFixture, config: &InterceptionConfig) -> Box<dyn std::any::Any>;

    /// sk_lookup keeps the original address on the proxy's inbound socket; iptables REDIRECT
    /// rewrites it to the proxy port. Both are acceptable: the proxy relies on SO_ORIGINAL_DST.
    fn inbound_keeps_local_address(&self) -> bool;
}

/// Runs one scenario against a backend, on a fresh pod, with connections of `family`.
pub fn run(backend: &dyn Backend, scenario: &Scenario, family: Family) {
    run_in(backend, scenario, family, PodFixture::new("scn"));
}

/// [`run`], in the pod `fixture` (one with a user namespace of its own, say).
pub fn run_in(backend: &dyn Backend, scenario: &Scenario, family: Family, fixture: PodFixture) {
    assert!(
        !(scenario.ipv4_only && family == Family::Ipv6),
        "scenario {} is IPv4 only",
        scenario.name
    );
    let _servers = Servers::start(&fixture);
    let mut config = linkerd_config();
    family.configure(&mut config);
    (scenario.configure)(&mut config);
    let _attached = backend.attach(&fixture, &config);
    let _again = scenario.twice.then(|| backend.attach(&fixture, &config));

    let mut process = match scenario.from {
        From::Pod => fixture.in_pod().uid(scenario.app_uid),
        From::Remote => fixture.on_remote(),
    };
    if let Some(gid) = scenario.app_gid {
        process = process.gid(gid);
    }
    let target = family.target(scenario.target);
    let (landing, app_peer) = process.connect_seen(&target, &[]);
    let target: SocketAddr = target.parse().expect("scenario target");
    // What the app sees of its own socket: the address it dialled, in the form it dialled it,
    // whether or not the connection was intercepted, as with NAT. (The kernel itself connects
    // the unspecified address to loopback, and says so.)
    if !matches!(landing, Landing::Failed(_)) {
        let dialled = match target.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
            IpAddr::V6(ip) if ip.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
            IpAddr::V6(ip) if ip.to_ipv4_mapped().is_some_and(|v4| v4.is_unspecified()) => {
                IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped())
            }
            ip => ip,
        };
        assert_eq!(
            app_peer.as_deref(),
            Some(SocketAddr::new(dialled, target.port()).to_string().as_str()),
            "scenario {} ({family:?}): getpeername() of the app's socket",
            scenario.name
        );
    }
    // What the pod's sockets see: an IPv4-mapped connection is plain IPv4 there.
    let target = SocketAddr::new(target.ip().to_canonical(), target.port());
    let ok = match (&scenario.expect, &landing) {
        (
            Expect::ProxyWithOrigDst,
            Landing::Proxy {
                name,
                orig: Ok(orig),
                ..
            },
        ) => name == "outbound" && *orig == target,
        // sk_lookup delivers without rewriting: the accepted socket's own address is the original.
        (
            Expect::InboundProxyWithOrigDst,
            Landing::Proxy {
                name,
                orig: Ok(orig),
                local,
                peer,
            },
        ) => {
            let local_ok = if backend.inbound_keeps_local_address() {
                *local == target.to_string()
            } else {
                local.ends_with(&format!(":{INBOUND_PORT}"))
            };
            let peer_ip = peer
                .parse::<SocketAddr>()
                .map(|p| p.ip().to_string())
                .unwrap_or_default();
            name == "inbound"
                && *orig == target
                && local_ok
                && peer_ip.parse::<IpAddr>().ok() == family.remote_addr().parse().ok()
        }
        (Expect::Server(want), Landing::Server { name, .. }) => name == want,
        (Expect::Failed(want), Landing::Failed(got)) => got == want,
        _ => false,
    };
    assert!(
        ok,
        "scenario {} ({family:?}, {target}): expected {:?}, got {landing:?}",
        scenario.name, scenario.expect
    );
}

/// A pod of `fixture` meshed with [`crate::agent_home::LINKERD_FLAGS`], whatever the backend: the
/// app's connects (both families) land on the outbound proxy with their original destination
/// (`SO_ORIGINAL_DST`), the proxy's own connect is not redirected, and inbound connections reach
/// the inbound proxy except on an ignored port (4190). Needs [`Servers::start`].
pub fn assert_meshed(fixture: &PodFixture) {
    let app = fixture.in_pod().uid(APP_UID);
    assert_eq!(
        app.connect(UNREACHABLE).proxy_orig().to_string(),
        UNREACHABLE
    );
    assert_eq!(
        app.connect("[2001:db8::2]:1404").proxy_orig().to_string(),
        "[2001:db8::2]:1404"
    );
    assert_eq!(
        fixture
            .in_pod()
            .uid(PROXY_UID)
            .connect("10.77.0.2:80")
            .server_name(),
        "remote-80",
        "the proxy's UID is exempt"
    );
    match fixture.on_remote().connect("10.77.0.1:80") {
        Landing::Proxy {
            name,
            orig: Ok(orig),
            ..
        } => {
            assert_eq!(name, "inbound");
            assert_eq!(orig.to_string(), "10.77.0.1:80");
        }
        other => panic!("expected the inbound proxy, got {other:?}"),
    }
    assert_eq!(
        fixture.on_remote().connect("10.77.0.1:4190").server_name(),
        "app-4190",
        "an ignored inbound port reaches the app"
    );
}
