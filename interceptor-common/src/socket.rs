//! Per-connection state that lets the proxy's `getsockopt(SO_ORIGINAL_DST)` answer.
//!
//! 1. connect4/connect6 record [`OrigDst`] under the app socket's cookie when they redirect it:
//!    in its [`ConnectSlot`] of `ICPT_CONN_SLOTS`, or in `ICPT_CONNECTING` (LRU) when that slot
//!    is taken by another connect in flight.
//! 2. sock_ops, when that socket is established (its source port is now known), moves it to
//!    `ICPT_PENDING` under the connection's 4-tuple as the proxy will see it ([`PendingKey`]),
//!    with the proxy side's initial sequence number.
//! 3. sock_ops, when the proxy side is established, recognises the connection and asks for that
//!    socket's state changes; when it closes, the entry is removed.
//! 4. getsockopt on the proxy's accepted socket finds the entry by (netns, peer address, peer
//!    port), checks it belongs to this very connection (initial sequence number), and answers,
//!    as often as it is asked.
//!
//! Entries whose proxy side never gets established are evicted least-recently-used.
use crate::Ip6Addr;
use bytemuck::{Pod, Zeroable};

/// An original destination, recorded at connect time. IPv4 destinations (from `AF_INET` sockets
/// and `::ffff:a.b.c.d` on `AF_INET6` ones) are in mapped form, see [`crate::addr`].
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct OrigDst {
    /// The pod the socket lives in (netns cookie), recorded by connect4/6 so sock_ops need not
    /// look it up again.
    pub netns_cookie: u64,
    pub addr: Ip6Addr,
    pub port_be: u16,
    pub _pad: u16,
    pub _pad2: u32,
}

/// A slot of `ICPT_CONN_SLOTS`, the array that hands a redirected connect's original
/// destination from connect4/6 to sock_ops when the socket is established, indexed by the app
/// socket's cookie modulo [`crate::CONNECT_SLOTS`]. Free when `socket_cookie` is 0. A slot
/// that is taken (another connect in flight with the same index) sends the connect to the
/// `ICPT_CONNECTING` LRU map instead; a slot left taken by a connect that never completed is
/// taken over once [`crate::CONNECT_SLOT_STALE_NS`] old.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct ConnectSlot {
    pub socket_cookie: u64,
    /// When it was taken (`bpf_ktime_get_coarse_ns`).
    pub taken_ns: u64,
    pub orig: OrigDst,
}

/// The redirected connection as the proxy's accepted socket sees its peer. The client address
/// is in mapped form for IPv4, so an `AF_INET6` proxy socket (`[::]` listener) accepting an IPv4
/// connection finds the same key as an `AF_INET` one.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct PendingKey {
    pub netns_cookie: u64,
    /// The app socket's local address, i.e. the proxy socket's peer address.
    pub client: Ip6Addr,
    /// The app socket's local port (host order).
    pub client_port: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct PendingOrigDst {
    /// IPv4 (mapped form) exactly when the connection is IPv4: `SO_ORIGINAL_DST` answers it,
    /// `IP6T_SO_ORIGINAL_DST` answers the others.
    pub addr: Ip6Addr,
    pub port_be: u16,
    pub _pad: u16,
    /// The proxy side's initial sequence number + 1, as the app socket saw it in the SYN-ACK
    /// (`rcv_nxt` when established). The proxy's socket derives the same number from
    /// `snd_una - bytes_acked`; a mismatch means the entry is from an earlier connection that
    /// reused this 4-tuple and was never read, and it must not answer for this one.
    pub server_isn_next: u32,
}

/// Key of the listener sock hash: a pod and the family of its proxy's inbound listening socket.
/// A proxy may listen with one socket per family (`0.0.0.0:4143` and `[::]:4143` with
/// `IPV6_V6ONLY`) or one dual-stack socket (`[::]:4143`); IPv4 connections use the IPv4 socket
/// when there is one, else the IPv6 one.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct ListenerKey {
    pub netns_cookie: u64,
    /// `crate::addr::family::*` of the listening socket.
    pub family: u32,
    pub _pad: u32,
}

const _: () = assert!(core::mem::size_of::<OrigDst>() == 32);
const _: () = assert!(core::mem::size_of::<ConnectSlot>() == 48);
const _: () = assert!(core::mem::size_of::<PendingKey>() == 32);
const _: () = assert!(core::mem::size_of::<PendingOrigDst>() == 24);
const _: () = assert!(core::mem::size_of::<ListenerKey>() == 16);
