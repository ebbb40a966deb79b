//! The addresses of the calling thread's network namespace, from one rtnetlink `RTM_GETADDR`
//! dump. `getifaddrs(3)` dumps every link with its statistics as well, which cost a pod's
//! registration more than the addresses themselves (a tenth of it, in `perf`).
use std::{io, net::IpAddr};

use interceptor_parse::netlink;
use netlink_packet_route::{RouteNetlinkMessage, address::AddressMessage};

use super::dump;

/// Every address assigned to an interface of the namespace, both families, loopback and
/// link-local included, as `getifaddrs` names them (`IFA_LOCAL`, else `IFA_ADDRESS`).
pub(super) fn dump() -> io::Result<Vec<IpAddr>> {
    // The default message's family is AF_UNSPEC: both.
    dump::dump(
        dump::Dump::Addresses,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
        netlink::assigned_address,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_namespace_has_loopback() {
        let addresses = dump().unwrap();
        assert!(
            addresses.contains(&"127.0.0.1".parse().unwrap()),
            "{addresses:?}"
        );
    }
}
