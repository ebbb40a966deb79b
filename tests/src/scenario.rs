//! The behaviour contract (SPEC "Outbound" and "Inbound") as one table of scenarios, run the same
//! way against every backend: who connects, from where, to what, under which configuration, and
//! where it must land.
use std::{collections::BTreeMap, net::SocketAddrV4};

use interceptor::config::{InterceptionConfig, PortRange, PortSet};

use crate::{
    PodFixture,
    fixture::{POD_ADDR, REMOTE_ADDR},
    probe::{Landing, Listener},
};

pub const INBOUND_PORT: u16 = 4143;
pub const OUTBOUND_PORT: u16 = 4140;
pub const PROXY_UID: u32 = 2102;
/// The app runs as an ordinary user, as in a pod.
pub const APP_UID: u32 = 1000;
/// A group the app can be put in for the proxy-GID rules.
pub const PROXY_GID: u32 = 2103;

/// Linkerd's defaults for a meshed pod (SPEC "Default Linkerd values").
pub fn linkerd_config() -> InterceptionConfig {
    InterceptionConfig {
        incoming_proxy_port: INBOUND_PORT,
        outgoing_proxy_port: OUTBOUND_PORT,
        proxy_uid: Some(PROXY_UID),
        proxy_gid: None,
        inbound_ports_to_ignore: PortSet(vec![PortRange::single(4190), PortRange::single(4191)]),
        outbound_ports_to_ignore: PortSet::default(),
        ports_to_redirect: Vec::new(),
        subnets_to_ignore: Vec::new(),
        outbound_subnets_to_ignore: Vec::new(),
        ipv6: false,
    }
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
    pub target: &'static str,
    pub expect: Expect,
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
    }
}

const fn client(name: &'static str, target: &'static str, expect: Expect) -> Scenario {
    Scenario {
        from: From::Remote,
        ..app(name, target, expect)
    }
}

/// SPEC "Outbound", rule by rule, each with the side that is intercepted and the side that is not.
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
    app(
        "all_of_127_8_is_loopback",
        "127.0.0.2:8080",
        Expect::Server("pod-lo2"),
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
        configure: |c| c.outbound_subnets_to_ignore = vec!["10.77.0.0/24".parse().unwrap()],
        ..app(
            "an_ignored_outbound_subnet_is_exempt",
            "10.77.0.2:80",
            Expect::Server("remote-80"),
        )
    },
    Scenario {
        configure: |c| c.outbound_subnets_to_ignore = vec!["10.77.0.0/24".parse().unwrap()],
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

/// SPEC "Inbound", rule by rule. The pod is 10.77.0.1; its app serves 80, 4190 and 9090 on all
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
        configure: |c| c.subnets_to_ignore = vec!["10.77.0.0/24".parse().unwrap()],
        ..client(
            "a_client_in_an_ignored_subnet_reaches_the_app",
            "10.77.0.1:80",
            Expect::Server("app-80"),
        )
    },
    Scenario {
        configure: |c| c.subnets_to_ignore = vec!["192.0.2.0/24".parse().unwrap()],
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
/// proxy UID), servers of the pod itself, and servers on the remote host.
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
        let outbound = format!("127.0.0.1:{OUTBOUND_PORT}");
        listeners.insert(
            "proxy",
            fixture
                .in_pod()
                .uid(PROXY_UID)
                .listen(&["proxy", &outbound, "--name", "outbound"]),
        );
        for (name, addr) in [
            ("app-80", "0.0.0.0:80"),
            ("app-4190", "0.0.0.0:4190"),
            ("app-9090", "0.0.0.0:9090"),
        ] {
            listeners.insert(
                name,
                fixture.in_pod().listen(&["server", addr, "--name", name]),
            );
        }
        listeners.insert(
            "pod-lo",
            fixture
                .in_pod()
                .listen(&["server", "127.0.0.1:8080", "--name", "pod-lo"]),
        );
        listeners.insert(
            "pod-lo2",
            fixture
                .in_pod()
                .listen(&["server", "127.0.0.2:8080", "--name", "pod-lo2"]),
        );
        let own = format!("{POD_ADDR}:8081");
        listeners.insert(
            "pod-own",
            fixture
                .in_pod()
                .listen(&["server", &own, "--name", "pod-own"]),
        );
        for (name, port) in [
            ("remote-80", 80),
            ("remote-443", 443),
            ("remote-8005", 8005),
        ] {
            let addr = format!("{REMOTE_ADDR}:{port}");
            listeners.insert(
                name,
                fixture
                    .on_remote()
                    .listen(&["server", &addr, "--name", name]),
            );
        }
        Self {
            _listeners: listeners,
        }
    }
}

/// The proxy's inbound listener, on all addresses as Linkerd's proxy listens.
pub fn start_inbound_proxy(fixture: &PodFixture) -> Listener {
    let inbound = format!("0.0.0.0:{INBOUND_PORT}");
    fixture
        .in_pod()
        .uid(PROXY_UID)
        .listen(&["proxy", &inbound, "--name", "inbound"])
}

/// A backend under test: attaches interception for the fixture's pod; dropping the returned
/// guard detaches it.
pub trait Backend {
    fn attach(&self, fixture: &PodFixture, config: &InterceptionConfig) -> Box<dyn std::any::Any>;

    /// sk_lookup keeps the original address on the proxy's inbound socket; iptables REDIRECT
    /// rewrites it to the proxy port (SPEC: both are acceptable, SO_ORIGINAL_DST is the contract).
    fn inbound_keeps_local_address(&self) -> bool;
}

/// Runs one scenario against a backend, on a fresh pod.
pub fn run(backend: &dyn Backend, scenario: &Scenario) {
    let fixture = PodFixture::new("scn");
    let _servers = Servers::start(&fixture);
    let mut config = linkerd_config();
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
    let landing = process.connect(scenario.target);
    let target: SocketAddrV4 = scenario.target.parse().expect("scenario target");
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
            name == "inbound" && *orig == target && local_ok && peer.starts_with(REMOTE_ADDR)
        }
        (Expect::Server(want), Landing::Server { name, .. }) => name == want,
        (Expect::Failed(want), Landing::Failed(got)) => got == want,
        _ => false,
    };
    assert!(
        ok,
        "scenario {}: expected {:?}, got {landing:?}",
        scenario.name, scenario.expect
    );
}
