//! Program and map names, shared so the loader and the object cannot drift apart. Each fits the
//! kernel's 15-character object name limit.

pub const PROG_CONNECT4: &str = "icpt_connect4";
pub const PROG_SOCKOPS: &str = "icpt_sockops";
pub const PROG_GETSOCKOPT: &str = "icpt_getsockopt";

/// netns cookie -> [`crate::PodConfig`]: which pods are meshed, and how.
pub const MAP_PODS: &str = "ICPT_PODS";
/// [`crate::LocalAddrKey`] -> 1: the addresses of each pod's own interfaces.
pub const MAP_LOCAL_ADDRS: &str = "ICPT_LOCAL_ADDRS";
/// LPM trie of [`crate::SubnetKey`] -> 1: subnets exempted per pod and direction.
pub const MAP_SUBNETS: &str = "ICPT_SUBNETS";
/// Per-CPU array indexed by pod slot -> [`crate::PodCounters`].
pub const MAP_COUNTERS: &str = "ICPT_COUNTERS";
/// Socket storage -> [`crate::OrigDst`], on redirected app sockets and on proxy sockets.
pub const MAP_SOCK_ORIG_DST: &str = "ICPT_SK_ORIG";
/// LRU [`crate::PendingKey`] -> [`crate::PendingOrigDst`]: connections waiting for the proxy.
pub const MAP_PENDING: &str = "ICPT_PENDING";

/// Every map the userspace side pins so `interceptor status` can read them from another process.
pub const PINNED_MAPS: [&str; 4] = [MAP_PODS, MAP_LOCAL_ADDRS, MAP_COUNTERS, MAP_PENDING];
