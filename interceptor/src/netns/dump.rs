//! One rtnetlink dump (`NLM_F_DUMP`) of the calling thread's network namespace, on a socket of
//! its own: the request sent, each answer read until `NLMSG_DONE`, what the caller picks from
//! each message kept. Addresses and routes are read this way.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
};

use interceptor_sys::netns::{recv, route_socket, send};
use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_ALIGNTO, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;

/// Sends `request` as a dump and returns what `pick` takes from the messages of the answer.
pub(super) fn dump<T>(
    request: RouteNetlinkMessage,
    mut pick: impl FnMut(RouteNetlinkMessage) -> Option<T>,
) -> io::Result<Vec<T>> {
    let fd = route_socket(0)?;
    send_request(&fd, request, NLM_F_DUMP)?;

    let mut picked = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_fd(), &mut buf)?;
        if parse(&buf[..n], &mut picked, &mut pick)? {
            return Ok(picked);
        }
    }
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
/// too few for a message header are ignored, as the kernel's `NLMSG_OK` does.
pub(super) fn parse<T>(
    mut data: &[u8],
    picked: &mut Vec<T>,
    pick: &mut impl FnMut(RouteNetlinkMessage) -> Option<T>,
) -> io::Result<bool> {
    while data.len() >= size_of::<libc::nlmsghdr>() {
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(data)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let len = (message.header.length as usize).next_multiple_of(NLMSG_ALIGNTO.into());
        match message.payload {
            NetlinkPayload::Done(_) => return Ok(true),
            NetlinkPayload::Error(e) => return Err(e.to_io()),
            NetlinkPayload::InnerMessage(inner) => picked.extend(pick(inner)),
            _ => {}
        }
        data = data.get(len..).unwrap_or_default();
    }
    Ok(false)
}
