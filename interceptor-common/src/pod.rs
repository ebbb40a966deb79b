//! Per-pod configuration, keyed by the pod's network namespace cookie.
use crate::{Ip6Addr, MAX_LOCAL_ADDRS_PER_POD};
use bytemuck::{Pod, Zeroable};

/// One bit per TCP port: membership is a single load whatever the number of ports or ranges, so
/// the per-connection cost does not grow with the ignore lists.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct PortBitmap {
    pub bits: [u8; 8192],
}

impl PortBitmap {
    pub const EMPTY: Self = Self { bits: [0; 8192] };

    /// Whether bit `port` is set. `port` must come straight from a 16-bit value the verifier
    /// knows the range of (a narrowed context field): verifiers before 6.19 do not bound the
    /// result of a byte swap (`u16::from_be`), and rejected `bits[swapped >> 3]` as an "unbounded
    /// memory access". Hence `PodConfig::outbound_ignore_ports_be`.
    #[inline(always)]
    pub fn contains(&self, port: u16) -> bool {
        self.bits[(port >> 3) as usize] & (1 << (port & 7)) != 0
    }

    pub fn insert(&mut self, port: u16) {
        self.bits[(port >> 3) as usize] |= 1 << (port & 7);
    }

    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|b| *b == 0)
    }
}

/// `PodConfig::flags` bits.
pub mod flags {
    /// `proxy_uid` is set: connections by that UID are never redirected.
    pub const HAS_PROXY_UID: u32 = 1 << 0;
    /// `proxy_gid` is set: connections by that GID are never redirected.
    pub const HAS_PROXY_GID: u32 = 1 << 1;
    /// The pod has IPv4 outbound subnets to ignore: consult the subnet trie.
    pub const HAS_OUTBOUND_SUBNETS_V4: u32 = 1 << 2;
    /// The pod has IPv4 inbound source subnets to ignore: consult the subnet trie.
    pub const HAS_INBOUND_SUBNETS_V4: u32 = 1 << 3;
    /// `--ports-to-redirect` was given: only ports in `redirect_ports` are steered inbound.
    pub const HAS_PORTS_TO_REDIRECT: u32 = 1 << 4;
    /// `--ipv6`: native IPv6 connections are intercepted too. IPv4 connections made through
    /// IPv6 sockets (`::ffff:a.b.c.d`) are IPv4 and always intercepted.
    pub const INTERCEPT_IPV6: u32 = 1 << 5;
    /// The pod has IPv6 outbound subnets to ignore.
    pub const HAS_OUTBOUND_SUBNETS_V6: u32 = 1 << 6;
    /// The pod has IPv6 inbound source subnets to ignore.
    pub const HAS_INBOUND_SUBNETS_V6: u32 = 1 << 7;
    /// The pod has `local` routes beyond its own addresses (`direction::LOCAL_ROUTE` entries
    /// in the subnet trie, either family).
    pub const HAS_LOCAL_ROUTES: u32 = 1 << 8;
}

/// How one pod is intercepted. Written by userspace, read on every connect in the pod.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct PodConfig {
    /// Index of this pod's counters in the per-CPU counter array.
    pub slot: u32,
    /// `flags::*` bits.
    pub flags: u32,
    pub proxy_uid: u32,
    pub proxy_gid: u32,
    /// Port (host order) the proxy's outbound listener uses on 127.0.0.1.
    pub outbound_port: u16,
    /// Port (host order) of the proxy's inbound listener.
    pub inbound_port: u16,
    /// How many of `local_addrs` are the pod's.
    pub local_addr_count: u32,
    /// The addresses of the pod's own interfaces (IPv4 ones mapped), first `local_addr_count`:
    /// right after the fields every connection reads, so the "to/from the pod itself" rules
    /// cost a scan of the pod's few addresses in cache lines already loaded, where a hash map
    /// keyed by (pod, address) cost about 40 ns per connection.
    pub local_addrs: [Ip6Addr; MAX_LOCAL_ADDRS_PER_POD as usize],
    /// Indexed by the port in network order, as connect4/6 read it from their context: no byte
    /// swap on the per-connection path (see `PortBitmap::contains`).
    pub outbound_ignore_ports_be: PortBitmap,
    /// Indexed by the port in host order, as sk_lookup reads it.
    pub inbound_ignore_ports: PortBitmap,
    /// Only meaningful with `flags::HAS_PORTS_TO_REDIRECT`.
    pub redirect_ports: PortBitmap,
}

impl PodConfig {
    /// Whether `addr` is one of the pod's own addresses.
    #[inline(always)]
    pub fn is_own_address(&self, addr: Ip6Addr) -> bool {
        let count = self.local_addr_count;
        // Written out, one constant index each: as a loop, LLVM ended it on a pointer compared
        // with `count * 16`, which the verifier cannot bound, and it rejected the program
        // ("R3 min value is outside of the allowed memory range").
        macro_rules! scan {
            ($($i:literal)*) => {$(
                if count <= $i {
                    return false;
                }
                if self.local_addrs[$i] == addr {
                    return true;
                }
            )*};
        }
        scan!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
        false
    }
}

const _: () = assert!(
    MAX_LOCAL_ADDRS_PER_POD == 32,
    "is_own_address scans 32 entries"
);

/// Direction of a subnet rule in [`SubnetKey`].
pub mod direction {
    pub const OUTBOUND: u32 = 1;
    pub const INBOUND: u32 = 2;
    /// The prefix of a `local` route of the pod that is none of its own addresses (AnyIP):
    /// delivered over lo, exempt as proxy-init's `-o lo -j RETURN` exempts it.
    pub const LOCAL_ROUTE: u32 = 3;
}

/// The data part of an LPM trie key: the pod, direction and family are always matched in full
/// (their 128 bits come first), then the first `prefix_len - SUBNET_KEY_FIXED_BITS` bits of the
/// address. An IPv4 subnet is stored in its mapped form (`10.0.0.0/8` as `::ffff:10.0.0.0/104`);
/// the family keeps an IPv6 rule such as `::/0` from matching IPv4 connections, as ip6tables
/// rules never see IPv4 packets.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Pod, Zeroable)]
pub struct SubnetKey {
    pub netns_cookie: u64,
    pub direction: u32,
    /// `crate::addr::family::*`.
    pub family: u32,
    pub addr: Ip6Addr,
}

/// Bits of [`SubnetKey`] that precede the address.
pub const SUBNET_KEY_FIXED_BITS: u32 = 128;

/// Prefix bits an IPv4 subnet's length is offset by in its mapped form.
pub const IP4_MAPPED_PREFIX_BITS: u32 = 96;

const _: () = assert!(
    core::mem::size_of::<PodConfig>() == 24 + 16 * MAX_LOCAL_ADDRS_PER_POD as usize + 3 * 8192
);
const _: () = assert!(core::mem::size_of::<SubnetKey>() == 32);
