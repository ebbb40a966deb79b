//! Every map of the object. Names come from `interceptor_common::names` (the `name` arguments
//! must be literals, so the loader checks they match at load time).
use aya_ebpf::{
    macros::map,
    maps::{
        Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, SockHash, lpm_trie::Key,
    },
};
use interceptor_common::{
    CONNECT_SLOTS, ConnectSlot, DEFAULT_PENDING_ORIG_DST_CAPACITY, Ip6Addr, ListenerKey, MAX_PODS,
    MAX_SUBNET_RULES, OrigDst, PENDING_SLOTS, PendingKey, PendingSlot, PodConfig, PodCounters,
    SUBNET_KEY_FIXED_BITS, SubnetKey, addr::family, counters::Decision, outbound_ports,
};

/// Not preallocated: a `PodConfig` is 24 KiB and most nodes run far fewer than `MAX_PODS` pods.
#[map(name = "ICPT_PODS")]
pub static PODS: HashMap<u64, PodConfig> =
    HashMap::with_max_entries(MAX_PODS, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

#[map(name = "ICPT_SUBNETS")]
pub static SUBNETS: LpmTrie<SubnetKey, u8> = LpmTrie::with_max_entries(MAX_SUBNET_RULES, 0);

#[map(name = "ICPT_COUNTERS")]
pub static COUNTERS: PerCpuArray<PodCounters> = PerCpuArray::with_max_entries(MAX_PODS, 0);

/// The original destination of a redirected app socket that is connecting, in the slot of its
/// socket cookie (see `connect_slots`): no hash, no lock and no allocation, where an LRU insert
/// took about a third of connect4's time. Preallocated, so a slot is memory of the map for the
/// map's life.
#[map(name = "ICPT_CONN_SLOTS")]
pub static CONNECT_SLOT_ARRAY: Array<ConnectSlot> = Array::with_max_entries(CONNECT_SLOTS, 0);

/// Socket cookie -> original destination of a redirected app socket that is connecting whose
/// slot in `CONNECT_SLOT_ARRAY` was taken; moved
/// to `PENDING` by sock_ops once the socket is established. Entries of connects that never
/// complete are evicted least-recently-used. Resized with `PENDING` (`--orig-dst-capacity`).
#[map(name = "ICPT_CONNECTING")]
pub static CONNECTING: LruHashMap<u64, OrigDst> =
    LruHashMap::with_max_entries(DEFAULT_PENDING_ORIG_DST_CAPACITY, 0);

/// Redirected connections waiting for (or read by) the proxy, in the slot of their key (see
/// `pending`): no hash, no lock and no allocation, where the LRU insert and delete were most of
/// what was left of sock_ops' cost. Preallocated; memory-mappable, so userspace counts the slots
/// in use by reading them, not with 65,536 system calls.
#[map(name = "ICPT_PEND_SLOTS")]
pub static PENDING_SLOT_ARRAY: Array<PendingSlot> =
    Array::with_max_entries(PENDING_SLOTS, aya_ebpf::bindings::BPF_F_MMAPABLE);

/// Key -> entry of a redirected connection whose slot in `PENDING_SLOT_ARRAY` was held by
/// another: a `PendingSlot`, whose phases it goes through as a slot does, and removed when
/// free. Userspace may resize it at load time (`--orig-dst-capacity`).
#[map(name = "ICPT_PENDING")]
pub static PENDING: LruHashMap<PendingKey, PendingSlot> =
    LruHashMap::with_max_entries(DEFAULT_PENDING_ORIG_DST_CAPACITY, 0);

/// The proxy's inbound listener per pod and family. The kernel removes a socket when it closes;
/// the next listen() on the inbound port puts the new one in.
#[map(name = "ICPT_LISTENERS")]
pub static LISTENERS: SockHash<ListenerKey> = SockHash::with_max_entries(2 * MAX_PODS, 0);

/// A bit per port (host order) that is a registered pod's proxy outbound port: see
/// `interceptor_common::outbound_ports`.
#[map(name = "ICPT_OUT_PORTS")]
pub static OUTBOUND_PORTS: Array<u64> = Array::with_max_entries(outbound_ports::WORDS, 0);

/// Whether `port` (host order) is some pod's proxy outbound port (or was: bits are never
/// cleared).
#[inline(always)]
pub fn is_outbound_port(port: u16) -> bool {
    OUTBOUND_PORTS
        .get(outbound_ports::word(port))
        .is_some_and(|word| word & outbound_ports::bit(port) != 0)
}

/// Index 0: the sk_lookup program every pod's own program tail-calls (see `inbound`). One
/// verified program serves every pod, and an upgrade swaps it for all pods with one update.
#[map(name = "ICPT_SK_LOOKUP")]
pub static SK_LOOKUP_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Index 0: the netns cookie of the pod whose sk_lookup runs on this CPU, written by the pod's
/// own program right before its tail call (a per-CPU slot: the two run back to back on one CPU
/// with bottom halves off, nothing can run a lookup in between).
#[map(name = "ICPT_LOOKUP_POD")]
pub static LOOKUP_POD: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The configuration of the pod whose network namespace has this cookie, if it is meshed.
#[inline(always)]
pub fn pod_config(netns_cookie: u64) -> Option<&'static PodConfig> {
    // SAFETY: the element stays memory of this map for the whole program run, which is as long
    // as the reference is used (the kernel frees map elements only after the programs that may
    // hold them have returned). A concurrent update of the same pod may let another version of
    // its configuration be read, even a mix of two; `PodConfig` is valid for every bit pattern,
    // so that is a decision made on a configuration being replaced, never an invalid value.
    unsafe { PODS.get(netns_cookie) }
}

/// Whether `addr` is in one of the pod's subnets for `direction`, among the subnets of the
/// address's own family.
#[inline(always)]
pub fn in_subnets(netns_cookie: u64, direction: u32, addr: Ip6Addr) -> bool {
    let family = if addr.is_ip4() {
        family::IPV4
    } else {
        family::IPV6
    };
    let key = Key::new(
        SUBNET_KEY_FIXED_BITS + 128,
        SubnetKey {
            netns_cookie,
            direction,
            family,
            addr,
        },
    );
    SUBNETS.get(key).is_some()
}

/// Reads a `__u32 ip6[4]` context field one word at a time: the verifier rejects the 8-byte
/// loads LLVM would merge a plain array copy into ("invalid bpf_context access").
///
/// # Safety
///
/// `field` points at such a field of the context the kernel passed to the running program.
#[inline(always)]
pub unsafe fn read_ip6(field: *const [u32; 4]) -> Ip6Addr {
    let words = field.cast::<u32>();
    // SAFETY: the caller passes a context field of four words; the verifier checks each 4-byte
    // read against the program type's context.
    unsafe {
        Ip6Addr::from_words_be([
            core::ptr::read_volatile(words),
            core::ptr::read_volatile(words.add(1)),
            core::ptr::read_volatile(words.add(2)),
            core::ptr::read_volatile(words.add(3)),
        ])
    }
}

#[inline(always)]
pub fn count(slot: u32, decision: Decision) {
    if let Some(counters) = COUNTERS.get_ptr_mut(slot) {
        // SAFETY: the pointer is this CPU's value of a per-CPU array slot, valid while the
        // program runs, and no other CPU writes it. Only a program that interrupts this one on
        // the same CPU could write it meanwhile, and at worst a count would be lost.
        unsafe { (*counters).values[decision as usize] += 1 };
    }
}
