//! The processes of a test pod: an app that connects, a proxy that asks SO_ORIGINAL_DST as any
//! proxy does, and plain servers. Each can first enter a network namespace, a cgroup and a
//! UID/GID, so a test (or the demo) starts it exactly where a pod's process would run.
//!
//! Every accepted connection is answered with one line:
//! `who=proxy:NAME orig=IP:PORT|errno:N peer=IP:PORT local=IP:PORT`
//! and `netprobe connect` prints that line (or `error=...`) per connection.
//!
//! Addresses of either family: `10.0.0.1:80` connects from an `AF_INET` socket,
//! `[2001:db8::1]:80` and `[::ffff:10.0.0.1]:80` from an `AF_INET6` one. `--via` picks the
//! socket path an app can open a TCP connection with (blocking or non-blocking connect, io_uring,
//! TCP Fast Open by `sendto(MSG_FASTOPEN)` or `TCP_FASTOPEN_CONNECT`, Multipath TCP).
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

fn usage() -> ! {
    eprintln!(
        "usage: netprobe [--netns PATH] [--cgroup DIR] [--uid N] [--gid N] [--groups G,...] COMMAND\n\
         commands:\n  \
           proxy ADDR... [--name N] [--no-orig] [--ask-ipv6] [--inline] [--v6only]  accept, answer with SO_ORIGINAL_DST\n  \
           server ADDR... [--name N] [--v6only] [--close]  accept, answer who it is\n  \
           connect ADDR... [--count N | --seconds S] [--bind ADDR] [--linger0] [--via PATH]\n  \
             PATH: connect (default), nonblocking, io-uring, fastopen-sendto, fastopen-connect, mptcp\n  \
           check ADDR... [--count N | --seconds S] [--threads T]  connect in a loop, verify every orig\n  \
           bench ADDR... --seconds S [--threads T] connect in a loop for S seconds, print the rate\n  \
           udp-server ADDR | udp-send ADDR MSG\n  \
           hold ADDR  one connection kept open: the peer's line and getpeername(), then, once stdin\n  \
             closes, getpeername() again (app_peer_after=)\n  \
           probes  one connection per stdin line: ADDR [--via PATH] [--bind ADDR]\n  \
             [--creds R:E:RG:EG] [--socket-creds R:E:RG:EG] [--groups G,...]; also reads to the end and\n  \
             prints getpeername() after the peer's close (app_peer_after=)"
    );
    std::process::exit(2)
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    enter_context(&mut args);
    let Some(command) = (!args.is_empty()).then(|| args.remove(0)) else {
        usage()
    };
    match command.as_str() {
        "proxy" => serve(&args, true),
        "server" => serve(&args, false),
        "connect" => connect_cmd(&args),
        "check" => check_cmd(&args),
        "bench" => bench_cmd(&args),
        "udp-server" => udp_server(&args),
        "udp-send" => udp_send(&args),
        "probes" => probes_cmd(),
        "hold" => hold_cmd(&args),
        _ => usage(),
    }
}

/// Takes `--flag value` out of args.
fn take_opt(args: &mut Vec<String>, flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    args.remove(i);
    (i < args.len()).then(|| args.remove(i))
}

fn take_flag(args: &mut Vec<String>, flag: &str) -> bool {
    args.iter()
        .position(|a| a == flag)
        .map(|i| args.remove(i))
        .is_some()
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("netprobe: {what}: {e}");
    std::process::exit(1)
}

