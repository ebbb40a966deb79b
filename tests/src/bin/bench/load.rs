//! One timed run of `connload` (the lean load generator and proxy in `tests/`) against a pod set
//! up for one mode, and what it measured.
use std::{fmt, path::Path, process::Command};

use super::idle_hooks::Watch;
use anyhow::{Context as _, ensure};
use interceptor_tests::{
    PodFixture,
    fixture::{POD_ADDR, POD_ADDR6},
    scenario::APP_UID,
};
use serde_json::Value;

/// Which way the connections go.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Direction {
    /// The pod's app connects out (connect4/6, sock_ops, getsockopt; iptables OUTPUT).
    Outbound,
    /// The pod's peer connects in (sk_lookup, sock_ops and getsockopt on the proxy's side;
    /// iptables PREROUTING).
    Inbound,
}

/// Which sockets the app connects with.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Family {
    /// AF_INET sockets (connect4).
    Ipv4,
    /// AF_INET6 sockets to IPv4-mapped addresses: IPv4 connections through connect6.
    Ipv4Mapped,
    /// Native IPv6 (connect6, the ip6tables pass).
    Ipv6,
}

/// How each connection ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Close {
    /// SO_LINGER 0 on the app's side: an RST, nothing left behind.
    Rst,
    /// A normal close, the pod's side first (the app outbound, the proxy inbound): FIN both
    /// ways and TIME_WAIT in the pod. (A single inbound client closing first would soon have
    /// every port of its address in TIME_WAIT, whatever the mode.)
    Fin,
}

/// What is in force in the pod.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Mode {
    /// Nothing: the app (or peer) connects to the proxy itself. The same work minus
    /// interception, the limit the others are compared with.
    Limit,
    /// Connections as in the limit, with a program that does nothing at each of eBPF
    /// interception's hooks: its floor (`idle_hooks`); with [`Watch::Close`], the floor of any
    /// interception that answers `SO_ORIGINAL_DST` until the proxy's socket closes.
    IdleHooks(Watch),
    /// eBPF with the programs the loader chooses on this kernel.
    Ebpf,
    /// eBPF with the programs the loader chooses on a kernel without some features.
    EbpfWithout(Without),
    IptablesLegacy,
    IptablesNft,
}

/// The modes of every case.
pub const MODES: [Mode; 4] = [
    Mode::Limit,
    Mode::Ebpf,
    Mode::IptablesLegacy,
    Mode::IptablesNft,
];

/// The modes of the headline cases: every program variant too, and the floor of any program.
pub const HEADLINE_MODES: [Mode; 8] = [
    Mode::Limit,
    Mode::IdleHooks(Watch::Nothing),
    Mode::IdleHooks(Watch::Close),
    Mode::Ebpf,
    Mode::EbpfWithout(Without::IngressIfindex),
    Mode::EbpfWithout(Without::SocketCreator),
    Mode::IptablesLegacy,
    Mode::IptablesNft,
];

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Limit => "no interception",
            Mode::IdleHooks(Watch::Nothing) => "programs doing nothing",
            Mode::IdleHooks(Watch::Close) => "programs doing nothing, watching close",
            Mode::Ebpf => "eBPF",
            Mode::EbpfWithout(Without::IngressIfindex) => "eBPF -ingress_ifindex",
            Mode::EbpfWithout(Without::SocketCreator) => "eBPF -socket_creator",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
        }
    }

    /// Whether the mode's pod sends connections to the proxy (the others' go there directly, and
    /// have no configuration, ignored ports included).
    pub fn redirects(self) -> bool {
        !matches!(self, Mode::Limit | Mode::IdleHooks(_))
    }

    pub fn is_ebpf(self) -> bool {
        matches!(self, Mode::Ebpf | Mode::EbpfWithout(_))
    }
}

/// What an older kernel lacks of what the programs use, taken away from the loader by
/// `INTERCEPTOR_KERNEL_FEATURES`: it then picks the variants made for such a kernel
/// (interceptor's `ebpf::variants`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Without {
    /// `ingress_ifindex` in sk_lookup (5.17): without, loopback is told by address. (BPF
    /// atomics have no variant: every kernel the programs load on has them.)
    IngressIfindex,
    /// BTF access to a socket's creator from connect4/6: without, the proxy's UID and GID are
    /// told by the task's real IDs.
    SocketCreator,
}

impl Without {
    /// The value of `INTERCEPTOR_KERNEL_FEATURES`.
    pub fn features_taken_away(self) -> &'static str {
        match self {
            Without::IngressIfindex => "-ingress_ifindex",
            Without::SocketCreator => "-socket_creator",
        }
    }
}

