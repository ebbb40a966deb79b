//! Per-connection state that lets the proxy's `getsockopt(SO_ORIGINAL_DST)` answer.
//!
//! 1. connect4/connect6 record [`OrigDst`] under the app socket's cookie when they redirect it:
//!    in its [`ConnectSlot`] of `ICPT_CONN_SLOTS`, or in `ICPT_CONNECTING` (LRU) when that slot
//!    is taken by another connect in flight.
//! 2. sock_ops, when that socket is established (its source port is now known), records it
//!    under the connection's 4-tuple as the proxy will see it ([`PendingKey`]), with the proxy
//!    side's initial sequence number and the app socket's tag: in its [`PendingSlot`] of
//!    `ICPT_PEND_SLOTS`, or in `ICPT_PENDING` (LRU, the same value) when that slot holds
//!    another live connection.
//! 3. sock_ops, when the proxy side is established, recognises the connection, asks for that
//!    socket's state changes (as it asked for the app socket's when it recorded it) and marks
//!    its entry watched; the entry, slot or LRU, is freed when the second of the two sockets
//!    closes (the app's `getpeername()` is answered from it until its own socket closes).
//! 4. getsockopt on the proxy's accepted socket finds the entry by (netns, peer address, peer
//!    port), checks it belongs to this very connection (initial sequence number), and answers,
//!    as often as it is asked; getpeername on the app's socket checks the socket's tag.
//!
//! Entries whose proxy side never gets established, or whose other side never reports its close
//! (a half-closed phase), are evicted least-recently-used, or their slot taken over after
//! [`crate::PENDING_SLOT_STALE_SECS`].
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
/// to the `ICPT_PENDING` LRU map instead, as the same value. One cache line.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct PendingSlot {
    /// [`pending_phase::state`]: the phase; the coarse second (`bpf_ktime_get_coarse_ns() >>
    /// 30`) the connection was recorded in, or for a half-closed one closed in; the app
    /// socket's tag. Changed only by compare-and-exchange or exchange.
    pub state: u64,
    pub key: PendingKey,
    pub orig: PendingOrigDst,
}

/// The phases of a [`PendingSlot`] (and of an entry of `ICPT_PENDING`, which is one too). A
/// redirected connection has two sockets: the app's (which `getpeername()` asks about while it
/// is open) and the proxy's (which `SO_ORIGINAL_DST` asks about). Its entry is freed when the
/// second of them closes, as conntrack keeps a connection's NAT until both ends are done with it.
///
/// A state is three fields in one word, changed only as a whole: the phase (low byte), a coarse
/// second (24 bits, wrapping: see [`age`]) and the app socket's tag (the high 32 bits, see
/// [`app_tag`]).
pub mod pending_phase {
    /// Nobody's: the next connection that folds to it takes it.
    pub const FREE: u64 = 0;
    /// Being written by the app side's sock_ops: readers skip it.
    pub const BUSY: u64 = 1;
    /// Written by the app side; the proxy side is not established yet. Taken over once
    /// [`crate::PENDING_SLOT_STALE_SECS`] old.
    pub const RECORDED: u64 = 2;
    /// Both sides are established and open: never taken over, however old.
    pub const WATCHED: u64 = 3;
    /// The proxy side closed; the app's socket is open and may still ask for its peer. Taken
    /// over once closed for [`crate::PENDING_SLOT_STALE_SECS`], as conntrack forgets a
    /// half-closed connection.
    pub const PROXY_CLOSED: u64 = 4;
    /// The app's socket closed; the proxy side is established and open (the proxy may not have
    /// accepted it yet). Taken over like [`PROXY_CLOSED`].
    pub const APP_CLOSED: u64 = 5;
    /// The app's socket closed before the proxy side was established (a client that writes and
    /// closes at once): still read by the proxy's accept, taken over like [`RECORDED`].
    pub const APP_CLOSED_EARLY: u64 = 6;
    /// The bits of a state that hold the phase.
    pub const MASK: u64 = 0xff;
    /// The coarse seconds of a state, once shifted down by 8: enough for ages of minutes
    /// compared with wrapping arithmetic (they wrap every 194 days).
    pub const SECS_MASK: u64 = 0xff_ffff;