/// Enters netns, then cgroup, then the user namespace that owns the netns where it is not
/// ours (a pod with `hostUsers: false`: its processes are in it, and the ids below are its),
/// then drops to uid/gid and the supplementary groups: the order a container runtime uses.
fn enter_context(args: &mut Vec<String>) {
    let netns = take_opt(args, "--netns");
    let cgroup = take_opt(args, "--cgroup");
    let uid = take_opt(args, "--uid").map(|u| u.parse::<u32>().unwrap_or_else(|e| die("--uid", e)));
    let gid = take_opt(args, "--gid").map(|g| g.parse::<u32>().unwrap_or_else(|e| die("--gid", e)));
    let groups: Vec<libc::gid_t> = take_opt(args, "--groups")
        .map(|list| {
            list.split(',')
                .map(|g| g.parse().unwrap_or_else(|e| die("--groups", e)))
                .collect()
        })
        .unwrap_or_default();
    let mut userns = None;
    if let Some(netns) = netns {
        let f = std::fs::File::open(&netns).unwrap_or_else(|e| die(&netns, e));
        // SAFETY: setns on a valid fd; this process is single-threaded here.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            die("setns", std::io::Error::last_os_error());
        }
        let owner = interceptor_sys::userns::owning_user_namespace(std::os::fd::AsFd::as_fd(&f))
            .unwrap_or_else(|e| die("NS_GET_USERNS", e));
        let own = interceptor_sys::userns::is_own_user_namespace(std::os::fd::AsFd::as_fd(&owner))
            .unwrap_or_else(|e| die("its user namespace", e));
        userns = (!own).then_some(owner);
    }
    if let Some(cgroup) = cgroup {
        let procs = PathBuf::from(&cgroup).join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string()).unwrap_or_else(|e| die(&cgroup, e));
    }
    // SAFETY: setns on a valid fd (single-threaded, as joining a user namespace needs), then
    // plain credential syscalls.
    unsafe {
        if let Some(userns) = &userns
            && libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER) != 0
        {
            die("setns(CLONE_NEWUSER)", std::io::Error::last_os_error());
        }
        if (uid.is_some() || gid.is_some() || !groups.is_empty() || userns.is_some())
            && libc::setgroups(groups.len(), groups.as_ptr()) != 0
        {
            die("setgroups", std::io::Error::last_os_error());
        }
        if let Some(gid) = gid
            && libc::setresgid(gid, gid, gid) != 0
        {
            die("setresgid", std::io::Error::last_os_error());
        }
        if let Some(uid) = uid
            && libc::setresuid(uid, uid, uid) != 0
        {
            die("setresuid", std::io::Error::last_os_error());
        }
    }
}

fn parse_addr(s: &str) -> SocketAddr {
    s.parse()
        .unwrap_or_else(|e| die(&format!("address {s:?}"), e))
}

/// The original destination as a proxy asks for it: `getsockopt(SOL_IP, SO_ORIGINAL_DST)` for an
/// IPv4 connection (also one accepted on a dual-stack `[::]` socket, whose peer is
/// `::ffff:a.b.c.d`), `getsockopt(SOL_IPV6, IP6T_SO_ORIGINAL_DST)` for an IPv6 one.
fn original_dst(stream: &TcpStream) -> Result<SocketAddr, i32> {
    let peer = stream
        .peer_addr()
        .map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let socket = socket2::SockRef::from(stream);
    let ipv4 = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
    } && !ASK_IPV6.get().copied().unwrap_or(false);
    let orig = if ipv4 {
        socket.original_dst_v4()
    } else {
        socket.original_dst_v6()
    };
    let orig = orig.map_err(|e| e.raw_os_error().unwrap_or(0))?;
    orig.as_socket().ok_or(0)
}

/// `proxy --ask-ipv6`: always ask `IP6T_SO_ORIGINAL_DST`, whatever the connection's family
/// (what a proxy that does not tell IPv4-mapped peers apart would do).
static ASK_IPV6: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// A listening socket on `addr`; an IPv6 one is dual-stack unless `v6only`.
fn listen_on(addr: SocketAddr, v6only: bool) -> TcpListener {
    interceptor_tests::sockets::listening(addr, v6only, 1024)
        .unwrap_or_else(|e| die(&format!("listen {addr}"), e))
        .into()
}

