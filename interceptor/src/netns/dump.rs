//! One rtnetlink dump (`NLM_F_DUMP`) of the calling thread's network namespace, on a socket of
//! its own: the request sent, each answer read until `NLMSG_DONE`, what the caller picks from
//! each message kept. Addresses and routes are read this way.
use std::{io, os::fd::AsFd as _};

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
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut request = NetlinkMessage::new(header, request.into());
    request.finalize();
    let mut datagram = vec![0u8; request.buffer_len()];
    request.serialize(&mut datagram);
    send(fd.as_fd(), &datagram)?;

    let mut picked = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_fd(), &mut buf)?;
        if parse(&buf[..n], &mut picked, &mut pick)? {
            return Ok(picked);
        }
    }
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
