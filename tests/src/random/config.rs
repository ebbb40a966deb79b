//! Random proxy-init configurations: what `linkerd-init`'s flags can say, drawn around the
//! addresses and ports of [`super::pod`] so that the probes meet every rule.
use fastrand::Rng;
use interceptor::config::{InterceptionConfig, PortRange, PortSet};

use super::pod::APP_PORTS;
use crate::scenario::{INBOUND_PORT, OUTBOUND_PORT, PROXY_GID, PROXY_UID};

/// Another proxy (`--proxy-uid`, `--proxy-gid`, ports) than Linkerd's, now and then.
pub const OTHER_PROXY_UID: u32 = 2200;
pub const OTHER_PROXY_GID: u32 = 2300;
const OTHER_PROXY_PORTS: (u16, u16) = (15006, 15001);

/// Subnets to ignore inbound, by the sources of [`super::pod::CLIENT_SOURCES`]: each holds some
/// of them and not others.
const INBOUND_SUBNETS: [&str; 12] = [
    "10.77.0.0/24",
    "10.250.61.0/24",
    "10.250.62.1/32",
    "10.250.0.0/16",
    "198.51.100.0/24",
    "10.0.0.0/8",
    "fd77::/64",
    "fd61::/64",
    "fd62::1/128",
    "fd00::/8",
    "fd63::/64",
    "2001:db8::/64",
];

/// Subnets to ignore outbound (an extension of proxy-init's flags), by the probes' targets:
/// other pods, the pod's own second interface, its AnyIP route.
const OUTBOUND_SUBNETS: [&str; 11] = [
    "10.77.0.0/24",
    "192.0.2.0/24",
    "198.51.100.0/25",
    "10.250.64.0/24",
    "10.250.65.0/24",
    "10.250.61.1/32",
    "fd77::/64",
    "2001:db8::/64",
    "fd64::/64",
    "fd65::/64",
    "fd61::1/128",
];

/// One random configuration, valid as proxy-init's flags give it (it goes through
/// `from_proxy_init_args`, the one parser of those flags).
pub fn draw(rng: &mut Rng) -> InterceptionConfig {
    let (incoming, outgoing) = if rng.u8(..10) == 0 {
        OTHER_PROXY_PORTS
    } else {
        (INBOUND_PORT, OUTBOUND_PORT)
    };
    let mut config = InterceptionConfig {
        incoming_proxy_port: incoming,
        outgoing_proxy_port: outgoing,
        proxy_uid: match rng.u8(..20) {
            0 => None,
            1 | 2 => Some(OTHER_PROXY_UID),
            _ => Some(PROXY_UID),
        },
        proxy_gid: match rng.u8(..10) {
            0..4 => None,
            4 => Some(OTHER_PROXY_GID),
            _ => Some(PROXY_GID),
        },
        inbound_ports_to_ignore: inbound_ports(rng, incoming, outgoing),
        outbound_ports_to_ignore: outbound_ports(rng, outgoing),
        ports_to_redirect: ports_to_redirect(rng, incoming, outgoing),
        subnets_to_ignore: subnets(rng, &INBOUND_SUBNETS, 4),
        outbound_subnets_to_ignore: subnets(rng, &OUTBOUND_SUBNETS, 3),
        ipv6: rng.bool(),
    };
    // Through the flags and back: the configuration a user's flags give, and a check that
    // nothing drawn is one proxy-init's flags cannot say.
    config = InterceptionConfig::from_proxy_init_args(&config.to_args())
        .unwrap_or_else(|e| panic!("a drawn configuration is refused: {e}: {config:?}"));
    config
}

/// Linkerd's admin ports most of the time, some of the app's ports and ranges, now and then
/// a proxy port, and now and then a long list, which proxy-init splits into several multiport
/// rules of 15 slots.
fn inbound_ports(rng: &mut Rng, incoming: u16, outgoing: u16) -> PortSet {
    let mut set = Vec::new();
    if rng.u8(..10) < 7 {
        set.extend([PortRange::single(4190), PortRange::single(4191)]);
    }
    set.extend(app_ports(rng, 3));
    if rng.u8(..12) == 0 {
        let proxy_port = if rng.bool() { incoming } else { outgoing };
        set.push(PortRange::single(proxy_port));
    }
    if rng.u8(..10) == 0 {
        set.extend(long_list(rng));
    }
    PortSet(set)
}

fn outbound_ports(rng: &mut Rng, outgoing: u16) -> PortSet {
    let mut set = Vec::new();
    if rng.u8(..5) == 0 {
        set.extend([PortRange::single(443), PortRange::single(6443)]);
    }
    if rng.bool() {
        set.extend(app_ports(rng, 3));
    }
    if rng.u8(..15) == 0 {
        set.push(PortRange::single(outgoing));
    }
    if rng.u8(..10) == 0 {
        set.extend(long_list(rng));
    }
    PortSet(set)
}

fn ports_to_redirect(rng: &mut Rng, incoming: u16, outgoing: u16) -> Vec<u16> {
    if rng.u8(..4) != 0 {
        return Vec::new();
    }
    let mut ports: Vec<u16> = (0..rng.usize(1..=4))
        .map(|_| APP_PORTS[rng.usize(..APP_PORTS.len())])
        .collect();
    if rng.u8(..5) == 0 {
        ports.push(if rng.bool() { incoming } else { outgoing });
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Up to `most` of the app's ports, each alone or as a range around it.
fn app_ports(rng: &mut Rng, most: usize) -> Vec<PortRange> {
    (0..rng.usize(..=most))
        .map(|_| {
            let port = APP_PORTS[rng.usize(..APP_PORTS.len())];
            if rng.u8(..3) == 0 {
                let low = port.saturating_sub(rng.u16(..3)).max(1);
                PortRange {
                    low,
                    high: port.saturating_add(rng.u16(..40)),
                }
            } else {
                PortRange::single(port)
            }
        })
        .collect()
}

/// 10 to 24 ports no probe uses, some as ranges: more than one multiport rule's 15 slots.
fn long_list(rng: &mut Rng) -> Vec<PortRange> {
    (0..rng.u16(10..25))
        .map(|i| {
            let low = 20_000 + i * 10 + rng.u16(..5);
            PortRange {
                low,
                high: low + rng.u16(..3),
            }
        })
        .collect()
}

fn subnets(rng: &mut Rng, pool: &[&str], most: usize) -> Vec<ipnet::IpNet> {
    let mut nets: Vec<ipnet::IpNet> = (0..rng.usize(..=most))
        .map(|_| pool[rng.usize(..pool.len())].parse().expect("a CIDR"))
        .collect();
    nets.sort();
    nets.dedup();
    nets
}
