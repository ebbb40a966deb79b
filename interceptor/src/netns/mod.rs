//! A pod's network namespace: its identity (the netns cookie) and its addresses. Work inside the
//! namespace runs on the calling thread, which `setns`es in and back out.
use interceptor_common::NetnsCookie;
mod addresses;
mod dump;
pub mod listener;
pub mod nsid;
mod routes;
mod users;

pub use dump::{Dump, failures as dump_failures};
/// What a namespace delivers over `lo`, from its address and route dumps.
pub use interceptor_parse::netlink::{LocalDestinations, skipped as dump_messages_skipped};

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
    /// `getsockopt(SO_NETNS_COOKIE)` is ENOPROTOOPT: the kernel is older than 5.14 and cannot
    /// name a namespace by its cookie, which the eBPF backend keys its maps by.
    #[error(
        "network namespace {path}: this kernel cannot tell a namespace's cookie (SO_NETNS_COOKIE needs Linux 5.14), which the eBPF backend needs; use the iptables backend (--mode iptables or auto)"
    )]
    NoCookie { path: PathBuf },
    #[error("the user namespace of network namespace {path}: {reason}")]
    IdMap { path: PathBuf, reason: String },
    #[error("{call} in network namespace {path}: {source}")]
    Syscall {
        call: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
}

/// An open handle on a pod's network namespace; keeps the namespace alive while held.
#[derive(Debug)]
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

    /// The namespace's cookie and local destinations with one switch into it (see
    /// [`Self::cookie`] and [`Self::local_destinations`]): the agent reads both for every pod at
    /// every periodic check.
    pub fn cookie_and_local(&self) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
        self.run_inside(|| Ok((self.cookie_here()?, self.local_here()?)))
    }

    /// The kernel's 64-bit identity of the namespace, the same value `bpf_get_netns_cookie`
    /// returns in the eBPF programs. Needs Linux 5.14 (`SO_NETNS_COOKIE`): before, the error is
    /// [`NetnsError::NoCookie`].
    pub fn cookie(&self) -> Result<NetnsCookie, NetnsError> {
        self.run_inside(|| self.cookie_here())
    }

    /// The namespace's key for a backend that needs no cookie in the kernel (iptables): its
    /// cookie, or, where the kernel cannot tell it (5.10 to 5.13), [`Self::inode_key`]. Its
    /// addresses come with it as its local destinations, but no `local` route: proxy-init's
    /// `-o lo -j RETURN` exempts whatever the pod delivers over lo, so the route dump (every
    /// table of both families) would be work, and a way to fail, for nothing.
    pub fn key_and_addresses(&self) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
        self.run_inside(|| {
            let key = match self.cookie_here() {
                Err(NetnsError::NoCookie { .. }) => self.inode_key()?,
                other => other?,
            };
            Ok((
                key,
                LocalDestinations::new(self.addresses_here()?, Vec::new()),
            ))
        })
    }

    /// An agent-internal key derived from the namespace file's inode, for kernels without
    /// `SO_NETNS_COOKIE` (before 5.14): the inode with the top bit set. Real cookies count up
    /// from 1 and never reach 2^63, so the two kinds cannot collide. The kernel knows nothing of
    /// this key (no eBPF program can use it), and an inode can be reused by a namespace created
    /// after this one is gone, so a replaced namespace at the same path may go unnoticed until
    /// the path disappears; the iptables backend's chains live and die with the namespace
    /// itself, which makes that harmless.
    pub fn inode_key(&self) -> Result<NetnsCookie, NetnsError> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = self.file.metadata().map_err(|e| NetnsError::Syscall {
            call: "fstat",
            path: self.path.clone(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        Ok(NetnsCookie(INODE_KEY_BIT | metadata.ino()))
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
                    .map_err(|e| match e.raw_os_error() {
                        Some(libc::ENOPROTOOPT) => NetnsError::NoCookie { path: path.clone() },
                        errno => NetnsError::Syscall {
                            call: "getsockopt(SO_NETNS_COOKIE)",
                            path,
                            source: nix::Error::from_raw(errno.unwrap_or(libc::EIO)),
                        },
                    })?;
            Ok(NetnsCookie(cookie))
        }
    }

    /// The addresses assigned to the namespace's interfaces, IPv4 and IPv6 (loopback and
    /// link-local ones included).
    pub fn addresses(&self) -> Result<Vec<IpAddr>, NetnsError> {
        self.run_inside(|| self.addresses_here())
    }

    /// Everything the namespace delivers over `lo` but loopback itself: its interfaces'
    /// addresses, and the prefixes of `local` routes that are not one of them (AnyIP).
    pub fn local_destinations(&self) -> Result<LocalDestinations, NetnsError> {
        self.run_inside(|| self.local_here())
    }

    /// [`Self::local_destinations`], from a thread already inside the namespace.
    fn local_here(&self) -> Result<LocalDestinations, NetnsError> {
        let addresses = self.addresses_here()?;
        let routes = routes::dump_local().map_err(|e| NetnsError::Syscall {
            call: "RTM_GETROUTE",
            path: self.path.clone(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        Ok(LocalDestinations::new(addresses, routes))
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

/// Where runtimes give pods' network namespaces a name that outlives their processes
/// (containerd and CRI-O bind-mount them there, as `ip netns add` does); `/var/run` is a link to
/// `/run` on most hosts, not on all.
pub const NAMED_NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// A namespace's identity as `stat` reports it on its nsfs file: the same through
/// `/proc/PID/ns/net` and through a bind mount of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsId {
    dev: u64,
    ino: u64,
}

impl NsId {
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let metadata = std::fs::metadata(path)?;
        Ok(Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
        })
    }
}

/// The entry of `dirs` that is the namespace `id`, if one is: the path a pod's records should
/// keep, as it stays valid for as long as the namespace (`/proc/PID/ns/net` lasts only as long
/// as that process).
pub fn named_path(id: NsId, dirs: &[&Path]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten())
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| NsId::of(path).is_ok_and(|other| other == id))
}

