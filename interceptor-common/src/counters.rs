//! Per-pod decision counters: one slot per pod in a per-CPU array, so counting costs one
//! increment in a CPU-local cache line on the connection path.
use bytemuck::{Pod, Zeroable};

/// Why a connection was (or was not) intercepted. The discriminant is the counter index.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Decision {
    /// Outbound connect rewritten to the proxy's outbound port.
    Redirected = 0,
    /// Outbound: the caller runs as the proxy UID.
    ProxyUid = 1,
    /// Outbound: the caller runs as the proxy GID.
    ProxyGid = 2,
    /// Outbound: destination on loopback (127.0.0.0/8, 0.0.0.0, `::1`, `::`).
    Loopback = 3,
    /// Outbound: destination is one of the pod's own addresses.
    PodAddress = 4,
    /// Outbound: destination port in the outbound ignore set.
    IgnoredPort = 5,
    /// Outbound: destination in an outbound subnet to ignore.
    IgnoredSubnet = 6,
    /// Outbound: redirected, but the original destination could not be recorded, so the proxy's
    /// `SO_ORIGINAL_DST` will fail and the connection is refused by the proxy (fails closed).
    OrigDstNotRecorded = 7,
    /// `SO_ORIGINAL_DST` answered with a redirected connection's original destination (every
    /// call counts: a proxy may ask more than once).
    OrigDstServed = 8,
    /// Inbound connection delivered to the proxy's inbound listener.
    Steered = 9,
    /// Inbound: from inside the pod itself (loopback or one of its own addresses). Loopback is
    /// counted by the pod's own sk_lookup program, whatever the family.
    InboundFromPod = 10,
    /// Inbound: destination port in the inbound ignore set.
    InboundIgnoredPort = 11,
    /// Inbound: source in a subnet to ignore.
    InboundIgnoredSubnet = 12,
    /// Inbound: `--ports-to-redirect` is set and does not list the destination port.
    InboundPortNotRedirected = 13,
    /// Inbound: to the proxy's inbound port, which the kernel's own lookup gives to the proxy.
    InboundProxyPort = 14,
    /// Inbound: would be steered, but the proxy is not listening: dropped (fails closed).
    InboundNoListener = 15,
    /// Outbound: a native IPv6 connect in a pod meshed with `--ipv6=false`, left alone.
    Ipv6NotIntercepted = 16,
    /// Inbound: a native IPv6 connection to a pod meshed with `--ipv6=false`, left alone (over
    /// loopback it counts as [`Decision::InboundFromPod`]).
    InboundIpv6NotIntercepted = 17,
}

impl Decision {
    pub const ALL: [Decision; 18] = [
        Decision::Redirected,
        Decision::ProxyUid,
        Decision::ProxyGid,
        Decision::Loopback,
        Decision::PodAddress,
        Decision::IgnoredPort,
        Decision::IgnoredSubnet,
        Decision::OrigDstNotRecorded,
        Decision::OrigDstServed,
        Decision::Steered,
        Decision::InboundFromPod,
        Decision::InboundIgnoredPort,
        Decision::InboundIgnoredSubnet,
        Decision::InboundPortNotRedirected,
        Decision::InboundProxyPort,
        Decision::InboundNoListener,
        Decision::Ipv6NotIntercepted,
        Decision::InboundIpv6NotIntercepted,
    ];

    /// Stable name used by `interceptor status` (text and JSON).
    pub const fn name(self) -> &'static str {
        match self {
            Decision::Redirected => "outbound_redirected",
            Decision::ProxyUid => "outbound_exempt_proxy_uid",
            Decision::ProxyGid => "outbound_exempt_proxy_gid",
            Decision::Loopback => "outbound_exempt_loopback",
            Decision::PodAddress => "outbound_exempt_pod_address",
            Decision::IgnoredPort => "outbound_exempt_ignored_port",
            Decision::IgnoredSubnet => "outbound_exempt_ignored_subnet",
            Decision::OrigDstNotRecorded => "outbound_orig_dst_not_recorded",
            Decision::OrigDstServed => "orig_dst_served",
            Decision::Steered => "inbound_steered",
            Decision::InboundFromPod => "inbound_exempt_from_pod",
            Decision::InboundIgnoredPort => "inbound_exempt_ignored_port",
            Decision::InboundIgnoredSubnet => "inbound_exempt_ignored_subnet",
            Decision::InboundPortNotRedirected => "inbound_exempt_port_not_redirected",
            Decision::InboundProxyPort => "inbound_exempt_proxy_port",
            Decision::InboundNoListener => "inbound_dropped_no_listener",
            Decision::Ipv6NotIntercepted => "outbound_exempt_ipv6_disabled",
            Decision::InboundIpv6NotIntercepted => "inbound_exempt_ipv6_disabled",
        }
    }
}

/// Number of counters per pod.
pub const COUNTERS_PER_POD: usize = 18;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct PodCounters {
    pub values: [u64; COUNTERS_PER_POD],
}

impl PodCounters {
    pub const ZERO: Self = Self {
        values: [0; COUNTERS_PER_POD],
    };
}

const _: () = assert!(Decision::ALL.len() <= COUNTERS_PER_POD);
