//! Handing a redirected connect's original destination from connect4/6 to sock_ops, where the
//! socket's source port is known: a slot of `ICPT_CONN_SLOTS` picked by the app socket's cookie,
//! falling back to the `ICPT_CONNECTING` LRU map when the slot is taken. An LRU insert, lookup
//! and delete cost a hash, a bucket lock and LRU list work each; a slot costs an inlined array
//! lookup and two compare-and-exchanges.
//!
//! Socket cookies are handed out in increasing order (per CPU, in batches), so connects in
//! flight at the same time take distinct slots. A slot is taken with a compare-and-exchange on
//! its cookie (0: free) and given back the same way by the socket that took it, once
//! established. A connect that never completes (refused, timed out) leaves its slot taken: after
//! `CONNECT_SLOT_STALE_NS`, longer than TCP's connect attempts last, the next connect with that
//! index takes it over.
//!
//! Kernels without BPF atomics (before 5.12, whose verifier rejects compare-and-exchange with
//! "BPF_STX uses reserved fields") load none of these programs: every kernel with the helpers
//! sock_ops and getsockopt need (5.15) has atomics, so a variant without them would never run.
use interceptor_common::{CONNECT_SLOT_STALE_NS, CONNECT_SLOTS, OrigDst};

use crate::{
    atomic::compare_exchange as exchange,
    maps::{CONNECT_SLOT_ARRAY, CONNECTING},
};

/// Records `orig` for the socket with `socket_cookie`: in its slot if it can take it, else in
/// `ICPT_CONNECTING`. `Err(errno)` when neither took it.
#[inline(always)]
pub fn record(socket_cookie: u64, orig: &OrigDst) -> Result<(), i32> {
    if let Some(slot) = CONNECT_SLOT_ARRAY.get_ptr_mut(index(socket_cookie)) {
        // SAFETY: the helper has no arguments and no preconditions.
        let now = unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns() };
        // SAFETY: `slot` points at a slot of a preallocated array, memory of the map for its
        // whole life; its cookie is only changed atomically, and its other fields only by the
        // program that took it.
        unsafe {
            let cookie = &raw mut (*slot).socket_cookie;
            let held = core::ptr::read_volatile(cookie);
            let free = held == 0 || now.wrapping_sub((*slot).taken_ns) > CONNECT_SLOT_STALE_NS;
            if free && exchange(cookie, held, socket_cookie) {
                (*slot).taken_ns = now;
                (*slot).orig = *orig;
                return Ok(());
            }
        }
    }
    CONNECTING.insert(socket_cookie, orig, 0)
}

/// Takes the original destination recorded for the socket with `socket_cookie` out of its slot
/// or out of `ICPT_CONNECTING`, with when the connect was recorded (coarse ns: sock_ops dates
/// its entry with it instead of asking the clock again). None for a socket connect4/6 did not
/// redirect.
#[inline(always)]
pub fn take(socket_cookie: u64) -> Option<(OrigDst, u64)> {
    if let Some(slot) = CONNECT_SLOT_ARRAY.get_ptr_mut(index(socket_cookie)) {
        // SAFETY: as in `record`. The value is copied between reading the cookie and giving the
        // slot back: if the slot was taken over meanwhile (its connect was older than
        // CONNECT_SLOT_STALE_NS), giving it back fails and the copy is not used.
        unsafe {
            let cookie = &raw mut (*slot).socket_cookie;
            if core::ptr::read_volatile(cookie) == socket_cookie {
                let orig = core::ptr::read_volatile(&raw const (*slot).orig);
                let taken_ns = core::ptr::read_volatile(&raw const (*slot).taken_ns);
                return exchange(cookie, socket_cookie, 0).then_some((orig, taken_ns));
            }
        }
    }
    let orig = take_from_lru(socket_cookie)?;
    // SAFETY: the helper has no arguments and no preconditions.
    Some((orig, unsafe {
        aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns()
    }))
}

#[inline(always)]
fn take_from_lru(socket_cookie: u64) -> Option<OrigDst> {
    // SAFETY: `CONNECTING` is preallocated: the element stays memory of the map, and the value
    // is copied at once. Only if the map is full and another CPU evicts and reuses this very
    // element during the copy can it mix two entries (`OrigDst` is valid for every bit
    // pattern, so the value is still a valid one).
    let orig = (unsafe { CONNECTING.get(socket_cookie) }).copied()?;
    let _ = CONNECTING.remove(socket_cookie);
    Some(orig)
}

#[inline(always)]
fn index(socket_cookie: u64) -> u32 {
    (socket_cookie as u32) & (CONNECT_SLOTS - 1)
}

const _: () = assert!(CONNECT_SLOTS.is_power_of_two());
