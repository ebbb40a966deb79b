//! The index of redirected connections the proxy's side looks up (by the 4-tuple it sees,
//! [`PendingKey`]): a slot of `ICPT_PEND_SLOTS` picked by the key's fold, falling back to the
//! `ICPT_PENDING` LRU map when that slot is held by another connection. An LRU insert and delete
//! cost a hash, a bucket lock with interrupts off and LRU list work each, most of what was left
//! of sock_ops' cost; a slot costs an inlined array lookup and a compare-and-exchange.
//!
//! An entry's life (`pending_phase`), the same in a slot and in the LRU map: the app side's
//! sock_ops takes a free slot (FREE -> BUSY), writes the key and the original destination and
//! publishes them (-> RECORDED, with the app socket's tag); the proxy side's sock_ops, once
//! established, marks it WATCHED. Each side's close is reported (both sockets ask for their
//! state changes): the first moves the entry to a half-closed phase, the second frees it
//! (-> FREE; an LRU entry is removed), so the app's `getpeername()` is answered for as long as
//! its socket lives, as NAT keeps it, and the proxy's `SO_ORIGINAL_DST` for as long as its own.
//! A slot in any phase but WATCHED is taken over once `PENDING_SLOT_STALE_SECS` old (its proxy
//! side never established, or the other side's close never reported), and a slot holding the
//! same key (the 4-tuple reused: the old connection is over) is taken at once.
//!
//! A reader checks the phase, copies the key and the value, and keeps them only if the key is
//! its own and the entry is its connection's: the proxy side's initial sequence number for the
//! proxy, the app socket's tag for the app. A slot rewritten during the copy by another
//! connection cannot hold the reader's key: a connection's own slot changes only through its
//! own sock_ops runs, which the socket's lock orders with its getsockopt.
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

/// Whose entry a reader wants: the proxy side's, by its initial sequence number + 1, or the app
/// side's, by its socket's tag (`pending_phase::app_tag`).
#[derive(Clone, Copy)]
pub enum Owner {
    Proxy {
        isn_next: u32,
    },
    App {
        tag: u32,
    },
    /// An MPTCP app socket: its first subflow, whose cookie tagged the entry, is a socket of
    /// its own that `getpeername` on the MPTCP socket cannot name, so its 4-tuple alone says.
    MultipathApp,
}

/// Records the connection with `key`, whose connect was recorded at `connected_ns` (coarse
/// ns), from the app socket tagged `tag`: in its slot if it can take it, else in
/// `ICPT_PENDING`. `Err(errno)` when neither took it.
#[inline(always)]
pub fn record(
    key: &PendingKey,
    orig: &PendingOrigDst,
    connected_ns: u64,
    tag: u32,
) -> Result<(), i32> {
    let recorded = phase::state(phase::RECORDED, coarse_secs(connected_ns), tag);
    if let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) {
        // SAFETY: `slot` points at a slot of a preallocated array, memory of the map for its
        // whole life; its state is only changed atomically, and its other fields only by the
        // program that set it BUSY.
        unsafe {
            let state = &raw mut (*slot).state;
            let held = core::ptr::read_volatile(state);
            if can_take(slot, held, key, recorded) && exchange(state, held, phase::BUSY) {
                (*slot).key = *key;
                (*slot).orig = *orig;
                // Whoever sees RECORDED sees what was written.
                publish(state, recorded);
                return Ok(());
            }
        }
    }
    let entry = PendingSlot {
        state: recorded,
        key: *key,
        orig: *orig,
    };
    PENDING.insert(key, entry, 0)
}

/// Whether the app side of a new connection with `key`, to be recorded as `recorded`, may take
/// `slot`, whose state is `held`.
///
/// # Safety
///
/// `slot` points at a slot of `ICPT_PEND_SLOTS`.
#[inline(always)]
unsafe fn can_take(slot: *const PendingSlot, held: u64, key: &PendingKey, recorded: u64) -> bool {
    if held & phase::MASK == phase::FREE {
        return true;
    }
    if !phase::holds_a_connection(held) {
        return false;
    }
    // SAFETY: the caller's promise; the key is copied, and a torn copy only fails to match.
    let same_key = unsafe { core::ptr::read_volatile(&raw const (*slot).key) } == *key;
    same_key
        || (phase::ages(held)
            && phase::age(held, (recorded >> 8) & phase::SECS_MASK) > PENDING_SLOT_STALE_SECS)
}

/// The original destination of the connection with `key` that `owner` asks about.
#[inline(always)]
pub fn find(key: &PendingKey, owner: Owner) -> Option<PendingOrigDst> {
    if let Some(orig) = find_in_slot(key, owner) {
        return Some(orig);
    }
    // SAFETY: `PENDING` is preallocated: the element stays memory of the map, and the value is
    // copied at once. An element evicted and reused by another CPU during the copy holds
    // another connection's key, number and tag, which `owns` refuses.
    let entry = (unsafe { PENDING.get(key) }).copied()?;
    owns(&entry, key, owner).then_some(entry.orig)
}

/// As [`find`], in the key's slot only: an inlined array lookup, where `ICPT_PENDING` costs a
/// hash. `None` for a connection that is not recorded there, recorded or not in `ICPT_PENDING`.
#[inline(always)]
pub fn find_in_slot(key: &PendingKey, owner: Owner) -> Option<PendingOrigDst> {
    let slot = PENDING_SLOT_ARRAY.get_ptr(key.slot_index())?;
    // SAFETY: as in `record`; state, key and value are copied, and kept only if they are ours.
    let entry = unsafe {
        let state = core::ptr::read_volatile(&raw const (*slot).state);
        if !phase::holds_a_connection(state) {
            return None;
        }
        PendingSlot {
            state,
            key: core::ptr::read_volatile(&raw const (*slot).key),
            orig: core::ptr::read_volatile(&raw const (*slot).orig),
        }
    };
    owns(&entry, key, owner).then_some(entry.orig)
}

