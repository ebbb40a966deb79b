//! Random proxy-init configurations: what `linkerd-init`'s flags can say, drawn around the
//! addresses and ports of [`super::pod`] so that the probes meet every rule.
use fastrand::Rng;
use interceptor::config::{InterceptionConfig, PortRange, PortSet};

use super::pod::APP_PORTS;
use crate::{
    proxy_init,
    scenario::{INBOUND_PORT, OUTBOUND_PORT, PROXY_GID, PROXY_UID},
};

/// Another proxy (`--proxy-uid`, `--proxy-gid`, ports) than Linkerd's, now and then.
pub const OTHER_PROXY_UID: u32 = 2200;
pub const OTHER_PROXY_GID: u32 = 2300;
const OTHER_PROXY_PORTS: (u16, u16) = (15006, 15001);

/// IPv4 subnets to ignore inbound, by the sources of [`super::pod::CLIENT_SOURCES`]: each
/// holds some of them and not others, and `/0` all. Only IPv4 ones, and only with
/// `--ipv6=false`: proxy-init hands every subnet to both its passes, and iptables refuses a CIDR
/// of the other family (see `proxy_init::accepted_by_both`); IPv4-mapped ones (`::ffff:a.b.c.d/n`)
/// are refused by its IPv4 pass too, so they are drawn only among our extension's outbound
/// subnets.
const INBOUND_SUBNETS: [&str; 8] = [
    "10.77.0.0/24",
    "10.250.61.0/24",
    "10.250.62.1/32",
    "10.250.0.0/16",
    "198.51.100.0/24",
    "10.0.0.0/8",
    "0.0.0.0/0",
    "10.250.62.0/31",
];

/// Subnets to ignore outbound (an extension of proxy-init's flags), by the probes' targets:
/// other pods, the pod's own second interface, its AnyIP routes (the one added after the pod
/// is meshed too), everything (`/0`), and IPv4-mapped ones, which name IPv4 destinations in
/// IPv6's form.
const OUTBOUND_SUBNETS: [&str; 18] = [
    "10.77.0.0/24",
    "192.0.2.0/24",
    "198.51.100.0/25",
    "10.250.64.0/24",
    "10.250.65.0/24",
    "10.250.66.0/24",
    "10.250.61.1/32",
    "0.0.0.0/0",
    "fd77::/64",
    "2001:db8::/64",
    "fd64::/64",
    "fd65::/64",
    "fd61::1/128",
    "::/0",
    "::ffff:10.77.0.0/120",
    "::ffff:192.0.2.0/120",
    "::ffff:10.250.64.0/120",
    "::ffff:0.0.0.0/96",
];

/// The app's UID and GID (see `probes`): a proxy UID or GID equal to them is drawn now and then.
const APP_ID: u32 = crate::scenario::APP_UID;

/// One random configuration as proxy-init's flags, and what we read from them (through
/// `from_proxy_init_args`, the one parser of those flags). Only flags both proxy-init and we
/// accept are drawn (`proxy_init::accepted_by_both` says why some are not).
pub fn draw(rng: &mut Rng) -> (Vec<String>, InterceptionConfig) {
    let (incoming, outgoing) = if rng.u8(..10) == 0 {
        OTHER_PROXY_PORTS
    } else {
        (INBOUND_PORT, OUTBOUND_PORT)
    };
    let ipv6 = rng.bool();
    // What the flags say: 0 (and -1, the flags' default) is no exemption to proxy-init and us.
    let uid: Option<i64> = match rng.u8(..20) {
        0 => None,
        1 | 2 => Some(OTHER_PROXY_UID.into()),
        3 => Some(0),
        4 => Some(APP_ID.into()),
        _ => Some(PROXY_UID.into()),
    };
    let gid: Option<i64> = match rng.u8(..12) {
        0..4 => None,
        4 => Some(OTHER_PROXY_GID.into()),
        5 => Some(0),
        6 => Some(APP_ID.into()),
        _ => Some(PROXY_GID.into()),
    };
    let config = InterceptionConfig {
        incoming_proxy_port: incoming,
        outgoing_proxy_port: outgoing,
        proxy_uid: None,
        proxy_gid: None,
        inbound_ports_to_ignore: inbound_ports(rng, incoming, outgoing),
        outbound_ports_to_ignore: outbound_ports(rng, incoming, outgoing),
        ports_to_redirect: ports_to_redirect(rng, incoming, outgoing),
        subnets_to_ignore: if ipv6 {
            Vec::new()
        } else {
            subnets(rng, &INBOUND_SUBNETS, 4)
        },
        outbound_subnets_to_ignore: subnets(rng, &OUTBOUND_SUBNETS, 3),
        ipv6,
    };
    let mut args = config.to_args();
    for (flag, id) in [("--proxy-uid", uid), ("--proxy-gid", gid)] {
        if let Some(id) = id {
            args.extend([flag.to_owned(), id.to_string()]);
        }
    }
    if let Err(why) = proxy_init::accepted_by_both(&args) {
        panic!(
            "a drawn configuration proxy-init does not take: {why}: {}",
            args.join(" ")
        );
    }
    let config = InterceptionConfig::from_proxy_init_args(&args)
        .unwrap_or_else(|e| panic!("a drawn configuration is refused: {e}: {}", args.join(" ")));
    (args, config)
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
    if rng.u8(..8) == 0 {
        set.push(covering_a_proxy_port(rng, incoming, outgoing));
    }
    if rng.u8(..10) == 0 {
        set.extend(long_list(rng));
    }
    PortSet(set)
}

/// A range that holds a proxy port (or both, 4140-4143), not only the port itself.
fn covering_a_proxy_port(rng: &mut Rng, incoming: u16, outgoing: u16) -> PortRange {
    let (low, high) = (incoming.min(outgoing), incoming.max(outgoing));
    match rng.u8(..3) {
        0 => PortRange { low, high },
        1 => PortRange {
            low: low - rng.u16(1..50),
            high: low + rng.u16(..2),
        },
        _ => PortRange {
            low: high - rng.u16(..2),
            high: high + rng.u16(1..50),
        },
    }
}

fn outbound_ports(rng: &mut Rng, incoming: u16, outgoing: u16) -> PortSet {
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
        set.push(covering_a_proxy_port(rng, incoming, outgoing));
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
