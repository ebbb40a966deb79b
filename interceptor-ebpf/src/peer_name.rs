//! `cgroup/getpeername4` and `cgroup/getpeername6`: an app's redirected socket reports the
//! address it dialled, as it would through NAT, not the proxy's loopback address. Go's
//! `RemoteAddr()`, access logs and client libraries read `getpeername()`.
//!
//! The original destination is already indexed for the proxy (`pending`, from the app side's
//! establishment until both sides closed, in a slot or in the LRU map) under the app socket's
//! own address and port, so answering costs one lookup, and only for a socket whose peer is the
//! pod's proxy outbound port on loopback: every other socket pays a few compares and, on
//! loopback, one read of the node's set of outbound ports. `getpeername()` before the
//! connection is established fails with ENOTCONN before these programs run, so the entry is
//! always there when it is asked, unless the LRU map evicted it under pressure or its slot was
//! taken over after the proxy side closed `PENDING_SLOT_STALE_SECS` ago; the app then sees the
//! proxy's address, as before.
//!
//! `getsockname()` is left alone: with NAT the app's local address is the pod's address the
//! route picks, which the kernel never chose here (the socket is bound to loopback).
use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_sock, bpf_sock_addr},
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use interceptor_common::{Ip6Addr, PendingKey, PendingOrigDst, pending_phase};

use crate::{
    maps::{is_outbound_port, pod_config, read_ip6},
    pending,
};

/// The only value getpeername programs may return.
const ALLOW: i32 = 1;
const IPPROTO_TCP: u32 = 6;
/// An MPTCP socket's own name is its first subflow's, which is what the proxy's index has.
const IPPROTO_MPTCP: u32 = 262;
const LOCALHOST_BE: u32 = u32::from_be_bytes([127, 0, 0, 1]).to_be();

#[cgroup_sock_addr(getpeername4)]
pub fn icpt_peername4(ctx: SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `sa` is this run's context; the kernel filled `user_ip4` and `user_port` with the
    // socket's peer before running the program, and the verifier checks the field reads.
    let peer = Ip6Addr::from_ip4_be(unsafe { (*sa).user_ip4 });
    if let Some(pending) = original_destination(&ctx, peer) {
        // SAFETY: `sa` is this run's context, whose address getpeername4 may rewrite; the
        // verifier checks both 4-byte stores.
        unsafe {
            (*sa).user_ip4 = pending.addr.ip4_be();
            (*sa).user_port = u32::from(pending.port_be);
        }
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn icpt_peername6(ctx: SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: `user_ip6` is a four-word field of this run's context, filled with the peer.
    let peer = unsafe { read_ip6(&raw const (*sa).user_ip6) };
    if let Some(pending) = original_destination(&ctx, peer) {
        // An IPv4 connection of an AF_INET6 socket keeps the mapped form it was dialled in.
        let words = pending.addr.words_be;
        // SAFETY: `sa` is this run's context, whose address getpeername6 may rewrite; the
        // verifier checks each 4-byte store.
        unsafe {
            // One 4-byte store per word: the verifier rejects wider stores to user_ip6.
            let out = (&raw mut (*sa).user_ip6).cast::<u32>();
            core::ptr::write_volatile(out, words[0]);
            core::ptr::write_volatile(out.add(1), words[1]);
            core::ptr::write_volatile(out.add(2), words[2]);
            core::ptr::write_volatile(out.add(3), words[3]);
            (*sa).user_port = u32::from(pending.port_be);
        }
    }
    ALLOW
}

/// The original destination of this socket's connection, if connect4/6 redirected it: its peer
/// is the meshed pod's proxy outbound port on loopback and the proxy's index has its tuple.
#[inline(always)]
fn original_destination(ctx: &SockAddrContext, peer: Ip6Addr) -> Option<PendingOrigDst> {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `sa` is this run's context; the verifier checks the field reads.
    let (protocol, peer_port_be) = unsafe { ((*sa).protocol, (*sa).user_port as u16) };
    if !(protocol == IPPROTO_TCP || protocol == IPPROTO_MPTCP)
        || !(peer == Ip6Addr::LOOPBACK || peer == Ip6Addr::from_ip4_be(LOCALHOST_BE))
        // The proxy's side of every redirected connection (its accept asks for the peer, the
        // app's ephemeral port) leaves here, before the netns cookie and the pod's hash.
        || !is_outbound_port(u16::from_be(peer_port_be))
    {
        return None;
    }
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that sock_addr programs may call it and that the argument is the context.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let pod = pod_config(netns_cookie)?;
    if u16::from_be(peer_port_be) != pod.outbound_port {
        return None;
    }
    // SAFETY: `sa` is this run's context; the verifier checks the read of its socket pointer,
    // which is only used for `bpf_sock` field reads below.
    let sk: *mut bpf_sock = unsafe { (*sa).__bindgen_anon_1.sk };
    // SAFETY: `bpf_sock` field reads, checked by the verifier.
    let client = match unsafe { (*sk).family } {
        // SAFETY: a `bpf_sock` field read, checked by the verifier.
        2 => Ip6Addr::from_ip4_be(unsafe { (*sk).src_ip4 }),
        // SAFETY: `src_ip6` is a four-word `bpf_sock` field.
        _ => unsafe { read_ip6(&raw const (*sk).src_ip6) },
    };
    let key = PendingKey {
        netns_cookie,
        client,
        // SAFETY: a `bpf_sock` field read (host order), checked by the verifier.
        client_port: unsafe { (*sk).src_port },
        _pad: 0,
    };
    // The app's side cannot read the proxy side's sequence number here, but knows its own
    // socket: an entry left behind by an earlier socket of the same 4-tuple (one whose closes
    // were never reported) has another tag, and answers nothing here.
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that sock_addr programs may call it and that the argument is the context.
    let tag = pending_phase::app_tag(unsafe { bpf_get_socket_cookie(ctx.as_ptr()) });
    let owner = if protocol == IPPROTO_MPTCP {
        pending::Owner::MultipathApp
    } else {
        pending::Owner::App { tag }
    };
    pending::find(&key, owner)
}
