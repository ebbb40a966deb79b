//! Churns redirected connections through every order their two sockets can close in, with
//! many live at once whose entries fold to the same pending slot, and checks every answer: the
//! proxy's `SO_ORIGINAL_DST` and the app's `getpeername()`, while both sockets are open and
//! after the other side closed. For `tests/tests/slot_churn.rs`.
//!
//! App and proxy are one process (the app's UID, in the pod's namespace and cgroup), except for
//! the connections whose proxy is killed: a `netprobe proxy` child. Each round binds its app
//! sockets to chosen addresses and ports: for each of `INDICES_PER_ROUND` slot indices, one
//! port on each of four loopback addresses folds to it (`PendingKey::slot_index`), so four live
//! connections share every slot, one in it and three in the LRU map. Round `r` uses indices
//! `r * INDICES_PER_ROUND ..`, each index once, so a test can prepare those slots.
//!
//! Prints `churn connections=N wrong=W` and a `wrong ...` line for each wrong answer.
use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use interceptor_common::{Ip6Addr, PendingKey};
use socket2::{SockRef, Socket};

const PROXY: &str = "127.0.0.1:4140";
/// Slot indices a round uses; four connections (one per client address) on each.
pub const INDICES_PER_ROUND: u32 = 20;
const ADDRESSES: u8 = 4;
/// The last indices of a round: connections never accepted, then connections whose proxy is
/// killed; the rest close in the four orders of [`Order`].
const NEVER_ACCEPTED_INDICES: u32 = 2;
const KILLED_INDICES: u32 = 2;

fn usage() -> ! {
    eprintln!(
        "usage: churn --netns PATH --cgroup DIR --uid N --netns-cookie C --rounds R\n  \
         R rounds of 4 x {INDICES_PER_ROUND} connections, round r on slot indices from \
         r x {INDICES_PER_ROUND}"
    );
    std::process::exit(2)
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("churn: {what}: {e}");
    std::process::exit(1)
}

/// How the two sockets of an accepted connection close.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// The app closes (FIN); the proxy reads the end, asks again, and closes.
    AppFirst,
    /// The proxy closes (FIN); the app reads the end, asks its peer, and closes.
    ProxyFirst,
    /// Both close at once.
    Both,
    /// The app resets (SO_LINGER 0); the proxy reads the reset and closes.
    Rst,
}

const ORDERS: [Order; 4] = [Order::AppFirst, Order::ProxyFirst, Order::Both, Order::Rst];

struct Churn {
    netns_cookie: u64,
    /// Four loopback addresses whose ports for the indices used are not privileged.
    addresses: Vec<Ipv4Addr>,
    connections: usize,
    wrong: Vec<String>,
    /// The destination of the next connection: each one's differs from the others' alive.
    next_destination: u32,
}

fn main() {
    let mut raw: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str| -> String {
        let i = raw
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| usage());
        raw.remove(i);
        if i >= raw.len() {
            usage()
        }
        raw.remove(i)
    };
    let netns = take("--netns");
    let cgroup = take("--cgroup");
    let uid: u32 = take("--uid").parse().unwrap_or_else(|e| die("--uid", e));
    let netns_cookie: u64 = take("--netns-cookie")
        .parse()
        .unwrap_or_else(|e| die("--netns-cookie", e));
    let rounds: u32 = take("--rounds")
        .parse()
        .unwrap_or_else(|e| die("--rounds", e));
    enter(&netns, &cgroup, uid);

    // A port folds to index `i` when it is `i` XOR the fold of the rest of the key: an address
    // whose fold is at least 1024 has unprivileged ports for every index below 1024.
    let addresses = (1..=254)
        .map(|last| Ipv4Addr::new(127, 0, 0, last))
        .filter(|&address| fold(netns_cookie, address) >= 1024)
        .take(usize::from(ADDRESSES))
        .collect();
    if rounds * INDICES_PER_ROUND > 1024 {
        die("--rounds", "at most 1024 indices");
    }
    let mut churn = Churn {
        netns_cookie,
        addresses,
        connections: 0,
        wrong: Vec::new(),
        next_destination: 0,
    };
    for round in 0..rounds {
        churn.round(round * INDICES_PER_ROUND);
    }
    println!(
        "churn connections={} wrong={}",
        churn.connections,
        churn.wrong.len()
    );
    for wrong in &churn.wrong {
        println!("wrong {wrong}");
    }
}

/// Enters the pod's namespace and cgroup, then its app's UID, as a container runtime does.
fn enter(netns: &str, cgroup: &str, uid: u32) {
    let f = std::fs::File::open(netns).unwrap_or_else(|e| die(netns, e));
    // SAFETY: setns on a valid fd; this process is single-threaded here.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        die("setns", std::io::Error::last_os_error());
    }
    let procs = std::path::Path::new(cgroup).join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string()).unwrap_or_else(|e| die(cgroup, e));
    // SAFETY: plain credential syscalls.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(uid, uid, uid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            die("dropping to the app's UID", std::io::Error::last_os_error());
        }
    }
}

