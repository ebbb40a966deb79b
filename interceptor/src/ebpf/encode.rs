//! How a pod's configuration and identity are encoded as the maps' keys and values (the types
//! shared with the programs in `interceptor-common`).
use interceptor_common::{NetnsCookie, PodSlot};
use std::{collections::BTreeSet, net::IpAddr};

use interceptor_common::{
    IP4_MAPPED_PREFIX_BITS, Ip6Addr, ListenerKey, LocalAddrKey, PodConfig, PortBitmap,
    SUBNET_KEY_FIXED_BITS, SubnetKey,
    addr::family,
    pod::{direction, flags},
};
use ipnet::IpNet;

use crate::config::InterceptionConfig;

/// One entry of the subnet trie: (prefix length, key).
pub(super) type SubnetEntry = (u32, SubnetKey);

/// The subnet trie entries of a pod's configuration: (prefix length, key).
pub(super) fn subnet_keys(
    cookie: NetnsCookie,
    config: &InterceptionConfig,
) -> BTreeSet<SubnetEntry> {
    let outbound = config
        .outbound_subnets_to_ignore
        .iter()
        .map(|net| (direction::OUTBOUND, net));
    let inbound = config
        .subnets_to_ignore
        .iter()
        .map(|net| (direction::INBOUND, net));
    outbound
        .chain(inbound)
        .map(|(direction, net)| {
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
        })
        .collect()
}

pub(super) fn local_key(netns_cookie: NetnsCookie, ip: IpAddr) -> LocalAddrKey {
    LocalAddrKey {
        netns_cookie: netns_cookie.0,
        addr: Ip6Addr::from(ip),
    }
}

pub(super) fn listener_key(netns_cookie: NetnsCookie, ipv6: bool) -> ListenerKey {
    ListenerKey {
        netns_cookie: netns_cookie.0,
        family: if ipv6 { family::IPV6 } else { family::IPV4 },
        _pad: 0,
    }
}

pub(super) fn pod_config(slot: PodSlot, config: &InterceptionConfig) -> PodConfig {
    let mut pod_flags = 0;
    if config.proxy_uid.is_some() {
        pod_flags |= flags::HAS_PROXY_UID;
    }
    if config.proxy_gid.is_some() {
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
    PodConfig {
        slot: slot.0,
        flags: pod_flags,
        proxy_uid: config.proxy_uid.unwrap_or(0),
        proxy_gid: config.proxy_gid.unwrap_or(0),
        outbound_port: config.outgoing_proxy_port,
        inbound_port: config.incoming_proxy_port,
        _pad: 0,
        outbound_ignore_ports: port_bitmap(&config.outbound_ports_to_ignore),
        inbound_ignore_ports: port_bitmap(&config.inbound_ports_to_ignore),
        redirect_ports,
    }
}

/// A port set as the programs test it: one bit per port.
pub(super) fn port_bitmap(ports: &crate::config::PortSet) -> PortBitmap {
    let mut bitmap = PortBitmap::EMPTY;
    for port in ports.ports() {
        bitmap.insert(port);
    }
    bitmap
}

#[cfg(test)]
mod tests {
    use crate::config::{PortRange, PortSet};

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
        let bitmap = super::port_bitmap(&set);
        for port in 1..=65535u16 {
            assert_eq!(bitmap.contains(port), set.contains(port), "port {port}");
        }
        assert!(super::port_bitmap(&PortSet::default()).is_empty());
    }
}
