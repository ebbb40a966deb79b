//! A lean load generator and proxy in one process, for `cargo xtask bench`: each worker thread
//! connects, accepts that connection on the proxy's listener (with its peer's address, as a
//! proxy's runtime does), asks `SO_ORIGINAL_DST` and checks the answer, sends one byte back and
//! reads it, then closes both ends. A few syscalls and no runtime, so the microsecond or so that
//! interception adds per connection is visible.
//!
//! The listener is opened in `--listen-netns` (the pod) from the process's `--cgroup`; the
//! connecting sockets in `--connect-netns` (the pod for outbound, its peer for inbound), from
//! `--client-cgroup` if given (the inbound client is no process of the pod). Prints one JSON line.
//!
//! A connection that fails, or whose original destination is not `--expect` (or, with
//! `--expect none`, that has one), counts as a failure: the bench refuses a run with any, so a
//! bypass can never pass for speed.
use std::{
    fs::File,
    mem::{size_of, zeroed},
    net::SocketAddr,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, Sender, channel},
    },
    time::{Duration, Instant},
};

use socket2::SockAddr;

fn usage() -> ! {
    eprintln!(
        "usage: connload --listen-netns PATH --listen ADDR [--v6only] --connect-netns PATH \
         --connect ADDR --expect ADDR|none [--cgroup DIR] [--client-cgroup DIR] [--uid N] \
         [--workers N] [--cpu N] [--seconds S | --ring-in FIFO --ring-out FIFO [--slice-ms MS]] \
         [--close rst|fin|fin-server]"
    );
    std::process::exit(2)
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("connload: {what}: {e}");
    std::process::exit(1)
}

#[derive(Clone, Copy, PartialEq)]
enum Close {
    /// SO_LINGER 0 on the connecting side: an RST, no TIME_WAIT anywhere.
    Rst,
    /// The connecting side closes first: FIN both ways, TIME_WAIT on its side.
    Fin,
    /// The accepting side closes first: TIME_WAIT on its side.
    FinServer,
}

struct Args {
    listen_netns: PathBuf,
    listen: SocketAddr,
    v6only: bool,
    connect_netns: PathBuf,
    connect: SocketAddr,
    expect: Option<SocketAddr>,
    cgroup: Option<PathBuf>,
    client_cgroup: Option<PathBuf>,
    uid: Option<u32>,
    workers: usize,
    cpu: Option<usize>,
    seconds: f64,
    close: Close,
    /// Slices handed in on the first FIFO and handed back on the second: see `ring`.
    ring: Option<(PathBuf, PathBuf)>,
    slice_ms: f64,
}

fn parse_args() -> Args {
    let mut raw: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str| -> Option<String> {
        let i = raw.iter().position(|a| a == flag)?;
        raw.remove(i);
        (i < raw.len()).then(|| raw.remove(i))
    };
    let addr = |s: String| -> SocketAddr { s.parse().unwrap_or_else(|e| die(&s, e)) };
    let num = |s: String| -> f64 { s.parse().unwrap_or_else(|e| die(&s, e)) };
    let args = Args {
        listen_netns: take("--listen-netns").unwrap_or_else(|| usage()).into(),
        listen: addr(take("--listen").unwrap_or_else(|| usage())),
        v6only: false,
        connect_netns: take("--connect-netns").unwrap_or_else(|| usage()).into(),
        connect: addr(take("--connect").unwrap_or_else(|| usage())),
        expect: match take("--expect").unwrap_or_else(|| usage()) {
            none if none == "none" => None,
            a => Some(addr(a)),
        },
        cgroup: take("--cgroup").map(PathBuf::from),
        client_cgroup: take("--client-cgroup").map(PathBuf::from),
        uid: take("--uid").map(|u| num(u) as u32),
        workers: take("--workers").map_or(1, |w| num(w) as usize),
        cpu: take("--cpu").map(|c| num(c) as usize),
        seconds: take("--seconds").map_or(1.0, num),
        close: match take("--close").as_deref() {
            None | Some("rst") => Close::Rst,
            Some("fin") => Close::Fin,
            Some("fin-server") => Close::FinServer,
            Some(other) => die(
                "--close",
                format!("{other:?} is not rst, fin or fin-server"),
            ),
        },
        ring: None,
        slice_ms: take("--slice-ms").map_or(20.0, num),
    };
    let ring_in = take("--ring-in").map(PathBuf::from);
    let ring_out = take("--ring-out").map(PathBuf::from);
    let args = Args {
        ring: match (ring_in, ring_out) {
            (Some(input), Some(output)) => Some((input, output)),
            (None, None) => None,
            _ => usage(),
        },
        ..args
    };
    let v6only = raw.iter().position(|a| a == "--v6only");
    let args = Args {
        v6only: v6only.map(|i| raw.remove(i)).is_some(),
        ..args
    };
    if !raw.is_empty() {
        usage()
    }
    args
}

