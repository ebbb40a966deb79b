//! The `local` routes of the calling thread's network namespace, from one rtnetlink
//! `RTM_GETROUTE` dump: every destination such a route covers is delivered over `lo`, which
//! proxy-init's `-o lo -j RETURN` exempts whatever the address. Each interface address has one
//! (already among the pod's own addresses); an AnyIP route (`ip route add local
//! 10.250.64.0/24 dev lo`) covers a whole prefix that no interface holds.
use std::io;

use interceptor_parse::netlink;
use ipnet::IpNet;
use netlink_packet_route::{RouteNetlinkMessage, route::RouteMessage};

use super::dump;

/// The prefixes of every `local` route, of every table and both families.
pub(super) fn dump_local() -> io::Result<Vec<IpNet>> {
    // The default message's family is AF_UNSPEC and its table 0: both families, every table.
    dump::dump(
        dump::Dump::Routes,
        RouteNetlinkMessage::GetRoute(RouteMessage::default()),
        netlink::local_route,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