/// One configuration the modes are compared in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Case {
    pub direction: Direction,
    pub family: Family,
    pub workers: usize,
    pub pinned: bool,
    pub close: Close,
    /// Ports in the pod's ignore lists (both directions; none of them is the one connected to).
    pub ignored_ports: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {} worker{}, {}, {} close",
            match self.direction {
                Direction::Outbound => "outbound",
                Direction::Inbound => "inbound",
            },
            self.workers,
            if self.workers == 1 { "" } else { "s" },
            if self.pinned { "pinned" } else { "unpinned" },
            match self.close {
                Close::Rst => "RST",
                Close::Fin => "FIN",
            },
        )?;
        if self.family != Family::Ipv4 {
            write!(f, ", {:?}", self.family)?;
        }
        if self.ignored_ports > 0 {
            write!(f, ", {} ignored ports", self.ignored_ports)?;
        }
        Ok(())
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct Sample {
    pub conns: f64,
    pub rate: f64,
    pub cpu_us_per_conn: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// Entries in the pod's conntrack table after the run (0 when conntrack is not loaded there).
    pub conntrack: u64,
}

/// Addresses of one run: (where the proxy listens, whether that listener is IPV6_V6ONLY, where
/// the client connects, the original destination the proxy must be told).
struct Addresses {
    listen: String,
    v6only: bool,
    connect: String,
    expect: Option<String>,
}

/// The pod's app port, where inbound clients connect: the app has it bound (see
/// `lab::bind_app_port`).
pub const APP_PORT: u16 = 80;

fn addresses(case: &Case, mode: Mode) -> Addresses {
    let limit = !mode.redirects();
    // Outbound, the app connects to a documentation address (the pod's remote refuses it, so a
    // connection that is not intercepted fails); inbound, to the pod's port 80, which the app
    // has bound but where nothing listens.
    let (listen, v6only, direct, redirected) = match (case.direction, case.family) {
        (Direction::Outbound, Family::Ipv4) => (
            "127.0.0.1:4140",
            false,
            "127.0.0.1:4140".into(),
            "192.0.2.1:80".into(),
        ),
        (Direction::Outbound, Family::Ipv4Mapped) => (
            "127.0.0.1:4140",
            false,
            "[::ffff:127.0.0.1]:4140".into(),
            "[::ffff:192.0.2.1]:80".into(),
        ),
        (Direction::Outbound, Family::Ipv6) => (
            "[::1]:4140",
            true,
            "[::1]:4140".into(),
            "[2001:db8::1]:80".into(),
        ),
        (Direction::Inbound, Family::Ipv4) => (
            "0.0.0.0:4143",
            false,
            format!("{POD_ADDR}:4143"),
            format!("{POD_ADDR}:{APP_PORT}"),
        ),
        (Direction::Inbound, Family::Ipv4Mapped) => (
            "0.0.0.0:4143",
            false,
            format!("[::ffff:{POD_ADDR}]:4143"),
            format!("[::ffff:{POD_ADDR}]:{APP_PORT}"),
        ),
        (Direction::Inbound, Family::Ipv6) => (
            "[::]:4143",
            true,
            format!("[{POD_ADDR6}]:4143"),
            format!("[{POD_ADDR6}]:{APP_PORT}"),
        ),
    };
    // The proxy sees an IPv4-mapped client's connection as plain IPv4.
    let expect = (!limit).then(|| match redirected.strip_prefix("[::ffff:") {
        Some(mapped) => mapped.replacen("]:", ":", 1),
        None => redirected.clone(),
    });
    Addresses {
        listen: listen.into(),
        v6only,
        connect: if limit { direct } else { redirected },
        expect,
    }
}

/// connload's command line for `case` in `pod`, set up for `mode` (how long it runs is the
/// caller's to add).
fn connload_command(
    connload: &Path,
    pod: &PodFixture,
    client_cgroup: &Path,
    case: &Case,
    mode: Mode,
) -> Command {
    let addrs = addresses(case, mode);
    let mut cmd = Command::new(connload);
    cmd.arg("--listen-netns")
        .arg(pod.pod.path())
        .args(["--listen", &addrs.listen])
        .arg("--cgroup")
        .arg(&pod.cgroup.path)
        .args(["--connect", &addrs.connect])
        .args(["--expect", addrs.expect.as_deref().unwrap_or("none")])
        .args(["--workers", &case.workers.to_string()])
        .args([
            "--close",
            match (case.close, case.direction) {
                (Close::Rst, _) => "rst",
                (Close::Fin, Direction::Outbound) => "fin",
                (Close::Fin, Direction::Inbound) => "fin-server",
            },
        ]);
    if addrs.v6only {
        cmd.arg("--v6only");
    }
    if case.pinned {
        cmd.args(["--cpu", "0"]);
    }
    match case.direction {
        Direction::Outbound => {
            cmd.arg("--connect-netns")
                .arg(pod.pod.path())
                .args(["--uid", &APP_UID.to_string()]);
        }
        Direction::Inbound => {
            // The client is no process of the pod: its sockets are in a cgroup nothing is
            // attached to.
            cmd.arg("--connect-netns")
                .arg(pod.remote.path())
                .arg("--client-cgroup")
                .arg(client_cgroup);
        }
    }
    cmd
}

