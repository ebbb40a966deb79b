//! Network namespaces and rtnetlink: what the node needs of them that neither std nor nix
//! offers safely (an nsfs ioctl, a socket option nix has no wrapper for, netlink sockets, and
//! entering a namespace in a child before it runs a program).
use std::{
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
        unix::process::CommandExt as _,
    },
    process::Command,
};

/// The loopback interface's index, the same in every network namespace: `LOOPBACK_IFINDEX` of
/// the kernel's `include/net/net_namespace.h`, which no UAPI header exports (Linux 4.9).
pub const LOOPBACK_IFINDEX: u32 = 1;

/// Whether `fd` (an open nsfs file, e.g. `/run/netns/NAME` or `/proc/PID/ns/net`) is a network
/// namespace. Any other file is not (the ioctl fails on it).
pub fn is_network_namespace(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd.
    let nstype = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    nstype == libc::CLONE_NEWNET
}

/// The cookie of the network namespace `socket` was created in (`SO_NETNS_COOKIE`).
pub fn socket_netns_cookie(socket: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    let mut len = size_of::<u64>() as libc::socklen_t;
    // SAFETY: the buffer is a valid u64 and len says so.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            (&raw mut cookie).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// An rtnetlink socket in the calling thread's network namespace, bound to the multicast
/// `groups` (`RTMGRP_*`; 0 for none, a socket that only asks).
pub fn route_socket(groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if groups != 0 {
        // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = groups;
        // SAFETY: addr is a valid sockaddr_nl of the given length.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Has a netlink socket receive the notifications of every network namespace that has an id in
/// its own (`NETLINK_LISTEN_ALL_NSID`, Linux 4.2); [`recv_with_nsid`] tells which one each came
/// from. Delivery from another namespace needs CAP_NET_BROADCAST over it.
pub fn listen_all_nsid(socket: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid c_int for the option's length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_LISTEN_ALL_NSID,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one datagram into `buf` on a socket set up with [`listen_all_nsid`]: its length, and
/// the id (in the socket's namespace) of the namespace it came from; `None` for the socket's own
/// namespace or one without an id.
pub fn recv_with_nsid(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<i32>)> {
    // Room for one control message holding an i32, aligned as CMSG_SPACE wants.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    // SAFETY: msg points at buffers valid for the lengths it gives.
    let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut nsid = None;
    // SAFETY: the CMSG_* macros walk the control buffer recvmsg filled, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_NETLINK
                && (*cmsg).cmsg_type == libc::NETLINK_LISTEN_ALL_NSID
                && (*cmsg).cmsg_len as usize >= libc::CMSG_LEN(size_of::<i32>() as u32) as usize
            {
                nsid = Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<i32>(),
                ));
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    Ok((n as usize, nsid))
}

/// Sends one datagram on a connected or netlink socket (to the kernel, for netlink).
pub fn send(socket: BorrowedFd<'_>, datagram: &[u8]) -> io::Result<usize> {
    // SAFETY: datagram is valid for reads of its length.
    let n = unsafe {
        libc::send(
            socket.as_raw_fd(),
            datagram.as_ptr().cast(),
            datagram.len(),
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives one datagram into `buf`; returns its length (at most `buf.len()`).
pub fn recv(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Makes `command`'s child enter the network namespace `netns` (an open nsfs fd) before it runs
/// its program. The fd must still be open when the command is spawned; if it is not, the spawn
/// fails with the error of setns(2).
pub fn enter_netns_before_exec(command: &mut Command, netns: RawFd) {
    // SAFETY: the closure runs between fork and exec and only calls setns(2), which is
    // async-signal-safe, and reads errno.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(netns, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs::File, os::fd::AsFd as _};

    #[test]
    fn a_network_namespace_is_told_from_other_namespaces() {
        let net = File::open("/proc/self/ns/net").unwrap();
        let uts = File::open("/proc/self/ns/uts").unwrap();
        assert!(is_network_namespace(net.as_fd()));
        assert!(!is_network_namespace(uts.as_fd()));
    }

    #[test]
    fn loopback_has_the_kernels_fixed_index() {
        // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
        let index = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        assert_eq!(index, LOOPBACK_IFINDEX);
    }

    /// Whether the running kernel is at least `major.minor`.
    fn kernel_at_least(major: u32, minor: u32) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release
            .split(['.', '-'])
            .map(|n| n.parse::<u32>().unwrap_or(0));
        (numbers.next().unwrap(), numbers.next().unwrap()) >= (major, minor)
    }

    #[test]
    fn sockets_of_one_namespace_have_its_cookie() {
        if !kernel_at_least(5, 14) {
            eprintln!("skipped: SO_NETNS_COOKIE needs Linux 5.14");
            return;
        }
        let socket = || std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, b) = (socket(), socket());
        let cookie = socket_netns_cookie(a.as_fd()).unwrap();
        assert_ne!(cookie, 0);
        assert_eq!(socket_netns_cookie(b.as_fd()).unwrap(), cookie);
    }
}
