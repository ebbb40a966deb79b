//! The atomic operations the slot arrays (`connect_slots`, `pending`) take and give slots with.
//! Rust's atomics have no compare-and-exchange for the BPF target (`atomic-cas` is off in its
//! specification, as the first BPF instruction sets had none), so the intrinsics they lower to.
//! Both are full barriers (BPF_CMPXCHG, BPF_XCHG). Loads stay plain (volatile): the BPF backend
//! selects no load-acquire below its v4 instruction set ("Cannot select: AtomicLoad<(load
//! acquire ...)>").
use core::intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xchg};

/// Compare-and-exchange: whether `*at` was `current` and is now `new`.
///
/// # Safety
///
/// `at` points at a `u64` in a map value, aligned, changed by others only atomically.
#[inline(always)]
pub unsafe fn compare_exchange(at: *mut u64, current: u64, new: u64) -> bool {
    // SAFETY: the caller's promise.
    unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::AcqRel }, { AtomicOrdering::Acquire }>(
            at, current, new,
        )
        .1
    }
}

/// Exchange: stores `new` at `at`, after every store before it is visible.
///
/// # Safety
///
/// As [`compare_exchange`].
#[inline(always)]
pub unsafe fn publish(at: *mut u64, new: u64) {
    // SAFETY: the caller's promise.
    unsafe { atomic_xchg::<u64, { AtomicOrdering::AcqRel }>(at, new) };
}