fn serve(args: &[String], is_proxy: bool) {
    let mut args = args.to_vec();
    let name = take_opt(&mut args, "--name").unwrap_or_else(|| "-".into());
    let ask = !take_flag(&mut args, "--no-orig");
    let _ = ASK_IPV6.set(take_flag(&mut args, "--ask-ipv6"));
    // A lean proxy for the bench: one SO_ORIGINAL_DST per connection, answered in the accept
    // loop instead of a thread per connection.
    let inline = take_flag(&mut args, "--inline");
    let v6only = take_flag(&mut args, "--v6only");
    let close = take_flag(&mut args, "--close");
    if args.is_empty() {
        usage()
    }
    // Every address listens before "ready"; each has its own accept loop.
    let listeners: Vec<TcpListener> = args
        .iter()
        .map(|a| listen_on(parse_addr(a), v6only))
        .collect();
    println!("ready");
    std::io::stdout().flush().ok();
    let role = if is_proxy { "proxy" } else { "server" };
    std::thread::scope(|scope| {
        for listener in &listeners {
            let name = &name;
            scope.spawn(move || accept_loop(listener, role, name, is_proxy && ask, inline, close));
        }
    });
}

/// `close`: read the client's first line, answer, and close the socket at once, as a proxy
/// does once it has forwarded everything (`netprobe probes` clients send a line).
fn accept_loop(
    listener: &TcpListener,
    role: &str,
    name: &str,
    ask: bool,
    inline: bool,
    close: bool,
) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let (role, name) = (role.to_owned(), name.to_owned());
        let mut answer = move || {
            if close {
                stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
                let _ = BufReader::new(&stream).read_line(&mut String::new());
            }
            // Asked twice (unless --inline): a proxy may ask again, and must get the same answer.
            let ask_twice = |s: &TcpStream| {
                let first = original_dst(s);
                (first, if inline { first } else { original_dst(s) })
            };
            let orig = match ask.then(|| ask_twice(&stream)) {
                None => "-".to_string(),
                Some((first, second)) if first != second => {
                    format!("inconsistent:{first:?}/{second:?}")
                }
                Some((Ok(a), _)) => a.to_string(),
                Some((Err(errno), _)) => format!("errno:{errno}"),
            };
            let peer = stream.peer_addr().map_or("-".into(), |a| a.to_string());
            let local = stream.local_addr().map_or("-".into(), |a| a.to_string());
            let _ = writeln!(
                stream,
                "who={role}:{name} orig={orig} peer={peer} local={local}"
            );
            if !inline && !close {
                // Read what the client sent (fast-open clients send a line) until it closes:
                // closing with unread data would reset the connection under the reply. A
                // `hold` client's line keeps this side open until it closes.
                let _ = stream.shutdown(std::net::Shutdown::Write);
                stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
                let mut reader = BufReader::new(&stream);
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                if first == HOLD_LINE {
                    stream.set_read_timeout(Some(HOLD_TIMEOUT)).ok();
                }
                let _ = reader.read_to_end(&mut Vec::new());
            }
        };
        if inline {
            answer();
        } else {
            std::thread::spawn(answer);
        }
    }
}

/// How an app opens its TCP connection: every socket path that reaches the kernel's connect.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// A blocking connect(2).
    Connect,
    /// O_NONBLOCK connect(2), EINPROGRESS, poll for POLLOUT, SO_ERROR.
    Nonblocking,
    /// IORING_OP_CONNECT.
    IoUring,
    /// No connect(2): sendto(MSG_FASTOPEN) with the destination and the first bytes.
    FastopenSendto,
    /// setsockopt(TCP_FASTOPEN_CONNECT), connect(2) returns at once, the SYN leaves on write.
    FastopenConnect,
    /// A Multipath TCP socket (IPPROTO_MPTCP, as Go and others may open): the kernel connects
    /// its first subflow, a TCP socket, which falls back to plain TCP with a peer that does not
    /// speak MPTCP.
    Mptcp,
}

