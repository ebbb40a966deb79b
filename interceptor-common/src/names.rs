//! Program and map names, shared so the loader and the object cannot drift apart. Each fits the
//! kernel's 15-character object name limit.

pub const PROG_CONNECT4: &str = "icpt_connect4";
pub const PROG_CONNECT6: &str = "icpt_connect6";
pub const PROG_SOCKOPS: &str = "icpt_sockops";
pub const PROG_GETSOCKOPT: &str = "icpt_getsockopt";
/// Loaded once per pod (sk_lookup attaches to a network namespace, and cannot ask which one it
/// runs in), with [`GLOBAL_POD_NETNS_COOKIE`] set to that pod's cookie.
pub const PROG_SK_LOOKUP: &str = "icpt_sk_lookup";
pub const GLOBAL_POD_NETNS_COOKIE: &str = "POD_NETNS_COOKIE";

/// netns cookie -> [`crate::PodConfig`]: which pods are meshed, and how.
pub const MAP_PODS: &str = "ICPT_PODS";
/// [`crate::LocalAddrKey`] -> 1: the addresses of each pod's own interfaces.
pub const MAP_LOCAL_ADDRS: &str = "ICPT_LOCAL_ADDRS";
/// LPM trie of [`crate::SubnetKey`] -> 1: subnets exempted per pod and direction.
pub const MAP_SUBNETS: &str = "ICPT_SUBNETS";
/// Per-CPU array indexed by pod slot -> [`crate::PodCounters`].
pub const MAP_COUNTERS: &str = "ICPT_COUNTERS";
/// LRU socket cookie -> [`crate::OrigDst`]: redirected app sockets still connecting.
pub const MAP_CONNECTING: &str = "ICPT_CONNECTING";
/// LRU [`crate::PendingKey`] -> [`crate::PendingOrigDst`]: connections waiting for the proxy.
pub const MAP_PENDING: &str = "ICPT_PENDING";
/// Sock hash [`crate::ListenerKey`] -> the proxy's inbound listening socket(s), per family.
pub const MAP_LISTENERS: &str = "ICPT_LISTENERS";

/// Maps shared by the node's programs and every pod's sk_lookup instance (through pins), and
/// read by `interceptor status` from another process.
pub const SHARED_MAPS: [&str; 7] = [
    MAP_PODS,
    MAP_LOCAL_ADDRS,
    MAP_SUBNETS,
    MAP_COUNTERS,
    MAP_CONNECTING,
    MAP_PENDING,
    MAP_LISTENERS,
];
