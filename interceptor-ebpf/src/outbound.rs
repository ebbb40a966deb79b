//! `cgroup/connect4` and `cgroup/connect6`: the outbound decision (SPEC "Outbound", first match
//! wins) and the rewrite to the proxy's outbound port.
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
    Ip6Addr, OrigDst, PodConfig,
    counters::Decision,
    pod::{direction, flags},
};

use crate::maps::{CONNECTING, PODS, count, in_subnets, is_pod_address, read_ip6};

const ALLOW: i32 = 1;
const IPPROTO_TCP: u32 = 6;
const LOCALHOST_BE: u32 = u32::from_be_bytes([127, 0, 0, 1]).to_be();

#[cgroup_sock_addr(connect4)]
pub fn icpt_connect4(ctx: SockAddrContext) -> i32 {
    try_connect4(&ctx);
    // Never refuse a connect: a decision either leaves it alone or rewrites it.
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn icpt_connect6(ctx: SockAddrContext) -> i32 {
    try_connect6(&ctx);
    ALLOW
}

/// The pod a TCP connect belongs to, if its network namespace is meshed. Sockets outside meshed
/// pods cost one failed hash lookup, nothing else.
#[inline(always)]
fn meshed_pod(ctx: &SockAddrContext) -> Option<(u64, &'static PodConfig)> {
    if unsafe { (*ctx.sock_addr).protocol } != IPPROTO_TCP {
        return None;
    }
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let pod = unsafe { PODS.get(&netns_cookie) }?;
    Some((netns_cookie, pod))
}

#[inline(always)]
fn try_connect4(ctx: &SockAddrContext) {
    let Some((netns_cookie, pod)) = meshed_pod(ctx) else {
        return;
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    let dst = Ip6Addr::from_ip4_be(unsafe { (*sa).user_ip4 });
    if redirect(ctx, pod, netns_cookie, dst) {
        unsafe {
            (*sa).user_ip4 = LOCALHOST_BE;
            (*sa).user_port = u32::from(pod.outbound_port.to_be());
        }
    }
}

#[inline(always)]
fn try_connect6(ctx: &SockAddrContext) {
    let Some((netns_cookie, pod)) = meshed_pod(ctx) else {
        return;
    };
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    let dst = read_ip6(unsafe { &raw const (*sa).user_ip6 });
    if !dst.is_ip4() && pod.flags & flags::INTERCEPT_IPV6 == 0 {
        count(pod.slot, Decision::Ipv6NotIntercepted);
        return;
    }
    if !redirect(ctx, pod, netns_cookie, dst) {
        return;
    }
    let proxy = if dst.is_ip4() {
        Ip6Addr::from_ip4_be(LOCALHOST_BE)
    } else {
        Ip6Addr::LOOPBACK
    };
    unsafe {
        // One 4-byte store per word: the verifier rejects wider stores to user_ip6.
        let words = (&raw mut (*sa).user_ip6).cast::<u32>();
        core::ptr::write_volatile(words, proxy.words_be[0]);
        core::ptr::write_volatile(words.add(1), proxy.words_be[1]);
        core::ptr::write_volatile(words.add(2), proxy.words_be[2]);
        core::ptr::write_volatile(words.add(3), proxy.words_be[3]);
        (*sa).user_port = u32::from(pod.outbound_port.to_be());
    }
}

/// Decides, counts, and when the connect is to be redirected records its original destination.
/// Returns whether the caller must rewrite the destination to the proxy.
#[inline(always)]
fn redirect(ctx: &SockAddrContext, pod: &PodConfig, netns_cookie: u64, dst: Ip6Addr) -> bool {
    // user_port holds the port in network order in its low 16 bits.
    let dst_port_be = unsafe { (*ctx.sock_addr).user_port } as u16;
    let decision = decide(pod, netns_cookie, dst, u16::from_be(dst_port_be));
    if decision != Decision::Redirected {
        count(pod.slot, decision);
        return false;
    }
    let orig = OrigDst {
        netns_cookie,
        addr: dst,
        port_be: dst_port_be,
        _pad: 0,
        _pad2: 0,
    };
    // Keyed by the socket cookie, unique for the machine's uptime: a plain LRU insert, about
    // 1 µs cheaper per connection than creating socket storage here (measured with bpf_stats).
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if CONNECTING.insert(&socket_cookie, &orig, 0).is_err() {
        // Still redirect: the proxy's SO_ORIGINAL_DST will not find it and the proxy refuses
        // the connection, which fails closed; letting it through would bypass the proxy.
        count(pod.slot, Decision::OrigDstNotRecorded);
    }
    count(pod.slot, Decision::Redirected);
    true
}

#[inline(always)]
fn decide(pod: &PodConfig, netns_cookie: u64, dst: Ip6Addr, dst_port: u16) -> Decision {
    let uid_gid = bpf_get_current_uid_gid();
    if pod.flags & flags::HAS_PROXY_UID != 0 && uid_gid as u32 == pod.proxy_uid {
        return Decision::ProxyUid;
    }
    if pod.flags & flags::HAS_PROXY_GID != 0 && (uid_gid >> 32) as u32 == pod.proxy_gid {
        return Decision::ProxyGid;
    }
    // Routed over lo, like iptables' `-o lo -j RETURN`.
    if dst.is_loopback_or_unspecified() {
        return Decision::Loopback;
    }
    if is_pod_address(netns_cookie, dst) {
        return Decision::PodAddress;
    }
    if pod.outbound_ignore_ports.contains(dst_port) {
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
