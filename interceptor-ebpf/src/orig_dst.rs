//! Answering `getsockopt(SOL_IP, SO_ORIGINAL_DST)` and `getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST)`
//! without conntrack: `sock_ops` indexes each redirected connection by the 4-tuple the proxy will
//! see, `cgroup/getsockopt` answers from that index, and the entry is removed when the second of
//! the connection's two sockets closes. See `interceptor_common::socket` for the whole life of an
//! entry.
use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_ANY, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_LISTEN_CB, bpf_sock,
    },
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_tcp_sock},
    macros::{cgroup_sockopt, sock_ops},
    programs::{SockOpsContext, SockoptContext},
};
use interceptor_common::{
    IP6T_SO_ORIGINAL_DST, Ip6Addr, ListenerKey, PendingKey, PendingOrigDst, SO_ORIGINAL_DST,
    SOL_IP, SOL_IPV6, addr::family, counters::Decision, names, pending_phase, pod::flags,
};

use crate::{
    connect_slots,
    error::Error,
    maps::{LISTENERS, count, is_outbound_port, pod_config, read_ip6},
    pending,
};

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const IPPROTO_TCP: u32 = 6;
const SOCKADDR_IN_LEN: usize = 16;
const SOCKADDR_IN6_LEN: usize = 28;
const TCP_CLOSE: u32 = 7;

/// Runs for every TCP callback of every socket under the cgroup (about nine per connection, for
/// both ends): all but four callbacks return after the first compares.
#[sock_ops]
pub fn icpt_sockops(ctx: SockOpsContext) -> u32 {
    match try_sockops(&ctx) {
        Ok(()) => 1,
        // What failed is only logged: the connection goes on either way.
        Err(e) => {
            e.log(&ctx, names::PROG_SOCKOPS);
            1
        }
    }
}

#[inline(always)]
fn try_sockops(ctx: &SockOpsContext) -> Result<(), Error> {
    match ctx.op() {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => index_redirected_connection(ctx),
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => watch_proxy_side(ctx),
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == TCP_CLOSE => {
            forget_closed_connection(ctx);
            Ok(())
        }
        BPF_SOCK_OPS_TCP_LISTEN_CB => remember_inbound_listener(ctx),
        _ => Ok(()),
    }
}

/// Whoever listens on a meshed pod's inbound port is its proxy's inbound listener, as with
/// iptables REDIRECT: the proxy needs no change. A restarted proxy's new socket replaces the old
/// one (the kernel already dropped the old one when it closed). Kept per family: a proxy may
/// listen with one socket per family or with one dual-stack socket.
#[inline(always)]
fn remember_inbound_listener(ctx: &SockOpsContext) -> Result<(), Error> {
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that sock_ops may call it and that the argument is the context.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let Some(pod) = pod_config(netns_cookie) else {
        return Ok(());
    };
    if ctx.local_port() != u32::from(pod.inbound_port) {
        return Ok(());
    }
    let family = if ctx.family() == u32::from(AF_INET6) {
        family::IPV6
    } else {
        family::IPV4
    };
    let mut key = ListenerKey {
        netns_cookie,
        family,
        _pad: 0,
    };
    // SAFETY: `ops` is the context the kernel passed to this run, valid throughout it; the
    // helper takes it as the socket to insert and keeps no reference to the context.
    let ops = unsafe { &mut *ctx.ops };
    LISTENERS
        .update(&mut key, ops, BPF_ANY.into())
        .map_err(|errno| Error::ListenerNotRemembered {
            netns_cookie,
            errno,
        })
}

/// A socket's local or remote address in the maps' form: an `AF_INET6` socket already shows an
/// IPv4 connection as `::ffff:a.b.c.d`, an `AF_INET` one is mapped here.
///
/// # Safety
///
/// `ip6` points at a four-word field of `ctx`'s context.
#[inline(always)]
unsafe fn sock_ops_addr(ctx: &SockOpsContext, ip6: *const [u32; 4], ip4_be: u32) -> Ip6Addr {
    if ctx.family() == u32::from(AF_INET6) {
        // SAFETY: the caller passes a four-word field of this run's context.
        unsafe { read_ip6(ip6) }
    } else {
        Ip6Addr::from_ip4_be(ip4_be)
    }
}