/// A connected app socket and the destination it dialled.
struct App {
    stream: TcpStream,
    dialled: SocketAddr,
}

impl Churn {
    fn round(&mut self, first_index: u32) {
        let main = INDICES_PER_ROUND - NEVER_ACCEPTED_INDICES - KILLED_INDICES;
        let listener = listen();

        // Accepted connections, all alive together, each closing in its order.
        let mut apps = Vec::new();
        for n in 0..main * u32::from(ADDRESSES) {
            if let Some(app) = self.connect(first_index + n / u32::from(ADDRESSES), n) {
                apps.push(app);
            }
        }
        let mut proxies: HashMap<SocketAddr, TcpStream> = HashMap::new();
        for _ in &apps {
            let (stream, peer) = listener.accept().unwrap_or_else(|e| die("accept", e));
            proxies.insert(peer, stream);
        }
        // Never accepted: alive beside the others in the listener's queue until it closes.
        let mut queued = Vec::new();
        for n in 0..NEVER_ACCEPTED_INDICES * u32::from(ADDRESSES) {
            let index = first_index + main + n / u32::from(ADDRESSES);
            if let Some(app) = self.connect(index, n) {
                queued.push(app);
            }
        }
        wait_for_queue(&listener, queued.len());
        for app in apps.iter().chain(&queued) {
            self.check_app_peer(app, "open");
        }
        let mut pairs = Vec::new();
        for (i, app) in apps.into_iter().enumerate() {
            let local = app
                .stream
                .local_addr()
                .unwrap_or_else(|e| die("getsockname", e));
            let Some(proxy) = proxies.remove(&local) else {
                self.wrong.push(format!("{local}: not accepted"));
                continue;
            };
            self.check_orig(&proxy, app.dialled, "open");
            // Mixed so that connections sharing a slot close in different orders.
            pairs.push((
                app,
                proxy,
                ORDERS[(i + i / usize::from(ADDRESSES)) % ORDERS.len()],
            ));
        }
        // The proxy-first ones are asked once their proxy's socket is gone (below).
        let mut proxy_closed = Vec::new();
        for (app, proxy, order) in pairs {
            if let Some(app) = self.close(app, proxy, order) {
                proxy_closed.push(app);
            }
        }
        self.after_proxies_closed(&proxy_closed, "after the proxy closed");
        // Half of the queued apps close first; the listener's close then resets the others.
        let (closing, reset): (Vec<_>, Vec<_>) = queued
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        drop(closing);
        drop(listener);
        for (_, app) in reset {
            read_to_end(&app.stream);
        }
        self.killed_proxy(first_index + INDICES_PER_ROUND - KILLED_INDICES);
    }

    /// Connections whose proxy (a `netprobe proxy` child) is killed while they are open: the
    /// app must still see the address it dialled, then closes.
    fn killed_proxy(&mut self, first_index: u32) {
        let mut proxy = spawn_proxy();
        let mut apps = Vec::new();
        for n in 0..KILLED_INDICES * u32::from(ADDRESSES) {
            if let Some(app) = self.connect(first_index + n / u32::from(ADDRESSES), n) {
                apps.push(app);
            }
        }
        for app in &apps {
            // The proxy answers every connection with a line holding its SO_ORIGINAL_DST.
            let mut line = String::new();
            let _ = BufReader::new(&app.stream).read_line(&mut line);
            let expected = format!(" orig={} ", app.dialled);
            if !line.contains(&expected) {
                self.wrong
                    .push(format!("{}: killed proxy answered {line:?}", app.dialled));
            }
            self.check_app_peer(app, "before the proxy is killed");
        }
        for app in &apps {
            quick_ack(&app.stream);
        }
        let _ = proxy.kill();
        let _ = proxy.wait();
        self.after_proxies_closed(&apps, "after the proxy was killed");
    }

    /// Checks the apps' `getpeername()` once their proxy's socket is gone: each app has read
    /// its proxy's FIN, and acknowledged it at once (`quick_ack`), so the proxy's socket went
    /// from FIN_WAIT2 to TIME_WAIT, reporting its close; the wait covers a slow softirq.
    fn after_proxies_closed(&mut self, apps: &[App], when: &str) {
        std::thread::sleep(Duration::from_millis(50));
        for app in apps {
            read_to_end(&app.stream);
            self.check_app_peer(app, when);
        }
    }

