//! Sockets the test binaries (`netprobe`, `connload`) listen with.
use std::{io, net::SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// A TCP socket listening on `addr` with `backlog`; an IPv6 one is dual-stack unless `v6only`.
pub fn listening(addr: SocketAddr, v6only: bool, backlog: i32) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true).ok();
    if addr.is_ipv6() {
        socket.set_only_v6(v6only)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    Ok(socket)
}