impl Via {
    fn parse(s: &str) -> Self {
        match s {
            "connect" => Self::Connect,
            "nonblocking" => Self::Nonblocking,
            "io-uring" => Self::IoUring,
            "fastopen-sendto" => Self::FastopenSendto,
            "fastopen-connect" => Self::FastopenConnect,
            "mptcp" => Self::Mptcp,
            _ => usage(),
        }
    }
}

/// What a `hold` client sends once answered: the proxy keeps its side open until the client
/// closes (at most [`HOLD_TIMEOUT`]), as a proxy forwarding a long connection does.
const HOLD_LINE: &str = "hold\n";
const HOLD_TIMEOUT: Duration = Duration::from_secs(120);

/// `hold ADDR`: a connection made before an event (an agent's upgrade) and asked about after it.
/// Prints the peer's line with the app's `getpeername()` at once; once stdin closes, prints
/// `app_peer_after=` with `getpeername()` again, the connection still open.
fn hold_cmd(args: &[String]) {
    let [target] = args else { usage() };
    let target = parse_addr(target);
    let connected = open_socket(target, Via::Connect).and_then(|socket| {
        connect_blocking(&socket, &SockAddr::from(target)).map_err(|e| errno("connect", e))?;
        Ok(TcpStream::from(socket))
    });
    let stream = match connected {
        Ok(stream) => stream,
        Err(e) => {
            println!("error={e}");
            return;
        }
    };
    let peer_name = || {
        stream
            .peer_addr()
            .map_or_else(|e| format!("error:{}", errno_name(&e)), |a| a.to_string())
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut line = String::new();
    match BufReader::new(&stream).read_line(&mut line) {
        Ok(n) if n > 0 => {
            println!("{} app_peer={}", line.trim_end(), peer_name());
            (&stream).write_all(HOLD_LINE.as_bytes()).ok();
        }
        Ok(_) => println!("error=read:eof"),
        Err(e) => println!("error=read:{e}"),
    }
    std::io::stdout().flush().ok();
    std::io::stdin().read_to_end(&mut Vec::new()).ok();
    println!("app_peer_after={}", peer_name());
}

/// Connects (optionally from a fixed local address), returns the peer's line.
fn connect_once(
    target: SocketAddr,
    bind: Option<SocketAddr>,
    linger0: bool,
    via: Via,
) -> Result<String, String> {
    let socket = open_socket(target, via)?;
    finish_connect(socket, target, bind, linger0, via, false)
}

fn errno(call: &str, e: std::io::Error) -> String {
    format!("{call}:{}", errno_name(&e))
}

/// The socket `via` connects with, not yet connected: whoever creates it owns it for
/// iptables' owner match, which reads the credentials of the socket's file.
fn open_socket(target: SocketAddr, via: Via) -> Result<Socket, String> {
    let protocol = if via == Via::Mptcp {
        Protocol::MPTCP
    } else {
        Protocol::TCP
    };
    let socket = Socket::new(Domain::for_address(target), Type::STREAM, Some(protocol))
        .map_err(|e| errno("socket", e))?;
    socket.set_reuse_address(true).ok();
    Ok(socket)
}

/// Connects `socket` and returns the peer's line with the app's `getpeername()`; with
/// `peer_after`, also reads to the end of the stream (the peer shuts its side down after its
/// line) and adds `getpeername()` then, as an app logging its peer on completion sees it.
fn finish_connect(
    socket: Socket,
    target: SocketAddr,
    bind: Option<SocketAddr>,
    linger0: bool,
    via: Via,
    peer_after: bool,
) -> Result<String, String> {
    if let Some(bind) = bind {
        socket.bind(&bind.into()).map_err(|e| errno("bind", e))?;
    }
    let addr = SockAddr::from(target);
    // The fast-open paths send a first line with (or right after) the SYN.
    match via {
        Via::Connect | Via::Mptcp => {
            connect_blocking(&socket, &addr).map_err(|e| errno("connect", e))?
        }
        Via::Nonblocking => connect_nonblocking(&socket, &addr).map_err(|e| errno("connect", e))?,
        Via::IoUring => connect_io_uring(&socket, &addr).map_err(|e| errno("connect", e))?,
        Via::FastopenSendto => {
            let sent = socket.send_to_with_flags(FIRST_LINE, &addr, libc::MSG_FASTOPEN);
            first_line_sent(&socket, sent).map_err(|e| errno("connect", e))?;
        }
        Via::FastopenConnect => {
            set_fastopen_connect(&socket).map_err(|e| errno("setsockopt", e))?;
            socket.connect(&addr).map_err(|e| errno("connect", e))?;
            let sent = socket.send(FIRST_LINE);
            first_line_sent(&socket, sent).map_err(|e| errno("connect", e))?;
        }
    }
    if linger0 {
        socket.set_linger(Some(Duration::ZERO)).ok();
    }
    // A peer started with `--close` reads a line before it answers (fast open sent one).
    if peer_after && !matches!(via, Via::FastopenSendto | Via::FastopenConnect) {
        socket.send(b"hi\n").map_err(|e| errno("send", e))?;
    }
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| format!("read:{e}"))?;
    if line.is_empty() {
        return Err("read:eof".into());
    }
    // What the app sees of its own connection: NAT shows it the address it dialled.
    let peer_name = |stream: &TcpStream| {
        stream
            .peer_addr()
            .map_or_else(|e| format!("error:{}", errno_name(&e)), |a| a.to_string())
    };
    let app_peer = peer_name(&stream);
    if !peer_after {
        return Ok(format!("{} app_peer={app_peer}", line.trim_end()));
    }
    let mut reader = BufReader::new(&stream);
    let after = match reader.read_to_end(&mut Vec::new()) {
        // The peer's socket closes once our side acknowledges its FIN: give the kernel that
        // moment, so what is read is the address after the peer's socket is gone.
        Ok(_) => {
            std::thread::sleep(Duration::from_millis(20));
            peer_name(&stream)
        }
        Err(e) => format!("read:{}", errno_name(&e)),
    };
    Ok(format!(
        "{} app_peer={app_peer} app_peer_after={after}",
        line.trim_end()
    ))
}

