//! Identifiers that must not be swapped for one another: both cookies are `u64` map keys, and a
//! slot is a bare `u32` index. Userspace passes these types; the map key structs keep the raw
//! integers the programs read.
use bytemuck::{Pod, Zeroable};
use core::fmt;

/// A network namespace's cookie: the kernel's 64-bit id of the namespace, unique for the life
/// of the system. A pod is keyed by it, never by an address.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Pod, Zeroable)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct NetnsCookie(pub u64);

/// A socket's cookie (`bpf_get_socket_cookie`): the key of a connection in progress.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Pod, Zeroable)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct SocketCookie(pub u64);

/// A pod's index in the per-CPU counter array (below `MAX_PODS`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(transparent)
)]
pub struct PodSlot(pub u32);

impl fmt::Display for NetnsCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for SocketCookie {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for PodSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl core::str::FromStr for NetnsCookie {
    type Err = core::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Self)
    }
}