/// Whether `entry` (a copy) is the connection with `key` that `owner` asks about.
#[inline(always)]
fn owns(entry: &PendingSlot, key: &PendingKey, owner: Owner) -> bool {
    phase::holds_a_connection(entry.state)
        && entry.key == *key
        && match owner {
            Owner::Proxy { isn_next } => entry.orig.server_isn_next == isn_next,
            Owner::App { tag } => phase::answers_app(entry.state, tag),
            Owner::MultipathApp => true,
        }
}

/// The proxy side of the connection is established, and its closes will be reported: if it is
/// recorded, keep its entry until the proxy's socket closes (no take-over by age). Whether it
/// is recorded.
#[inline(always)]
pub fn watch(key: &PendingKey, isn_next: u32) -> bool {
    advance_entry(key, isn_next, phase::after_proxy_established)
}

/// Undoes [`watch`] for a proxy side whose closes cannot be reported after all: its entry ages
/// again, as if its proxy side were never established.
#[inline(always)]
pub fn unwatch(key: &PendingKey, isn_next: u32) {
    advance_entry(key, isn_next, phase::after_proxy_unwatched);
}

/// The proxy's socket of the connection closed: `SO_ORIGINAL_DST` cannot be asked any more.
/// Whether the connection was found.
#[inline(always)]
pub fn proxy_closed(key: &PendingKey, isn_next: u32) -> bool {
    advance_entry(key, isn_next, |held| {
        phase::after_proxy_close(held, coarse_secs_now)
    })
}

/// The app's socket of the connection closed: its `getpeername()` cannot be asked any more.
/// Whether the connection was found.
#[inline(always)]
pub fn app_closed(key: &PendingKey, isn_next: u32) -> bool {
    advance_entry(key, isn_next, |held| {
        phase::after_app_close(held, coarse_secs_now)
    })
}

/// Moves the entry of the connection with `key` and `isn_next`, in its slot or in
/// `ICPT_PENDING`, to `next(state)`, and removes an LRU entry that is then free. Whether the
/// connection was found.
#[inline(always)]
fn advance_entry(key: &PendingKey, isn_next: u32, next: impl Fn(u64) -> u64) -> bool {
    if let Some(slot) = PENDING_SLOT_ARRAY.get_ptr_mut(key.slot_index()) {
        // SAFETY: `slot` points at a slot of `ICPT_PEND_SLOTS`.
        if unsafe { advance(slot, key, isn_next, &next) }.is_some() {
            return true;
        }
    }
    let Some(entry) = PENDING.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: `PENDING` is preallocated: the element stays memory of the map; one evicted and
    // reused meanwhile holds another key or number, which `advance` refuses before changing it.
    match unsafe { advance(entry, key, isn_next, &next) } {
        Some(phase::FREE) => {
            // The entry's two sockets are gone: the 4-tuple cannot be recorded again before
            // this run (the closing socket is unhashed after it), so the key is still ours.
            let _ = PENDING.remove(key);
            true
        }
        Some(_) => true,
        None => false,
    }
}

/// Moves `entry`, if it holds the connection with `key` and `isn_next`, to `next(state)`: the
/// new state, `None` if it did not hold it. Others may change the state at the same moment
/// (both sides closing at once on two CPUs, the proxy side's establishment racing the app's
/// close): then it is read and moved again. A connection's state moves at most three times
/// (recorded, watched or closed early, half closed, free), so after three changes by others it
/// is free or another connection's and no longer held; a slot taken over meanwhile (old, or a
/// new connection with the same key) is left alone.
///
/// # Safety
///
/// `entry` points at a `PendingSlot` of `ICPT_PEND_SLOTS` or `ICPT_PENDING`.
#[inline(always)]
unsafe fn advance(
    entry: *mut PendingSlot,
    key: &PendingKey,
    isn_next: u32,
    next: &impl Fn(u64) -> u64,
) -> Option<u64> {
    // SAFETY: the caller's promise; the state is only changed atomically.
    let state = unsafe { &raw mut (*entry).state };
    for _ in 0..4 {
        // SAFETY: as above.
        let held = unsafe { core::ptr::read_volatile(state) };
        // SAFETY: the caller's promise.
        if !unsafe { holds(entry, held, key, isn_next) } {
            return None;
        }
        let new = next(held);
        // SAFETY: as above.
        if new == held || unsafe { exchange(state, held, new) } {
            return Some(new);
        }
    }
    None
}

/// Whether `entry`, in state `held`, is the entry of the connection with `key` and `isn_next`.
///
/// # Safety
///
/// `entry` points at a `PendingSlot` in a map.
#[inline(always)]
unsafe fn holds(entry: *const PendingSlot, held: u64, key: &PendingKey, isn_next: u32) -> bool {
    // SAFETY: the caller's promise; key and number are copied, a torn copy only fails to match.
    phase::holds_a_connection(held)
        && unsafe { core::ptr::read_volatile(&raw const (*entry).key) } == *key
        && unsafe { core::ptr::read_volatile(&raw const (*entry).orig.server_isn_next) } == isn_next
}

/// Coarse seconds (2^30 ns), enough for a take-over after minutes and cheaper than a division.
#[inline(always)]
fn coarse_secs(ns: u64) -> u64 {
    ns >> 30
}

/// Now in coarse seconds: read only when a connection becomes half closed, to date it.
#[inline(always)]
fn coarse_secs_now() -> u64 {
    // SAFETY: the helper has no arguments and no preconditions.
    coarse_secs(unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns() })
}