/// The app side of a redirected connection is established: its source port is known now, so
/// index the original destination under the tuple the proxy's socket will see as its peer.
#[inline(always)]
fn index_redirected_connection(ctx: &SockOpsContext) -> Result<(), Error> {
    // connect4/6 redirect to the proxy on loopback: a connection to anywhere else (most of those
    // of unmeshed pods, whose sockets pass here too where the programs are attached node-wide)
    // was not redirected, and is left before its socket is given a cookie and its slot read.
    // SAFETY: `remote_ip6` is a four-word field of this run's context.
    let remote = unsafe { sock_ops_addr(ctx, &raw const (*ctx.ops).remote_ip6, ctx.remote_ip4()) };
    if !remote.is_loopback_or_unspecified() {
        return Ok(());
    }
    // Present only for sockets connect4/connect6 redirected.
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that sock_ops may call it and that the argument is the context.
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let Some((orig, connected_ns)) = connect_slots::take(socket_cookie) else {
        return Ok(());
    };
    let key = PendingKey {
        netns_cookie: orig.netns_cookie,
        // SAFETY: `local_ip6` is a four-word field of this run's context.
        client: unsafe { sock_ops_addr(ctx, &raw const (*ctx.ops).local_ip6, ctx.local_ip4()) },
        client_port: ctx.local_port(),
        _pad: 0,
    };
    let pending = PendingOrigDst {
        addr: orig.addr,
        port_be: orig.port_be,
        counter_slot: orig.counter_slot,
        // SAFETY: `ops` is this run's context; the verifier checks the field read.
        server_isn_next: unsafe { (*ctx.ops).rcv_nxt },
    };
    // The app socket's close frees its slot once the proxy's has closed too: until then its
    // getpeername() is answered. Asked before recording, so a slot is never left waiting for a
    // close that is not reported.
    ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
        .map_err(|errno| Error::CloseNotWatched {
            netns_cookie: orig.netns_cookie,
            errno,
        })?;
    // On failure the proxy's SO_ORIGINAL_DST fails and it refuses the connection (fails closed).
    let tag = pending_phase::app_tag(socket_cookie);
    pending::record(&key, &pending, connected_ns, tag).map_err(|errno| Error::OrigDstNotIndexed {
        netns_cookie: orig.netns_cookie,
        errno,
    })
}

/// The key of a connection as its proxy-side socket sees it.
#[inline(always)]
fn proxy_side_key(ctx: &SockOpsContext) -> PendingKey {
    PendingKey {
        // SAFETY: the helper only reads this run's socket, from its context; the verifier
        // checks that sock_ops may call it and that the argument is the context.
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        // SAFETY: `remote_ip6` is a four-word field of this run's context.
        client: unsafe { sock_ops_addr(ctx, &raw const (*ctx.ops).remote_ip6, ctx.remote_ip4()) },
        // sock_ops keeps the network-order port in the upper 16 bits of remote_port.
        client_port: u32::from(u16::from_be((ctx.remote_port() >> 16) as u16)),
        _pad: 0,
    }
}

/// The proxy side of a connection is established (the app side always is first). If it is a
/// redirected connection, ask for this socket's state changes, so its entry goes when it closes.
#[inline(always)]
fn watch_proxy_side(ctx: &SockOpsContext) -> Result<(), Error> {
    // A redirected connection reaches the proxy on loopback (connect4/6 rewrite to 127.0.0.1,
    // ::ffff:127.0.0.1 or ::1): any other connection (every inbound one) needs no lookup.
    // SAFETY: `local_ip6` is a four-word field of this run's context.
    let local = unsafe { sock_ops_addr(ctx, &raw const (*ctx.ops).local_ip6, ctx.local_ip4()) };
    if !local.is_loopback_or_unspecified() {
        return Ok(());
    }
    let key = proxy_side_key(ctx);
    let isn_next = proxy_side_isn_next(ctx);
    // Watched first (it tells a redirected connection from any other loopback one, which is
    // left without state callbacks), and back to an entry that ages if this socket's closes
    // cannot be reported: a watched entry is held until its proxy side's close.
    if !pending::watch(&key, isn_next) {
        return Ok(());
    }
    ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32)
        .map_err(|errno| {
            pending::unwatch(&key, isn_next);
            Error::CloseNotWatched {
                netns_cookie: key.netns_cookie,
                errno,
            }
        })
}

