//! The processes of a test pod: an app that connects, a proxy that asks SO_ORIGINAL_DST as any
//! proxy does, and plain servers. Each can first enter a network namespace, a cgroup and a
//! UID/GID, so a test (or the demo) starts it exactly where a pod's process would run.
//!
//! Every accepted connection is answered with one line:
//! `who=proxy:NAME orig=IP:PORT|errno:N peer=IP:PORT local=IP:PORT`
//! and `netprobe connect` prints that line (or `error=...`) per connection.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _},
    path::PathBuf,
    time::{Duration, Instant},
};

fn usage() -> ! {
    eprintln!(
        "usage: netprobe [--netns PATH] [--cgroup DIR] [--uid N] [--gid N] COMMAND\n\
         commands:\n  \
           proxy ADDR [--name N] [--no-orig] [--inline]  accept, answer with SO_ORIGINAL_DST\n  \
           server ADDR [--name N]              accept, answer who it is\n  \
           connect ADDR... [--count N] [--bind ADDR] [--linger0]\n  \
           check ADDR... --count N [--threads T]  connect in a loop, verify every orig\n  \
           bench ADDR... --seconds S [--threads T] connect in a loop for S seconds, print the rate\n  \
           udp-server ADDR | udp-send ADDR MSG"
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

/// Enters netns, then cgroup, then drops to uid/gid: the order a container runtime uses.
fn enter_context(args: &mut Vec<String>) {
    let netns = take_opt(args, "--netns");
    let cgroup = take_opt(args, "--cgroup");
    let uid = take_opt(args, "--uid").map(|u| u.parse::<u32>().unwrap_or_else(|e| die("--uid", e)));
    let gid = take_opt(args, "--gid").map(|g| g.parse::<u32>().unwrap_or_else(|e| die("--gid", e)));
    if let Some(netns) = netns {
        let f = std::fs::File::open(&netns).unwrap_or_else(|e| die(&netns, e));
        // SAFETY: setns on a valid fd; this process is single-threaded here.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            die("setns", std::io::Error::last_os_error());
        }
    }
    if let Some(cgroup) = cgroup {
        let procs = PathBuf::from(&cgroup).join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string()).unwrap_or_else(|e| die(&cgroup, e));
    }
    // SAFETY: plain credential syscalls.
    unsafe {
        if (uid.is_some() || gid.is_some()) && libc::setgroups(0, std::ptr::null()) != 0 {
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

fn parse_addr(s: &str) -> SocketAddrV4 {
    s.parse()
        .unwrap_or_else(|e| die(&format!("address {s:?}"), e))
}

/// `getsockopt(SOL_IP, SO_ORIGINAL_DST)`, as Linkerd's proxy calls it.
fn original_dst(stream: &TcpStream) -> Result<SocketAddrV4, i32> {
    // SAFETY: sockaddr_in is plain data; the kernel writes at most `len` bytes.
    unsafe {
        let mut sin: libc::sockaddr_in = std::mem::zeroed();
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_IP,
            80, // SO_ORIGINAL_DST
            (&raw mut sin).cast(),
            &mut len,
        );
        if rc != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        Ok(SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            u16::from_be(sin.sin_port),
        ))
    }
}

fn serve(args: &[String], is_proxy: bool) {
    let mut args = args.to_vec();
    let name = take_opt(&mut args, "--name").unwrap_or_else(|| "-".into());
    let ask = !take_flag(&mut args, "--no-orig");
    // A lean proxy for the bench: one SO_ORIGINAL_DST per connection, answered in the accept
    // loop instead of a thread per connection.
    let inline = take_flag(&mut args, "--inline");
    let Some(addr) = args.first() else { usage() };
    let listener =
        TcpListener::bind(parse_addr(addr)).unwrap_or_else(|e| die(&format!("listen {addr}"), e));
    println!("ready");
    std::io::stdout().flush().ok();
    let role = if is_proxy { "proxy" } else { "server" };
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let name = name.clone();
        let mut answer = move || {
            // Asked twice (unless --inline): a proxy may ask again, and must get the same answer.
            let ask_twice = |s: &TcpStream| {
                let first = original_dst(s);
                (first, if inline { first } else { original_dst(s) })
            };
            let orig = match (is_proxy && ask).then(|| ask_twice(&stream)) {
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
        };
        if inline {
            answer();
        } else {
            std::thread::spawn(answer);
        }
    }
}

/// Connects (optionally from a fixed local address), returns the peer's line.
fn connect_once(
    target: SocketAddrV4,
    bind: Option<SocketAddrV4>,
    linger0: bool,
) -> Result<String, String> {
    // SAFETY: plain socket syscalls on an fd this function owns.
    let stream = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(format!("socket:{}", std::io::Error::last_os_error()));
        }
        let stream = TcpStream::from_raw_fd(fd);
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const one).cast(),
            4,
        );
        if let Some(bind) = bind {
            let sin = sockaddr(bind);
            if libc::bind(
                fd,
                (&raw const sin).cast(),
                size_of::<libc::sockaddr_in>() as u32,
            ) != 0
            {
                return Err(format!("bind:{}", errno_name()));
            }
        }
        let sin = sockaddr(target);
        if libc::connect(
            fd,
            (&raw const sin).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        ) != 0
        {
            return Err(format!("connect:{}", errno_name()));
        }
        if linger0 {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                8,
            );
        }
        stream
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| format!("read:{e}"))?;
    if line.is_empty() {
        return Err("read:eof".into());
    }
    Ok(line.trim_end().to_string())
}

fn errno_name() -> String {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".into(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".into(),
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".into(),
        Some(libc::ETIMEDOUT) => "ETIMEDOUT".into(),
        Some(libc::EADDRINUSE) => "EADDRINUSE".into(),
        _ => e.to_string().replace(' ', "_"),
    }
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn connect_cmd(args: &[String]) {
    let mut args = args.to_vec();
    let count: usize = take_opt(&mut args, "--count")
        .map_or(1, |c| c.parse().unwrap_or_else(|e| die("--count", e)));
    let bind = take_opt(&mut args, "--bind").map(|b| parse_addr(&b));
    let linger0 = take_flag(&mut args, "--linger0");
    if args.is_empty() {
        usage()
    }
    for _ in 0..count {
        for target in &args {
            match connect_once(parse_addr(target), bind, linger0) {
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
    let targets: Vec<SocketAddrV4> = args.iter().map(|a| parse_addr(a)).collect();
    if targets.is_empty() {
        usage()
    }
    let results: Vec<(usize, usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let targets = &targets;
                s.spawn(move || {
                    let (mut ok, mut bad, mut samples) = (0, 0, Vec::new());
                    for i in (t..count).step_by(threads) {
                        let target = targets[i % targets.len()];
                        match connect_once(target, None, true) {
                            Ok(line)
                                if line.contains(&format!(" orig={target} "))
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
    let targets: Vec<SocketAddrV4> = args.iter().map(|a| parse_addr(a)).collect();
    if targets.is_empty() {
        usage()
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let (conns, failures) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let targets = &targets;
                s.spawn(move || {
                    let (mut conns, mut failures) = (0u64, 0u64);
                    for &target in targets.iter().cycle().skip(t) {
                        if Instant::now() >= deadline {
                            break;
                        }
                        match connect_once(target, None, true) {
                            Ok(_) => conns += 1,
                            Err(_) => failures += 1,
                        }
                    }
                    (conns, failures)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "conns={conns} failures={failures} seconds={elapsed:.3} rate={:.1}",
        conns as f64 / elapsed
    );
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
