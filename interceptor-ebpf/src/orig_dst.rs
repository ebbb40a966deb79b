//! Answering `getsockopt(SOL_IP, SO_ORIGINAL_DST)` without conntrack: `sock_ops` indexes each
//! redirected connection by the 4-tuple the proxy will see, `cgroup/getsockopt` answers from that
//! index, and the entry is removed when the proxy's socket closes. See
//! `interceptor_common::socket` for the whole life of an entry.
use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_ANY, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_LISTEN_CB, bpf_sock,
        bpf_sockopt,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_tcp_sock},
    macros::{cgroup_sockopt, sock_ops},
    programs::{SockOpsContext, SockoptContext},
};
use interceptor_common::{PendingKey, PendingOrigDst, SO_ORIGINAL_DST, SOL_IP, counters::Decision};

use crate::maps::{CONNECTING, LISTENERS, PENDING, PODS, count};

const AF_INET: u16 = 2;
const IPPROTO_TCP: u32 = 6;
const SOCKADDR_IN_LEN: usize = 16;
const TCP_CLOSE: u32 = 7;

/// Runs for every TCP callback of every socket under the cgroup (about nine per connection, for
/// both ends): all but four callbacks return after the first compares.
#[sock_ops]
pub fn icpt_sockops(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => index_redirected_connection(&ctx),
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => watch_proxy_side(&ctx),
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == TCP_CLOSE => forget_closed_connection(&ctx),
        BPF_SOCK_OPS_TCP_LISTEN_CB => remember_inbound_listener(&ctx),
        _ => {}
    }
    1
}

/// Whoever listens on a meshed pod's inbound port is its proxy's inbound listener, as with
/// iptables REDIRECT: the proxy needs no change. A restarted proxy's new socket replaces the old
/// one (the kernel already dropped the old one when it closed).
#[inline(always)]
fn remember_inbound_listener(ctx: &SockOpsContext) {
    let mut netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let Some(pod) = (unsafe { PODS.get(&netns_cookie) }) else {
        return;
    };
    if ctx.local_port() != u32::from(pod.inbound_port) {
        return;
    }
    let _ = LISTENERS.update(&mut netns_cookie, unsafe { &mut *ctx.ops }, BPF_ANY.into());
}

/// The app side of a redirected connection is established: its source port is known now, so
/// index the original destination under the tuple the proxy's socket will see as its peer.
#[inline(always)]
fn index_redirected_connection(ctx: &SockOpsContext) {
    // Present only for sockets connect4 redirected.
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some(orig) = (unsafe { CONNECTING.get(&socket_cookie) }) else {
        return;
    };
    let orig = *orig;
    let _ = CONNECTING.remove(&socket_cookie);
    let key = PendingKey {
        netns_cookie: orig.netns_cookie,
        client_ip4_be: ctx.local_ip4(),
        client_port: ctx.local_port(),
    };
    let pending = PendingOrigDst {
        ip4_be: orig.ip4_be,
        port_be: orig.port_be,
        _pad: 0,
        server_isn_next: unsafe { (*ctx.ops).rcv_nxt },
        _pad2: 0,
    };
    // On failure the proxy's SO_ORIGINAL_DST fails and it refuses the connection (fails closed).
    let _ = PENDING.insert(&key, &pending, 0);
}

/// The key of a connection as its proxy-side socket sees it.
#[inline(always)]
fn proxy_side_key(ctx: &SockOpsContext) -> PendingKey {
    PendingKey {
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        client_ip4_be: ctx.remote_ip4(),
        // sock_ops keeps the network-order port in the upper 16 bits of remote_port.
        client_port: u32::from(u16::from_be((ctx.remote_port() >> 16) as u16)),
    }
}

/// The proxy side of a connection is established (the app side always is first). If it is a
/// redirected connection, ask for this socket's state changes, so its entry goes when it closes.
#[inline(always)]
fn watch_proxy_side(ctx: &SockOpsContext) {
    if ctx.family() != u32::from(AF_INET) {
        return;
    }
    let Some(pending) = (unsafe { PENDING.get(&proxy_side_key(ctx)) }) else {
        return;
    };
    let isn_next = unsafe {
        (*ctx.ops)
            .snd_una
            .wrapping_sub((*ctx.ops).bytes_acked as u32)
    };
    if isn_next == pending.server_isn_next {
        let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
    }
}

