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
