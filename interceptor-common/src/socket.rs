//! Per-connection state that lets the proxy's `getsockopt(SO_ORIGINAL_DST)` answer.
//!
//! 1. connect4/connect6 record [`OrigDst`] under the app socket's cookie when they redirect it:
//!    in its [`ConnectSlot`] of `ICPT_CONN_SLOTS`, or in `ICPT_CONNECTING` (LRU) when that slot
//!    is taken by another connect in flight.
//! 2. sock_ops, when that socket is established (its source port is now known), records it
//!    under the connection's 4-tuple as the proxy will see it ([`PendingKey`]), with the proxy
//!    side's initial sequence number: in its [`PendingSlot`] of `ICPT_PEND_SLOTS`, or in
//!    `ICPT_PENDING` (LRU) when that slot holds another live connection.
//! 3. sock_ops, when the proxy side is established, recognises the connection, marks its slot
//!    watched and asks for that socket's state changes, as it asked for the app socket's when
//!    it recorded it; the slot is freed when the second of the two sockets closes (the app's
//!    `getpeername()` is answered from it until its own socket closes). An entry in
//!    `ICPT_PENDING` is removed when the proxy's socket closes.
//! 4. getsockopt on the proxy's accepted socket finds the entry by (netns, peer address, peer
//!    port), checks it belongs to this very connection (initial sequence number), and answers,
//!    as often as it is asked.
//!
//! Entries whose proxy side never gets established are evicted least-recently-used, or their
//! slot taken over after [`crate::PENDING_SLOT_STALE_SECS`].
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
    /// See [`CounterSlotTag`]: sock_ops copies it into the connection's [`PendingOrigDst`].
    pub counter_slot: CounterSlotTag,
    pub _pad2: u32,
}

/// The pod's counter slot + 1 (`PodConfig::slot`), carried with a redirected connection so that
/// the proxy's `SO_ORIGINAL_DST` is counted without looking the pod up again; 0 when not known.
/// Layout 5's field was padding, written 0 by the programs of agents before it carried the slot:
/// an entry of theirs met during an upgrade is counted after looking the pod up, as before.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct CounterSlotTag(pub u16);

impl CounterSlotTag {
    pub const UNKNOWN: Self = Self(0);

    /// The tag of counter slot `slot` (below `MAX_PODS`, so `slot + 1` fits).
    pub const fn of(slot: u32) -> Self {
        Self((slot as u16).wrapping_add(1))
    }

    /// The counter slot, if known.
    pub const fn slot(self) -> Option<u32> {
        match self.0 {
            0 => None,
            tag => Some(tag as u32 - 1),
        }
    }
}

const _: () = assert!(crate::MAX_PODS < u16::MAX as u32);

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
    /// The pod's counter slot, from the connect's [`OrigDst`].
    pub counter_slot: CounterSlotTag,
    /// The proxy side's initial sequence number + 1, as the app socket saw it in the SYN-ACK
    /// (`rcv_nxt` when established). The proxy's socket derives the same number from
    /// `snd_una - bytes_acked`; a mismatch means the entry is from an earlier connection that
    /// reused this 4-tuple and was never read, and it must not answer for this one.
    pub server_isn_next: u32,
}

/// A connection waiting for (or read by) the proxy, in the slot of `ICPT_PEND_SLOTS` its key
/// folds to ([`PendingKey::slot_index`]); when that slot is held by another connection it goes
/// to the `ICPT_PENDING` LRU map instead. One cache line.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct PendingSlot {
    /// `pending_phase::*` in the low byte; above it, for [`pending_phase::RECORDED`], the coarse
    /// second it was recorded in (`bpf_ktime_get_coarse_ns() >> 30`). Changed only by
    /// compare-and-exchange or exchange.
    pub state: u64,
    pub key: PendingKey,
    pub orig: PendingOrigDst,
}

/// The phases of a [`PendingSlot`]. A redirected connection has two sockets: the app's (which
/// `getpeername()` asks about while it is open) and the proxy's (which `SO_ORIGINAL_DST` asks
/// about). Its slot is freed when the second of them closes, as conntrack keeps a connection's
/// NAT until both ends are done with it.
pub mod pending_phase {
    /// Nobody's: the next connection that folds to it takes it.
    pub const FREE: u64 = 0;
    /// Being written by the app side's sock_ops: readers skip it.
    pub const BUSY: u64 = 1;
    /// Written by the app side; the proxy side is not established yet. Taken over once
    /// [`crate::PENDING_SLOT_STALE_SECS`] old.
    pub const RECORDED: u64 = 2;
    /// Both sides are established and open.
    pub const WATCHED: u64 = 3;
    /// The proxy side closed; the app's socket is open and may still ask for its peer.
    pub const PROXY_CLOSED: u64 = 4;
    /// The app's socket closed; the proxy side is established and open.
    pub const APP_CLOSED: u64 = 5;
    /// The app's socket closed before the proxy side was established (a client that writes and
    /// closes at once): still read by the proxy's accept, taken over like [`RECORDED`].
    pub const APP_CLOSED_EARLY: u64 = 6;
    /// The bits of `state` that hold the phase.
    pub const MASK: u64 = 0xff;

