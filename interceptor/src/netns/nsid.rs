//! Address changes in every pod's namespace, heard on one socket: an rtnetlink socket in the
//! agent's namespace, subscribed to address notifications with `NETLINK_LISTEN_ALL_NSID`, hears
//! those of every namespace that has an id (an nsid) in the agent's, and learns from each
//! message's control data which one it came from. A pod's namespace is given an id when it is
//! watched (`ip netns set NAME auto` does the same; a veth across namespaces gets one anyway).
//!
//! Unlike a socket opened inside each pod's namespace, this holds no reference to the pods'
//! namespaces (a socket keeps its namespace alive), and costs one file descriptor per node.
use std::{io, os::fd::AsFd as _, os::fd::AsRawFd as _, os::fd::OwnedFd};

use interceptor_parse::netlink;
use interceptor_sys::netns::{listen_all_nsid, recv, recv_with_nsid, route_socket};
use netlink_packet_core::{NLM_F_ACK, NLM_F_ECHO, NLMSG_ALIGNTO, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    nsid::{NsidAttribute, NsidMessage},
};

use super::{PodNetns, dump::send_request};

/// `NETNSA_NSID_NOT_ASSIGNED`: the namespace has no id in ours.
const NOT_ASSIGNED: i32 = -1;

/// The id the namespace has in the calling thread's, given one first if it has none: one round
/// trip for a namespace that has one (a pod with a veth to the node has), two for one that has
/// not (`RTM_NEWNSID` with `NLM_F_ECHO` answers with the id it assigned, since Linux 5.6).
pub fn nsid_of(netns: &PodNetns) -> io::Result<i32> {
    let fd = netns.file().as_raw_fd() as u32;
    let socket = route_socket(0)?;
    match ask(&socket, RouteNetlinkMessage::GetNsId(by_fd(fd, None)), 0)? {
        Some(id) if id != NOT_ASSIGNED => return Ok(id),
        _ => {}
    }
    // Another process may assign one in between: EEXIST, and the next question has it.
    match ask(
        &socket,
        RouteNetlinkMessage::NewNsId(by_fd(fd, Some(NOT_ASSIGNED))),
        NLM_F_ECHO,
    ) {
        Ok(Some(id)) if id != NOT_ASSIGNED => return Ok(id),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(e),
    }
    match ask(&socket, RouteNetlinkMessage::GetNsId(by_fd(fd, None)), 0)? {
        Some(id) if id != NOT_ASSIGNED => Ok(id),
        _ => Err(io::Error::other(
            "the kernel assigned the namespace no id (RTM_NEWNSID)",
        )),
    }
}

fn by_fd(fd: u32, id: Option<i32>) -> NsidMessage {
    let mut message = NsidMessage::default();
    message.attributes.push(NsidAttribute::Fd(fd));
    message.attributes.extend(id.map(NsidAttribute::Id));
    message
}

/// Sends one request (with `flags` beside `NLM_F_REQUEST | NLM_F_ACK`) and reads its answer:
/// the id a `NEWNSID` answer (or echo) carries, `None` for an acknowledgement alone. The answer
/// and its acknowledgement are read up to the acknowledgement, so the next request on `socket`
/// reads its own.
fn ask(socket: &OwnedFd, request: RouteNetlinkMessage, flags: u16) -> io::Result<Option<i32>> {
    send_request(socket, request, NLM_F_ACK | flags)?;
    let mut buf = vec![0u8; 4096];
    let mut id = None;
    loop {
        let n = recv(socket.as_fd(), &mut buf)?;
        let mut data = &buf[..n];
        while data.len() >= size_of::<libc::nlmsghdr>() {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(data)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            match reply.payload {
                NetlinkPayload::Error(e) => match e.code {
                    Some(_) => return Err(interceptor_parse::netlink::error_to_io(&e)),
                    None => return Ok(id),
                },
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(answer)) => {
                    id = answer.attributes.iter().find_map(|a| match a {
                        NsidAttribute::Id(id) => Some(*id),
                        _ => None,
                    });
                }
                _ => {}
            }
            let len = (reply.header.length as usize).next_multiple_of(NLMSG_ALIGNTO.into());
            data = data.get(len..).unwrap_or_default();
        }
    }
}

/// Address and route notifications from every namespace with an id in the calling thread's.
pub struct AddressChanges {
    socket: OwnedFd,
    buf: Vec<u8>,
}

/// What one [`AddressChanges::wait`] heard.
#[derive(Debug, PartialEq, Eq)]
pub enum Heard {
    /// An address or route of the namespace with this id was added or removed.
    In(i32),
    /// Something of the listener's own namespace, or of one without an id: not a pod's.
    Elsewhere,
    /// The socket's buffer overflowed (ENOBUFS): notifications were lost.
    Lost,
}

impl AddressChanges {
    pub fn open() -> io::Result<Self> {
        // Routes too: an AnyIP `local` route changes what a pod delivers over lo. The node's
        // own route changes (a pod's veth route) are heard as `Elsewhere` and cost a wake-up.
        let socket = route_socket(
            (libc::RTMGRP_IPV4_IFADDR
                | libc::RTMGRP_IPV6_IFADDR
                | libc::RTMGRP_IPV4_ROUTE
                | libc::RTMGRP_IPV6_ROUTE) as u32,
        )?;
        listen_all_nsid(socket.as_fd())?;
        Ok(Self {
            socket,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Blocks until the next notification.
    pub fn wait(&mut self) -> io::Result<Heard> {
        match recv_with_nsid(self.socket.as_fd(), &mut self.buf) {
            Ok((n, Some(id))) if netlink::changes_local_delivery(&self.buf[..n]) => {
                Ok(Heard::In(id))
            }
            Ok((_, Some(_))) => Ok(Heard::Elsewhere),
            Ok((_, None)) => Ok(Heard::Elsewhere),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(Heard::Lost),
            Err(e) => Err(e),
        }
    }
}