/// `setsockopt(IPPROTO_TCP, TCP_FASTOPEN_CONNECT, 1)` (Linux 4.11; socket2 has no setter).
fn set_fastopen_connect(socket: &Socket) -> std::io::Result<()> {
    const TCP_FASTOPEN_CONNECT: libc::c_int = 30;
    let one: libc::c_int = 1;
    // SAFETY: a valid int option value of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_FASTOPEN_CONNECT,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The line the fast-open paths send with (or right after) the SYN.
const FIRST_LINE: &[u8] = b"hi\n";

/// The outcome of a fast-open path's first send, which waits for the handshake as a blocking
/// connect does. Interrupted (EINTR, as in [`connect_blocking`]), the handshake goes on in the
/// kernel and nothing was sent (no peer here answers with a fast-open cookie, so the SYN carries
/// no data): the connection is waited for and the line sent, as an app retrying on EINTR does.
fn first_line_sent(socket: &Socket, sent: std::io::Result<usize>) -> std::io::Result<()> {
    match sent {
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
            wait_connected(socket)?;
            socket.send(FIRST_LINE).map(drop)
        }
        other => other.map(drop),
    }
}

/// A blocking connect. One interrupted (EINTR: an earlier probe's io_uring ring leaves task work
/// that makes a wait with a send timeout end early) goes on in the kernel: it is waited for as a
/// non-blocking one is, as an app that retries on EINTR does.
fn connect_blocking(socket: &Socket, addr: &SockAddr) -> std::io::Result<()> {
    match socket.connect(addr) {
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => wait_connected(socket),
        other => other,
    }
}

