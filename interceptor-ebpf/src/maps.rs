//! Every map of the object. Names come from `interceptor_common::names` (the `name` arguments
//! must be literals, so the loader checks they match at load time).
use aya_ebpf::{
    macros::map,
    maps::{HashMap, LpmTrie, LruHashMap, PerCpuArray, SockHash, lpm_trie::Key},
};
use interceptor_common::{
    DEFAULT_PENDING_ORIG_DST_CAPACITY, LocalAddrKey, MAX_LOCAL_ADDRS_PER_POD, MAX_PODS,
    MAX_SUBNET_RULES, OrigDst, PendingKey, PendingOrigDst, PodConfig, PodCounters,
    SUBNET_KEY_FIXED_BITS, SubnetKey, counters::Decision,
};

/// Not preallocated: a `PodConfig` is 24 KiB and most nodes run far fewer than `MAX_PODS` pods.
#[map(name = "ICPT_PODS")]
pub static PODS: HashMap<u64, PodConfig> =
    HashMap::with_max_entries(MAX_PODS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

#[map(name = "ICPT_LOCAL_ADDRS")]
pub static LOCAL_ADDRS: HashMap<LocalAddrKey, u8> =
    HashMap::with_max_entries(MAX_PODS * MAX_LOCAL_ADDRS_PER_POD, 0);

#[map(name = "ICPT_SUBNETS")]
pub static SUBNETS: LpmTrie<SubnetKey, u8> = LpmTrie::with_max_entries(MAX_SUBNET_RULES, 0);

#[map(name = "ICPT_COUNTERS")]
pub static COUNTERS: PerCpuArray<PodCounters> = PerCpuArray::with_max_entries(MAX_PODS, 0);

/// Socket cookie -> original destination of a redirected app socket that is connecting; moved
/// to `PENDING` by sock_ops once the socket is established. Entries of connects that never
/// complete are evicted least-recently-used. Resized with `PENDING` (`--orig-dst-capacity`).
#[map(name = "ICPT_CONNECTING")]
pub static CONNECTING: LruHashMap<u64, OrigDst> =
    LruHashMap::with_max_entries(DEFAULT_PENDING_ORIG_DST_CAPACITY, 0);

/// Userspace may resize it at load time (`--orig-dst-capacity`).
#[map(name = "ICPT_PENDING")]
pub static PENDING: LruHashMap<PendingKey, PendingOrigDst> =
    LruHashMap::with_max_entries(DEFAULT_PENDING_ORIG_DST_CAPACITY, 0);

/// The proxy's inbound listener per pod. The kernel removes a socket when it closes; the next
/// listen() on the inbound port puts the new one in.
#[map(name = "ICPT_LISTENERS")]
pub static LISTENERS: SockHash<u64> = SockHash::with_max_entries(MAX_PODS, 0);

/// Whether `ip4_be` is in one of the pod's subnets for `direction`.
#[inline(always)]
pub fn in_subnets(netns_cookie: u64, direction: u32, ip4_be: u32) -> bool {
    let key = Key::new(
        SUBNET_KEY_FIXED_BITS + 32,
        SubnetKey {
            netns_cookie,
            direction,
            ip4_be,
        },
    );
    SUBNETS.get(&key).is_some()
}

#[inline(always)]
pub fn count(slot: u32, decision: Decision) {
    if let Some(counters) = COUNTERS.get_ptr_mut(slot) {
        // Per-CPU value: no other CPU writes it, so a plain increment is exact.
        unsafe { (*counters).values[decision as usize] += 1 };
    }
}
