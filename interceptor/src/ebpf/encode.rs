//! How a pod's configuration and identity are encoded as the maps' keys and values (the types
//! shared with the programs in `interceptor-common`).
use interceptor_common::{NetnsCookie, PodSlot};
use std::{collections::BTreeSet, net::IpAddr};

use interceptor_common::{
    IP4_MAPPED_PREFIX_BITS, Ip6Addr, ListenerKey, MAX_LOCAL_ADDRS_PER_POD, PodConfig, PortBitmap,
    SUBNET_KEY_FIXED_BITS, SubnetKey,
    addr::family,
    pod::{direction, flags},
};
use ipnet::IpNet;

use crate::config::{InterceptionConfig, user_ids::HostIds};

/// One entry of the subnet trie: (prefix length, key).
pub(super) type SubnetEntry = (u32, SubnetKey);

/// The subnet trie entries of a pod's configuration and of its `local` routes (AnyIP
/// prefixes, delivered over lo): (prefix length, key).
pub(super) fn subnet_keys(
    cookie: NetnsCookie,
    config: &InterceptionConfig,
    local_routes: &BTreeSet<IpNet>,
) -> BTreeSet<SubnetEntry> {
    let outbound = config
        .outbound_subnets_to_ignore
        .iter()
        .map(|net| subnet_entry(cookie, direction::OUTBOUND, net));
    let inbound = config
        .subnets_to_ignore
        .iter()
        .map(|net| subnet_entry(cookie, direction::INBOUND, net));
    outbound
        .chain(inbound)
        .chain(local_route_keys(cookie, local_routes))
        .collect()
}

/// The subnet trie entries of a pod's `local` routes.
pub(super) fn local_route_keys(
    cookie: NetnsCookie,
    local_routes: &BTreeSet<IpNet>,
) -> impl Iterator<Item = SubnetEntry> {
    local_routes
        .iter()
        .map(move |net| subnet_entry(cookie, direction::LOCAL_ROUTE, net))
}

fn subnet_entry(cookie: NetnsCookie, direction: u32, net: &IpNet) -> SubnetEntry {
    let (family, prefix_len) = match net {
        IpNet::V4(v4) => (
            family::IPV4,
            IP4_MAPPED_PREFIX_BITS + u32::from(v4.prefix_len()),
        ),
        IpNet::V6(v6) => (family::IPV6, u32::from(v6.prefix_len())),
    };
    let key = SubnetKey {
        netns_cookie: cookie.0,
        direction,
        family,
        addr: Ip6Addr::from(net.network()),
    };
    (SUBNET_KEY_FIXED_BITS + prefix_len, key)
}

/// The `local` routes among a pod's subnet entries, as [`subnet_keys`] wrote them.
pub(super) fn local_routes_of(subnets: &BTreeSet<SubnetEntry>) -> BTreeSet<IpNet> {
    subnets
        .iter()
        .filter(|(_, key)| key.direction == direction::LOCAL_ROUTE)
        .filter_map(|(prefix_len, key)| {
            let bits = prefix_len.checked_sub(SUBNET_KEY_FIXED_BITS)?;
            let net = match IpAddr::from(key.addr) {
                IpAddr::V4(v4) => {
                    IpNet::new(v4.into(), bits.checked_sub(IP4_MAPPED_PREFIX_BITS)? as u8)
                }
                v6 => IpNet::new(v6, bits as u8),
            };
            net.ok()
        })
        .collect()
}

/// A pod's subnet entries but its `local` routes: what its configuration asks for.
pub(super) fn configured_subnets(subnets: &BTreeSet<SubnetEntry>) -> BTreeSet<SubnetEntry> {
    subnets
        .iter()
        .filter(|(_, key)| key.direction != direction::LOCAL_ROUTE)
        .copied()
        .collect()
}

pub(super) fn listener_key(netns_cookie: NetnsCookie, ipv6: bool) -> ListenerKey {
    ListenerKey {
        netns_cookie: netns_cookie.0,
        family: if ipv6 { family::IPV6 } else { family::IPV4 },
        _pad: 0,
    }
}