fn check(rc: libc::c_int, what: &str) -> libc::c_int {
    if rc < 0 {
        die(what, std::io::Error::last_os_error())
    }
    rc
}

fn enter_netns(path: &Path) {
    let netns = File::open(path).unwrap_or_else(|e| die(&path.display().to_string(), e));
    // SAFETY: setns on a valid fd; it moves only the calling thread.
    check(
        unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) },
        "setns",
    );
}

fn enter_cgroup(dir: &Path) {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
        .unwrap_or_else(|e| die(&dir.display().to_string(), e));
}

fn listener(addr: SocketAddr, v6only: bool) -> OwnedFd {
    interceptor_tests::sockets::listening(addr, v6only, 4096)
        .unwrap_or_else(|e| die(&format!("listen on {addr}"), e))
        .into()
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    conns: u64,
    failures: u64,
    first_failure: Option<String>,
    /// Connect-to-first-byte, ns, one per connection.
    latencies: Vec<u32>,
}

impl Tally {
    fn fail(&mut self, what: String) {
        self.failures += 1;
        self.first_failure.get_or_insert(what);
    }
}

/// The socket's original destination as a proxy asks for it: SOL_IP for an IPv4 connection
/// (also on an AF_INET6 socket), SOL_IPV6 for an IPv6 one; None if the kernel has no answer.
fn original_dst(fd: RawFd, ipv4: bool) -> Option<SocketAddr> {
    // SAFETY: fd is an open socket for the duration of this call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    let socket = socket2::SockRef::from(&fd);
    let orig = if ipv4 {
        socket.original_dst_v4()
    } else {
        socket.original_dst_v6()
    };
    orig.ok()?.as_socket()
}