    /// The state of `phase`, dated `secs` (coarse seconds, see [`crate::PendingSlot::state`]),
    /// of the app socket tagged `tag`.
    #[inline(always)]
    pub const fn state(phase: u64, secs: u64, tag: u32) -> u64 {
        ((tag as u64) << 32) | ((secs & SECS_MASK) << 8) | (phase & MASK)
    }

    /// The tag of an app socket: the low half of its cookie, never [`UNTAGGED`]. `getpeername()`
    /// answers only the socket whose tag its connection's entry holds, so an entry left behind
    /// (its sockets' closes never reported) does not answer for another socket of the same
    /// 4-tuple: two sockets of one pod and 4-tuple whose cookies share their low 32 bits are 4
    /// billion sockets apart.
    #[inline(always)]
    pub const fn app_tag(socket_cookie: u64) -> u32 {
        match socket_cookie as u32 {
            UNTAGGED => 1,
            tag => tag,
        }
    }

    /// The tag of an entry copied from a map layout before 8, which kept none: it answers the
    /// app socket of its 4-tuple whatever its cookie, as layouts before 8 did, so that
    /// `getpeername()` stays right across the upgrade for a connection made before it. A
    /// connection of the same 4-tuple made after takes the entry over when it records its own.
    pub const UNTAGGED: u32 = 0;

    /// Whether an entry whose state is `state` answers the app socket tagged `tag`.
    #[inline(always)]
    pub const fn answers_app(state: u64, tag: u32) -> bool {
        let held = self::tag(state);
        held == tag || held == UNTAGGED
    }

    /// The app socket's tag a state holds.
    #[inline(always)]
    pub const fn tag(state: u64) -> u32 {
        (state >> 32) as u32
    }

    /// How many coarse seconds `state` is old at `now_secs`.
    #[inline(always)]
    pub const fn age(state: u64, now_secs: u64) -> u64 {
        now_secs.wrapping_sub(state >> 8) & SECS_MASK
    }

    /// Whether a slot in `state` holds a connection (any phase from recorded to half closed).
    #[inline(always)]
    pub fn holds_a_connection(state: u64) -> bool {
        let phase = state & MASK;
        (RECORDED..=APP_CLOSED_EARLY).contains(&phase)
    }

    /// Whether a slot in `state` may be taken over once old: every phase that holds a
    /// connection but [`WATCHED`], whose two sockets are open and will report their closes.
    #[inline(always)]
    pub fn ages(state: u64) -> bool {
        holds_a_connection(state) && state & MASK != WATCHED
    }

    /// The state after the proxy side of the connection in `state` closed, at `now_secs()`
    /// (asked only when the connection stays half closed).
    #[inline(always)]
    pub fn after_proxy_close(held: u64, now_secs: impl FnOnce() -> u64) -> u64 {
        match held & MASK {
            WATCHED => state(PROXY_CLOSED, now_secs(), tag(held)),
            _ => FREE,
        }
    }

    /// The state after the app side of the connection in `held` closed, at `now_secs()` (asked
    /// only when the proxy side stays open); the age of a connection whose proxy side is not
    /// established yet is kept.
    #[inline(always)]
    pub fn after_app_close(held: u64, now_secs: impl FnOnce() -> u64) -> u64 {
        match held & MASK {
            RECORDED => (held & !MASK) | APP_CLOSED_EARLY,
            WATCHED => state(APP_CLOSED, now_secs(), tag(held)),
            _ => FREE,
        }
    }

    /// The state after the proxy side of the connection in `held` was established. An early
    /// app close keeps its date: the app closed no later than that.
    #[inline(always)]
    pub fn after_proxy_established(held: u64) -> u64 {
        match held & MASK {
            APP_CLOSED_EARLY => (held & !MASK) | APP_CLOSED,
            RECORDED => (held & !MASK) | WATCHED,
            _ => held,
        }
    }