    /// An app socket bound to the port of the `n`-th client address that folds to slot
    /// `index`, connected to a destination of its own; `None` for the proxy's own address.
    fn connect(&mut self, index: u32, n: u32) -> Option<App> {
        let address = self.addresses[(n % u32::from(ADDRESSES)) as usize];
        let port = (index ^ fold(self.netns_cookie, address)) as u16;
        // The proxy's own port, on its address.
        if (address, port) == (Ipv4Addr::LOCALHOST, 4140) {
            return None;
        }
        let socket = Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .unwrap_or_else(|e| die("socket", e));
        socket.set_reuse_address(true).ok();
        socket
            .bind(&SocketAddr::from((address, port)).into())
            .unwrap_or_else(|e| die(&format!("bind {address}:{port}"), e));
        self.next_destination += 1;
        let d = self.next_destination;
        let dialled = SocketAddr::from((
            Ipv4Addr::new(192, 0, 2, 1 + (d % 250) as u8),
            10_000 + (d % 50_000) as u16,
        ));
        self.connections += 1;
        if let Err(e) = socket.connect(&dialled.into()) {
            self.wrong.push(format!("{dialled}: connect: {e}"));
            return None;
        }
        let stream: TcpStream = socket.into();
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
        Some(App { stream, dialled })
    }

    /// Closes the pair in `order`; a proxy-first app is given back, open, to be asked later.
    fn close(&mut self, app: App, proxy: TcpStream, order: Order) -> Option<App> {
        match order {
            Order::AppFirst => {
                drop(app.stream);
                read_to_end(&proxy);
                self.check_orig(&proxy, app.dialled, "after the app closed");
            }
            Order::ProxyFirst => {
                quick_ack(&app.stream);
                drop(proxy);
                return Some(app);
            }
            Order::Both => {
                drop(app.stream);
                drop(proxy);
            }
            Order::Rst => {
                SockRef::from(&app.stream)
                    .set_linger(Some(Duration::ZERO))
                    .ok();
                drop(app.stream);
                read_to_end(&proxy);
            }
        }
        None
    }

    fn check_app_peer(&mut self, app: &App, when: &str) {
        match app.stream.peer_addr() {
            Ok(peer) if peer == app.dialled => {}
            other => self.wrong.push(format!(
                "{}: the app's getpeername() {when}: {other:?}",
                app.dialled
            )),
        }
    }

    fn check_orig(&mut self, proxy: &TcpStream, dialled: SocketAddr, when: &str) {
        match SockRef::from(proxy).original_dst_v4() {
            Ok(orig) if orig.as_socket() == Some(dialled) => {}
            other => self.wrong.push(format!(
                "{dialled}: the proxy's SO_ORIGINAL_DST {when}: {:?}",
                other.map(|a| a.as_socket())
            )),
        }
    }
}

/// What the port of a connection from `address` in the pod with `netns_cookie` is XORed with
/// to give its pending slot's index (`PendingKey::slot_index` of port 0).
fn fold(netns_cookie: u64, address: Ipv4Addr) -> u32 {
    PendingKey {
        netns_cookie,
        client: Ip6Addr::from(IpAddr::V4(address)),
        client_port: 0,
        _pad: 0,
    }
    .slot_index()
}

fn listen() -> TcpListener {
    let addr: SocketAddr = PROXY.parse().expect("the proxy's address");
    let socket = interceptor_tests::sockets::listening(addr, false, 1024)
        .unwrap_or_else(|e| die(&format!("listen {addr}"), e));
    // A connection that did not reach it fails the accept instead of hanging it.
    socket.set_read_timeout(Some(Duration::from_secs(10))).ok();
    socket.into()
}

/// Waits until the listener's accept queue holds `count` connections (their proxy sides are
/// established), so closing it resets them rather than a handshake still in flight.
fn wait_for_queue(listener: &TcpListener, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: `tcp_info` is plain data; getsockopt writes at most `len` bytes into it.
        let queued = unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
            let ok = libc::getsockopt(
                listener.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&raw mut info).cast(),
                &raw mut len,
            ) == 0;
            // A listener's `tcpi_unacked` is its accept queue's length.
            ok.then_some(info.tcpi_unacked as usize)
        };
        if queued == Some(count) {
            return;
        }
        if Instant::now() > deadline {
            die("the accept queue", format!("{queued:?} of {count} queued"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Acknowledges what arrives next at once: a delayed ACK of the proxy's FIN would leave its
/// socket in FIN_WAIT1, its close not yet reported, for 40 ms.
fn quick_ack(stream: &TcpStream) {
    SockRef::from(stream).set_tcp_quickack(true).ok();
}

/// Reads until the peer's close (or reset); what is read is nothing here.
fn read_to_end(mut stream: &TcpStream) {
    let _ = stream.read_to_end(&mut Vec::new());
}

/// A `netprobe proxy` on the proxy's address, in this process's namespace, cgroup and UID.
fn spawn_proxy() -> Child {
    let netprobe = interceptor_tests::probe::sibling_binary("netprobe");
    let mut child = Command::new(netprobe)
        .args(["proxy", PROXY])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| die("spawn netprobe", e));
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line);
    if line.trim() != "ready" {
        die("netprobe proxy", format!("said {line:?}"));
    }
    child
}