/// A socket that asked for its state changes closed: the proxy's or the app's side of a
/// redirected connection. Which one is told by the port (the proxy's is a pod's outbound port)
/// and confirmed by the connection's number, so an app whose ephemeral port is another pod's
/// outbound port is still found, as the app side.
#[inline(always)]
fn forget_closed_connection(ctx: &SockOpsContext) {
    let proxy_first = is_outbound_port(ctx.local_port() as u16);
    if proxy_first && pending::proxy_closed(&proxy_side_key(ctx), proxy_side_isn_next(ctx)) {
        return;
    }
    if pending::app_closed(&app_side_key(ctx), app_side_server_isn_next(ctx)) {
        return;
    }
    if !proxy_first {
        pending::proxy_closed(&proxy_side_key(ctx), proxy_side_isn_next(ctx));
    }
}

/// The key of a connection as its app-side socket sees it: its own address and port.
#[inline(always)]
fn app_side_key(ctx: &SockOpsContext) -> PendingKey {
    PendingKey {
        // SAFETY: as in `proxy_side_key`.
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        // SAFETY: `local_ip6` is a four-word field of this run's context.
        client: unsafe { sock_ops_addr(ctx, &raw const (*ctx.ops).local_ip6, ctx.local_ip4()) },
        client_port: ctx.local_port(),
        _pad: 0,
    }
}

/// The proxy side's initial sequence number + 1 as the app's socket knows it: `rcv_nxt` when
/// it was established (what `PendingOrigDst::server_isn_next` holds), `rcv_nxt -
/// bytes_received` for the socket's whole life (a FIN counts in both).
#[inline(always)]
fn app_side_server_isn_next(ctx: &SockOpsContext) -> u32 {
    // SAFETY: `ops` is this run's context; the verifier checks the field reads.
    unsafe {
        (*ctx.ops)
            .rcv_nxt
            .wrapping_sub((*ctx.ops).bytes_received as u32)
    }
}

/// The proxy side's initial sequence number + 1: `snd_una - bytes_acked` for the socket's whole
/// life.
#[inline(always)]
fn proxy_side_isn_next(ctx: &SockOpsContext) -> u32 {
    // SAFETY: `ops` is this run's context; the verifier checks the field reads.
    unsafe {
        (*ctx.ops)
            .snd_una
            .wrapping_sub((*ctx.ops).bytes_acked as u32)
    }
}

/// Runs for every getsockopt under the cgroup: anything but the two original-destination options
/// returns after a few compares with the kernel's own answer untouched.
#[cgroup_sockopt(getsockopt)]
pub fn icpt_getsockopt(ctx: SockoptContext) -> i32 {
    match try_getsockopt(&ctx) {
        Ok(()) => 1,
        // The kernel's own answer stays.
        Err(e) => {
            e.log(&ctx, names::PROG_GETSOCKOPT);
            1
        }
    }
}

#[inline(always)]
fn try_getsockopt(ctx: &SockoptContext) -> Result<(), Error> {
    let so = ctx.sockopt;
    // SAFETY: `so` is the context the kernel passed to this run, valid throughout it; the
    // verifier checks the field reads.
    let (level, optname) = unsafe { ((*so).level, (*so).optname) };
    // SO_ORIGINAL_DST and IP6T_SO_ORIGINAL_DST are both 80.
    if optname != SO_ORIGINAL_DST {
        return Ok(());
    }
    if level == SOL_IP {
        serve_orig_dst(ctx, false)
    } else if level == SOL_IPV6 {
        serve_orig_dst(ctx, true)
    } else {
        Ok(())
    }
}

const _: () = assert!(SO_ORIGINAL_DST == IP6T_SO_ORIGINAL_DST);

