//! `sk_lookup`: steers inbound TCP to the proxy's inbound listener (`decide`, the first rule that
//! matches wins).
//!
//! sk_lookup attaches to a network namespace and cannot ask which one it runs in (the verifier
//! rejects `bpf_get_netns_cookie` there), so each pod's namespace gets a program of its own: a
//! few instructions, assembled and loaded by userspace per pod (`interceptor::ebpf::pod_lookup`),
//! that write the pod's netns cookie to `LOOKUP_POD` and tail-call this program, which is
//! loaded and verified once. Loading a copy of this program per pod instead took about 1.2 ms of
//! verification per registration.
//!
//! IPv4 connections are looked up as IPv4 whatever socket will take them, so they are steered
//! whatever `--ipv6` says, to the proxy's IPv4 listener or, when it has none, to its dual-stack
//! `[::]` one. Native IPv6 connections are steered with `--ipv6`, to an IPv6 listener.
use aya_ebpf::{bindings::bpf_sk_lookup, macros::sk_lookup, programs::SkLookupContext};
use interceptor_common::{
    Ip6Addr, ListenerKey, PodConfig,
    addr::family,
    counters::Decision,
    names,
    pod::{direction, flags},
    sk_lookup_ctx,
};

use crate::{
    error::Error,
    maps::{LISTENERS, LOOKUP_POD, count, in_subnets, pod_config, read_ip6},
};

// The pods' own programs read these two fields at offsets userspace cannot take from bindings.
const _: () = assert!(
    core::mem::offset_of!(bpf_sk_lookup, protocol) == sk_lookup_ctx::PROTOCOL as usize
        && core::mem::offset_of!(bpf_sk_lookup, ingress_ifindex)
            == sk_lookup_ctx::INGRESS_IFINDEX as usize
);

const SK_PASS: u32 = 1;
const SK_DROP: u32 = 0;
const IPPROTO_TCP: u32 = 6;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const LOOPBACK_IFINDEX: u32 = 1;

#[sk_lookup]
pub fn icpt_sk_lookup(ctx: SkLookupContext) -> u32 {
    sk_lookup::<true>(&ctx)
}

/// For kernels whose sk_lookup context has no `ingress_ifindex` (before 5.17; the verifier
/// rejects the read with "invalid bpf_context access off=64 size=4"): the pod talking to itself
/// is told by the source address alone, a loopback one or one of the pod's own. Over lo, a
/// connection's source is always one of these: an address of the namespace's own.
#[sk_lookup]
pub fn icpt_sklkp_addr(ctx: SkLookupContext) -> u32 {
    sk_lookup::<false>(&ctx)
}

/// `BY_IFINDEX`: whether loopback is told by the ingress interface or by the source address.
#[inline(always)]
fn sk_lookup<const BY_IFINDEX: bool>(ctx: &SkLookupContext) -> u32 {
    match try_sk_lookup::<BY_IFINDEX>(ctx) {
        Ok(()) => SK_PASS,
        // The proxy is not listening: the connection is refused, as with iptables REDIRECT to a
        // closed port, instead of reaching the app around the proxy.
        Err(e) => {
            e.log(ctx, names::PROG_SK_LOOKUP);
            SK_DROP
        }
    }
}