/// The proxy's socket of a redirected connection closed: nobody can ask about it any more.
#[inline(always)]
fn forget_closed_connection(ctx: &SockOpsContext) {
    let _ = PENDING.remove(&proxy_side_key(ctx));
}

/// Runs for every getsockopt under the cgroup: anything but SO_ORIGINAL_DST returns after two
/// compares with the kernel's own answer untouched.
#[cgroup_sockopt(getsockopt)]
pub fn icpt_getsockopt(ctx: SockoptContext) -> i32 {
    let so = ctx.sockopt;
    if unsafe { (*so).level } == SOL_IP && unsafe { (*so).optname } == SO_ORIGINAL_DST {
        serve_orig_dst(&ctx, so);
    }
    1
}

#[inline(always)]
fn serve_orig_dst(ctx: &SockoptContext, so: *mut bpf_sockopt) {
    let sk: *mut bpf_sock = unsafe { (*so).__bindgen_anon_1.sk };
    // Like conntrack's getorigdst: IPv4 TCP sockets only.
    if unsafe { (*sk).family } != u32::from(AF_INET) || unsafe { (*sk).protocol } != IPPROTO_TCP {
        return;
    }
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let Some(pod) = (unsafe { PODS.get(&netns_cookie) }) else {
        return;
    };
    let key = PendingKey {
        netns_cookie,
        client_ip4_be: unsafe { (*sk).dst_ip4 },
        client_port: u32::from(u16::from_be(unsafe { (*sk).dst_port })),
    };
    let Some(pending) = (unsafe { PENDING.get(&key) }) else {
        answer_local_address(so, sk);
        return;
    };
    let pending = *pending;
    let tcp = unsafe { bpf_tcp_sock(sk) };
    if tcp.is_null() {
        return;
    }
    // snd_una - bytes_acked is this socket's initial sequence number + 1 for its whole life. An
    // entry that does not match is from an earlier connection that reused the 4-tuple.
    let isn_next = unsafe { (*tcp).snd_una.wrapping_sub((*tcp).bytes_acked as u32) };
    if isn_next != pending.server_isn_next {
        answer_local_address(so, sk);
        return;
    }
    // The entry stays until the socket closes: a proxy may ask more than once.
    write_sockaddr_in(so, pending.ip4_be, pending.port_be);
    count(pod.slot, Decision::OrigDstServed);
}

/// Not an outbound-redirected connection: the original destination is the socket's own local
/// address. That is the inbound case (sk_lookup delivers without rewriting addresses), and what
/// conntrack answers for any connection that was not NATed. An answer that is already there
/// (conntrack's, or another instance's during an upgrade) is kept.
#[inline(always)]
fn answer_local_address(so: *mut bpf_sockopt, sk: *mut bpf_sock) {
    if unsafe { (*so).retval } == 0 {
        return;
    }
    let ip4_be = unsafe { (*sk).src_ip4 };
    let port_be = (unsafe { (*sk).src_port } as u16).to_be();
    write_sockaddr_in(so, ip4_be, port_be);
}

#[inline(always)]
fn write_sockaddr_in(so: *mut bpf_sockopt, ip4_be: u32, port_be: u16) {
    let optval = unsafe { (*so).__bindgen_anon_2.optval } as usize;
    let optval_end = unsafe { (*so).__bindgen_anon_3.optval_end } as usize;
    if optval + SOCKADDR_IN_LEN > optval_end {
        // The caller's buffer is too small for a sockaddr_in: leave the kernel's answer.
        return;
    }
    let sin = optval as *mut u8;
    unsafe {
        core::ptr::write_unaligned(sin.cast::<u16>(), AF_INET);
        core::ptr::write_unaligned(sin.add(2).cast::<u16>(), port_be);
        core::ptr::write_unaligned(sin.add(4).cast::<u32>(), ip4_be);
        core::ptr::write_unaligned(sin.add(8).cast::<u64>(), 0);
        // Separate volatile stores: LLVM merges adjacent 4-byte context stores into one 8-byte
        // store, which the verifier rejects ("invalid bpf_context access").
        core::ptr::write_volatile(&raw mut (*so).optlen, SOCKADDR_IN_LEN as i32);
        core::ptr::write_volatile(&raw mut (*so).retval, 0);
    }
}
