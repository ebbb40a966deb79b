//! `sk_lookup`: steers inbound TCP to the proxy's inbound listener (SPEC "Inbound", first match
//! wins). One instance per pod, attached to the pod's network namespace.
use aya_ebpf::{bindings::bpf_sk_lookup, macros::sk_lookup, programs::SkLookupContext};
use interceptor_common::{
    LocalAddrKey, PodConfig,
    counters::Decision,
    pod::{direction, flags},
};

use crate::maps::{LISTENERS, LOCAL_ADDRS, PODS, count, in_subnets};

const SK_PASS: u32 = 1;
const SK_DROP: u32 = 0;
const IPPROTO_TCP: u32 = 6;
const AF_INET: u32 = 2;
const LOOPBACK_IFINDEX: u32 = 1;

/// The cookie of the namespace this instance is attached to, set by the loader: the verifier
/// rejects `bpf_get_netns_cookie` in sk_lookup programs.
#[unsafe(no_mangle)]
static POD_NETNS_COOKIE: u64 = 0;

#[sk_lookup]
pub fn icpt_sk_lookup(ctx: SkLookupContext) -> u32 {
    let lookup: *mut bpf_sk_lookup = ctx.lookup;
    if unsafe { (*lookup).protocol } != IPPROTO_TCP || unsafe { (*lookup).family } != AF_INET {
        return SK_PASS;
    }
    // Another sk_lookup program (e.g. a second instance during an upgrade) already chose a
    // socket: leave its choice, assigning again would fail.
    if !unsafe { (*lookup).__bindgen_anon_1.__bindgen_anon_1.sk }.is_null() {
        return SK_PASS;
    }
    let netns_cookie = unsafe { core::ptr::read_volatile(&POD_NETNS_COOKIE) };
    let Some(pod) = (unsafe { PODS.get(&netns_cookie) }) else {
        return SK_PASS;
    };
    let decision = decide(lookup, pod, netns_cookie);
    if decision != Decision::Steered {
        count(pod.slot, decision);
        return SK_PASS;
    }
    // SK_DROP when the proxy is not listening: the connection is refused, as with iptables
    // REDIRECT to a closed port, instead of reaching the app around the proxy.
    match LISTENERS.redirect_sk_lookup(&ctx, netns_cookie, 0) {
        Ok(()) => {
            count(pod.slot, Decision::Steered);
            SK_PASS
        }
        Err(_) => {
            count(pod.slot, Decision::InboundNoListener);
            SK_DROP
        }
    }
}

#[inline(always)]
fn decide(lookup: *mut bpf_sk_lookup, pod: &PodConfig, netns_cookie: u64) -> Decision {
    let remote_ip4_be = unsafe { (*lookup).remote_ip4 };
    let local_port = unsafe { (*lookup).local_port } as u16;
    // From the pod itself: over lo, or from one of its own addresses (a connection to its own
    // veth address arrives with the veth's ifindex). iptables' PREROUTING never sees these.
    let from_pod = unsafe { (*lookup).ingress_ifindex } == LOOPBACK_IFINDEX
        || unsafe {
            LOCAL_ADDRS.get(&LocalAddrKey {
                netns_cookie,
                ip4_be: remote_ip4_be,
                _pad: 0,
            })
        }
        .is_some();
    if from_pod {
        return Decision::InboundFromPod;
    }
    if pod.inbound_ignore_ports.contains(local_port) {
        return Decision::InboundIgnoredPort;
    }
    if pod.flags & flags::HAS_INBOUND_SUBNETS != 0
        && in_subnets(netns_cookie, direction::INBOUND, remote_ip4_be)
    {
        return Decision::InboundIgnoredSubnet;
    }
    if pod.flags & flags::HAS_PORTS_TO_REDIRECT != 0 && !pod.redirect_ports.contains(local_port) {
        return Decision::InboundPortNotRedirected;
    }
    if local_port == pod.inbound_port || local_port == pod.outbound_port {
        return Decision::InboundProxyPort;
    }
    Decision::Steered
}
