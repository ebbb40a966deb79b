//! Finding a proxy inbound listener that already existed when the pod was registered.
//!
//! New listeners are caught in the kernel: the sock_ops program sees every listen() in a meshed
//! pod (`BPF_SOCK_OPS_TCP_LISTEN_CB`) and puts the socket on the inbound port in the listener map.
//! A socket that was listening before that program was attached produced no callback, so on
//! registration userspace looks for it: a process in the pod's namespace with a TCP socket in
//! LISTEN state on the inbound port (from /proc/PID/net/tcp{,6} and /proc/PID/fd), and takes a
//! duplicate of it with pidfd_getfd(2) (Linux 5.6) to insert into the map. No change to the proxy.
use std::{collections::HashSet, fs, os::fd::OwnedFd, os::unix::fs::MetadataExt as _, path::Path};

use super::PodNetns;

/// A listening socket found in a pod, and whether it is an IPv6 (`AF_INET6`) one.
pub struct Listening {
    pub socket: OwnedFd,
    pub ipv6: bool,
}

/// Duplicates of the TCP sockets listening on `port` in the namespace at `netns`, at most one
/// per family (a proxy may listen on `0.0.0.0` and `[::]`, or only on a dual-stack `[::]`).
pub fn find_listeners(netns: &PodNetns, port: u16) -> Vec<Listening> {
    let mut found: Vec<Listening> = Vec::new();
    // Nothing has the port there (a pod registered before its containers start, as a CNI
    // plugin does): no need to look through every process of the machine.
    if !netns.run_inside(|| Ok(port_in_use(port))).unwrap_or(true) {
        return found;
    }
    let Ok(target) = fs::metadata(netns.path()) else {
        return found;
    };
    let Ok(procs) = fs::read_dir("/proc") else {
        return found;
    };
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let proc_dir = Path::new("/proc").join(pid.to_string());
        let Ok(ns) = fs::metadata(proc_dir.join("ns/net")) else {
            continue;
        };
        if (ns.dev(), ns.ino()) != (target.dev(), target.ino()) {
            continue;
        }
        for ipv6 in [false, true] {
            if found.iter().any(|l| l.ipv6 == ipv6) {
                continue;
            }
            let inodes = listening_inodes(&proc_dir, port, ipv6);
            if let Some(socket) = steal_socket(&proc_dir, pid, &inodes) {
                found.push(Listening { socket, ipv6 });
            }
        }
        if found.len() == 2 {
            break;
        }
    }
    found
}

/// Whether a socket of the current network namespace has TCP `port`: a bind that is never
/// followed by listen() (so no connection can reach it, and no sock_ops callback sees it), on
/// a dual-stack `[::]` (which conflicts with sockets of both families), else on `0.0.0.0`.
/// Reading `/proc/net/tcp` instead walks the whole machine's connection table, milliseconds.
fn port_in_use(port: u16) -> bool {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, socket,
    };
    let in_use = |e: nix::Error| e == nix::Error::EADDRINUSE;
    let stream = SockType::Stream;
    match socket(AddressFamily::Inet6, stream, SockFlag::SOCK_CLOEXEC, None) {
        Ok(fd) => {
            let any6 = SockaddrIn6::from(std::net::SocketAddrV6::new(
                std::net::Ipv6Addr::UNSPECIFIED,
                port,
                0,
                0,
            ));
            bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &any6).is_err_and(in_use)
        }
        // No IPv6 in this namespace: IPv4 only.
        Err(_) => socket(AddressFamily::Inet, stream, SockFlag::SOCK_CLOEXEC, None)
            .map(|fd| {
                let any4 = SockaddrIn::new(0, 0, 0, 0, port);
                bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &any4).is_err_and(in_use)
            })
            .unwrap_or(true),
    }
}

/// A duplicate of the first of `pid`'s file descriptors that is one of the sockets `inodes`.
fn steal_socket(proc_dir: &Path, pid: i32, inodes: &HashSet<u64>) -> Option<OwnedFd> {
    if inodes.is_empty() {
        return None;
    }
    for fd in fs::read_dir(proc_dir.join("fd")).ok()?.flatten() {
        let Ok(link) = fs::read_link(fd.path()) else {
            continue;
        };
        let inode = interceptor_parse::proc::socket_inode(&link);
        if inode.is_some_and(|i| inodes.contains(&i))
            && let Some(fd_num) = fd.file_name().to_str().and_then(|n| n.parse().ok())
            && let Ok(dup) = interceptor_sys::duplicate_fd_of(pid, fd_num)
        {
            return Some(dup);
        }
    }
    None
}

/// Inodes of sockets listening on `port` in the namespace of `proc_dir`'s process, from
/// `net/tcp6` (IPv6 sockets, dual-stack ones included) or `net/tcp`.
fn listening_inodes(proc_dir: &Path, port: u16, ipv6: bool) -> HashSet<u64> {
    let table = if ipv6 { "net/tcp6" } else { "net/tcp" };
    fs::read_to_string(proc_dir.join(table))
        .map(|text| interceptor_parse::proc::listening_inodes(&text, port))
        .unwrap_or_default()
}
