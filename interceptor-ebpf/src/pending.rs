//! The index of redirected connections the proxy's side looks up (by the 4-tuple it sees,
//! [`PendingKey`]): a slot of `ICPT_PEND_SLOTS` picked by the key's fold, falling back to the
//! `ICPT_PENDING` LRU map when that slot is held by another connection. An LRU insert and delete
//! cost a hash, a bucket lock with interrupts off and LRU list work each, most of what was left
//! of sock_ops' cost; a slot costs an inlined array lookup and a compare-and-exchange.
//!
//! A slot's life (`pending_phase`): the app side's sock_ops takes a free slot (FREE -> BUSY),
//! writes the key and the original destination and publishes them (-> RECORDED); the proxy
//! side's sock_ops, once established, marks it WATCHED. Each side's close is reported (both
//! sockets ask for their state changes): the first moves the slot to a half-closed phase, the
//! second frees it (-> FREE), so the app's `getpeername()` is answered for as long as its socket
//! lives, as NAT keeps it, and the proxy's `SO_ORIGINAL_DST` for as long as its own. A slot
//! whose proxy side never got established is taken over after `PENDING_SLOT_STALE_SECS`, and a
//! slot holding the same key (the 4-tuple reused: the old connection is over) is taken at once.
//! An entry in the LRU map is removed when the proxy's socket closes.
//!
//! A reader checks the phase, copies the key and the value, and keeps them only if the key is
//! its own (and, where it knows it, the proxy side's initial sequence number matches). A slot
//! rewritten during the copy by another connection cannot hold the reader's key: a connection's
//! own slot changes only through its own sock_ops runs, which the socket's lock orders with its
//! getsockopt.
//!
//! Readers (`find`) look in both, so programs of an older agent that kept every connection in
//! the LRU map (its variant for kernels without BPF atomics) can run beside these during an
//! upgrade.
use interceptor_common::{
    PENDING_SLOT_STALE_SECS, PendingKey, PendingOrigDst, PendingSlot, pending_phase as phase,
};

use crate::{
    atomic::{compare_exchange as exchange, publish},
    maps::{PENDING, PENDING_SLOT_ARRAY},
};

/// Records the connection with `key`, whose connect was recorded at `connected_ns` (coarse
/// ns): in its slot if it can take it, else in `ICPT_PENDING`. `Err(errno)` when neither took
/// it.
#[inline(always)]
pub fn record(key: &PendingKey, orig: &PendingOrigDst, connected_ns: u64) -> Result<(), i32> {
    if let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) {
        let now = coarse_secs(connected_ns);
        // SAFETY: `slot` points at a slot of a preallocated array, memory of the map for its
        // whole life; its state is only changed atomically, and its other fields only by the
        // program that set it BUSY.
        unsafe {
            let state = &raw mut (*slot).state;
            let held = core::ptr::read_volatile(state);
            if can_take(slot, held, key, now) && exchange(state, held, phase::BUSY) {
                (*slot).key = *key;
                (*slot).orig = *orig;
                // Whoever sees RECORDED sees what was written.
                publish(state, (now << 8) | phase::RECORDED);
                return Ok(());
            }
        }
    }
    PENDING.insert(key, orig, 0)
}

/// Whether the app side of a new connection with `key` may take `slot`, whose state is `held`.
///
/// # Safety
///
/// `slot` points at a slot of `ICPT_PEND_SLOTS`.
#[inline(always)]
unsafe fn can_take(slot: *const PendingSlot, held: u64, key: &PendingKey, now: u64) -> bool {
    if held & phase::MASK == phase::FREE {
        return true;
    }
    if !phase::holds_a_connection(held) {
        return false;
    }
    // SAFETY: the caller's promise; the key is copied, and a torn copy only fails to match.
    let same_key = unsafe { core::ptr::read_volatile(&raw const (*slot).key) } == *key;
    same_key || (phase::unwatched(held) && now.wrapping_sub(held >> 8) > PENDING_SLOT_STALE_SECS)
}

/// The original destination of the connection with `key`, whose proxy side's initial sequence
/// number + 1 is `isn_next` (`None`: any, for the app side, which cannot read it).
#[inline(always)]
pub fn find(key: &PendingKey, isn_next: Option<u32>) -> Option<PendingOrigDst> {
    if let Some(orig) = find_in_slot(key, isn_next) {
        return Some(orig);
    }
    // SAFETY: `PENDING` is preallocated: the element stays memory of the map, and the value is
    // copied at once. An element evicted and reused by another CPU during the copy holds another
    // connection's `server_isn_next`, which `matches` refuses where the caller knows its own.
    let orig = (unsafe { PENDING.get(key) }).copied()?;
    matches(&orig, isn_next).then_some(orig)
}

