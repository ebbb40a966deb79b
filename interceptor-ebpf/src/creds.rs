//! A socket's creator credentials, read as iptables' owner match reads them (see
//! `interceptor_common::creds`): `sk->sk_socket->file->f_cred->{fsuid,fsgid}`.
//!
//! Each hop is a load through a BTF pointer at an offset from `ICPT_CRED_OFFSETS`, which the
//! verifier knows as a constant (the object's `.rodata` is frozen before the programs load) and
//! checks against the kernel's BTF; a fault on a hop (a pointer freed meanwhile) reads zero, as
//! the JIT's exception table makes such loads, and a zero pointer is not followed.
use aya_ebpf::{helpers::generated::bpf_skc_to_tcp_sock, programs::SockAddrContext};
use interceptor_common::CredOffsets;

// The loader's probe of this feature reads `sk` at an offset it cannot take from bindings.
const _: () = assert!(
    core::mem::offset_of!(aya_ebpf::bindings::bpf_sock_addr, __bindgen_anon_1)
        == interceptor_common::creds::SOCK_ADDR_CTX_SK as usize
);

/// Set by the loader from the kernel's BTF; [`CredOffsets::UNSET`] where it has none.
#[unsafe(no_mangle)]
static ICPT_CRED_OFFSETS: CredOffsets = CredOffsets::UNSET;

/// The (fsuid, fsgid) of the credentials the connecting socket's file was opened with; `None`
/// for a socket without a file (a kernel socket), which iptables' owner match never matches,
/// or where they cannot be read (no offsets: the loader never picks this variant then).
#[inline(always)]
pub fn socket_creator(ctx: &SockAddrContext) -> Option<(u32, u32)> {
    // Each field read on its own and volatile: a plain read of the static would be folded to
    // UNSET at compile time, and the verifier must see each offset as a load from `.rodata`.
    let offset = |field: *const u32| {
        // SAFETY: `field` points into the static above.
        unsafe { core::ptr::read_volatile(field) }
    };
    let sock_socket = offset(&raw const ICPT_CRED_OFFSETS.sock_socket);
    if sock_socket == u32::MAX {
        return None;
    }
    let socket_file = offset(&raw const ICPT_CRED_OFFSETS.socket_file);
    let file_cred = offset(&raw const ICPT_CRED_OFFSETS.file_cred);
    let cred_fsuid = offset(&raw const ICPT_CRED_OFFSETS.cred_fsuid);
    let cred_fsgid = offset(&raw const ICPT_CRED_OFFSETS.cred_fsgid);
    // SAFETY: `sock_addr` is this run's context; the verifier checks the read of its socket.
    let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
    // SAFETY: the helper takes the context's socket (the verifier checks its type) and returns
    // a BTF pointer to it as a TCP socket, or null when it is not one.
    let tcp = unsafe { bpf_skc_to_tcp_sock(sk.cast()) }
        .cast::<u8>()
        .cast_const();
    // SAFETY: `tcp` is the helper's BTF pointer, `sock_socket` the offset of a pointer member
    // of its type; the verifier checks the load against the kernel's BTF.
    let socket = unsafe { pointer_at(tcp, sock_socket) }?;
    // SAFETY: as above, a `struct socket` and its `file`.
    let file = unsafe { pointer_at(socket, socket_file) }?;
    // SAFETY: as above, a `struct file` and its `f_cred`.
    let cred = unsafe { pointer_at(file, file_cred) }?;
    // SAFETY: as above; `kuid_t` and `kgid_t` are a `u32` each.
    unsafe {
        Some((
            core::ptr::read_volatile(cred.add(cred_fsuid as usize).cast::<u32>()),
            core::ptr::read_volatile(cred.add(cred_fsgid as usize).cast::<u32>()),
        ))
    }
}

/// The pointer stored at `base + offset`, unless `base` or it is null.
///
/// # Safety
///
/// `base` is a BTF pointer the verifier tracks, and `offset` the offset of a pointer member of
/// its type.
#[inline(always)]
unsafe fn pointer_at(base: *const u8, offset: u32) -> Option<*const u8> {
    if base.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    let p = unsafe { core::ptr::read_volatile(base.add(offset as usize).cast::<*const u8>()) };
    (!p.is_null()).then_some(p)
}
