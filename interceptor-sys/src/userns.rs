//! User namespaces: which one owns a network namespace, how it maps ids to ours, and running a
//! program inside a pod's user and network namespaces (as a pod's own init container runs).
use std::{
    fs::File,
    io::{self, Read as _, Write as _},
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
        unix::{fs::MetadataExt as _, process::CommandExt as _},
    },
    process::Command,
};

/// The user namespace that owns the namespace `ns` (an open nsfs file), as a new nsfs fd
/// (`NS_GET_USERNS`, Linux 4.9).
pub fn owning_user_namespace(ns: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new fd or -1.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `userns` (an nsfs fd) is the calling process's own user namespace.
pub fn is_own_user_namespace(userns: BorrowedFd<'_>) -> io::Result<bool> {
    let ours = std::fs::metadata("/proc/self/ns/user")?;
    let theirs = File::from(userns.try_clone_to_owned()?).metadata()?;
    Ok((ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()))
}

/// The `uid_map` and `gid_map` of the user namespace `userns`, as this process sees them (the
/// outside ids are ours).
///
/// A map can only be read through a process of the namespace, and a pod's may have none (a
/// runtime makes the namespace, then the network namespace in it, before any container
/// starts), so a child is forked to join it: the maps are read from its `/proc` entry, then it
/// exits. Joining needs `CAP_SYS_ADMIN` over the namespace (an ancestor's root has it).
pub fn id_maps(userns: BorrowedFd<'_>) -> io::Result<(String, String)> {
    let (joined_r, joined_w) = pipe()?;
    let (release_r, release_w) = pipe()?;
    // SAFETY: the child calls only async-signal-safe functions (setns, write, read, _exit) on
    // fds opened before the fork, and never returns into Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; the errno is handed to the parent as 4 bytes.
        unsafe {
            let errno: i32 = if libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::write(joined_w.as_raw_fd(), (&raw const errno).cast(), 4);
            let mut byte = 0u8;
            libc::read(release_r.as_raw_fd(), (&raw mut byte).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(joined_w);
    drop(release_r);
    let read_maps = || -> io::Result<(String, String)> {
        let mut errno = [0u8; 4];
        File::from(joined_r).read_exact(&mut errno)?;
        let errno = i32::from_ne_bytes(errno);
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok((
            std::fs::read_to_string(format!("/proc/{pid}/uid_map"))?,
            std::fs::read_to_string(format!("/proc/{pid}/gid_map"))?,
        ))
    };
    let maps = read_maps();
    let _ = File::from(release_w).write_all(&[1]);
    let mut status = 0;
    // SAFETY: waits for our own child, which exits once released (or already has).
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
    maps
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are new and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `CAP_NET_ADMIN` and `CAP_NET_RAW`: what iptables needs of its network namespace.
const IPTABLES_CAPS: [u32; 2] = [12, 13];

/// Makes `command`'s child run in the network namespace `netns` and, inside it, in the user
/// namespace `userns` that owns it, with `CAP_NET_ADMIN` and `CAP_NET_RAW` there and nothing
/// else: how iptables must run to write an owner match in a pod with a user namespace of its own
/// (`xt_owner` refuses one written from another user namespace). Its ids stay ours (a file it
/// opens, such as the xtables lock, is opened as ours), so the two capabilities are kept across
/// its exec as ambient capabilities (Linux 4.3). Both fds must still be open at the spawn.
pub fn enter_pod_before_exec(command: &mut Command, netns: RawFd, userns: RawFd) {
    // SAFETY: the closure runs between fork and exec and calls only setns(2), capset(2) and
    // prctl(2), which are async-signal-safe, and reads errno.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(netns, libc::CLONE_NEWNET) != 0
                || libc::setns(userns, libc::CLONE_NEWUSER) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // Joining the namespace gave every capability in it, none inheritable; ambient
            // ones must be inheritable first.
            let header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let mut inheritable = 0u32;
            for cap in IPTABLES_CAPS {
                inheritable |= 1 << cap;
            }
            let data = [
                CapData {
                    effective: u32::MAX,
                    permitted: u32::MAX,
                    inheritable,
                },
                CapData {
                    effective: u32::MAX,
                    permitted: u32::MAX,
                    inheritable: 0,
                },
            ];
            if libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            for cap in IPTABLES_CAPS {
                let raise = libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                    cap as libc::c_ulong,
                    0 as libc::c_ulong,
                    0 as libc::c_ulong,
                );
                if raise != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct`; version 3 takes two, for capabilities 0-31 and 32-63.
#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;

    #[test]
    fn our_network_namespace_is_owned_by_our_user_namespace() {
        let net = File::open("/proc/self/ns/net").unwrap();
        let owner = owning_user_namespace(net.as_fd()).unwrap();
        assert!(is_own_user_namespace(owner.as_fd()).unwrap());
    }

    /// Needs root (to map ids into a new user namespace): the kernel tests' run.
    #[test]
    fn a_childs_maps_are_read_through_a_child_of_ours() {
        if !is_root() {
            assert!(
                std::env::var_os("INTERCEPTOR_REQUIRE_PRIVILEGED").is_none(),
                "this test needs root: run as root, e.g. sudo -E cargo xtask test"
            );
            eprintln!("skipped: needs root");
            return;
        }
        let mut child = Command::new("unshare")
            .args(["--user", "sleep", "30"])
            .spawn()
            .expect("unshare");
        let ours = std::fs::metadata("/proc/self/ns/user").unwrap().ino();
        let path = format!("/proc/{}/ns/user", child.id());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let userns = loop {
            if std::fs::metadata(&path).unwrap().ino() != ours {
                break File::open(&path).unwrap();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "unshare never ran sleep"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // A map is written once, by a process with CAP_SETUID over the namespace: ours.
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", child.id()), "0 300000 65536\n").unwrap();
        }
        assert!(!is_own_user_namespace(userns.as_fd()).unwrap());
        let maps = id_maps(userns.as_fd());
        let _ = child.kill();
        let _ = child.wait();
        let (uid_map, gid_map) = maps.unwrap();
        let fields = |map: &str| {
            map.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(fields(&uid_map), ["0", "300000", "65536"]);
        assert_eq!(fields(&gid_map), ["0", "300000", "65536"]);
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
