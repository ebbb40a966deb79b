//! The pod every random configuration runs in: the standard pod and remote host
//! ([`PodFixture`]) with more addresses, so probes can tell apart what proxy-init's chains and
//! the eBPF programs decide by address.
//!
//! - the pod: a second interface (`eth1`, 10.250.65.1/24, fd65::1/64; a veth pair whose both
//!   ends are in the pod, as the test kernels may have no dummy driver), whose address is the
//!   pod's own but not on eth0; an AnyIP `local` route on lo (10.250.64.0/24, fd64::/64): no
//!   address, yet routed over lo, which proxy-init's `-o lo -j RETURN` exempts; and another
//!   one (10.250.66.0/24, fd66::/64) added after the pod is meshed;
//! - the remote host: more addresses to connect from (10.250.61.1, 10.250.62.1, fd61::1,
//!   fd62::1, fd63::1 on its lo, and its documentation ranges), the clients in and out of the subnets a
//!   configuration ignores, and a route back to the pod's eth1.
//!
//! Servers (as root: some ports are below 1024): the app listens on every port of [`APP_PORTS`] on all addresses of the pod (so
//! loopback, its own addresses and the AnyIP route all reach it), the remote host on the same
//! ports on all of its addresses; the proxy listens on the configuration's ports as its UID.
//! Every one closes its socket right after answering (`--close`), as a proxy does once it has
//! forwarded a response, so the app's `getpeername()` after the end of the stream is read
//! after the peer's socket is gone. Nothing has a route out of the two namespaces.
use interceptor::config::InterceptionConfig;

use crate::{PodFixture, probe::Listener, scenario::PROXY_UID};

/// Ports the pod's app and the remote host serve; the configurations' ignored and redirected
/// ports are drawn among them (and a few more), so most probes reach a real server when not
/// intercepted. None is a proxy port of any configuration drawn.
pub const APP_PORTS: [u16; 15] = [
    25, 27, 80, 443, 3306, 4190, 4191, 5432, 6443, 8080, 8086, 9090, 9091, 9100, 30000,
];

/// A port nothing listens on.
pub const CLOSED_PORT: u16 = 7777;

/// An IPv4 address and its IPv6 counterpart.
pub type Pair = (&'static str, &'static str);

/// The remote host's addresses an app of the pod connects to ("other pods", outside the pod).
pub const REMOTE_TARGETS: [Pair; 4] = [
    ("10.77.0.2", "fd77::2"),
    ("192.0.2.2", "2001:db8::2"),
    ("198.51.100.9", "2001:db8::9"),
    ("10.250.61.1", "fd61::1"),
];

/// The pod's own addresses, on eth0 and on eth1.
pub const OWN: [Pair; 2] = [("10.77.0.1", "fd77::1"), ("10.250.65.1", "fd65::1")];

/// An address of the pod's AnyIP `local` route on lo.
pub const ANYIP: Pair = ("10.250.64.5", "fd64::5");

/// An address of the AnyIP `local` route added once the pod is meshed ([`RandomPod::add_late_route`]).
pub const LATE_ANYIP: Pair = ("10.250.66.5", "fd66::5");

/// The routes [`RandomPod::add_late_route`] adds.
pub const LATE_ROUTES: [&str; 2] = ["10.250.66.0/24", "fd66::/64"];

/// Loopback, the second loopback address (IPv4 has 127.0.0.0/8) and the unspecified address,
/// which the kernel connects to loopback.
pub const LOOPBACK: [Pair; 3] = [
    ("127.0.0.1", "::1"),
    ("127.0.0.2", "::1"),
    ("0.0.0.0", "::"),
];

/// Where the remote host's clients connect from.
pub const CLIENT_SOURCES: [Pair; 4] = [
    ("10.77.0.2", "fd77::2"),
    ("10.250.61.1", "fd61::1"),
    ("10.250.62.1", "fd62::1"),
    // IPv6 binds only to an address, not into a local route as IPv4 does.
    ("198.51.100.7", "fd63::1"),
];