fn wait_connected(socket: &Socket) -> std::io::Result<()> {
    let mut pollfd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut pollfd, 1, 5000) } != 1 {
        return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    match socket.take_error()? {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn connect_nonblocking(socket: &Socket, addr: &SockAddr) -> std::io::Result<()> {
    socket.set_nonblocking(true)?;
    match socket.connect(addr) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => wait_connected(socket)?,
        Err(e) => return Err(e),
    }
    socket.set_nonblocking(false)
}

fn connect_io_uring(socket: &Socket, addr: &SockAddr) -> std::io::Result<()> {
    let mut ring = io_uring::IoUring::new(2)?;
    let connect = io_uring::opcode::Connect::new(
        io_uring::types::Fd(socket.as_raw_fd()),
        addr.as_ptr().cast(),
        addr.len(),
    )
    .build();
    // SAFETY: `addr` outlives the submission, which is waited for right here.
    unsafe { ring.submission().push(&connect) }.map_err(std::io::Error::other)?;
    ring.submit_and_wait(1)?;
    let result = ring
        .completion()
        .next()
        .map_or(-libc::EIO, |cqe| cqe.result());
    if result < 0 {
        return Err(std::io::Error::from_raw_os_error(-result));
    }
    Ok(())
}

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::ETIMEDOUT) => "ETIMEDOUT".into(),
        Some(libc::EADDRINUSE) => "EADDRINUSE".into(),
        _ => e.to_string().replace(' ', "_"),
    }
}

fn connect_cmd(args: &[String]) {
    let mut args = args.to_vec();
    let count: usize = take_opt(&mut args, "--count")
        .map_or(1, |c| c.parse().unwrap_or_else(|e| die("--count", e)));
    let bind = take_opt(&mut args, "--bind").map(|b| parse_addr(&b));
    let linger0 = take_flag(&mut args, "--linger0");
    let via = take_opt(&mut args, "--via").map_or(Via::Connect, |v| Via::parse(&v));
    let until = take_opt(&mut args, "--seconds").map(|s| deadline(&s));
    if args.is_empty() {
        usage()
    }
    for round in 0.. {
        let more = match until {
            Some(until) => Instant::now() < until,
            None => round < count,
        };
        if !more {
            break;
        }
        for target in &args {
            match connect_once(parse_addr(target), bind, linger0, via) {
                Ok(line) => println!("{line}"),
                Err(e) => println!("error={e}"),
            }
        }
    }
}

/// Many short connections (closed with RST, so ports are reused at once), each checked to land
/// on a proxy that reports exactly the address the app asked for.
fn check_cmd(args: &[String]) {
    let mut args = args.to_vec();
    let count: usize = take_opt(&mut args, "--count")
        .map_or(1000, |c| c.parse().unwrap_or_else(|e| die("--count", e)));
    let threads: usize = take_opt(&mut args, "--threads")
        .map_or(4, |c| c.parse().unwrap_or_else(|e| die("--threads", e)));
    // For a time instead of a count: a load that must outlast an event, whatever the speed.
    let until = take_opt(&mut args, "--seconds").map(|s| deadline(&s));
    let targets: Vec<SocketAddr> = args.iter().map(|a| parse_addr(a)).collect();
    if targets.is_empty() {
        usage()
    }
    let results: Vec<(usize, usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let targets = &targets;
                s.spawn(move || {
                    let (mut ok, mut bad, mut samples) = (0, 0, Vec::new());
                    let indexes = (t..).step_by(threads).take_while(|i| match until {
                        Some(until) => Instant::now() < until,
                        None => *i < count,
                    });
                    for i in indexes {
                        let target = targets[i % targets.len()];
                        // An IPv4-mapped target is an IPv4 connection: its original
                        // destination is the plain IPv4 address.
                        let orig = SocketAddr::new(target.ip().to_canonical(), target.port());
                        match connect_once(target, None, true, Via::Connect) {
                            Ok(line)
                                if line.contains(&format!(" orig={orig} "))
                                    && line.starts_with("who=proxy") =>
                            {
                                ok += 1
                            }
                            other => {
                                bad += 1;
                                if samples.len() < 5 {
                                    samples.push(format!("{target}: {other:?}"));
                                }
                            }
                        }
                    }
                    (ok, bad, samples)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("check thread"))
            .collect()
    });
    let ok: usize = results.iter().map(|r| r.0).sum();
    let bad: usize = results.iter().map(|r| r.1).sum();
    println!("ok={ok} bad={bad}");
    for (_, _, samples) in results {
        for s in samples {
            println!("sample {s}");
        }
    }
}