/// Set in [`PodNetns::inode_key`]'s keys: a real netns cookie never has it.
pub const INODE_KEY_BIT: u64 = 1 << 63;

impl PodNetns {
    /// The address and route notifications of this namespace, on a netlink socket bound inside
    /// it (the socket stays in the namespace it was created in).
    pub fn local_changes(&self) -> Result<LocalChanges, NetnsError> {
        let path = self.path.clone();
        self.run_inside(move || {
            // Routes too: an AnyIP `local` route changes what is delivered over lo.
            let socket = interceptor_sys::netns::route_socket(
                (libc::RTMGRP_IPV4_IFADDR
                    | libc::RTMGRP_IPV6_IFADDR
                    | libc::RTMGRP_IPV4_ROUTE
                    | libc::RTMGRP_IPV6_ROUTE) as u32,
            )
            .map_err(|e| NetnsError::Syscall {
                call: "socket(NETLINK_ROUTE) bound to the address and route groups",
                path: path.clone(),
                source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })?;
            Ok(LocalChanges {
                socket,
                buf: vec![0u8; 64 * 1024],
            })
        })
    }
}

/// One namespace's address and route notifications ([`PodNetns::local_changes`]).
pub struct LocalChanges {
    socket: std::os::fd::OwnedFd,
    buf: Vec<u8>,
}

/// What one [`LocalChanges::wait`] heard.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// An address or a `local` route was added or removed.
    Local,
    /// Another route changed: nothing the namespace delivers over lo.
    Other,
    /// The socket's buffer overflowed (ENOBUFS, a burst of changes): some were lost, and only
    /// a dump tells what is in force now. The socket goes on hearing the next ones.
    Lost,
}

impl std::os::fd::AsFd for LocalChanges {
    /// Readable when a notification (or the news of lost ones) waits.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl LocalChanges {
    /// Blocks until the next notification.
    pub fn wait(&mut self) -> std::io::Result<Change> {
        loop {
            return match interceptor_sys::netns::recv(self.socket.as_fd(), &mut self.buf) {
                Ok(n) if interceptor_parse::netlink::changes_local_delivery(&self.buf[..n]) => {
                    Ok(Change::Local)
                }
                Ok(_) => Ok(Change::Other),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(Change::Lost),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inode_key_cannot_be_a_cookie() {
        use std::os::unix::fs::MetadataExt as _;
        let netns = PodNetns::open(Path::new("/proc/self/ns/net")).unwrap();
        let key = netns.inode_key().unwrap();
        let inode = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(key.0, INODE_KEY_BIT | inode);
        assert!(key.0 >= 1 << 63, "real cookies count up from 1");
        assert_eq!(netns.inode_key().unwrap(), key, "stable");
    }

    #[test]
    fn a_namespace_is_found_by_its_identity_among_named_ones() {
        let dir = std::env::temp_dir().join(format!("icpt-named-netns-{}", std::process::id()));
        let other = dir.join("other");
        std::fs::create_dir_all(&other).unwrap();
        for (at, name) in [(&dir, "a"), (&other, "b"), (&other, "c")] {
            std::fs::write(at.join(name), name).unwrap();
        }
        let dirs = [dir.as_path(), Path::new("/nonexistent"), other.as_path()];
        let b = NsId::of(&other.join("b")).unwrap();
        assert_eq!(named_path(b, &dirs), Some(other.join("b")));
        let elsewhere = NsId::of(Path::new("/proc/self/ns/net")).unwrap();
        assert_ne!(elsewhere, b);
        assert_eq!(named_path(elsewhere, &dirs), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