/// The pod, its servers and proxies, ready for one backend to attach.
pub struct RandomPod {
    pub fixture: PodFixture,
    _listeners: Vec<Listener>,
}

impl RandomPod {
    /// The pod for `config`, its proxy's inbound listener only if `inbound_listening` (without
    /// it, what is steered inbound must fail, on every backend), with a user namespace of its
    /// own if `own_users` ([`PodFixture::with_own_users`]).
    pub fn new(config: &InterceptionConfig, inbound_listening: bool, own_users: bool) -> Self {
        let fixture = if own_users {
            PodFixture::with_own_users("rnd")
        } else {
            PodFixture::new("rnd")
        };
        Self::with_fixture(fixture, config, inbound_listening)
    }

    /// Another pod of the node, with the same addresses in a namespace of its own, whose
    /// processes run in `first`'s cgroup, as a node's pods share the cgroup the programs are
    /// attached to.
    pub fn next_to(first: &RandomPod, config: &InterceptionConfig) -> Self {
        Self::with_fixture(
            PodFixture::new("rnd2").share_cgroup_with(&first.fixture),
            config,
            true,
        )
    }

    fn with_fixture(
        fixture: PodFixture,
        config: &InterceptionConfig,
        inbound_listening: bool,
    ) -> Self {
        fixture.pod.ip_batch(
            "link add eth1 type veth peer name eth1-end\n\
             addr add 10.250.65.1/24 dev eth1\n\
             addr add fd65::1/64 dev eth1 nodad\n\
             link set eth1-end up\n\
             link set eth1 up\n\
             route add local 10.250.64.0/24 dev lo\n\
             route add local fd64::/64 dev lo\n",
        );
        fixture.remote.ip_batch(
            "addr add 10.250.61.1/32 dev lo\n\
             addr add 10.250.62.1/32 dev lo\n\
             addr add fd61::1/128 dev lo nodad\n\
             addr add fd62::1/128 dev lo nodad\n\
             addr add fd63::1/128 dev lo nodad\n\
             route add 10.250.65.0/24 via 10.77.0.1\n\
             route add fd65::/64 via fd77::1\n",
        );
        let mut listeners = Vec::new();
        let every_port = |v4: &str, v6: &str| -> Vec<String> {
            APP_PORTS
                .iter()
                .flat_map(|p| [format!("{v4}:{p}"), format!("[{v6}]:{p}")])
                .collect()
        };
        for (name, probe) in [("pod", fixture.in_pod()), ("remote", fixture.on_remote())] {
            let mut args = vec!["server".to_owned()];
            args.extend(every_port("0.0.0.0", "::"));
            args.extend(["--v6only", "--close", "--name", name].map(String::from));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            listeners.push(probe.listen(&args));
        }
        // The proxy as its UID, as Linkerd's proxy listens: outbound on loopback only, inbound
        // on every address (a configuration without a proxy UID still has a proxy).
        let proxy = fixture.in_pod().uid(config.proxy_uid.unwrap_or(PROXY_UID));
        let (out, inb) = (config.outgoing_proxy_port, config.incoming_proxy_port);
        listeners.push(proxy.listen(&[
            "proxy",
            &format!("127.0.0.1:{out}"),
            &format!("[::1]:{out}"),
            "--close",
            "--name",
            "outbound",
        ]));
        if inbound_listening {
            listeners.push(proxy.listen(&[
                "proxy",
                &format!("0.0.0.0:{inb}"),
                &format!("[::]:{inb}"),
                "--v6only",
                "--close",
                "--name",
                "inbound",
            ]));
        }
        Self {
            fixture,
            _listeners: listeners,
        }
    }

    /// An AnyIP `local` route on lo ([`LATE_ROUTES`]), added once a backend is attached: the
    /// eBPF backend learns it by netlink events, iptables' `-o lo` sees it at once.
    pub fn add_late_route(&self) {
        self.fixture.pod.ip_batch(&format!(
            "route add local {} dev lo\nroute add local {} dev lo\n",
            LATE_ROUTES[0], LATE_ROUTES[1]
        ));
    }
}
