//! The addresses of the calling thread's network namespace, from one rtnetlink `RTM_GETADDR`
//! dump. `getifaddrs(3)` dumps every link with its statistics as well, which cost a pod's
//! registration more than the addresses themselves (a tenth of it, in `perf`).
use std::{io, net::IpAddr};

use netlink_packet_route::{
    RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
};

use super::dump;

/// Every address assigned to an interface of the namespace, both families, loopback and
/// link-local included, as `getifaddrs` names them (`IFA_LOCAL`, else `IFA_ADDRESS`).
pub(super) fn dump() -> io::Result<Vec<IpAddr>> {
    // The default message's family is AF_UNSPEC: both.
    dump::dump(
        dump::Dump::Addresses,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        pick,
    )
}

fn pick(message: RouteNetlinkMessage) -> Option<IpAddr> {
    match message {
        RouteNetlinkMessage::NewAddress(address) => assigned(&address),
        _ => None,
    }
}

/// One datagram of the dump, parsed as [`dump`] parses it.
#[cfg(test)]
fn parse(data: &[u8], addresses: &mut Vec<IpAddr>) -> io::Result<bool> {
    dump::parse(data, addresses, &mut pick)
}

/// `IFA_LOCAL`, else `IFA_ADDRESS`: on a point-to-point link `IFA_ADDRESS` is the peer's.
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

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};

    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage, NetlinkBuffer};
    use netlink_packet_route::AddressFamily;

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

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
        data.extend(bytes(NetlinkPayload::Done(DoneMessage::default())));
        let mut addresses = Vec::new();
        assert!(parse(&data, &mut addresses).unwrap());
        assert_eq!(addresses, [ip("10.0.0.1"), ip("fd77::1")]);
    }

    #[test]
    fn an_error_message_is_an_error() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-libc::EPERM);
        let data = bytes(NetlinkPayload::Error(error));
        let err = parse(&data, &mut Vec::new()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn a_truncated_message_is_an_error() {
        let mut data = new_address(AddressFamily::Inet, vec![]);
        data.truncate(size_of::<libc::nlmsghdr>() - 1);
        assert!(
            !parse(&data, &mut Vec::new()).unwrap(),
            "too short: ignored"
        );
        let mut data = new_address(AddressFamily::Inet, vec![]);
        NetlinkBuffer::new(&mut data).set_length(200);
        assert!(parse(&data, &mut Vec::new()).is_err());
    }

    /// A newer kernel's message kind, or an attribute too short to be one, among good ones: the
    /// good ones are kept, the others skipped and counted, and the dump goes on to its end.
    #[test]
    fn a_message_that_does_not_parse_is_skipped_and_counted() {
        let before = dump::skipped();
        let mut data = dump::unknown_message();
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
        data.extend(bytes(NetlinkPayload::Done(DoneMessage::default())));
        let mut addresses = Vec::new();
        assert!(parse(&data, &mut addresses).unwrap(), "read to its end");
        assert_eq!(addresses, [ip("10.0.0.1"), ip("fd77::1")]);
        // Other tests of this process parse too: at least these two.
        assert!(dump::skipped() >= before + 2);
    }

    #[test]
    fn this_namespace_has_loopback() {
        let addresses = dump().unwrap();
        assert!(addresses.contains(&ip("127.0.0.1")), "{addresses:?}");
    }
}
