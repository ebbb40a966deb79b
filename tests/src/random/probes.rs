//! Random probes of one configuration: who connects, with which credentials and socket path,
//! from where to what; each one line of `netprobe probes` (see `src/bin/netprobe.rs`).
use fastrand::Rng;
use interceptor::config::InterceptionConfig;

use super::pod::{
    ANYIP, APP_PORTS, CLIENT_SOURCES, CLOSED_PORT, LATE_ANYIP, LOOPBACK, OWN, Pair, REMOTE_TARGETS,
};
use crate::scenario::{APP_UID, PROXY_GID, PROXY_UID};

/// Where a probe's process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The pod's app (or proxy): outbound.
    Pod,
    /// The remote host: inbound.
    Remote,
    /// The app of a second pod of the node, meshed with another configuration.
    SecondPod,
    /// The second pod's remote host.
    SecondRemote,
}

impl Place {
    pub const ALL: [Place; 4] = [
        Place::Pod,
        Place::Remote,
        Place::SecondPod,
        Place::SecondRemote,
    ];
}

#[derive(Clone, Debug)]
pub struct RandomProbe {
    pub place: Place,
    /// What the probe is, for the report: `out/<who>/<target kind>` or `in/<port kind>`.
    pub kind: String,
    /// Its line for `netprobe probes`.
    pub line: String,
    /// Whether the IDs iptables' owner match reads (the socket creator's effective ones) differ
    /// from the connecting task's real ones: the `task IDs` connect programs tell the proxy by
    /// the latter.
    pub task_ids_differ: bool,
}

impl std::fmt::Display for RandomProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]", self.kind, self.line)
    }
}

/// How a process addresses its target.
#[derive(Clone, Copy)]
enum Family {
    Ipv4,
    /// An `AF_INET6` socket to `::ffff:a.b.c.d`: an IPv4 connection.
    Ipv4Mapped,
    Ipv6,
}

impl Family {
    fn draw(rng: &mut Rng) -> Self {
        match rng.u8(..20) {
            0..8 => Self::Ipv4,
            8..13 => Self::Ipv4Mapped,
            _ => Self::Ipv6,
        }
    }

    fn addr(self, (v4, v6): Pair, port: u16) -> String {
        match self {
            Self::Ipv4 => format!("{v4}:{port}"),
            Self::Ipv4Mapped => format!("[::ffff:{v4}]:{port}"),
            Self::Ipv6 => format!("[{v6}]:{port}"),
        }
    }
}

/// The IDs a probe runs with: `R:E:RG:EG` to connect, and to create the socket when that
/// differs (the process changed its IDs in between), and its supplementary groups.
struct Who {
    name: &'static str,
    creds: [u32; 4],
    socket_creds: Option<[u32; 4]>,
    groups: Option<u32>,
}

/// Every identity an outbound probe takes: the app, root, the proxy's UID and GID, IDs whose
/// real and effective values differ (iptables' owner match reads the socket file's, which
/// follow the effective IDs; a program may read the real ones), and sockets made under other
/// IDs than those that connect them.
fn identities(config: &InterceptionConfig, other: Option<&InterceptionConfig>) -> Vec<Who> {
    let (app, uid) = (APP_UID, config.proxy_uid.unwrap_or(PROXY_UID));
    let gid = config.proxy_gid.unwrap_or(PROXY_GID);
    let who = |name, creds| Who {
        name,
        creds,
        socket_creds: None,
        groups: None,
    };
    let switched = |name, socket_creds, creds| Who {
        name,
        creds,
        socket_creds: Some(socket_creds),
        groups: None,
    };
    // The proxy's GID only among the supplementary groups: iptables' `--gid-owner` (without
    // `--suppl-groups`) reads the socket's file-system GID alone.
    let supplementary = |name, creds| Who {
        groups: Some(gid),
        ..who(name, creds)
    };
    let app_ids = [app, app, app, app];
    let mut identities = vec![
        who("app", app_ids),
        who("app", app_ids),
        who("root", [0; 4]),
        who("proxy-uid", [uid, uid, app, app]),
        who("proxy-gid", [app, app, gid, gid]),
        who("real-uid-proxy-effective-app", [uid, app, app, app]),
        who("real-uid-app-effective-proxy", [app, uid, app, app]),
        who("real-gid-proxy-effective-app", [app, app, gid, app]),
        who("real-gid-app-effective-proxy", [app, app, app, gid]),
        switched(
            "socket-as-root-then-proxy-uid",
            [0; 4],
            [uid, uid, app, app],
        ),
        switched(
            "socket-as-app-then-proxy-uid",
            app_ids,
            [uid, uid, app, app],
        ),
        switched(
            "socket-as-proxy-uid-then-app",
            [uid, uid, app, app],
            app_ids,
        ),
        switched(
            "socket-as-proxy-gid-then-app",
            [app, app, gid, gid],
            app_ids,
        ),
        supplementary("app-in-proxy-gid-supplementary", app_ids),
        supplementary("proxy-uid-in-proxy-gid-supplementary", [uid, uid, app, app]),
    ];
    // The other pod's proxy IDs, which must mean nothing here.
    if let Some(other) = other {
        let (uid, gid) = (
            other.proxy_uid.unwrap_or(PROXY_UID),
            other.proxy_gid.unwrap_or(PROXY_GID),
        );
        identities.push(who("other-pods-proxy-uid", [uid, uid, app, app]));
        identities.push(who("other-pods-proxy-gid", [app, app, gid, gid]));
    }
    identities
}

