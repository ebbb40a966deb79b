//! One rtnetlink dump (`NLM_F_DUMP`) of the calling thread's network namespace, on a socket of
//! its own: the request sent, each answer read until `NLMSG_DONE`, what the caller picks from
//! each message kept. Addresses and routes are read this way.
//!
//! A message that does not parse (a kind or attribute this crate's netlink types do not know,
//! from a newer kernel) is skipped and counted rather than failing the dump: a pod's namespace
//! must not pass for unreadable because of one message the pick would not have kept anyway.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    sync::atomic::{AtomicU64, Ordering},
};

use interceptor_sys::netns::{recv, route_socket, send};
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ALIGNTO, NetlinkBuffer, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use tracing::warn;

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

/// Dumps that failed since the process started, by [`Dump`]; messages skipped.
static FAILED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// How many dumps of `what` failed since the process started.
pub fn failures(what: Dump) -> u64 {
    FAILED[what as usize].load(Ordering::Relaxed)
}

/// How many messages of dumps did not parse and were skipped since the process started.
pub fn skipped() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
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
        let mut unknown = fault!("netns-dump-unknown-message").then(unknown_message);
        loop {
            let n = recv(fd.as_fd(), &mut buf)?;
            let done = match unknown.take() {
                Some(mut datagram) => {
                    datagram.extend_from_slice(&buf[..n]);
                    parse(&datagram, &mut picked, &mut pick)?
                }
                None => parse(&buf[..n], &mut picked, &mut pick)?,
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

/// A message of a kind no kernel sends yet (`RTM_*` types end far below it), as a newer kernel's
/// would look to this crate: for the fault tests and the parser's.
pub(super) fn unknown_message() -> Vec<u8> {
    const LEN: u32 = 20;
    let mut bytes = Vec::with_capacity(LEN as usize);
    bytes.extend_from_slice(&LEN.to_ne_bytes());
    bytes.extend_from_slice(&0x3ffu16.to_ne_bytes());
    bytes.extend_from_slice(&(libc::NLM_F_MULTI as u16).to_ne_bytes());
    bytes.extend_from_slice(&1u32.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes
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

/// Parses one datagram of a dump, keeping what `pick` takes; true once the dump is done. Bytes
/// too few for a message header are ignored, as the kernel's `NLMSG_OK` does. A message whose
/// header holds but whose content does not parse is skipped and counted; a header whose length
/// does not fit the datagram leaves nothing after it readable, and fails the dump.
pub(super) fn parse<T>(
    mut data: &[u8],
    picked: &mut Vec<T>,
    pick: &mut impl FnMut(RouteNetlinkMessage) -> Option<T>,
) -> io::Result<bool> {
    while data.len() >= size_of::<libc::nlmsghdr>() {
        let header = NetlinkBuffer::new_checked(data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let (length, kind) = (header.length(), header.message_type());
        let len = (length as usize).next_multiple_of(NLMSG_ALIGNTO.into());
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(data) {
            Ok(message) => match message.payload {
                NetlinkPayload::Done(_) => return Ok(true),
                NetlinkPayload::Error(e) => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(inner) => picked.extend(pick(inner)),
                _ => {}
            },
            Err(error) => {
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                warn!(message_type = kind, length, %error, "skipped a netlink message that does not parse");
            }
        }
        data = data.get(len..).unwrap_or_default();
    }
    Ok(false)
}
