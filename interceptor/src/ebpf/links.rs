//! Attachments that outlive the process: links created with BPF_LINK_CREATE and pinned on the
//! bpffs. If `interceptor run` is killed, its programs stay attached and keep intercepting
//! (SPEC "Failure semantics": fail closed, no window around the proxy); the next run of the
//! same instance attaches its own programs first, then unpins these. aya 0.14 cannot pin every
//! link type we use (no `FdLink` for cgroup sockopt links), so this module makes them itself.
use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

/// `enum bpf_attach_type` values from `<linux/bpf.h>`.
pub mod attach_type {
    pub const CGROUP_SOCK_OPS: u32 = 3;
    pub const CGROUP_INET4_CONNECT: u32 = 10;
    pub const CGROUP_INET6_CONNECT: u32 = 11;
    pub const CGROUP_GETSOCKOPT: u32 = 21;
    pub const SK_LOOKUP: u32 = 36;
}

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_LINK_CREATE: libc::c_long = 28;

/// A pinned link: dropping it unpins and closes it, which detaches the program. A process that
/// dies without dropping it leaves the program attached.
#[derive(Debug)]
pub struct PinnedLink {
    _fd: OwnedFd,
    path: PathBuf,
}

impl PinnedLink {
    /// Attaches `program` to `target` (a cgroup or network namespace fd) and pins the link at
    /// `path`. Kernel >= 5.7 (cgroup links), 5.9 (sk_lookup links).
    pub fn attach(
        program: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach_type: u32,
        path: &Path,
    ) -> io::Result<Self> {
        // union bpf_attr, link_create: prog_fd, target_fd, attach_type, flags; the rest zero.
        let mut attr = [0u32; 16];
        attr[0] = program.as_raw_fd() as u32;
        attr[1] = target.as_raw_fd() as u32;
        attr[2] = attach_type;
        let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
        // SAFETY: BPF_LINK_CREATE returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };

        let pathname = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // obj_pin: pathname (u64), bpf_fd (u32), file_flags (u32), path_fd; the rest zero.
        let mut attr = [0u64; 4];
        attr[0] = pathname.as_ptr() as u64;
        attr[1] = fd.as_raw_fd() as u32 as u64;
        bpf(BPF_OBJ_PIN, &mut attr)?;
        Ok(Self {
            _fd: fd,
            path: path.to_owned(),
        })
    }
}

impl Drop for PinnedLink {
    /// Unpins; closing `fd` right after releases the last reference and detaches.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i32> {
    // SAFETY: attr is a valid, initialised buffer of size_of::<T>() bytes for this command.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}
