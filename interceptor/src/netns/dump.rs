//! One rtnetlink dump (`NLM_F_DUMP`) of the calling thread's network namespace, on a socket of
//! its own: the request sent, each answer read until `NLMSG_DONE`, what the caller picks from
//! each message kept. Addresses and routes are read this way.
//!
//! The datagrams are parsed by `interceptor_parse::netlink` (which the `netlink` fuzz target
//! drives): a message that does not parse is skipped and counted there, not a failed dump.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    sync::atomic::{AtomicU64, Ordering},
};

use interceptor_parse::netlink;
use interceptor_sys::netns::{recv, route_socket, send};
use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;

use crate::crash_points::fault;

/// What a dump reads, as its failures are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dump {
    /// `RTM_GETADDR`: the namespace's addresses.
    Addresses,
    /// `RTM_GETROUTE`: its `local` routes.
    Routes,
}

impl Dump {
    pub const ALL: [Self; 2] = [Self::Addresses, Self::Routes];

    /// The metrics' label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Addresses => "addresses",
            Self::Routes => "routes",
        }
    }

    /// Whether the fault tests armed this dump's failure.
    fn fault_armed(self) -> bool {
        match self {
            Self::Addresses => fault!("netns-address-dump-fails"),
            Self::Routes => fault!("netns-route-dump-fails"),
        }
    }
}

/// Dumps that failed since the process started, by [`Dump`].
static FAILED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many dumps of `what` failed since the process started.
pub fn failures(what: Dump) -> u64 {
    FAILED[what as usize].load(Ordering::Relaxed)
}

/// Sends `request` as a dump and returns what `pick` takes from the messages of the answer.
pub(super) fn dump<T>(
    what: Dump,
    request: RouteNetlinkMessage,
    mut pick: impl FnMut(RouteNetlinkMessage) -> Option<T>,
) -> io::Result<Vec<T>> {
    let dumped = (|| {
        if what.fault_armed() {
            // What a dump that outran its socket's buffer gets.
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        let fd = route_socket(0)?;
        send_request(&fd, request, NLM_F_DUMP)?;

        let mut picked = Vec::new();
        let mut buf = vec![0u8; 32 * 1024];
        let mut unknown = fault!("netns-dump-unknown-message").then(netlink::unknown_message);
        loop {
            let n = recv(fd.as_fd(), &mut buf)?;
            let done = match unknown.take() {
                Some(mut datagram) => {
                    datagram.extend_from_slice(&buf[..n]);
                    netlink::parse_dump(&datagram, &mut picked, &mut pick)?
                }
                None => netlink::parse_dump(&buf[..n], &mut picked, &mut pick)?,
            };
            if done {
                return Ok(picked);
            }
        }
    })();
    if dumped.is_err() {
        FAILED[what as usize].fetch_add(1, Ordering::Relaxed);
    }
    dumped
}

/// Sends one request on `socket`, with `flags` beside `NLM_F_REQUEST`, as sequence number 1.
pub(super) fn send_request(
    socket: &OwnedFd,
    request: RouteNetlinkMessage,
    flags: u16,
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut message = NetlinkMessage::new(header, request.into());
    message.finalize();
    let mut datagram = vec![0u8; message.buffer_len()];
    message.serialize(&mut datagram);
    send(socket.as_fd(), &datagram).map(drop)
}
