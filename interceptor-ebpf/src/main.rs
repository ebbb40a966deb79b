//! The kernel side of interception: programs attached once per node to a cgroup v2 directory,
//! acting only on sockets whose network namespace is registered in `ICPT_PODS`.
//!
//! Each program's entry calls its `try_` function and maps the result to the kernel's return
//! code. Nothing here logs per connection: decisions are counted in a per-CPU array instead, and
//! only the rare failures in `error` are logged, when userspace turns the log on.
#![no_std]
#![feature(core_intrinsics)]
#![allow(
    internal_features,
    reason = "core_intrinsics: the programs' atomics (see atomic.rs); nightly-only, see xtask/src/setup.rs"
)]
#![no_main]
#![warn(clippy::undocumented_unsafe_blocks)]

mod atomic;
mod connect_slots;
mod creds;
mod error;
mod inbound;
mod maps;
mod orig_dst;
mod outbound;
mod peer_name;
mod pending;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // eBPF code cannot panic at run time: the verifier rejects any path that reaches here.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
