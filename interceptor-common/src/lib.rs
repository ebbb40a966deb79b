//! The contract between the eBPF programs and the userspace loader: map and program names, and
//! the `#[repr(C)]` types stored in the maps. `no_std` so both sides compile the same bytes.
//!
//! Layout rules: every type is `Copy`, has no implicit padding (explicit `_pad` fields; deriving
//! `bytemuck::Pod` refuses a type with padding) and uses `u32` flags rather than `bool`. Fields
//! in network byte order end in `_be`.
#![no_std]
// The one unsafe item is `aya_pod!`'s `aya::Pod` impl, justified there.
#![deny(unsafe_code)]

pub mod addr;
pub mod counters;
pub mod creds;
pub mod ids;
pub mod names;
pub mod outbound_ports;
pub mod pod;
pub mod sk_lookup_ctx;
pub mod socket;

pub use addr::Ip6Addr;
pub use counters::{Decision, PodCounters};
pub use creds::CredOffsets;
pub use ids::{NetnsCookie, PodSlot, SocketCookie};
pub use pod::{IP4_MAPPED_PREFIX_BITS, PodConfig, PortBitmap, SUBNET_KEY_FIXED_BITS, SubnetKey};
pub use socket::{
    ConnectSlot, CounterSlotTag, ListenerKey, OrigDst, PendingKey, PendingOrigDst, PendingSlot,
    pending_phase,
};

/// The version of the maps' layout (their names, key and value types). Bump it with any map added,
/// any change to a map's name (list the old name in `names::RETIRED_MAPS`) or to a type stored
/// in a map (6: `ICPT_OUT_PORTS` added, which an agent of layout 5 would not fill; 7: pending
/// slots freed at the second close of a connection's two sockets, with half-closed phases an
/// agent of layout 6 would never free; 8: `ICPT_PENDING` holds `PendingSlot`s, freed like the
/// slots, and a state carries the app socket's tag, which programs of layout 7 would take for
/// part of its date): the
/// node agent keeps its maps in a directory per layout, and an agent that finds only an older one
/// builds new maps from its pod records and switches over.
pub const MAP_LAYOUT_VERSION: u32 = 8;

/// The most pods one node attachment serves. Bounds the per-CPU counter array (one slot per pod)
/// and the pod configuration map.
pub const MAX_PODS: u32 = 1024;

/// Addresses per pod remembered as "the pod's own" (outbound rule 3), both families (a
/// dual-stack pod has at least five: two loopback, one of each family and a link-local one),
/// kept in its `PodConfig`.
pub const MAX_LOCAL_ADDRS_PER_POD: u32 = 32;

/// Subnet rules (CIDRs) per node, across pods and directions.
pub const MAX_SUBNET_RULES: u32 = 16 * 1024;

/// Default capacity of the maps of original destinations (connecting, and waiting for the
/// proxy). Entries are removed when the connection is over (its connect established; its
/// app's and proxy's sockets both closed); entries nobody removes are evicted
/// least-recently-used once a map is full.
pub const DEFAULT_PENDING_ORIG_DST_CAPACITY: u32 = 64 * 1024;

/// Slots of `ICPT_CONN_SLOTS` (a power of two: the index is the socket cookie's low bits).
/// Socket cookies are handed out in increasing order, so the connects in flight at one time
/// take distinct slots; 3 MiB.
pub const CONNECT_SLOTS: u32 = 64 * 1024;

/// A slot taken longer ago than this is taken over: its connect never completed. Longer than
/// TCP's connect attempts last with the default `tcp_syn_retries` (6: 127 s).
pub const CONNECT_SLOT_STALE_NS: u64 = 150 * 1_000_000_000;

/// Slots of `ICPT_PEND_SLOTS` (a power of two: the index is a fold of the connection's key,
/// mostly the app socket's ephemeral port); 4 MiB.
pub const PENDING_SLOTS: u32 = 64 * 1024;

/// A slot recorded by the app side whose proxy side never got established (the handshake's last
/// ACK lost with the proxy's accept queue full, say), or half closed this long ago (the other
/// side's close never reported, or an app holding a socket its proxy closed), is taken over
/// after this long, in the coarse seconds of [`PendingSlot::state`].
pub const PENDING_SLOT_STALE_SECS: u64 = 150;

/// `getsockopt(SOL_IP, SO_ORIGINAL_DST)` from `<linux/netfilter_ipv4.h>`.
pub const SO_ORIGINAL_DST: i32 = 80;
pub const SOL_IP: i32 = 0;
/// `getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST)` from `<linux/netfilter_ipv6/ip6_tables.h>`.
pub const IP6T_SO_ORIGINAL_DST: i32 = 80;
pub const SOL_IPV6: i32 = 41;

/// Implements `aya::Pod` (what aya's userspace maps ask of their keys and values) for types
/// that are `bytemuck::Pod`, which the compiler checks for each of them first.
#[cfg(feature = "user")]
macro_rules! aya_pod {
    ($($ty:ty),+ $(,)?) => {$(
        const _: fn() = || {
            fn is_pod<T: bytemuck::Pod>() {}
            is_pod::<$ty>();
        };
        // SAFETY: the type is `bytemuck::Pod` (checked just above): `Copy`, `#[repr(C)]` or
        // `#[repr(transparent)]`, without padding, and valid for every bit pattern, which is
        // all `aya::Pod` requires.
        #[allow(unsafe_code, reason = "the crate's one unsafe impl: aya's marker trait")]
        unsafe impl aya::Pod for $ty {}
    )+};
}

#[cfg(feature = "user")]
aya_pod!(
    CredOffsets,
    PodConfig,
    SubnetKey,
    PodCounters,
    PendingKey,
    PendingOrigDst,
    ListenerKey,
    OrigDst,
    ConnectSlot,
    PendingSlot,
    NetnsCookie,
    SocketCookie,
);
