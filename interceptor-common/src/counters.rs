//! Per-pod decision counters: one slot per pod in a per-CPU array, so counting costs one
//! increment in a CPU-local cache line on the connection path.

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
    /// Outbound: destination on loopback (127.0.0.0/8 or 0.0.0.0).
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
    /// The proxy read an original destination with `SO_ORIGINAL_DST`.
    OrigDstServed = 8,
}

impl Decision {
    pub const ALL: [Decision; 9] = [
        Decision::Redirected,
        Decision::ProxyUid,
        Decision::ProxyGid,
        Decision::Loopback,
        Decision::PodAddress,
        Decision::IgnoredPort,
        Decision::IgnoredSubnet,
        Decision::OrigDstNotRecorded,
        Decision::OrigDstServed,
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
        }
    }
}

/// Number of counters per pod; leaves room for the inbound decisions without changing the
/// value size of the counter map.
pub const COUNTERS_PER_POD: usize = 16;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PodCounters {
    pub values: [u64; COUNTERS_PER_POD],
}

impl PodCounters {
    pub const ZERO: Self = Self { values: [0; COUNTERS_PER_POD] };
}

const _: () = assert!(Decision::ALL.len() <= COUNTERS_PER_POD);
