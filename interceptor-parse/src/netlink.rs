//! rtnetlink, as the agent reads it: the datagrams of a dump (`NLM_F_DUMP`) of a pod's
//! addresses or routes, what it keeps of each message, what a namespace delivers over `lo`
//! (its local destinations), and which notifications can change that.
//!
//! A message that does not parse (a kind or attribute this crate's netlink types do not know,
//! from a newer kernel) is skipped and counted rather than failing the dump: a pod's namespace
//! must not pass for unreadable because of one message the pick would not have kept anyway.
use std::{
    io,
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use ipnet::IpNet;
use netlink_packet_core::{
    ErrorMessage, NLMSG_ALIGNTO, NetlinkBuffer, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
};
use tracing::warn;

/// Messages of dumps that did not parse and were skipped since the process started.
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// How many messages of dumps did not parse and were skipped since the process started.
pub fn skipped() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// Parses one datagram of a dump, keeping what `pick` takes; true once the dump is done. Bytes
/// too few for a message header are ignored, as the kernel's `NLMSG_OK` does. A message whose
/// header holds but whose content does not parse is skipped and counted; a header whose length
/// does not fit the datagram leaves nothing after it readable, and fails the dump.
pub fn parse_dump<T>(
    mut data: &[u8],
    picked: &mut Vec<T>,
    pick: &mut impl FnMut(RouteNetlinkMessage) -> Option<T>,
) -> io::Result<bool> {
    while data.len() >= size_of::<libc::nlmsghdr>() {
        let header = NetlinkBuffer::new_checked(data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let (length, kind) = (header.length(), header.message_type());
        let len = (length as usize).next_multiple_of(NLMSG_ALIGNTO.into());
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(data) {
            Ok(message) => match message.payload {
                NetlinkPayload::Done(_) => return Ok(true),
                NetlinkPayload::Error(e) => return Err(error_to_io(&e)),
                NetlinkPayload::InnerMessage(inner) => picked.extend(pick(inner)),
                _ => {}
            },
            Err(error) => {
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                warn!(message_type = kind, length, %error, "skipped a netlink message that does not parse");
            }
        }
        data = data.get(len..).unwrap_or_default();
    }
    Ok(false)
}

/// An `NLMSG_ERROR` message as the error it reports: the kernel's code is a negated errno (0, an
/// acknowledgement, reads as success, as `ErrorMessage::to_io` has it). A code that is no errno
/// is refused as data: `to_io` takes its absolute value, which panics on `i32::MIN` in a debug
/// build (found by the `netlink` fuzz target).
pub fn error_to_io(e: &ErrorMessage) -> io::Error {
    let code = e.raw_code();
    match i32::try_from(code.unsigned_abs()) {
        Ok(errno) => io::Error::from_raw_os_error(errno),
        Err(_) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a netlink error message with code {code}, which is no errno"),
        ),
    }
}

/// A message of a kind no kernel sends yet (`RTM_*` types end far below it), as a newer kernel's
/// would look to this crate: for the fault tests and the parser's.
pub fn unknown_message() -> Vec<u8> {
    const LEN: u32 = 20;
    let mut bytes = Vec::with_capacity(LEN as usize);
    bytes.extend_from_slice(&LEN.to_ne_bytes());
    bytes.extend_from_slice(&0x3ffu16.to_ne_bytes());
    bytes.extend_from_slice(&(libc::NLM_F_MULTI as u16).to_ne_bytes());
    bytes.extend_from_slice(&1u32.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes
}

/// What an `RTM_GETADDR` dump keeps of a message: the address it assigns to an interface, as
/// `getifaddrs` names it (`IFA_LOCAL`, else `IFA_ADDRESS`: on a point-to-point link
/// `IFA_ADDRESS` is the peer's).
pub fn assigned_address(message: RouteNetlinkMessage) -> Option<IpAddr> {
    let RouteNetlinkMessage::NewAddress(address) = message else {
        return None;
    };
    assigned(&address)
}

fn assigned(message: &AddressMessage) -> Option<IpAddr> {
    let (mut local, mut address) = (None, None);
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    local.or(address)
}

/// What an `RTM_GETROUTE` dump keeps of a message: the destination of a `local` route. Every
/// destination such a route covers is delivered over `lo`, which proxy-init's `-o lo -j RETURN`
/// exempts whatever the address.
pub fn local_route(message: RouteNetlinkMessage) -> Option<IpNet> {
    let RouteNetlinkMessage::NewRoute(route) = message else {
        return None;
    };
    local_prefix(&route)
}

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

/// What a namespace delivers over `lo` besides loopback (`127.0.0.0/8`, `::1`), which
/// proxy-init's `-o lo -j RETURN` exempts: its interfaces' addresses, and the prefixes of its
/// `local` routes that are not one of them (an AnyIP `ip route add local 10.250.64.0/24 dev
/// lo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalDestinations {
    /// Sorted, without duplicates.
    pub addresses: Vec<IpAddr>,
    /// Sorted, without duplicates.
    pub routes: Vec<IpNet>,
}

impl LocalDestinations {
    /// From the address dump and every `local` route: a route to one address of the namespace
    /// (each address has one) or within loopback adds nothing.
    pub fn new(mut addresses: Vec<IpAddr>, routes: Vec<IpNet>) -> Self {
        addresses.sort();
        addresses.dedup();
        let loopback: [IpNet; 2] = [
            ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(127, 0, 0, 0), 8)
                .expect("a valid prefix")
                .into(),
            ipnet::Ipv6Net::new(std::net::Ipv6Addr::LOCALHOST, 128)
                .expect("a valid prefix")
                .into(),
        ];
        let mut routes: Vec<IpNet> = routes
            .into_iter()
            .filter(|net| !loopback.iter().any(|lo| lo.contains(net)))
            .filter(|net| {
                net.prefix_len() != net.max_prefix_len()
                    || addresses.binary_search(&net.addr()).is_err()
            })
            .collect();
        routes.sort();
        routes.dedup();
        Self { addresses, routes }
    }
}