/// Answers `SO_ORIGINAL_DST` for IPv4 connections (`ipv6` false) and `IP6T_SO_ORIGINAL_DST` for
/// IPv6 ones, like conntrack: `SOL_IP` works on an `AF_INET6` socket whose connection is IPv4
/// (a dual-stack `[::]` proxy listener), `SOL_IPV6` only for native IPv6 connections.
#[inline(always)]
fn serve_orig_dst(ctx: &SockoptContext, ipv6: bool) -> Result<(), Error> {
    // SAFETY: `sockopt` is this run's context; the verifier checks the field read, and that
    // the socket pointer it holds is only used as `bpf_sock` fields below.
    let sk: *mut bpf_sock = unsafe { (*ctx.sockopt).__bindgen_anon_1.sk };
    // SAFETY: `sk` is the context's socket; the verifier checks each `bpf_sock` field read.
    if unsafe { (*sk).protocol } != IPPROTO_TCP {
        return Ok(());
    }
    // SAFETY: a `bpf_sock` field read, checked by the verifier.
    let (peer, local) = match unsafe { (*sk).family } as u16 {
        AF_INET => (
            // SAFETY: a `bpf_sock` field read, checked by the verifier.
            Ip6Addr::from_ip4_be(unsafe { (*sk).dst_ip4 }),
            // SAFETY: a `bpf_sock` field read, checked by the verifier.
            Ip6Addr::from_ip4_be(unsafe { (*sk).src_ip4 }),
        ),
        AF_INET6 => (
            // SAFETY: `dst_ip6` is a four-word `bpf_sock` field.
            unsafe { read_ip6(&raw const (*sk).dst_ip6) },
            // SAFETY: `src_ip6` is a four-word `bpf_sock` field.
            unsafe { read_ip6(&raw const (*sk).src_ip6) },
        ),
        _ => return Ok(()),
    };
    if peer.is_ip4() == ipv6 {
        return Ok(());
    }
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that getsockopt may call it and that the argument is the context.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: a `bpf_sock` field read, checked by the verifier.
    let local_port = unsafe { (*sk).src_port } as u16;
    let local_port_be = local_port.to_be();
    // The proxy's side of a redirected outbound connection is on loopback (connect4/6 rewrite to
    // 127.0.0.1, ::ffff:127.0.0.1 or ::1). Its entry is almost always in its slot, and carries
    // the pod's counter slot: answered without looking the pod up. Only the slot is read here,
    // so a socket that is not such a connection pays no hash before the pod's lookup below.
    if local.is_loopback_or_unspecified()
        && let Some(pending) = redirected_connection(sk, netns_cookie, peer, pending::find_in_slot)?
    {
        let slot = pending
            .counter_slot
            .slot()
            .or_else(|| pod_config(netns_cookie).map(|pod| pod.slot));
        answer_orig_dst(ctx, &pending, slot);
        return Ok(());
    }
    let Some(pod) = pod_config(netns_cookie) else {
        return Ok(());
    };
    if ipv6 && pod.flags & flags::INTERCEPT_IPV6 == 0 {
        return Ok(());
    }
    // Redirected outbound connections all land on the proxy's outbound port: any other socket
    // (an inbound one above all) needs no lookup.
    if local_port != pod.outbound_port {
        answer_local_address(ctx, local, local_port_be);
        return Ok(());
    }
    match redirected_connection(sk, netns_cookie, peer, pending::find)? {
        Some(pending) => answer_orig_dst(ctx, &pending, Some(pod.slot)),
        None => answer_local_address(ctx, local, local_port_be),
    }
    Ok(())
}

/// The entry of the redirected connection whose proxy-side socket is `sk`, found with `find`
/// (`pending::find` or `pending::find_in_slot`), if there is one.
#[inline(always)]
fn redirected_connection(
    sk: *mut bpf_sock,
    netns_cookie: u64,
    peer: Ip6Addr,
    find: impl FnOnce(&PendingKey, pending::Owner) -> Option<PendingOrigDst>,
) -> Result<Option<PendingOrigDst>, Error> {
    let key = PendingKey {
        netns_cookie,
        client: peer,
        // SAFETY: a `bpf_sock` field read, checked by the verifier.
        client_port: u32::from(u16::from_be(unsafe { (*sk).dst_port })),
        _pad: 0,
    };
    // SAFETY: the helper takes the context's socket, checked by the verifier, and returns
    // null when it is not a full TCP socket.
    let tcp = unsafe { bpf_tcp_sock(sk) };
    if tcp.is_null() {
        return Err(Error::NoTcpSock { netns_cookie });
    }
    // snd_una - bytes_acked is this socket's initial sequence number + 1 for its whole life. An
    // entry that does not match is from an earlier connection that reused the 4-tuple.
    // SAFETY: `tcp` is not null; the verifier checks each `bpf_tcp_sock` field read.
    let isn_next = unsafe { (*tcp).snd_una.wrapping_sub((*tcp).bytes_acked as u32) };
    Ok(find(&key, pending::Owner::Proxy { isn_next }))
}

