//! A pod's network namespace: its identity (the netns cookie) and its addresses. Work inside the
//! namespace runs on the calling thread, which `setns`es in and back out.
use interceptor_common::NetnsCookie;
mod addresses;

use std::{
    fs::File,
    net::IpAddr,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use nix::{
    sched::{CloneFlags, setns},
    sys::socket::{AddressFamily, SockFlag, SockType, socket},
};

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(
        "cannot open network namespace {path}: {source} (pass a path like /run/netns/NAME or /proc/PID/ns/net)"
    )]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a network namespace")]
    NotNetns { path: PathBuf },
    #[error("{call} in network namespace {path}: {source}")]
    Syscall {
        call: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// An open handle on a pod's network namespace; keeps the namespace alive while held.
pub struct PodNetns {
    path: PathBuf,
    file: File,
}

/// `SO_NETNS_COOKIE` from `<asm-generic/socket.h>` (Linux 5.14).
const SO_NETNS_COOKIE: libc::c_int = 71;
/// `NS_GET_NSTYPE` ioctl from `<linux/nsfs.h>`.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

impl PodNetns {
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd.
        let nstype = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&file), NS_GET_NSTYPE) };
        if nstype != libc::CLONE_NEWNET {
            return Err(NetnsError::NotNetns {
                path: path.to_owned(),
            });
        }
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// Runs `f` with the calling thread in this namespace, then puts the thread back where it
    /// was (also if `f` panics). Sockets `f` creates stay in this namespace. A thread switches
    /// namespace in microseconds; spawning a thread for it, as this did before, cost a pod's
    /// registration about a quarter of its time (three per registration).
    pub fn run_inside<T: Send>(
        &self,
        f: impl FnOnce() -> Result<T, NetnsError> + Send,
    ) -> Result<T, NetnsError> {
        let syscall = |call, source| NetnsError::Syscall {
            call,
            path: self.path.clone(),
            source,
        };
        thread_local! {
            /// The namespace this thread started in, opened on its first switch.
            static HOME: std::io::Result<File> = File::open("/proc/thread-self/ns/net");
        }
        /// Back to the thread's own namespace however `f` ends.
        struct GoHome;
        impl Drop for GoHome {
            fn drop(&mut self) {
                HOME.with(|home| {
                    let home = home.as_ref().expect("opened before leaving");
                    // Failing here would leave this thread in a pod's namespace, where every
                    // socket it made later would be: nothing can be trusted after that.
                    if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
                        panic!("returning to the thread's own network namespace: {e}");
                    }
                });
            }
        }
        HOME.with(|home| {
            home.as_ref().map(drop).map_err(|e| {
                syscall(
                    "open /proc/thread-self/ns/net",
                    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                )
            })
        })?;
        setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|source| syscall("setns", source))?;
        let _home = GoHome;
        f()
    }

    /// The namespace's cookie and addresses with one switch into it (see [`Self::cookie`] and
    /// [`Self::addresses`]): the agent reads both for every pod at every periodic check.
    pub fn cookie_and_addresses(&self) -> Result<(NetnsCookie, Vec<IpAddr>), NetnsError> {
        self.run_inside(|| Ok((self.cookie_here()?, self.addresses_here()?)))
    }

    /// The kernel's 64-bit identity of the namespace, the same value `bpf_get_netns_cookie`
    /// returns in the eBPF programs. Needs Linux 5.14 (`SO_NETNS_COOKIE`).
    pub fn cookie(&self) -> Result<NetnsCookie, NetnsError> {
        self.run_inside(|| self.cookie_here())
    }

    /// [`Self::cookie`], from a thread already inside the namespace.
    fn cookie_here(&self) -> Result<NetnsCookie, NetnsError> {
        let path = self.path.clone();
        {
            let sock = socket(
                AddressFamily::Inet,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .map_err(|source| NetnsError::Syscall {
                call: "socket",
                path: path.clone(),
                source,
            })?;
            let mut cookie: u64 = 0;
            let mut len = size_of::<u64>() as libc::socklen_t;
            // SAFETY: the buffer is a valid u64 and len says so.
            let rc = unsafe {
                libc::getsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&sock),
                    libc::SOL_SOCKET,
                    SO_NETNS_COOKIE,
                    (&raw mut cookie).cast(),
                    &mut len,
                )
            };
            if rc != 0 {
                return Err(NetnsError::Syscall {
                    call: "getsockopt(SO_NETNS_COOKIE)",
                    path,
                    source: nix::Error::last(),
                });
            }
            Ok(NetnsCookie(cookie))
        }
    }

    /// The addresses assigned to the namespace's interfaces, IPv4 and IPv6 (loopback and
    /// link-local ones included).
    pub fn addresses(&self) -> Result<Vec<IpAddr>, NetnsError> {
        self.run_inside(|| self.addresses_here())
    }

    /// [`Self::addresses`], from a thread already inside the namespace.
    fn addresses_here(&self) -> Result<Vec<IpAddr>, NetnsError> {
        let mut all = addresses::dump().map_err(|e| NetnsError::Syscall {
            call: "RTM_GETADDR",
            path: self.path.clone(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        all.sort();
        all.dedup();
        Ok(all)
    }
}

/// `RTMGRP_IPV4_IFADDR` and `RTMGRP_IPV6_IFADDR` from `<linux/rtnetlink.h>`.
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;

impl PodNetns {
    /// A netlink socket, bound inside the namespace, that becomes readable whenever an address
    /// of either family is added or removed there. The socket stays in the namespace it was created in.
    pub fn address_changes(&self) -> Result<std::os::fd::OwnedFd, NetnsError> {
        let path = self.path.clone();
        self.run_inside(move || {
            let error = |call, source| NetnsError::Syscall {
                call,
                path: path.clone(),
                source,
            };
            let fd = addresses::route_socket().map_err(|e| {
                error(
                    "socket(NETLINK_ROUTE)",
                    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                )
            })?;
            // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
            let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            addr.nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
            // SAFETY: addr is a valid sockaddr_nl of the given length.
            let rc = unsafe {
                libc::bind(
                    std::os::fd::AsRawFd::as_raw_fd(&fd),
                    (&raw const addr).cast(),
                    size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(error(
                    "bind(RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)",
                    nix::Error::last(),
                ));
            }
            Ok(fd)
        })
    }
}
