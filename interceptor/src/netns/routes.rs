//! The `local` routes of the calling thread's network namespace, from one rtnetlink
//! `RTM_GETROUTE` dump: every destination such a route covers is delivered over `lo`, which
//! proxy-init's `-o lo -j RETURN` exempts whatever the address. Each interface address has one
//! (already among the pod's own addresses); an AnyIP route (`ip route add local
//! 10.250.64.0/24 dev lo`) covers a whole prefix that no interface holds.
use std::{io, net::IpAddr};

use ipnet::IpNet;
use netlink_packet_route::{
    RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
};

use super::dump;

/// The prefixes of every `local` route, of every table and both families.
pub(super) fn dump_local() -> io::Result<Vec<IpNet>> {
    // The default message's family is AF_UNSPEC and its table 0: both families, every table.
    dump::dump(
        dump::Dump::Routes,
        RouteNetlinkMessage::GetRoute(RouteMessage::default()),
        pick,
    )
}

fn pick(message: RouteNetlinkMessage) -> Option<IpNet> {
    match message {
        RouteNetlinkMessage::NewRoute(route) => local_prefix(&route),
        _ => None,
    }
}

/// One datagram of the dump, parsed as [`dump_local`] parses it.
#[cfg(test)]
fn parse(data: &[u8], routes: &mut Vec<IpNet>) -> io::Result<bool> {
    dump::parse(data, routes, &mut pick)
}

/// The destination of a `local` route.
fn local_prefix(route: &RouteMessage) -> Option<IpNet> {
    if route.header.kind != RouteType::Local {
        return None;
    }
    let ip: IpAddr = route.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some((*ip).into()),
        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => Some((*ip).into()),
        _ => None,
    })?;
    IpNet::new(ip, route.header.destination_prefix_length)
        .ok()
        .map(|net| net.trunc())
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};

    use super::*;
    use netlink_packet_core::DoneMessage;
    use netlink_packet_route::AddressFamily;

    fn bytes(payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut message = NetlinkMessage::new(NetlinkHeader::default(), payload);
        message.finalize();
        let mut bytes = vec![0u8; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    fn route(kind: RouteType, family: AddressFamily, dst: &str, len: u8) -> Vec<u8> {
        let mut message = RouteMessage::default();
        message.header.kind = kind;
        message.header.address_family = family;
        message.header.destination_prefix_length = len;
        let ip: IpAddr = dst.parse().unwrap();
        message
            .attributes
            .push(RouteAttribute::Destination(ip.into()));
        bytes(RouteNetlinkMessage::NewRoute(message).into())
    }

    #[test]
    fn only_local_routes_are_kept_in_both_families() {
        let mut data = route(RouteType::Local, AddressFamily::Inet, "10.250.64.0", 24);
        data.extend(route(
            RouteType::Unicast,
            AddressFamily::Inet,
            "10.0.0.0",
            8,
        ));
        data.extend(route(
            RouteType::Broadcast,
            AddressFamily::Inet,
            "10.77.0.255",
            32,
        ));
        data.extend(route(
            RouteType::Local,
            AddressFamily::Inet6,
            "fd77:64::",
            64,
        ));
        data.extend(bytes(NetlinkPayload::Done(DoneMessage::default())));
        let mut routes = Vec::new();
        assert!(parse(&data, &mut routes).unwrap());
        let want: Vec<IpNet> = vec![
            "10.250.64.0/24".parse().unwrap(),
            "fd77:64::/64".parse().unwrap(),
        ];
        assert_eq!(routes, want);
    }

    /// The calling thread's namespace has at least its loopback's `local 127.0.0.0/8`.
    #[test]
    fn the_namespace_routes_loopback_locally() {
        let routes = dump_local().unwrap();
        assert!(
            routes.contains(&"127.0.0.0/8".parse().unwrap()),
            "{routes:?}"
        );
    }
}