fn ids(creds: [u32; 4]) -> String {
    creds.map(|id| id.to_string()).join(":")
}

fn pick<T: Copy>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.usize(..items.len())]
}

/// `count` outbound probes from the pod (`place`: the first pod's or the second's), under
/// `config`; `other` is the other pod's configuration, whose exemptions must not apply here.
pub fn outbound(
    rng: &mut Rng,
    place: Place,
    config: &InterceptionConfig,
    other: Option<&InterceptionConfig>,
    count: usize,
) -> Vec<RandomProbe> {
    let identities = identities(config, other);
    let ports: Vec<u16> = APP_PORTS
        .iter()
        .copied()
        .chain(other.map(|o| o.outgoing_proxy_port))
        .collect();
    (0..count)
        .map(|_| {
            let who = &identities[rng.usize(..identities.len())];
            let (target_kind, pair) = match rng.u8(..20) {
                0..10 => ("remote", pick(rng, &REMOTE_TARGETS)),
                10..14 => ("own", pick(rng, &OWN)),
                14..15 => ("anyip", ANYIP),
                15..16 => ("anyip-added-after-meshing", LATE_ANYIP),
                _ => ("loopback", pick(rng, &LOOPBACK)),
            };
            // Now and then the proxy's own outbound port on another host.
            let port = if target_kind == "remote" && rng.u8(..10) == 0 {
                config.outgoing_proxy_port
            } else {
                pick(rng, &ports)
            };
            let via = match rng.u8(..10) {
                0..5 => "connect",
                5..7 => "nonblocking",
                7..8 => "io-uring",
                _ => "fastopen-sendto",
            };
            let target = Family::draw(rng).addr(pair, port);
            let mut line = format!("{target} --via {via} --creds {}", ids(who.creds));
            if let Some(socket) = who.socket_creds {
                line.push_str(&format!(" --socket-creds {}", ids(socket)));
            }
            if let Some(group) = who.groups {
                line.push_str(&format!(" --groups {group}"));
            }
            let creator = who.socket_creds.unwrap_or(who.creds);
            RandomProbe {
                place,
                kind: format!("{}out/{}/{target_kind}", prefix(place), who.name),
                line,
                task_ids_differ: (who.creds[0], who.creds[2]) != (creator[1], creator[3]),
            }
        })
        .collect()
}

fn prefix(place: Place) -> &'static str {
    match place {
        Place::Pod | Place::Remote => "",
        Place::SecondPod | Place::SecondRemote => "second-pod/",
    }
}

/// `count` inbound probes from the remote host (`place`: the first pod's or the second's),
/// from sources in and out of the ignored subnets, to the pod's addresses on ignored,
/// redirected, proxy and other ports, and on the other pod's (`other`).
pub fn inbound(
    rng: &mut Rng,
    place: Place,
    config: &InterceptionConfig,
    other: Option<&InterceptionConfig>,
    count: usize,
) -> Vec<RandomProbe> {
    let mut ports: Vec<(&'static str, u16)> = vec![
        ("proxy-inbound-port", config.incoming_proxy_port),
        ("proxy-outbound-port", config.outgoing_proxy_port),
        ("linkerd-inbound-port", 4143),
        ("linkerd-outbound-port", 4140),
        ("closed", CLOSED_PORT),
    ];
    ports.extend(config.ports_to_redirect.iter().map(|p| ("to-redirect", *p)));
    ports.extend(
        config
            .inbound_ports_to_ignore
            .ports()
            .filter(|p| APP_PORTS.contains(p))
            .map(|p| ("ignored", p)),
    );
    if let Some(other) = other {
        ports.push(("other-pods-inbound-port", other.incoming_proxy_port));
        ports.extend(
            other
                .inbound_ports_to_ignore
                .ports()
                .filter(|p| APP_PORTS.contains(p))
                .map(|p| ("other-pods-ignored", p)),
        );
        ports.extend(
            other
                .ports_to_redirect
                .iter()
                .map(|p| ("other-pods-to-redirect", *p)),
        );
    }
    (0..count)
        .map(|_| {
            let (kind, port) = if rng.bool() {
                ("app", pick(rng, &APP_PORTS))
            } else {
                pick(rng, &ports)
            };
            let family = Family::draw(rng);
            let target = family.addr(pick(rng, &OWN), port);
            let source = family.addr(pick(rng, &CLIENT_SOURCES), 0);
            let via = match rng.u8(..8) {
                0 | 1 => "nonblocking",
                2 => "io-uring",
                _ => "connect",
            };
            RandomProbe {
                place,
                kind: format!("{}in/{kind}", prefix(place)),
                line: format!("{target} --via {via} --bind {source}"),
                task_ids_differ: false,
            }
        })
        .collect()
}
