//! Addresses as the programs store them: one 16-byte form for both families.
//!
//! An IPv4 address is kept as its IPv4-mapped IPv6 address `::ffff:a.b.c.d`. That is also how the
//! kernel shows an IPv4 connection on an `AF_INET6` socket, so an app's `AF_INET6` socket that
//! connects to `::ffff:192.0.2.2` and an `AF_INET` socket that connects to `192.0.2.2` produce
//! the same keys, and a proxy listening on `[::]` finds the entry of either.
use bytemuck::{Pod, Zeroable};

/// An IPv6 address, or an IPv4 address in its IPv4-mapped form; four 32-bit words in network
/// byte order, as the kernel's `__u32 ip6[4]` context fields hold them.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default, Pod, Zeroable)]
pub struct Ip6Addr {
    pub words_be: [u32; 4],
}

/// Word 2 of an IPv4-mapped address (`::ffff:0:0/96`), in network order.
const MAPPED_WORD2_BE: u32 = 0x0000_ffff_u32.to_be();

impl Ip6Addr {
    pub const UNSPECIFIED: Self = Self { words_be: [0; 4] };
    pub const LOOPBACK: Self = Self {
        words_be: [0, 0, 0, 1u32.to_be()],
    };

    pub const fn from_words_be(words_be: [u32; 4]) -> Self {
        Self { words_be }
    }

    /// `::ffff:a.b.c.d` for the IPv4 address `ip4_be` (network order).
    #[inline(always)]
    pub const fn from_ip4_be(ip4_be: u32) -> Self {
        Self {
            words_be: [0, 0, MAPPED_WORD2_BE, ip4_be],
        }
    }

    /// Whether this is an IPv4 address (`::ffff:0:0/96`).
    #[inline(always)]
    pub const fn is_ip4(&self) -> bool {
        self.words_be[0] == 0 && self.words_be[1] == 0 && self.words_be[2] == MAPPED_WORD2_BE
    }

    /// The IPv4 address in network order; only meaningful when [`Self::is_ip4`].
    #[inline(always)]
    pub const fn ip4_be(&self) -> u32 {
        self.words_be[3]
    }

    /// Whether a connect to this address stays on the local host, i.e. is routed over `lo`:
    /// 127.0.0.0/8 and 0.0.0.0 for IPv4, `::1` and `::` for IPv6 (the kernel connects an
    /// unspecified destination to the loopback address).
    #[inline(always)]
    pub const fn is_loopback_or_unspecified(&self) -> bool {
        if self.is_ip4() {
            let ip4 = u32::from_be(self.ip4_be());
            return ip4 >> 24 == 127 || ip4 == 0;
        }
        self.words_be[0] == 0
            && self.words_be[1] == 0
            && self.words_be[2] == 0
            && (self.words_be[3] == 0 || self.words_be[3] == 1u32.to_be())
    }

    /// The 16 bytes in network order, as `std::net::Ipv6Addr::octets` gives them.
    pub fn octets(&self) -> [u8; 16] {
        let mut octets = [0u8; 16];
        let mut i = 0;
        while i < 4 {
            let word = self.words_be[i].to_ne_bytes();
            octets[i * 4] = word[0];
            octets[i * 4 + 1] = word[1];
            octets[i * 4 + 2] = word[2];
            octets[i * 4 + 3] = word[3];
            i += 1;
        }
        octets
    }

    pub fn from_octets(octets: [u8; 16]) -> Self {
        let word = |i: usize| {
            u32::from_ne_bytes([
                octets[i * 4],
                octets[i * 4 + 1],
                octets[i * 4 + 2],
                octets[i * 4 + 3],
            ])
        };
        Self {
            words_be: [word(0), word(1), word(2), word(3)],
        }
    }
}

impl From<core::net::IpAddr> for Ip6Addr {
    fn from(ip: core::net::IpAddr) -> Self {
        match ip {
            core::net::IpAddr::V4(v4) => Self::from_octets(v4.to_ipv6_mapped().octets()),
            core::net::IpAddr::V6(v6) => Self::from_octets(v6.octets()),
        }
    }
}

impl From<Ip6Addr> for core::net::IpAddr {
    /// The mapped form back to an IPv4 address, anything else as IPv6.
    fn from(ip: Ip6Addr) -> Self {
        if ip.is_ip4() {
            core::net::Ipv4Addr::from(u32::from_be(ip.ip4_be())).into()
        } else {
            core::net::Ipv6Addr::from(ip.octets()).into()
        }
    }
}

/// Address families as the map keys name them (not the kernel's `AF_*` values, so a key never
/// depends on which socket family carried an IPv4 connection).
pub mod family {
    pub const IPV4: u32 = 4;
    pub const IPV6: u32 = 6;
}

const _: () = assert!(core::mem::size_of::<Ip6Addr>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_is_kept_mapped() {
        let ip = Ip6Addr::from_ip4_be(u32::from_be_bytes([192, 0, 2, 2]).to_be());
        assert!(ip.is_ip4());
        assert_eq!(
            ip.octets(),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2]
        );
        assert_eq!(Ip6Addr::from_octets(ip.octets()), ip);
        assert!(!Ip6Addr::LOOPBACK.is_ip4());
        let v4: core::net::IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(Ip6Addr::from(v4), ip);
        assert_eq!(core::net::IpAddr::from(ip), v4);
        let v6: core::net::IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(core::net::IpAddr::from(Ip6Addr::from(v6)), v6);
        assert_eq!(
            Ip6Addr::from(core::net::IpAddr::from([0u8; 16])),
            Ip6Addr::UNSPECIFIED
        );
    }

    #[test]
    fn loopback_and_unspecified_in_both_families() {
        let v4 = |a, b, c, d| Ip6Addr::from_ip4_be(u32::from_be_bytes([a, b, c, d]).to_be());
        assert!(v4(127, 0, 0, 1).is_loopback_or_unspecified());
        assert!(v4(127, 9, 9, 9).is_loopback_or_unspecified());
        assert!(v4(0, 0, 0, 0).is_loopback_or_unspecified());
        assert!(!v4(10, 0, 0, 1).is_loopback_or_unspecified());
        assert!(Ip6Addr::LOOPBACK.is_loopback_or_unspecified());
        assert!(Ip6Addr::UNSPECIFIED.is_loopback_or_unspecified());
        let mut doc = [0u8; 16];
        doc[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        doc[15] = 1;
        assert!(!Ip6Addr::from_octets(doc).is_loopback_or_unspecified());
    }
}
