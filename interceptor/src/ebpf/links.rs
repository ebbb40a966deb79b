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
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// A pinned link: dropping it unpins and closes it, which detaches the program, unless it is
/// [`PinnedLink::persistent`]. A process that dies without dropping it leaves the program
/// attached.
#[derive(Debug)]
pub struct PinnedLink {
    _fd: OwnedFd,
    path: PathBuf,
    /// Leave the pin (and so the attachment) in place on drop: the node agent's links outlive
    /// every agent process, and only `interceptor uninstall` removes them.
    persistent: bool,
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
            persistent: false,
        })
    }

    /// Makes `program` the one a link pinned at `path` runs, replacing the old one atomically
    /// (BPF_LINK_UPDATE: no moment without a program on the hook), or attaches and pins a new
    /// link when there is none. The link is persistent. Kernel >= 5.7 (cgroup), 5.9 (sk_lookup).
    pub fn attach_or_update(
        program: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        attach_type: u32,
        path: &Path,
    ) -> io::Result<Self> {
        let mut link = match open_pinned(path)? {
            Some(fd) => {
                // link_update: link_fd, new_prog_fd, flags, old_prog_fd.
                let mut attr = [0u32; 4];
                attr[0] = fd.as_raw_fd() as u32;
                attr[1] = program.as_raw_fd() as u32;
                bpf(BPF_LINK_UPDATE, &mut attr)?;
                Self {
                    _fd: fd,
                    path: path.to_owned(),
                    persistent: true,
                }
            }
            None => Self::attach(program, target, attach_type, path)?,
        };
        link.persistent = true;
        Ok(link)
    }

    /// Unpins and detaches the link pinned at `path`, if any (`interceptor uninstall`, a removed
    /// pod). The program stops running once no process holds the link either.
    pub fn remove_pinned(path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The object pinned at `path` (BPF_OBJ_GET), or `None` when nothing is pinned there.
pub(super) fn open_pinned(path: &Path) -> io::Result<Option<OwnedFd>> {
    let pathname = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // obj_get: pathname (u64), bpf_fd (u32), file_flags (u32); the rest zero.
    let mut attr = [0u64; 3];
    attr[0] = pathname.as_ptr() as u64;
    match bpf(BPF_OBJ_GET, &mut attr) {
        // SAFETY: BPF_OBJ_GET returned a new fd that nothing else owns.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Drop for PinnedLink {
    /// Unpins; closing `fd` right after releases the last reference and detaches. A persistent
    /// link keeps its pin, and stays attached.
    fn drop(&mut self) {
        if !self.persistent {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(super) fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i32> {
    // SAFETY: attr is a valid, initialised buffer of size_of::<T>() bytes for this command.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}