    /// The state after the proxy side was established (`held`) but its closes cannot be reported
    /// (setting its callback flags failed): back to the phase of a proxy side never
    /// established, which ages, instead of one held until a close that never comes.
    #[inline(always)]
    pub fn after_proxy_unwatched(held: u64) -> u64 {
        match held & MASK {
            WATCHED => (held & !MASK) | RECORDED,
            APP_CLOSED => (held & !MASK) | APP_CLOSED_EARLY,
            _ => held,
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
    fn a_state_keeps_its_phase_date_and_tag() {
        use pending_phase::*;
        let state = state(PROXY_CLOSED, 0x1234_5678_9abc, 0xdead_beef);
        assert_eq!(state & MASK, PROXY_CLOSED);
        assert_eq!(tag(state), 0xdead_beef);
        // Dates wrap at 24 bits, and ages with them.
        assert_eq!(age(state, 0x1234_5678_9abc + 3), 3);
        assert_eq!(age(state, 0x1234_5679_0000 + 3), 0x1_0000 - 0x9abc + 3);
        assert_eq!(age(pending_phase::state(RECORDED, SECS_MASK, 0), 2), 3);
    }

    #[test]
    fn an_app_socket_is_never_untagged_and_an_untagged_entry_answers_any() {
        use pending_phase::*;
        assert_eq!(app_tag(1 << 32), 1, "a cookie whose low half is 0");
        assert_eq!(app_tag(0xdead_beef), 0xdead_beef);
        let tagged = state(WATCHED, 5, app_tag(7));
        assert!(answers_app(tagged, app_tag(7)));
        assert!(!answers_app(tagged, app_tag(8)));
        let migrated = state(WATCHED, 0, UNTAGGED);
        assert!(answers_app(migrated, app_tag(7)) && answers_app(migrated, app_tag(1 << 32)));
    }

    #[test]
    fn every_phase_but_watched_ages() {
        use pending_phase::*;
        let aging: [u64; 7] = [
            FREE,
            BUSY,
            RECORDED,
            WATCHED,
            PROXY_CLOSED,
            APP_CLOSED,
            APP_CLOSED_EARLY,
        ]
        .map(|phase| u64::from(ages(state(phase, 0, 0))));
        assert_eq!(aging, [0, 0, 1, 0, 1, 1, 1]);
    }

    /// The moves of one connection's entry in every order the kernel can report them (the
    /// proxy side's close only after its establishment): the entry is freed at the second
    /// close, keeps its tag, and is dated when it becomes half closed.
    #[test]
    fn an_entry_is_freed_at_the_second_close_in_every_order() {
        use pending_phase::*;
        #[derive(Clone, Copy, Debug)]
        enum Move {
            Watch,
            AppClose,
            ProxyClose,
        }
        let orders = [
            [Move::Watch, Move::AppClose, Move::ProxyClose],
            [Move::Watch, Move::ProxyClose, Move::AppClose],
            [Move::AppClose, Move::Watch, Move::ProxyClose],
        ];
        for order in orders {
            let mut held = state(RECORDED, 10, 77);
            for (i, step) in order.into_iter().enumerate() {
                held = match step {
                    Move::Watch => after_proxy_established(held),
                    Move::AppClose => after_app_close(held, || 20),
                    Move::ProxyClose => after_proxy_close(held, || 20),
                };
                if i < 2 {
                    assert!(holds_a_connection(held), "{order:?}: {step:?} freed it");
                    assert_eq!(tag(held), 77, "{order:?}: {step:?}");
                }
                if matches!(held & MASK, PROXY_CLOSED) {
                    assert_eq!(age(held, 20), 0, "{order:?}: dated at its close");
                }
            }
            assert_eq!(held, FREE, "{order:?}");
        }
        // A proxy side whose closes cannot be reported goes back to a phase that ages.
        for phase in [WATCHED, APP_CLOSED] {
            let unwatched = after_proxy_unwatched(state(phase, 10, 77));
            assert!(ages(unwatched) && holds_a_connection(unwatched), "{phase}");
        }
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