/// The pod's entry: its configuration, its own addresses and whether it has `local` routes.
pub(super) fn pod_config(
    slot: PodSlot,
    config: &InterceptionConfig,
    host_ids: HostIds,
    addresses: &BTreeSet<IpAddr>,
    has_local_routes: bool,
) -> PodConfig {
    let mut pod_flags = 0;
    // The programs compare the host's ids (a socket's `kuid_t`): a pod with a user namespace
    // of its own has its configuration's translated.
    if host_ids.proxy_uid.is_some() {
        pod_flags |= flags::HAS_PROXY_UID;
    }
    if host_ids.proxy_gid.is_some() {
        pod_flags |= flags::HAS_PROXY_GID;
    }
    if config.ipv6 {
        pod_flags |= flags::INTERCEPT_IPV6;
    }
    for (nets, v4_flag, v6_flag) in [
        (
            &config.outbound_subnets_to_ignore,
            flags::HAS_OUTBOUND_SUBNETS_V4,
            flags::HAS_OUTBOUND_SUBNETS_V6,
        ),
        (
            &config.subnets_to_ignore,
            flags::HAS_INBOUND_SUBNETS_V4,
            flags::HAS_INBOUND_SUBNETS_V6,
        ),
    ] {
        for net in nets {
            pod_flags |= match net {
                IpNet::V4(_) => v4_flag,
                IpNet::V6(_) => v6_flag,
            };
        }
    }
    let mut redirect_ports = interceptor_common::PortBitmap::EMPTY;
    for port in &config.ports_to_redirect {
        redirect_ports.insert(*port);
    }
    if !config.ports_to_redirect.is_empty() {
        pod_flags |= flags::HAS_PORTS_TO_REDIRECT;
    }
    let mut pod = PodConfig {
        slot: slot.0,
        flags: pod_flags,
        proxy_uid: host_ids.proxy_uid.unwrap_or(0),
        proxy_gid: host_ids.proxy_gid.unwrap_or(0),
        outbound_port: config.outgoing_proxy_port,
        inbound_port: config.incoming_proxy_port,
        local_addr_count: 0,
        local_addrs: [Ip6Addr::UNSPECIFIED; MAX_LOCAL_ADDRS_PER_POD as usize],
        outbound_ignore_ports_be: port_bitmap(&config.outbound_ports_to_ignore, u16::to_be),
        inbound_ignore_ports: port_bitmap(&config.inbound_ports_to_ignore, |port| port),
        redirect_ports,
    };
    write_local(&mut pod, addresses, has_local_routes);
    pod
}

/// Makes `addresses` the pod's own in its entry (see [`write_addresses`]), and says whether
/// the subnet trie holds `local` routes of it (the programs look only then).
pub(super) fn write_local(pod: &mut PodConfig, addresses: &BTreeSet<IpAddr>, routes: bool) {
    write_addresses(pod, addresses);
    if routes {
        pod.flags |= flags::HAS_LOCAL_ROUTES;
    } else {
        pod.flags &= !flags::HAS_LOCAL_ROUTES;
    }
}

/// Makes `addresses` (at most `MAX_LOCAL_ADDRS_PER_POD`, which registration checks first; any
/// beyond are not written) the pod's own in its entry.
fn write_addresses(pod: &mut PodConfig, addresses: &BTreeSet<IpAddr>) {
    pod.local_addrs = [Ip6Addr::UNSPECIFIED; MAX_LOCAL_ADDRS_PER_POD as usize];
    for (slot, ip) in pod.local_addrs.iter_mut().zip(addresses) {
        *slot = Ip6Addr::from(*ip);
    }
    pod.local_addr_count = addresses.len().min(pod.local_addrs.len()) as u32;
}

/// The addresses a pod's entry holds as its own.
pub(super) fn own_addresses(config: &PodConfig) -> BTreeSet<IpAddr> {
    let count = (config.local_addr_count as usize).min(config.local_addrs.len());
    config.local_addrs[..count]
        .iter()
        .map(|addr| IpAddr::from(*addr))
        .collect()
}

/// A port set as the programs test it: one bit per port, the port in the byte order `order`
/// gives it (the order the program reads the port in).
pub(super) fn port_bitmap(ports: &crate::config::PortSet, order: fn(u16) -> u16) -> PortBitmap {
    let mut bitmap = PortBitmap::EMPTY;
    for port in ports.ports() {
        bitmap.insert(order(port));
    }
    bitmap
}

#[cfg(test)]
mod tests {
    use crate::config::{PortRange, PortSet};

    #[test]
    fn a_pods_entry_holds_its_addresses_and_only_those() {
        use std::net::IpAddr;
        let addresses: std::collections::BTreeSet<IpAddr> = ["10.77.0.1", "fd77::1", "fe80::1"]
            .map(|a| a.parse().unwrap())
            .into();
        let config = crate::config::InterceptionConfig::linkerd();
        let host_ids = crate::config::user_ids::HostIds::of_host_pod(&config);
        let mut pod = super::pod_config(
            interceptor_common::PodSlot(3),
            &config,
            host_ids,
            &addresses,
            false,
        );
        assert_eq!(super::own_addresses(&pod), addresses);
        for addr in &addresses {
            assert!(pod.is_own_address((*addr).into()), "{addr}");
        }
        let other: IpAddr = "10.77.0.2".parse().unwrap();
        assert!(!pod.is_own_address(other.into()));
        // The unused entries are zero, and :: is not an address of the pod's.
        assert!(!pod.is_own_address(interceptor_common::Ip6Addr::UNSPECIFIED));

        let fewer = [other].into();
        super::write_addresses(&mut pod, &fewer);
        assert_eq!(super::own_addresses(&pod), fewer);
        assert!(!pod.is_own_address("fd77::1".parse::<IpAddr>().unwrap().into()));
    }

    #[test]
    fn a_port_bitmap_matches_membership() {
        let set = PortSet(vec![
            PortRange::single(443),
            PortRange {
                low: 6000,
                high: 6010,
            },
            PortRange::single(65535),
        ]);
        let host = super::port_bitmap(&set, |port| port);
        let network = super::port_bitmap(&set, u16::to_be);
        for port in 1..=65535u16 {
            assert_eq!(host.contains(port), set.contains(port), "port {port}");
            assert_eq!(
                network.contains(port.to_be()),
                set.contains(port),
                "port {port}"
            );
        }
        assert!(super::port_bitmap(&PortSet::default(), u16::to_be).is_empty());
    }
}