/// Short connections as `check` makes them, for a fixed time and without looking at the replies,
/// so the loop costs little more than the connections themselves (for `cargo xtask bench`).
fn bench_cmd(args: &[String]) {
    let mut args = args.to_vec();
    let seconds: f64 = take_opt(&mut args, "--seconds")
        .map_or(3.0, |s| s.parse().unwrap_or_else(|e| die("--seconds", e)));
    let threads: usize = take_opt(&mut args, "--threads")
        .map_or(1, |c| c.parse().unwrap_or_else(|e| die("--threads", e)));
    let targets: Vec<SocketAddr> = args.iter().map(|a| parse_addr(a)).collect();
    if targets.is_empty() {
        usage()
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    // Per thread: connections that reached a proxy, ones answered by anything else (a bypass
    // must not count), failures, and each proxy connection's connect-to-first-byte time.
    let results: Vec<(u64, u64, u64, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let targets = &targets;
                s.spawn(move || {
                    let (mut conns, mut misrouted, mut failures) = (0u64, 0u64, 0u64);
                    let mut latencies = Vec::with_capacity(1 << 16);
                    for &target in targets.iter().cycle().skip(t) {
                        let started = Instant::now();
                        if started >= deadline {
                            break;
                        }
                        match connect_once(target, None, true, Via::Connect) {
                            Ok(line) if line.starts_with("who=proxy:") => {
                                conns += 1;
                                let micros = started.elapsed().as_micros();
                                latencies.push(u32::try_from(micros).unwrap_or(u32::MAX));
                            }
                            Ok(_) => misrouted += 1,
                            Err(_) => failures += 1,
                        }
                    }
                    (conns, misrouted, failures, latencies)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let conns: u64 = results.iter().map(|r| r.0).sum();
    let misrouted: u64 = results.iter().map(|r| r.1).sum();
    let failures: u64 = results.iter().map(|r| r.2).sum();
    let mut latencies: Vec<u32> = results.into_iter().flat_map(|r| r.3).collect();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len().saturating_sub(1)) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "conns={conns} misrouted={misrouted} failures={failures} seconds={elapsed:.3} rate={:.1} p50_us={} p99_us={} p999_us={}",
        conns as f64 / elapsed,
        pct(0.5),
        pct(0.99),
        pct(0.999)
    );
}

/// `--seconds S` from now.
fn deadline(seconds: &str) -> Instant {
    let seconds: f64 = seconds.parse().unwrap_or_else(|e| die("--seconds", e));
    Instant::now() + Duration::from_secs_f64(seconds)
}

fn udp_server(args: &[String]) {
    let Some(addr) = args.first() else { usage() };
    let socket =
        UdpSocket::bind(parse_addr(addr)).unwrap_or_else(|e| die(&format!("udp bind {addr}"), e));
    println!("ready");
    std::io::stdout().flush().ok();
    let mut buf = [0u8; 1500];
    loop {
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            println!("udp from={from} msg={}", String::from_utf8_lossy(&buf[..n]));
            std::io::stdout().flush().ok();
        }
    }
}

fn udp_send(args: &[String]) {
    let (Some(addr), Some(msg)) = (args.first(), args.get(1)) else {
        usage()
    };
    let socket = UdpSocket::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)))
        .unwrap_or_else(|e| die("udp bind", e));
    socket
        .send_to(msg.as_bytes(), parse_addr(addr))
        .unwrap_or_else(|e| die("udp send", e));
    println!("sent");
}