/// Whether a notification can change what a namespace delivers over lo: an address, or a
/// `local` route (an AnyIP one, or an address's own). Other route changes (a pod's default
/// route, say) cannot, and check no pod.
pub fn changes_local_delivery(datagram: &[u8]) -> bool {
    // The `rtmsg` after the message header: family, dst_len, src_len, tos, table, protocol,
    // scope, type.
    const RTM_TYPE: usize = size_of::<libc::nlmsghdr>() + 7;
    let kind = datagram.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    match kind {
        Some(libc::RTM_NEWROUTE | libc::RTM_DELROUTE) => {
            datagram.get(RTM_TYPE).copied() == Some(libc::RTN_LOCAL)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{
        DoneMessage, ErrorMessage, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_route::AddressFamily;

    use super::*;

    fn bytes(payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut message = NetlinkMessage::new(NetlinkHeader::default(), payload);
        message.finalize();
        let mut bytes = vec![0u8; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    fn new_address(family: AddressFamily, attributes: Vec<AddressAttribute>) -> Vec<u8> {
        let mut message = AddressMessage::default();
        message.header.family = family;
        message.attributes = attributes;
        bytes(RouteNetlinkMessage::NewAddress(message).into())
    }

    fn route(kind: RouteType, family: AddressFamily, dst: &str, len: u8) -> Vec<u8> {
        let mut message = RouteMessage::default();
        message.header.kind = kind;
        message.header.address_family = family;
        message.header.destination_prefix_length = len;
        message
            .attributes
            .push(RouteAttribute::Destination(ip(dst).into()));
        bytes(RouteNetlinkMessage::NewRoute(message).into())
    }

    fn done() -> Vec<u8> {
        bytes(NetlinkPayload::Done(DoneMessage::default()))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn addresses(data: &[u8]) -> io::Result<(bool, Vec<IpAddr>)> {
        let mut picked = Vec::new();
        let done = parse_dump(data, &mut picked, &mut assigned_address)?;
        Ok((done, picked))
    }

    #[test]
    fn local_wins_over_address_and_both_families_parse() {
        let mut data = new_address(
            AddressFamily::Inet,
            vec![
                AddressAttribute::Address(ip("10.0.0.2")),
                AddressAttribute::Local(ip("10.0.0.1")),
            ],
        );
        data.extend(new_address(
            AddressFamily::Inet6,
            vec![AddressAttribute::Address(ip("fd77::1"))],
        ));
        data.extend(done());
        assert_eq!(
            addresses(&data).unwrap(),
            (true, vec![ip("10.0.0.1"), ip("fd77::1")])
        );
    }

    #[test]
    fn an_error_message_is_an_error() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-libc::EPERM);
        let data = bytes(NetlinkPayload::Error(error));
        let err = addresses(&data).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    /// Found by the `netlink` fuzz target: an error message whose code is `i32::MIN` made the
    /// dump's reader panic (`ErrorMessage::to_io` negates it), in the agent, on the kernel's
    /// answer. It is an error of its own now.
    #[test]
    fn an_error_code_that_is_no_errno_is_an_error_not_a_panic() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(i32::MIN);
        let data = bytes(NetlinkPayload::Error(error));
        let err = addresses(&data).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("-2147483648"), "{err}");
        // The fuzz target's input, as it found it.
        let found = b"\x24\x00\x00\x00\x02\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\
            \x00\x00\x00\x80\x00\x00\x00\x06\xff\xff\xff\xff\xff\xff\x0a\x4d\
            \x00\x40\xff\xff\xff\x84\xf6\x2e\x00\x84\xf6\x2e\x00\x50\x00\x00\
            \x00\x14\x00\x02\x00\x00\x14\x00\x00\x00\x00";
        assert!(addresses(found).is_err());
    }

    #[test]
    fn a_truncated_message_is_an_error() {
        let mut data = new_address(AddressFamily::Inet, vec![]);
        data.truncate(size_of::<libc::nlmsghdr>() - 1);
        assert!(!addresses(&data).unwrap().0, "too short: ignored");
        let mut data = new_address(AddressFamily::Inet, vec![]);
        NetlinkBuffer::new(&mut data).set_length(200);
        assert!(addresses(&data).is_err());
    }

    /// A newer kernel's message kind, or an attribute too short to be one, among good ones: the
    /// good ones are kept, the others skipped and counted, and the dump goes on to its end.
    #[test]
    fn a_message_that_does_not_parse_is_skipped_and_counted() {
        let before = skipped();
        let mut data = unknown_message();
        data.extend(new_address(
            AddressFamily::Inet,
            vec![AddressAttribute::Local(ip("10.0.0.1"))],
        ));
        let mut broken = new_address(
            AddressFamily::Inet,
            vec![AddressAttribute::Local(ip("10.0.0.9"))],
        );
        // The attribute's own length, after the message header (16 bytes) and ifaddrmsg (8).
        broken[24..26].copy_from_slice(&2u16.to_ne_bytes());
        data.extend(broken);
        data.extend(new_address(
            AddressFamily::Inet6,
            vec![AddressAttribute::Address(ip("fd77::1"))],
        ));
        data.extend(done());
        assert_eq!(
            addresses(&data).unwrap(),
            (true, vec![ip("10.0.0.1"), ip("fd77::1")]),
            "read to its end"
        );
        // Other tests of this process parse too: at least these two.
        assert!(skipped() >= before + 2);
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
        data.extend(done());
        let mut routes = Vec::new();
        assert!(parse_dump(&data, &mut routes, &mut local_route).unwrap());
        let want: Vec<IpNet> = vec![
            "10.250.64.0/24".parse().unwrap(),
            "fd77:64::/64".parse().unwrap(),
        ];
        assert_eq!(routes, want);
    }

    /// A `local` route whose prefix length does not fit its family's address is not a prefix: it
    /// is left out, and the host bits of one that fits are cleared.
    #[test]
    fn a_local_route_with_an_impossible_prefix_is_left_out() {
        let mut data = route(RouteType::Local, AddressFamily::Inet, "10.250.64.9", 33);
        data.extend(route(
            RouteType::Local,
            AddressFamily::Inet,
            "10.250.64.9",
            24,
        ));
        let mut routes = Vec::new();
        assert!(!parse_dump(&data, &mut routes, &mut local_route).unwrap());
        assert_eq!(routes, ["10.250.64.0/24".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn local_destinations_leave_out_loopback_and_the_addresses_own_routes() {
        let local = LocalDestinations::new(
            vec![ip("10.0.0.1"), ip("127.0.0.1"), ip("10.0.0.1")],
            vec![
                "127.0.0.0/8".parse().unwrap(),
                "::1/128".parse().unwrap(),
                "10.0.0.1/32".parse().unwrap(),
                "10.250.64.0/24".parse().unwrap(),
                "10.250.64.0/24".parse().unwrap(),
            ],
        );
        assert_eq!(local.addresses, [ip("10.0.0.1"), ip("127.0.0.1")]);
        assert_eq!(local.routes, ["10.250.64.0/24".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn only_local_route_notifications_change_local_delivery() {
        let local = route(RouteType::Local, AddressFamily::Inet, "10.250.64.0", 24);
        let unicast = route(RouteType::Unicast, AddressFamily::Inet, "10.0.0.0", 8);
        let address = new_address(AddressFamily::Inet, vec![]);
        assert!(changes_local_delivery(&local));
        assert!(!changes_local_delivery(&unicast));
        assert!(changes_local_delivery(&address));
        assert!(
            changes_local_delivery(&[]),
            "what cannot be told checks the pods"
        );
    }
}