/// connload's report; any connection that failed or whose original destination was wrong fails
/// the run: a bypass must never count as speed. `what` names the run.
fn checked_report(out: &str, what: &str) -> anyhow::Result<Value> {
    let json: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("connload printed {out:?}"))?;
    let failures = json["failures"].as_f64().unwrap_or(f64::NAN);
    ensure!(
        failures == 0.0,
        "{what}: {failures} of {} connections failed, the first: {}",
        json["conns"],
        json["first_failure"].as_str().unwrap_or("?")
    );
    Ok(json)
}

/// How a mode's run is named in errors.
fn run_name(case: &Case, mode: Mode) -> String {
    format!("{} ({case})", mode.name())
}

fn num(json: &Value, key: &str) -> anyhow::Result<f64> {
    json[key]
        .as_f64()
        .with_context(|| format!("no {key} in connload's report {json}"))
}

/// Runs connload once for `case` in `pod`, set up for `mode`, for `seconds`.
pub fn measure(
    connload: &Path,
    pod: &PodFixture,
    client_cgroup: &Path,
    case: &Case,
    mode: Mode,
    seconds: f64,
) -> anyhow::Result<Sample> {
    let out = connload_command(connload, pod, client_cgroup, case, mode)
        .args(["--seconds", &seconds.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("could not start connload")?;
    ensure!(out.status.success(), "connload failed ({})", out.status);
    let json = checked_report(&String::from_utf8_lossy(&out.stdout), &run_name(case, mode))?;
    Ok(Sample {
        conns: num(&json, "conns")?,
        rate: num(&json, "rate")?,
        cpu_us_per_conn: num(&json, "cpu_us_per_conn")?,
        p50: num(&json, "p50_us")?,
        p99: num(&json, "p99_us")?,
        p999: num(&json, "p999_us")?,
        conntrack: conntrack_entries(pod),
    })
}

/// The connections the pod's conntrack holds (0 when conntrack is not loaded): the state
/// iptables' NAT leaves behind, which eBPF interception does not create.
fn conntrack_entries(pod: &PodFixture) -> u64 {
    Command::new("nsenter")
        .arg(format!("--net={}", pod.pod.path().display()))
        .args(["cat", "/proc/sys/net/netfilter/nf_conntrack_count"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(0)
}

/// Slices of time given to each mode's process in turn.
const SLICE_MS: f64 = 20.0;

/// Every mode of `pods` at once, each in a connload process of its own, taking turns in slices
/// of 20 ms for `seconds` in all (see [`interleave`]), grouped into `repetitions` samples per
/// mode, in order.
pub fn measure_interleaved(
    connload: &Path,
    pods: &[(Mode, &PodFixture)],
    client_cgroup: &Path,
    case: &Case,
    seconds: f64,
    repetitions: usize,
) -> anyhow::Result<Vec<Vec<Sample>>> {
    let processes = pods
        .iter()
        .map(|(mode, pod)| {
            (
                run_name(case, *mode),
                connload_command(connload, pod, client_cgroup, case, *mode),
            )
        })
        .collect();
    let mut samples = interleave(processes, seconds, repetitions)?;
    for ((_, pod), mode_samples) in pods.iter().zip(&mut samples) {
        let conntrack = conntrack_entries(pod);
        for sample in mode_samples {
            sample.conntrack = conntrack;
        }
    }
    Ok(samples)
}

/// connload `processes` (each a name for errors and its command line, without the turn's
/// arguments) at once, taking turns in slices of 20 ms for `seconds` in all: the bench hands
/// each process its turn through a FIFO and waits on another for the turn to come back (see
/// connload's `ring`). Whatever else the machine does in a moment falls on all of them alike,
/// which timed runs one after the other cannot give on a shared machine. Every round takes the
/// processes in a new random order, so no mode always follows the same one: a mode after one
/// whose slice left the CPU idle (iptables' connects waiting on a SYN retransmission with FIN
/// close) or its caches cold would otherwise carry that in every sample.
/// The slices are grouped into `repetitions` samples per process, in order (their `conntrack`
/// is left at 0).
pub fn interleave(
    processes: Vec<(String, Command)>,
    seconds: f64,
    repetitions: usize,
) -> anyhow::Result<Vec<Vec<Sample>>> {
    let dir = std::env::temp_dir().join(interceptor_tests::unique_name("bench-ring"));
    std::fs::create_dir_all(&dir)?;
    // Process i's turn comes on `turn-i-in` and goes back on `turn-i-out`.
    let fifo = |i: usize, way: &str| dir.join(format!("turn-{i}-{way}"));
    for i in 0..processes.len() {
        for way in ["in", "out"] {
            let path = std::ffi::CString::new(fifo(i, way).as_os_str().as_encoded_bytes())?;
            // SAFETY: a valid NUL-terminated path.
            ensure!(
                unsafe { libc::mkfifo(path.as_ptr(), 0o600) } == 0,
                "mkfifo {}: {}",
                fifo(i, way).display(),
                std::io::Error::last_os_error()
            );
        }
    }
    let result = run_turns(processes, seconds, repetitions, &fifo);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_turns(
    processes: Vec<(String, Command)>,
    seconds: f64,
    repetitions: usize,
    fifo: &dyn Fn(usize, &str) -> std::path::PathBuf,
) -> anyhow::Result<Vec<Vec<Sample>>> {
    use std::io::{BufRead as _, Read as _, Write as _};
    /// The mode processes, killed if the run fails half-way: they would wait for their turn
    /// for ever.
    struct Children(
        Vec<(
            std::process::Child,
            std::io::BufReader<std::process::ChildStdout>,
        )>,
    );
    impl Drop for Children {
        fn drop(&mut self) {
            for (child, _) in &mut self.0 {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
    let mut children = Children(Vec::new());
    let mut names = Vec::new();
    for (i, (name, mut cmd)) in processes.into_iter().enumerate() {
        cmd.arg("--ring-in")
            .arg(fifo(i, "in"))
            .arg("--ring-out")
            .arg(fifo(i, "out"))
            .args(["--slice-ms", &SLICE_MS.to_string()])
            .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().context("starting connload")?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        children.0.push((child, stdout));
        ensure!(line.trim() == "ready", "connload for {name} did not start");
        names.push(name);
    }
    // Read and write: opening a FIFO one way only would wait for the other end.
    let open = |path: std::path::PathBuf| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
    };
    let mut turns = (0..names.len())
        .map(|i| Ok((open(fifo(i, "in"))?, open(fifo(i, "out"))?)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut order: Vec<usize> = (0..turns.len()).collect();
    // A fixed seed: two runs take the same orders.
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut token = [0u8];
    let started = std::time::Instant::now();
    while started.elapsed().as_secs_f64() < seconds {
        rng.shuffle(&mut order);
        for &i in &order {
            let (give, back) = &mut turns[i];
            give.write_all(b"t")?;
            back.read_exact(&mut token)?;
        }
    }
    for (give, back) in &mut turns {
        give.write_all(b"q")?;
        back.read_exact(&mut token)?;
    }

    let mut samples = Vec::new();
    for (name, (child, stdout)) in names.iter().zip(&mut children.0) {
        let mut out = String::new();
        stdout.read_to_string(&mut out)?;
        let status = child.wait()?;
        ensure!(status.success(), "connload for {name} failed ({status})");
        let json = checked_report(&out, name)?;
        let rounds: Vec<[f64; 3]> =
            serde_json::from_value(json["rounds"].clone()).context("connload's rounds")?;
        let per_sample = rounds.len().div_ceil(repetitions).max(1);
        let mode_samples = rounds
            .chunks(per_sample)
            .map(|chunk| {
                let conns: f64 = chunk.iter().map(|r| r[0]).sum();
                let secs: f64 = chunk.iter().map(|r| r[1]).sum();
                let cpu: f64 = chunk.iter().map(|r| r[2]).sum();
                Ok(Sample {
                    conns,
                    rate: conns / secs,
                    cpu_us_per_conn: cpu * 1e6 / conns.max(1.0),
                    // Latency percentiles are over the whole run.
                    p50: num(&json, "p50_us")?,
                    p99: num(&json, "p99_us")?,
                    p999: num(&json, "p999_us")?,
                    conntrack: 0,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        samples.push(mode_samples);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base_case as case;

    #[test]
    fn the_proxy_is_told_the_address_the_app_connected_to() {
        let expect = |direction, family| addresses(&case(direction, family), Mode::Ebpf).expect;
        assert_eq!(
            expect(Direction::Outbound, Family::Ipv4).as_deref(),
            Some("192.0.2.1:80")
        );
        // An IPv4-mapped connect is an IPv4 connection: SO_ORIGINAL_DST answers plain IPv4.
        assert_eq!(
            expect(Direction::Outbound, Family::Ipv4Mapped).as_deref(),
            Some("192.0.2.1:80")
        );
        assert_eq!(
            expect(Direction::Outbound, Family::Ipv6).as_deref(),
            Some("[2001:db8::1]:80")
        );
        assert_eq!(
            expect(Direction::Inbound, Family::Ipv6),
            Some(format!("[{POD_ADDR6}]:{APP_PORT}"))
        );
        assert_eq!(
            addresses(&case(Direction::Outbound, Family::Ipv6), Mode::Limit).expect,
            None
        );
    }
}
