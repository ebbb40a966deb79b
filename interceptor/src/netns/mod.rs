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

impl PodNetns {
    pub fn open(path: &Path) -> Result<Self, NetnsError> {
        let file = File::open(path).map_err(|source| NetnsError::Open {
            path: path.to_owned(),
            source,
        })?;
        if !interceptor_sys::netns::is_network_namespace(std::os::fd::AsFd::as_fd(&file)) {
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
            let cookie =
                interceptor_sys::netns::socket_netns_cookie(std::os::fd::AsFd::as_fd(&sock))
                    .map_err(|e| NetnsError::Syscall {
                        call: "getsockopt(SO_NETNS_COOKIE)",
                        path,
                        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                    })?;
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
            let fd = interceptor_sys::netns::route_socket(RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)
                .map_err(|e| {
                    error(
                        "socket(NETLINK_ROUTE) bound to RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR",
                        nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                    )
                })?;
            Ok(fd)
        })
    }
}