fn set_linger0(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: linger is a valid struct linger.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

fn now_ns() -> u64 {
    let mut ts: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is writable.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// When a worker stops: when `stop` is set (a timed run), or at each slice's deadline (a ring:
/// the bench hands out slices of time to each mode's process in turn).
enum Pace<'a> {
    Until(&'a AtomicBool),
    Slices {
        deadlines: Receiver<u64>,
        /// The connections made in each slice.
        done: Sender<u64>,
    },
}

/// connect, accept, SO_ORIGINAL_DST, one byte back, close, over and over. Every worker accepts
/// from the same listener, so it may take another worker's connection; each connects once before
/// it accepts once, so an accept always has a connection waiting.
fn worker(listener: RawFd, args: &Args, pace: Pace<'_>) -> Tally {
    let target = Target::of(args.connect);
    let mut tally = Tally {
        latencies: Vec::with_capacity(1 << 20),
        ..Tally::default()
    };
    match pace {
        Pace::Until(stop) => {
            while !stop.load(Ordering::Relaxed) && connection(listener, args, &target, &mut tally) {
            }
        }
        Pace::Slices { deadlines, done } => {
            while let Ok(deadline) = deadlines.recv() {
                let before = tally.conns;
                while now_ns() < deadline && connection(listener, args, &target, &mut tally) {}
                if done.send(tally.conns - before).is_err() {
                    break;
                }
            }
        }
    }
    tally
}

/// Where a worker connects, worked out once rather than per connection.
struct Target {
    addr: SockAddr,
    /// The socket family: `AF_INET6` for an IPv4-mapped address too.
    domain: libc::c_int,
    /// Whether the connection is IPv4 (so SO_ORIGINAL_DST is asked at SOL_IP).
    ipv4: bool,
}

impl Target {
    fn of(connect: SocketAddr) -> Self {
        Self {
            addr: SockAddr::from(connect),
            domain: if connect.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            },
            ipv4: match connect {
                SocketAddr::V4(_) => true,
                SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
            },
        }
    }
}

/// One connection; false once there were too many failures to go on.
fn connection(listener: RawFd, args: &Args, target: &Target, tally: &mut Tally) -> bool {
    let mut byte = [b'x'];
    let start = now_ns();
    // SAFETY: plain syscalls on fds this loop owns; buffers are valid for their lengths.
    unsafe {
        let client = check(
            libc::socket(target.domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
            "socket",
        );
        if libc::connect(client, target.addr.as_ptr().cast(), target.addr.len()) != 0 {
            let err = std::io::Error::last_os_error();
            libc::close(client);
            tally.fail(format!("connect to {}: {err}", args.connect));
            return tally.failures <= 100;
        }
        // With the peer's address, as a proxy's runtime accepts (tokio through mio, so
        // linkerd2-proxy): the kernel runs the cgroup's getpeername program for it.
        let mut peer: libc::sockaddr_storage = zeroed();
        let mut peer_len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let accepted = check(
            libc::accept4(
                listener,
                (&raw mut peer).cast(),
                &mut peer_len,
                libc::SOCK_CLOEXEC,
            ),
            "accept",
        );
        let orig = original_dst(accepted, target.ipv4);
        if orig != args.expect {
            tally.fail(format!(
                "original destination {orig:?}, expected {:?}",
                args.expect
            ));
        }
        if libc::write(accepted, byte.as_ptr().cast(), 1) != 1
            || libc::read(client, byte.as_mut_ptr().cast(), 1) != 1
        {
            tally.fail(format!("echo: {}", std::io::Error::last_os_error()));
        }
        tally
            .latencies
            .push((now_ns() - start).min(u64::from(u32::MAX)) as u32);
        match args.close {
            Close::Rst => {
                set_linger0(client);
                libc::close(client);
                libc::close(accepted);
            }
            Close::Fin => {
                libc::close(client);
                libc::close(accepted);
            }
            Close::FinServer => {
                libc::close(accepted);
                libc::close(client);
            }
        }
    }
    tally.conns += 1;
    true
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        check(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            "sched_setaffinity",
        );
    }
}

fn cpu_seconds() -> f64 {
    // SAFETY: usage is writable.
    let mut usage: libc::rusage = unsafe { zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[index]) / 1e3
}

/// Every worker for `args.seconds`: (seconds, CPU seconds, tallies, no rounds).
fn timed_run(listener: RawFd, args: &Arc<Args>) -> (f64, f64, Vec<Tally>, Vec<[f64; 3]>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (cpu_before, started) = (cpu_seconds(), Instant::now());
    let workers: Vec<_> = (0..args.workers)
        .map(|_| {
            let (args, stop) = (Arc::clone(args), Arc::clone(&stop));
            std::thread::spawn(move || worker(listener, &args, Pace::Until(&stop)))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let tallies = workers
        .into_iter()
        .map(|w| w.join().expect("a worker panicked"))
        .collect();
    (
        started.elapsed().as_secs_f64(),
        cpu_seconds() - cpu_before,
        tallies,
        Vec::new(),
    )
}

/// One process per mode, each with its own pair of FIFOs to the bench: a `t` on `input` is
/// this process's turn, a slice of `--slice-ms` in which its workers connect; then the `t` goes
/// back on `output`, and the bench gives the next mode its turn (in an order it shuffles every
/// round). A `q` ends the process, which answers with a `q`. The modes thus alternate every few
/// tens of milliseconds, and whatever else the machine does lands on all of them alike. Returns (seconds in slices, CPU seconds, tallies, per slice [connections,
/// seconds, CPU seconds]).
fn ring(
    listener: RawFd,
    args: &Arc<Args>,
    (mut input, mut output): (File, File),
) -> (f64, f64, Vec<Tally>, Vec<[f64; 3]>) {
    use std::io::{Read as _, Write as _};
    let (done_tx, done_rx) = channel();
    let mut deadlines = Vec::new();
    let workers: Vec<_> = (0..args.workers)
        .map(|_| {
            let (tx, rx) = channel();
            deadlines.push(tx);
            let (args, done) = (Arc::clone(args), done_tx.clone());
            std::thread::spawn(move || {
                worker(
                    listener,
                    &args,
                    Pace::Slices {
                        deadlines: rx,
                        done,
                    },
                )
            })
        })
        .collect();
    println!("ready");
    let mut rounds = Vec::new();
    let mut token = [0u8];
    loop {
        input
            .read_exact(&mut token)
            .unwrap_or_else(|e| die("reading the ring", e));
        if token[0] == b'q' {
            break;
        }
        let (cpu_before, started) = (cpu_seconds(), now_ns());
        let deadline = started + (args.slice_ms * 1e6) as u64;
        for tx in &deadlines {
            tx.send(deadline).expect("a worker is gone");
        }
        let conns: u64 = deadlines
            .iter()
            .map(|_| done_rx.recv().expect("a worker is gone"))
            .sum();
        rounds.push([
            conns as f64,
            (now_ns() - started) as f64 / 1e9,
            cpu_seconds() - cpu_before,
        ]);
        output
            .write_all(b"t")
            .unwrap_or_else(|e| die("writing the ring", e));
    }
    drop(deadlines);
    let tallies = workers
        .into_iter()
        .map(|w| w.join().expect("a worker panicked"))
        .collect();
    output
        .write_all(b"q")
        .unwrap_or_else(|e| die("writing the ring", e));
    let elapsed = rounds.iter().map(|r| r[1]).sum();
    let cpu = rounds.iter().map(|r| r[2]).sum();
    (elapsed, cpu, tallies, rounds)
}

fn main() {
    let args = parse_args();
    if let Some(cpu) = args.cpu {
        pin_to(cpu);
    }
    if let Some(cgroup) = &args.cgroup {
        enter_cgroup(cgroup);
    }
    // Threads inherit the network namespace of the thread that creates them, and sockets keep
    // the namespace and cgroup they were created in.
    enter_netns(&args.listen_netns);
    let listener = listener(args.listen, args.v6only);
    enter_netns(&args.connect_netns);
    if let Some(cgroup) = &args.client_cgroup {
        enter_cgroup(cgroup);
    }
    // Opened before dropping to the app's UID: the bench's FIFOs are root's. Read and write:
    // opening a FIFO that way never waits for the other end.
    let ring_files = args.ring.as_ref().map(|(input, output)| {
        let open = |path: &Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .unwrap_or_else(|e| die(&path.display().to_string(), e))
        };
        (open(input), open(output))
    });
    if let Some(uid) = args.uid {
        // SAFETY: plain credential syscalls (glibc applies them to every thread).
        unsafe {
            check(libc::setgroups(0, std::ptr::null()), "setgroups");
            check(libc::setresgid(uid, uid, uid), "setresgid");
            check(libc::setresuid(uid, uid, uid), "setresuid");
        }
    }

    let args = Arc::new(args);
    let (elapsed, cpu, tallies, rounds) = match ring_files {
        None => timed_run(listener.as_raw_fd(), &args),
        Some(files) => ring(listener.as_raw_fd(), &args, files),
    };
    let conns: u64 = tallies.iter().map(|t| t.conns).sum();
    let failures: u64 = tallies.iter().map(|t| t.failures).sum();
    let first_failure = tallies.iter().find_map(|t| t.first_failure.clone());
    let mut latencies: Vec<u32> = tallies.into_iter().flat_map(|t| t.latencies).collect();
    latencies.sort_unstable();
    let json = serde_json::json!({
        "conns": conns,
        "failures": failures,
        "first_failure": first_failure,
        "seconds": elapsed,
        "rate": conns as f64 / elapsed,
        "cpu_us_per_conn": cpu * 1e6 / conns.max(1) as f64,
        "p50_us": percentile(&latencies, 0.50),
        "p99_us": percentile(&latencies, 0.99),
        "p999_us": percentile(&latencies, 0.999),
        "rounds": rounds,
    });
    println!("{json}");
}
