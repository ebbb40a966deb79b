//! The `local` routes of the calling thread's network namespace, from one rtnetlink
//! `RTM_GETROUTE` dump: every destination such a route covers is delivered over `lo`, which
//! proxy-init's `-o lo -j RETURN` exempts whatever the address. Each interface address has one
//! (already among the pod's own addresses); an AnyIP route (`ip route add local
//! 10.250.64.0/24 dev lo`) covers a whole prefix that no interface holds.
use std::{io, net::IpAddr, os::fd::AsFd as _};

use interceptor_sys::netns::{recv, route_socket, send};
use ipnet::IpNet;
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ALIGNTO, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
};

/// The prefixes of every `local` route, of every table and both families.
pub(super) fn dump_local() -> io::Result<Vec<IpNet>> {
    let fd = route_socket(0)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    // The default message's family is AF_UNSPEC and its table 0: both families, every table.
    let mut request = NetlinkMessage::new(
        header,
        RouteNetlinkMessage::GetRoute(RouteMessage::default()).into(),
    );
    request.finalize();
    let mut datagram = vec![0u8; request.buffer_len()];
    request.serialize(&mut datagram);
    send(fd.as_fd(), &datagram)?;

    let mut routes = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_fd(), &mut buf)?;
        if parse(&buf[..n], &mut routes)? {
            return Ok(routes);
        }
    }
}

/// Parses one datagram of the dump into `routes`; true once the dump is done.
fn parse(mut data: &[u8], routes: &mut Vec<IpNet>) -> io::Result<bool> {
    while data.len() >= size_of::<libc::nlmsghdr>() {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match message.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => return Err(e.to_io()),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(route)) => {
                routes.extend(local_prefix(&route));
            }
            _ => {}
        }
        let len = (message.header.length as usize).next_multiple_of(NLMSG_ALIGNTO.into());
        data = data.get(len..).unwrap_or_default();
    }
    Ok(false)
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
