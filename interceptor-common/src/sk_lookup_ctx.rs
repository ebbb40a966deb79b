//! Offsets in the sk_lookup context (`struct bpf_sk_lookup` of the kernel's UAPI) that the pods'
//! hand-assembled programs read (`interceptor::ebpf::pod_lookup`). The eBPF crate checks them at
//! build time against its generated bindings of the same struct, which userspace does not have.

/// `__u32 protocol`.
pub const PROTOCOL: i16 = 12;
/// `__u32 ingress_ifindex`.
pub const INGRESS_IFINDEX: i16 = 64;
