//! `cgroup/connect4`: the outbound decision (SPEC "Outbound", first match wins) and the rewrite
//! to the proxy's outbound port.
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
    LocalAddrKey, OrigDst, PodConfig,
    counters::Decision,
    pod::{direction, flags},
};

use crate::maps::{CONNECTING, LOCAL_ADDRS, PODS, count, in_subnets};

const ALLOW: i32 = 1;
const IPPROTO_TCP: u32 = 6;
const LOCALHOST_BE: u32 = u32::from_be_bytes([127, 0, 0, 1]).to_be();

#[cgroup_sock_addr(connect4)]
pub fn icpt_connect4(ctx: SockAddrContext) -> i32 {
    try_connect4(&ctx);
    // Never refuse a connect: a decision either leaves it alone or rewrites it.
    ALLOW
}

#[inline(always)]
fn try_connect4(ctx: &SockAddrContext) {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    if unsafe { (*sa).protocol } != IPPROTO_TCP {
        return;
    }
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // Sockets outside meshed pods: one failed hash lookup, nothing else.
    let Some(pod) = (unsafe { PODS.get(&netns_cookie) }) else {
        return;
    };
    let dst_ip4_be = unsafe { (*sa).user_ip4 };
    // user_port holds the port in network order in its low 16 bits.
    let dst_port_be = unsafe { (*sa).user_port } as u16;

    let decision = decide(pod, netns_cookie, dst_ip4_be, u16::from_be(dst_port_be));
    if decision != Decision::Redirected {
        count(pod.slot, decision);
        return;
    }

    let orig = OrigDst {
        netns_cookie,
        ip4_be: dst_ip4_be,
        port_be: dst_port_be,
        _pad: 0,
    };
    // Keyed by the socket cookie, unique for the machine's uptime: a plain LRU insert, about
    // 1 µs cheaper per connection than creating socket storage here (measured with bpf_stats).
    let socket_cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if CONNECTING.insert(&socket_cookie, &orig, 0).is_err() {
        // Still redirect: the proxy's SO_ORIGINAL_DST will not find it and the proxy refuses
        // the connection, which fails closed; letting it through would bypass the proxy.
        count(pod.slot, Decision::OrigDstNotRecorded);
    }
    unsafe {
        (*sa).user_ip4 = LOCALHOST_BE;
        (*sa).user_port = u32::from(pod.outbound_port.to_be());
    }
    count(pod.slot, Decision::Redirected);
}

#[inline(always)]
fn decide(pod: &PodConfig, netns_cookie: u64, dst_ip4_be: u32, dst_port: u16) -> Decision {
    let uid_gid = bpf_get_current_uid_gid();
    if pod.flags & flags::HAS_PROXY_UID != 0 && uid_gid as u32 == pod.proxy_uid {
        return Decision::ProxyUid;
    }
    if pod.flags & flags::HAS_PROXY_GID != 0 && (uid_gid >> 32) as u32 == pod.proxy_gid {
        return Decision::ProxyGid;
    }
    let dst_ip4 = u32::from_be(dst_ip4_be);
    // 0.0.0.0 connects to the local host, like 127.0.0.0/8: both are routed over lo.
    if dst_ip4 >> 24 == 127 || dst_ip4 == 0 {
        return Decision::Loopback;
    }
    let local = LocalAddrKey {
        netns_cookie,
        ip4_be: dst_ip4_be,
        _pad: 0,
    };
    if unsafe { LOCAL_ADDRS.get(&local) }.is_some() {
        return Decision::PodAddress;
    }
    if pod.outbound_ignore_ports.contains(dst_port) {
        return Decision::IgnoredPort;
    }
    if pod.flags & flags::HAS_OUTBOUND_SUBNETS != 0
        && in_subnets(netns_cookie, direction::OUTBOUND, dst_ip4_be)
    {
        return Decision::IgnoredSubnet;
    }
    Decision::Redirected
}