/// As [`find`], in the key's slot only: an inlined array lookup, where `ICPT_PENDING` costs a
/// hash. `None` for a connection that is not recorded there, recorded or not in `ICPT_PENDING`.
#[inline(always)]
pub fn find_in_slot(key: &PendingKey, isn_next: Option<u32>) -> Option<PendingOrigDst> {
    let slot = PENDING_SLOT_ARRAY.get_ptr(key.slot_index())?;
    // SAFETY: as in `record`; key and value are copied, and kept only if the key is ours.
    unsafe {
        if !phase::holds_a_connection(core::ptr::read_volatile(&raw const (*slot).state)) {
            return None;
        }
        let found = core::ptr::read_volatile(&raw const (*slot).key);
        let orig = core::ptr::read_volatile(&raw const (*slot).orig);
        (found == *key && matches(&orig, isn_next)).then_some(orig)
    }
}

#[inline(always)]
fn matches(orig: &PendingOrigDst, isn_next: Option<u32>) -> bool {
    isn_next.is_none_or(|isn| orig.server_isn_next == isn)
}

/// The proxy side of the connection is established: if it is recorded, keep its slot until the
/// proxy's socket closes (no take-over by age). Whether it is recorded.
#[inline(always)]
pub fn watch(key: &PendingKey, isn_next: u32) -> bool {
    if let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) {
        // SAFETY: as in `record`.
        if unsafe { advance(slot, key, isn_next, phase::after_proxy_established) } {
            return true;
        }
    }
    find_in_lru(key, isn_next)
}

/// The proxy's socket of the connection closed: `SO_ORIGINAL_DST` cannot be asked any more.
/// Whether the connection was found.
#[inline(always)]
pub fn proxy_closed(key: &PendingKey, isn_next: u32) -> bool {
    if let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) {
        // SAFETY: as in `record`.
        if unsafe { advance(slot, key, isn_next, phase::after_proxy_close) } {
            return true;
        }
    }
    // Absent if it was evicted already (or is not this socket's): nothing to do then.
    find_in_lru(key, isn_next) && PENDING.remove(key).is_ok()
}

/// The app's socket of the connection closed: its `getpeername()` cannot be asked any more.
/// Whether the connection was found in its slot (an entry in the LRU map goes with the proxy's
/// socket).
#[inline(always)]
pub fn app_closed(key: &PendingKey, isn_next: u32) -> bool {
    let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) else {
        return false;
    };
    // SAFETY: as in `record`.
    unsafe { advance(slot, key, isn_next, phase::after_app_close) }
}

/// Moves `slot`, if it holds the connection with `key` and `isn_next`, to `next(state)`.
/// Whether it held it. The other side's sock_ops may change the state at the same moment (both
/// sides closing at once, on two CPUs): then it is read and moved again, and a slot taken over
/// meanwhile (150 s old, or a new connection with the same key) is left alone.
///
/// # Safety
///
/// `slot` points at a slot of `ICPT_PEND_SLOTS`.
#[inline(always)]
unsafe fn advance(
    slot: *mut PendingSlot,
    key: &PendingKey,
    isn_next: u32,
    next: impl Fn(u64) -> u64,
) -> bool {
    // SAFETY: the caller's promise; the state is only changed atomically.
    let state = unsafe { &raw mut (*slot).state };
    // Two attempts: only the connection's other socket moves its slot concurrently, once.
    for _ in 0..2 {
        // SAFETY: as above.
        let held = unsafe { core::ptr::read_volatile(state) };
        // SAFETY: the caller's promise.
        if !unsafe { holds(slot, held, key, isn_next) } {
            return false;
        }
        let new = next(held);
        // SAFETY: as above.
        if new == held || unsafe { exchange(state, held, new) } {
            return true;
        }
    }
    true
}

/// Whether `slot`, in state `held`, is the entry of the connection with `key` and `isn_next`.
///
/// # Safety
///
/// `slot` points at a slot of `ICPT_PEND_SLOTS`.
#[inline(always)]
unsafe fn holds(slot: *const PendingSlot, held: u64, key: &PendingKey, isn_next: u32) -> bool {
    // SAFETY: the caller's promise; key and number are copied, a torn copy only fails to match.
    phase::holds_a_connection(held)
        && unsafe { core::ptr::read_volatile(&raw const (*slot).key) } == *key
        && unsafe { core::ptr::read_volatile(&raw const (*slot).orig.server_isn_next) } == isn_next
}

#[inline(always)]
fn find_in_lru(key: &PendingKey, isn_next: u32) -> bool {
    // SAFETY: as in `find`: only the number is read from the element.
    (unsafe { PENDING.get(key) }).is_some_and(|p| p.server_isn_next == isn_next)
}

/// Coarse seconds (2^30 ns), enough for a take-over after minutes and cheaper than a division.
#[inline(always)]
fn coarse_secs(ns: u64) -> u64 {
    ns >> 30
}
