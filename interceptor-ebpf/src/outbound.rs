//! `cgroup/connect4` and `cgroup/connect6`: the outbound decision (`decide`, the first rule that
//! matches wins) and the rewrite to the proxy's outbound port.
//!
//! An `AF_INET6` socket connecting to `::ffff:a.b.c.d` makes an IPv4 connection that only
//! connect6 sees: it gets the IPv4 rules and is rewritten to `::ffff:127.0.0.1`, which keeps
//! the socket's connection IPv4 (the proxy's outbound listener is on 127.0.0.1). It is
//! intercepted whatever `--ipv6` says, as iptables' IPv4 rules see its packets.
use aya_ebpf::{
    EbpfContext as _,
    bindings::bpf_sock_addr,
    helpers::{
        bpf_get_current_uid_gid,
        generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    },
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use interceptor_common::{
    CounterSlotTag, Ip6Addr, OrigDst, PodConfig,
    counters::Decision,
    names,
    pod::{direction, flags},
};

use crate::{
    connect_slots, creds,
    error::Error,
    maps::{count, in_subnets, pod_config, read_ip6},
};

const ALLOW: i32 = 1;
const IPPROTO_TCP: u32 = 6;
const LOCALHOST_BE: u32 = u32::from_be_bytes([127, 0, 0, 1]).to_be();

#[cgroup_sock_addr(connect4)]
pub fn icpt_connect4(ctx: SockAddrContext) -> i32 {
    connect4::<true>(&ctx, names::PROG_CONNECT4)
}

#[cgroup_sock_addr(connect6)]
pub fn icpt_connect6(ctx: SockAddrContext) -> i32 {
    connect6::<true>(&ctx, names::PROG_CONNECT6)
}

/// For kernels where connect4/6 cannot read a socket's creator (see `creds`): the proxy's UID
/// and GID are told by the connecting task's real IDs.
#[cgroup_sock_addr(connect4)]
pub fn icpt_conn4_task(ctx: SockAddrContext) -> i32 {
    connect4::<false>(&ctx, names::PROG_CONNECT4_TASK)
}

#[cgroup_sock_addr(connect6)]
pub fn icpt_conn6_task(ctx: SockAddrContext) -> i32 {
    connect6::<false>(&ctx, names::PROG_CONNECT6_TASK)
}

/// `CREATOR`: whether the proxy's UID and GID are told by the socket's creator, as iptables'
/// owner match tells them, or by the task's real IDs.
#[inline(always)]
fn connect4<const CREATOR: bool>(ctx: &SockAddrContext, program: &'static str) -> i32 {
    match try_connect4::<CREATOR>(ctx) {
        Ok(()) => ALLOW,
        // Never refuse a connect: a decision either leaves it alone or rewrites it, and a
        // rewritten connect whose original destination could not be recorded still goes to the
        // proxy, which refuses it (letting it through would bypass the proxy).
        Err(e) => {
            e.log(ctx, program);
            ALLOW
        }
    }
}

#[inline(always)]
fn connect6<const CREATOR: bool>(ctx: &SockAddrContext, program: &'static str) -> i32 {
    match try_connect6::<CREATOR>(ctx) {
        Ok(()) => ALLOW,
        Err(e) => {
            e.log(ctx, program);
            ALLOW
        }
    }
}

/// The pod a TCP connect belongs to, if its network namespace is meshed. Sockets outside meshed
/// pods cost one failed hash lookup, nothing else.
#[inline(always)]
fn meshed_pod(ctx: &SockAddrContext) -> Option<(u64, &'static PodConfig)> {
    // SAFETY: `sock_addr` is the context the kernel passed to this run, valid throughout it;
    // the verifier checks the field read.
    if unsafe { (*ctx.sock_addr).protocol } != IPPROTO_TCP {
        return None;
    }
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that connect4/6 may call it and that the argument is the context.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let pod = pod_config(netns_cookie)?;
    Some((netns_cookie, pod))
}

#[inline(always)]
fn try_connect4<const CREATOR: bool>(ctx: &SockAddrContext) -> Result<(), Error> {
    let Some((netns_cookie, pod)) = meshed_pod(ctx) else {
        return Ok(());
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `sa` is this run's context; the verifier checks the field read.
    let dst = Ip6Addr::from_ip4_be(unsafe { (*sa).user_ip4 });
    let Some(orig) = intercept::<CREATOR>(ctx, pod, netns_cookie, dst) else {
        return Ok(());
    };
    // SAFETY: `sa` is this run's context, whose destination connect4 may rewrite; the
    // verifier checks both 4-byte stores.
    unsafe {
        (*sa).user_ip4 = LOCALHOST_BE;
        (*sa).user_port = u32::from(pod.outbound_port.to_be());
    }
    record_orig_dst(ctx, pod, &orig)
}

#[inline(always)]
fn try_connect6<const CREATOR: bool>(ctx: &SockAddrContext) -> Result<(), Error> {
    let Some((netns_cookie, pod)) = meshed_pod(ctx) else {
        return Ok(());
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `user_ip6` is a four-word field of this run's context.
    let dst = unsafe { read_ip6(&raw const (*sa).user_ip6) };
    if !dst.is_ip4() && pod.flags & flags::INTERCEPT_IPV6 == 0 {
        count(pod.slot, Decision::Ipv6NotIntercepted);
        return Ok(());
    }
    let Some(orig) = intercept::<CREATOR>(ctx, pod, netns_cookie, dst) else {
        return Ok(());
    };
    let proxy = if dst.is_ip4() {
        Ip6Addr::from_ip4_be(LOCALHOST_BE)
    } else {
        Ip6Addr::LOOPBACK
    };
    // SAFETY: `sa` is this run's context, whose destination connect6 may rewrite; the
    // verifier checks each 4-byte store.
    unsafe {
        // One 4-byte store per word: the verifier rejects wider stores to user_ip6.
        let words = (&raw mut (*sa).user_ip6).cast::<u32>();
        core::ptr::write_volatile(words, proxy.words_be[0]);
        core::ptr::write_volatile(words.add(1), proxy.words_be[1]);
        core::ptr::write_volatile(words.add(2), proxy.words_be[2]);
        core::ptr::write_volatile(words.add(3), proxy.words_be[3]);
        (*sa).user_port = u32::from(pod.outbound_port.to_be());
    }
    record_orig_dst(ctx, pod, &orig)
}

/// Decides and counts. Returns the original destination when the connect is to be redirected
/// (the caller then rewrites it to the proxy).
#[inline(always)]
fn intercept<const CREATOR: bool>(
    ctx: &SockAddrContext,
    pod: &PodConfig,
    netns_cookie: u64,
    dst: Ip6Addr,
) -> Option<OrigDst> {
    // user_port holds the port in network order in its low 16 bits.
    // SAFETY: `sock_addr` is this run's context; the verifier checks the field read.
    let dst_port_be = unsafe { (*ctx.sock_addr).user_port } as u16;
    let decision = decide::<CREATOR>(ctx, pod, netns_cookie, dst, dst_port_be);
    count(pod.slot, decision);
    if decision != Decision::Redirected {
        return None;
    }
    Some(OrigDst {
        netns_cookie,
        addr: dst,
        port_be: dst_port_be,
        counter_slot: CounterSlotTag::of(pod.slot),
        _pad2: 0,
    })
}

/// Records a redirected connect's original destination, for the proxy's `SO_ORIGINAL_DST`.
#[inline(always)]
fn record_orig_dst(ctx: &SockAddrContext, pod: &PodConfig, orig: &OrigDst) -> Result<(), Error> {
    // By the socket cookie, unique for the machine's uptime (creating socket storage here cost
    // about 1 µs more per connection than an LRU insert, measured with bpf_stats).
    // SAFETY: the helper only reads this run's socket, from its context; the verifier checks
    // that connect4/6 may call it and that the argument is the context.
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    connect_slots::record(socket_cookie, orig).map_err(|errno| {
        count(pod.slot, Decision::OrigDstNotRecorded);
        Error::OrigDstNotRecorded {
            netns_cookie: orig.netns_cookie,
            errno,
        }
    })
}

#[inline(always)]
fn decide<const CREATOR: bool>(
    ctx: &SockAddrContext,
    pod: &PodConfig,
    netns_cookie: u64,
    dst: Ip6Addr,
    dst_port_be: u16,
) -> Decision {
    if pod.flags & (flags::HAS_PROXY_UID | flags::HAS_PROXY_GID) != 0
        && let Some((uid, gid)) = owner::<CREATOR>(ctx)
    {
        if pod.flags & flags::HAS_PROXY_UID != 0 && uid == pod.proxy_uid {
            return Decision::ProxyUid;
        }
        if pod.flags & flags::HAS_PROXY_GID != 0 && gid == pod.proxy_gid {
            return Decision::ProxyGid;
        }
    }
    // Routed over lo, like iptables' `-o lo -j RETURN`.
    if dst.is_loopback_or_unspecified() {
        return Decision::Loopback;
    }
    if pod.is_own_address(dst) {
        return Decision::PodAddress;
    }
    // A `local` route's prefix (AnyIP) is delivered over lo too; looked up only for a pod that
    // has one beyond its own addresses.
    if pod.flags & flags::HAS_LOCAL_ROUTES != 0
        && in_subnets(netns_cookie, direction::LOCAL_ROUTE, dst)
    {
        return Decision::Loopback;
    }
    if pod.outbound_ignore_ports_be.contains(dst_port_be) {
        return Decision::IgnoredPort;
    }
    let subnets = if dst.is_ip4() {
        flags::HAS_OUTBOUND_SUBNETS_V4
    } else {
        flags::HAS_OUTBOUND_SUBNETS_V6
    };
    if pod.flags & subnets != 0 && in_subnets(netns_cookie, direction::OUTBOUND, dst) {
        return Decision::IgnoredSubnet;
    }
    Decision::Redirected
}

/// The (UID, GID) the proxy's exemption is told by, as the host knows them (the agent wrote
/// the pod's proxy ids translated out of its user namespace): with `CREATOR` the socket's
/// creator's (`fsuid`, `fsgid`, what iptables' owner match reads), and none for a socket
/// without a file, which the owner match never matches; else the connecting task's real IDs.
#[inline(always)]
fn owner<const CREATOR: bool>(ctx: &SockAddrContext) -> Option<(u32, u32)> {
    if CREATOR {
        return creds::socket_creator(ctx);
    }
    let uid_gid = bpf_get_current_uid_gid();
    Some((uid_gid as u32, (uid_gid >> 32) as u32))
}
