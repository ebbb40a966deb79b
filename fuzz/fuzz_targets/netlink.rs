//! One datagram of an rtnetlink dump, as the agent reads a pod's namespace
//! (`interceptor_parse::netlink`): parsed with both of the agent's picks (the addresses an
//! `RTM_GETADDR` dump assigns, the `local` routes of an `RTM_GETROUTE` one), then the local
//! destinations the agent derives from them (`LocalDestinations::new`, what proxy-init's `-o lo`
//! exempts), and whether the datagram, heard as a notification, can change them
//! (`changes_local_delivery`).
//!
//! Input: the datagram's bytes, as the kernel would send them.
#![no_main]

use std::net::IpAddr;

use interceptor_parse::netlink::{
    LocalDestinations, assigned_address, changes_local_delivery, local_route, parse_dump,
};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{RouteNetlinkMessage, route::RouteType};

fuzz_target!(|data: &[u8]| {
    let mut addresses: Vec<IpAddr> = Vec::new();
    let addressed = parse_dump(data, &mut addresses, &mut assigned_address);
    let mut routes: Vec<IpNet> = Vec::new();
    let routed = parse_dump(data, &mut routes, &mut local_route);
    // The picks keep different messages; the messages read, and where the dump ends or fails,
    // are the same.
    match (&addressed, &routed) {
        (Ok(a), Ok(r)) => assert_eq!(a, r, "both picks read to the same end"),
        (Err(a), Err(r)) => {
            assert_eq!(a.kind(), r.kind());
            assert!(!a.to_string().is_empty(), "a failed dump says why");
        }
        _ => panic!("one pick failed and not the other: {addressed:?} {routed:?}"),
    }
    for route in &routes {
        assert_eq!(
            *route,
            route.trunc(),
            "a local route is a prefix, host bits clear"
        );
    }

    let local = LocalDestinations::new(addresses.clone(), routes.clone());
    assert!(local.addresses.is_sorted() && local.routes.is_sorted());
    assert!(
        local.addresses.windows(2).all(|w| w[0] != w[1]),
        "no duplicates"
    );
    assert!(
        local.routes.windows(2).all(|w| w[0] != w[1]),
        "no duplicates"
    );
    for address in &addresses {
        assert!(local.addresses.contains(address), "every address is local");
    }
    let loopback: [IpNet; 2] = ["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    for route in &routes {
        let own = route.prefix_len() == route.max_prefix_len() && addresses.contains(&route.addr());
        let in_loopback = loopback.iter().any(|lo| lo.contains(route));
        assert_eq!(
            local.routes.contains(route),
            !own && !in_loopback,
            "{route}: a local route is kept unless loopback or an address's own"
        );
    }
    for route in &local.routes {
        assert!(routes.contains(route), "nothing is made up");
    }
    assert_eq!(
        LocalDestinations::new(local.addresses.clone(), local.routes.clone()),
        local,
        "deriving again changes nothing"
    );

    // A notification that adds or removes a `local` route must wake the pod's check.
    if let Ok(message) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(data)
        && let NetlinkPayload::InnerMessage(
            RouteNetlinkMessage::NewRoute(route) | RouteNetlinkMessage::DelRoute(route),
        ) = message.payload
        && route.header.kind == RouteType::Local
    {
        assert!(
            changes_local_delivery(data),
            "a local route's notification changes local delivery"
        );
    }
});