/// Answers with the connection's original destination, counted in the pod's `counter_slot`
/// where it is known. The entry stays until the socket closes: a proxy may ask more than once.
#[inline(always)]
fn answer_orig_dst(ctx: &SockoptContext, pending: &PendingOrigDst, counter_slot: Option<u32>) {
    write_sockaddr(ctx, pending.addr, pending.port_be);
    if let Some(slot) = counter_slot {
        count(slot, Decision::OrigDstServed);
    }
}

/// Not an outbound-redirected connection: the original destination is the socket's own local
/// address. That is the inbound case (sk_lookup delivers without rewriting addresses), and what
/// conntrack answers for any connection that was not NATed. An answer that is already there
/// (conntrack's, or another instance's during an upgrade) is kept.
#[inline(always)]
fn answer_local_address(ctx: &SockoptContext, local: Ip6Addr, port_be: u16) {
    // SAFETY: `sockopt` is this run's context; the verifier checks the field read.
    if unsafe { (*ctx.sockopt).retval } == 0 {
        return;
    }
    write_sockaddr(ctx, local, port_be);
}

/// Writes `sockaddr_in` for an IPv4 address, `sockaddr_in6` for an IPv6 one, as conntrack does.
#[inline(always)]
fn write_sockaddr(ctx: &SockoptContext, addr: Ip6Addr, port_be: u16) {
    let so = ctx.sockopt;
    // SAFETY: `so` is this run's context; the verifier checks the field reads.
    let (optval, optval_end) = unsafe {
        (
            (*so).__bindgen_anon_2.optval as usize,
            (*so).__bindgen_anon_3.optval_end as usize,
        )
    };
    let len = if addr.is_ip4() {
        SOCKADDR_IN_LEN
    } else {
        SOCKADDR_IN6_LEN
    };
    if optval + len > optval_end {
        // The caller's buffer is too small: leave the kernel's answer.
        return;
    }
    let out = optval as *mut u8;
    // SAFETY: `out..out + len` lies within the kernel's copy of the caller's option buffer
    // (checked just above, as the verifier requires before any store to it); the stores are
    // unaligned ones. `optlen` and `retval` are context fields getsockopt may write.
    unsafe {
        if addr.is_ip4() {
            // sockaddr_in: family, port, address, 8 bytes of zero.
            core::ptr::write_unaligned(out.cast::<u16>(), AF_INET);
            core::ptr::write_unaligned(out.add(2).cast::<u16>(), port_be);
            core::ptr::write_unaligned(out.add(4).cast::<u32>(), addr.ip4_be());
            core::ptr::write_unaligned(out.add(8).cast::<u64>(), 0);
        } else {
            // sockaddr_in6: family, port, flow info, address, scope id.
            core::ptr::write_unaligned(out.cast::<u16>(), AF_INET6);
            core::ptr::write_unaligned(out.add(2).cast::<u16>(), port_be);
            core::ptr::write_unaligned(out.add(4).cast::<u32>(), 0);
            for i in 0..4 {
                core::ptr::write_unaligned(out.add(8 + 4 * i).cast::<u32>(), addr.words_be[i]);
            }
            core::ptr::write_unaligned(out.add(24).cast::<u32>(), 0);
        }
        // Separate volatile stores: LLVM merges adjacent 4-byte context stores into one 8-byte
        // store, which the verifier rejects ("invalid bpf_context access").
        core::ptr::write_volatile(&raw mut (*so).optlen, len as i32);
        core::ptr::write_volatile(&raw mut (*so).retval, 0);
    }
}