/// Steers the connection, or leaves it to the kernel's own lookup. An error means it was to be
/// steered and cannot be.
#[inline(always)]
fn try_sk_lookup<const BY_IFINDEX: bool>(ctx: &SkLookupContext) -> Result<(), Error> {
    let lookup: *mut bpf_sk_lookup = ctx.lookup;
    // SAFETY: `lookup` is the context the kernel passed to this run, valid throughout it; the
    // verifier checks the field read.
    if unsafe { (*lookup).protocol } != IPPROTO_TCP {
        return Ok(());
    }
    // SAFETY: a field read of this run's context, checked by the verifier.
    let is_ip4 = match unsafe { (*lookup).family } {
        AF_INET => true,
        AF_INET6 => false,
        _ => return Ok(()),
    };
    // Another sk_lookup program (e.g. a second instance during an upgrade) already chose a
    // socket: leave its choice, assigning again would fail.
    // SAFETY: a field read of this run's context, checked by the verifier; the union holds
    // the pointer of the socket already chosen, null if none.
    if !unsafe { (*lookup).__bindgen_anon_1.__bindgen_anon_1.sk }.is_null() {
        return Ok(());
    }
    let Some(&netns_cookie) = LOOKUP_POD.get(0) else {
        return Ok(());
    };
    let Some(pod) = pod_config(netns_cookie) else {
        return Ok(());
    };
    if !is_ip4 && pod.flags & flags::INTERCEPT_IPV6 == 0 {
        count(pod.slot, Decision::InboundIpv6NotIntercepted);
        return Ok(());
    }
    let remote = if is_ip4 {
        // SAFETY: a field read of this run's context, checked by the verifier.
        Ip6Addr::from_ip4_be(unsafe { (*lookup).remote_ip4 })
    } else {
        // SAFETY: `remote_ip6` is a four-word field of this run's context.
        unsafe { read_ip6(&raw const (*lookup).remote_ip6) }
    };
    // Read once, here: a read at each use let LLVM keep `ctx + 60` in a register across the
    // calls, and the verifier rejects a context pointer that was moved ("dereference of modified
    // ctx ptr").
    // SAFETY: a field read of this run's context, checked by the verifier.
    let local_port = unsafe { core::ptr::read_volatile(&raw const (*lookup).local_port) };
    let decision = decide::<BY_IFINDEX>(ctx, pod, netns_cookie, remote, local_port as u16);
    if decision != Decision::Steered {
        count(pod.slot, decision);
        return Ok(());
    }
    if steer(ctx, netns_cookie, is_ip4) {
        count(pod.slot, Decision::Steered);
        Ok(())
    } else {
        count(pod.slot, Decision::InboundNoListener);
        Err(Error::NoListener {
            netns_cookie,
            port: local_port,
        })
    }
}

/// Hands the connection to the proxy's listener of its family; an IPv4 connection falls back to
/// an IPv6 listener, which takes it if it is dual-stack (the kernel refuses an `IPV6_V6ONLY`
/// one).
#[inline(always)]
fn steer(ctx: &SkLookupContext, netns_cookie: u64, is_ip4: bool) -> bool {
    let key = |family| ListenerKey {
        netns_cookie,
        family,
        _pad: 0,
    };
    if !is_ip4 {
        return LISTENERS
            .redirect_sk_lookup(ctx, key(family::IPV6), 0)
            .is_ok();
    }
    LISTENERS
        .redirect_sk_lookup(ctx, key(family::IPV4), 0)
        .is_ok()
        || LISTENERS
            .redirect_sk_lookup(ctx, key(family::IPV6), 0)
            .is_ok()
}

#[inline(always)]
fn decide<const BY_IFINDEX: bool>(
    ctx: &SkLookupContext,
    pod: &PodConfig,
    netns_cookie: u64,
    remote: Ip6Addr,
    local_port: u16,
) -> Decision {
    let lookup: *mut bpf_sk_lookup = ctx.lookup;
    // From the pod itself: over lo, or from one of its own addresses (a connection to its own
    // veth address arrives with the veth's ifindex). iptables' PREROUTING never sees these. The
    // pod's own program lets lo through before the tail call; the check stays for a program of
    // an older agent during an upgrade.
    let over_lo = if BY_IFINDEX {
        // SAFETY: a field read of this run's context, checked by the verifier.
        (unsafe { (*lookup).ingress_ifindex }) == LOOPBACK_IFINDEX
    } else {
        // A connection to one of the pod's `local` routes (AnyIP) comes from an address in it.
        remote.is_loopback_or_unspecified()
            || (pod.flags & flags::HAS_LOCAL_ROUTES != 0
                && in_subnets(netns_cookie, direction::LOCAL_ROUTE, remote))
    };
    if over_lo || pod.is_own_address(remote) {
        return Decision::InboundFromPod;
    }
    if pod.inbound_ignore_ports.contains(local_port) {
        return Decision::InboundIgnoredPort;
    }
    let subnets = if remote.is_ip4() {
        flags::HAS_INBOUND_SUBNETS_V4
    } else {
        flags::HAS_INBOUND_SUBNETS_V6
    };
    if pod.flags & subnets != 0 && in_subnets(netns_cookie, direction::INBOUND, remote) {
        return Decision::InboundIgnoredSubnet;
    }
    if pod.flags & flags::HAS_PORTS_TO_REDIRECT != 0 && !pod.redirect_ports.contains(local_port) {
        return Decision::InboundPortNotRedirected;
    }
    // The kernel's own lookup gives the proxy's inbound port to the proxy, as iptables' REDIRECT
    // of it to itself does. Every other port not exempted above is steered, the proxy's outbound
    // port too: proxy-init's PREROUTING sends it to the inbound proxy, whose listener on
    // 127.0.0.1 would otherwise refuse it.
    if local_port == pod.inbound_port {
        return Decision::InboundProxyPort;
    }
    Decision::Steered
}