/// Credentials for a probe: real and effective UID, real and effective GID (`R:E:RG:EG`).
#[derive(Clone, Copy)]
struct Creds([libc::uid_t; 4]);

impl Creds {
    const ROOT: Self = Self([0; 4]);

    fn parse(s: &str) -> Self {
        let ids: Vec<u32> = s
            .split(':')
            .map(|id| id.parse().unwrap_or_else(|e| die("credentials", e)))
            .collect();
        match ids[..] {
            [r, e, rg, eg] => Self([r, e, rg, eg]),
            _ => die("credentials", format!("{s:?} is not R:E:RG:EG")),
        }
    }

    /// Becomes these IDs, keeping 0 as the saved UID and GID: a later call may become root
    /// again and switch to other IDs (the file-system IDs follow the effective ones).
    fn enter(self) {
        let [r, e, rg, eg] = self.0;
        let keep = libc::uid_t::MAX; // -1: unchanged
        // SAFETY: plain credential syscalls on this single-threaded process.
        unsafe {
            if libc::setresuid(keep, 0, keep) != 0
                || libc::setresgid(rg, eg, 0) != 0
                || libc::setresuid(r, e, 0) != 0
            {
                die("setresuid", std::io::Error::last_os_error());
            }
        }
    }
}

/// The supplementary groups (as root).
fn set_groups(groups: &[libc::gid_t]) {
    // SAFETY: a valid array of `groups.len()` GIDs.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        die("setgroups", std::io::Error::last_os_error());
    }
}

/// `probes`: one connection per line of stdin, each with its own credentials for creating the
/// socket and for connecting it (so one process in the pod runs every probe of a random
/// configuration), printing one line each with `getpeername()` before and after the peer's
/// close. Started as root in its namespace and cgroup, without `--uid`/`--gid`.
fn probes_cmd() {
    // Only the probe's own GIDs count, and the supplementary groups a line gives.
    set_groups(&[]);
    for line in std::io::stdin().lines() {
        let line = line.unwrap_or_else(|e| die("stdin", e));
        let mut args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if args.is_empty() {
            continue;
        }
        let via = take_opt(&mut args, "--via").map_or(Via::Connect, |v| Via::parse(&v));
        let bind = take_opt(&mut args, "--bind").map(|b| parse_addr(&b));
        let creds = take_opt(&mut args, "--creds").map_or(Creds::ROOT, |c| Creds::parse(&c));
        let socket_creds =
            take_opt(&mut args, "--socket-creds").map_or(creds, |c| Creds::parse(&c));
        let groups: Vec<libc::gid_t> = take_opt(&mut args, "--groups").map_or_else(Vec::new, |g| {
            g.split(',')
                .map(|id| id.parse().unwrap_or_else(|e| die("--groups", e)))
                .collect()
        });
        let target = parse_addr(&args[0]);
        set_groups(&groups);
        socket_creds.enter();
        let result = open_socket(target, via).and_then(|socket| {
            // A blocking connect gives up after 5 s, as the other paths do, not the kernel's
            // two minutes of SYN retries: one lost probe must not stall the rest.
            socket.set_write_timeout(Some(Duration::from_secs(5))).ok();
            creds.enter();
            finish_connect(socket, target, bind, false, via, true)
        });
        Creds::ROOT.enter();
        set_groups(&[]);
        match result {
            Ok(line) => println!("{line}"),
            Err(e) => println!("error={e}"),
        }
        std::io::stdout().flush().ok();
    }
}