    /// Whether a slot in `state` holds a connection (any phase from recorded to half closed).
    #[inline(always)]
    pub fn holds_a_connection(state: u64) -> bool {
        let phase = state & MASK;
        (RECORDED..=APP_CLOSED_EARLY).contains(&phase)
    }

    /// Whether a slot in `state` may be taken over once old: its proxy side was never
    /// established.
    #[inline(always)]
    pub fn unwatched(state: u64) -> bool {
        let phase = state & MASK;
        phase == RECORDED || phase == APP_CLOSED_EARLY
    }

    /// The state after the proxy side of the connection in `state` closed.
    #[inline(always)]
    pub fn after_proxy_close(state: u64) -> u64 {
        match state & MASK {
            WATCHED => PROXY_CLOSED,
            _ => FREE,
        }
    }

    /// The state after the app side of the connection in `state` closed (its age kept while
    /// the proxy side is not established).
    #[inline(always)]
    pub fn after_app_close(state: u64) -> u64 {
        match state & MASK {
            RECORDED => (state & !MASK) | APP_CLOSED_EARLY,
            WATCHED => APP_CLOSED,
            _ => FREE,
        }
    }

    /// The state after the proxy side of the connection in `state` was established.
    #[inline(always)]
    pub fn after_proxy_established(state: u64) -> u64 {
        match state & MASK {
            APP_CLOSED_EARLY => APP_CLOSED,
            RECORDED => WATCHED,
            _ => state,
        }
    }
}

impl PendingKey {
    /// Which slot of `ICPT_PEND_SLOTS` the connection uses: its port (ephemeral ports of live
    /// connections differ), folded with its pod and address so pods and addresses spread.
    #[inline(always)]
    pub fn slot_index(&self) -> u32 {
        let cookie = self.netns_cookie as u32 ^ (self.netns_cookie >> 32) as u32;
        let fold =
            cookie.wrapping_mul(0x9e37_79b1) ^ self.client.words_be[3].wrapping_mul(0x85eb_ca6b);
        (self.client_port ^ (fold >> 16)) & (crate::PENDING_SLOTS - 1)
    }
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
const _: () = assert!(core::mem::size_of::<PendingSlot>() == 64);
const _: () = assert!(crate::PENDING_SLOTS.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;

    fn key(netns_cookie: u64, client_port: u32) -> PendingKey {
        PendingKey {
            netns_cookie,
            client: Ip6Addr::from_ip4_be(u32::from_be_bytes([127, 0, 0, 1]).to_be()),
            client_port,
            _pad: 0,
        }
    }

    #[test]
    fn a_counter_slot_tag_gives_back_its_slot_and_zero_is_unknown() {
        for slot in [0, 1, crate::MAX_PODS - 1] {
            assert_eq!(CounterSlotTag::of(slot).slot(), Some(slot));
        }
        assert_eq!(CounterSlotTag::UNKNOWN.slot(), None);
        assert_eq!(CounterSlotTag::zeroed(), CounterSlotTag::UNKNOWN);
    }

    #[test]
    fn live_connections_of_one_pod_take_distinct_pending_slots() {
        // The ports of live connections from one address differ, and so do their slots.
        let mut seen = [false; crate::PENDING_SLOTS as usize];
        for port in 0..=u16::MAX {
            let index = key(7, u32::from(port)).slot_index() as usize;
            assert!(!seen[index], "port {port} shares slot {index}");
            seen[index] = true;
        }
    }

    #[test]
    fn pods_spread_over_the_pending_slots() {
        // The same port in different pods lands in different slots.
        let mut seen = [false; crate::PENDING_SLOTS as usize];
        let mut distinct = 0;
        for cookie in 1..=64 {
            let index = key(cookie, 40000).slot_index() as usize;
            distinct += usize::from(!seen[index]);
            seen[index] = true;
        }
        assert!(distinct > 60, "{distinct} distinct slots");
    }
}
