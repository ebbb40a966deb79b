//! Where a socket's creator credentials are in this kernel's structures, for connect4/6.
//!
//! iptables' owner match (`-m owner --uid-owner`, `--gid-owner`) reads the credentials the
//! socket's file was opened with (`sk->sk_socket->file->f_cred->fsuid` and `fsgid`), not the
//! connecting task's: a process whose real and effective IDs differ, or a socket made before its
//! process became the proxy's user, is told by those. The programs read the same fields through
//! the BTF pointer `bpf_skc_to_tcp_sock` returns, at offsets the loader takes from the kernel's
//! own BTF (`/sys/kernel/btf/vmlinux`): the verifier checks each load against that BTF, and
//! knows the offsets as constants because they live in the object's frozen `.rodata`.
use bytemuck::{Pod, Zeroable};

/// Offset of `sk` in the cgroup/connect4 context (`struct bpf_sock_addr`), for the loader's
/// probe of the feature, which cannot take it from bindings (the eBPF crate checks it).
pub const SOCK_ADDR_CTX_SK: i16 = 64;

/// Byte offsets of the four hops from a socket to its creator's IDs.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Pod, Zeroable)]
pub struct CredOffsets {
    /// `struct sock`'s `sk_socket` (`struct socket *`); `struct sock` starts `struct tcp_sock`.
    pub sock_socket: u32,
    /// `struct socket`'s `file` (`struct file *`).
    pub socket_file: u32,
    /// `struct file`'s `f_cred` (`const struct cred *`).
    pub file_cred: u32,
    /// `struct cred`'s `fsuid` (`kuid_t`, a `u32`).
    pub cred_fsuid: u32,
    /// `struct cred`'s `fsgid` (`kgid_t`, a `u32`).
    pub cred_fsgid: u32,
    pub _pad: u32,
}

impl CredOffsets {
    /// Not set by the loader (no BTF): the programs use the task's IDs. Not zero, so the global
    /// is placed in `.rodata` (an all-zero one would go to `.bss`, which is not frozen, and the
    /// verifier would not know the offsets).
    pub const UNSET: Self = Self {
        sock_socket: u32::MAX,
        socket_file: u32::MAX,
        file_cred: u32::MAX,
        cred_fsuid: u32::MAX,
        cred_fsgid: u32::MAX,
        _pad: u32::MAX,
    };
}
