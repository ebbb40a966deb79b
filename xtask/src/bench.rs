//! `cargo xtask bench`: what interception costs per connection on this machine, eBPF and
//! iptables side by side in one run.
//!
//! One throwaway pod (see `sandbox`) and one stand-in proxy that answers in its accept loop; each
//! round times the same short connections (closed with RST, as PERF-NOTES measured) once per
//! mode, in rotating order: `direct` (nothing attached, the app connects to the proxy itself: the
//! same proxy work without interception), `ebpf` (`interceptor run`), `iptables-legacy` and
//! `iptables-nft` (`interceptor run --mode iptables`), the last three connecting to an address
//! only interception can reach. Load generator, proxy and interceptor are pinned to CPU 0, so
//! 1e6/rate is what one connection takes of it. A last, untimed eBPF run with the kernel's
//! run-time statistics on (they slow every program run) says where the eBPF time goes. Timings
//! never fail the bench: these machines are shared and noisy, compare the ratios of one run.
use std::{
    collections::BTreeSet,
    env, fs,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, ensure};
use clap::ValueEnum as _;

use crate::sandbox::{APP_UID, POD_ADDR, POD_ADDR6, PROXY_ARGS, PROXY_UID, Pod};

/// The proxy's listeners, both families as Linkerd's proxy listens with IPv6 on: outbound on
/// loopback, inbound on every address (`[::]` with IPV6_V6ONLY).
const PROXY_LISTEN: [&str; 4] = ["127.0.0.1:4140", "[::1]:4140", "0.0.0.0:4143", "[::]:4143"];

/// Which way the connections go.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Direction {
    /// The pod's app connects out (connect4/6, sock_ops, getsockopt; iptables OUTPUT).
    Outbound,
    /// The pod's peer connects in (sk_lookup, sock_ops and getsockopt on the proxy's side;
    /// iptables PREROUTING).
    Inbound,
}

/// Which sockets the app connects with.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Family {
    /// AF_INET sockets (connect4).
    Ipv4,
    /// AF_INET6 sockets to IPv4-mapped addresses: IPv4 connections through connect6.
    Ipv4Mapped,
    /// Native IPv6 (connect6, the ip6tables pass).
    Ipv6,
}

impl Family {
    /// (the proxy itself, for `direct`; an address only interception reaches it at)
    fn targets(self, direction: Direction) -> (String, String) {
        let pair = |direct: &str, redirected: &str| (direct.to_owned(), redirected.to_owned());
        match (direction, self) {
            // The pod's peer refuses documentation ranges.
            (Direction::Outbound, Family::Ipv4) => pair("127.0.0.1:4140", "192.0.2.1:80"),
            (Direction::Outbound, Family::Ipv4Mapped) => {
                pair("[::ffff:127.0.0.1]:4140", "[::ffff:192.0.2.1]:80")
            }
            (Direction::Outbound, Family::Ipv6) => pair("[::1]:4140", "[2001:db8::1]:80"),
            // Nothing listens on the pod's port 80: only steering lands there on the proxy.
            (Direction::Inbound, Family::Ipv4) => {
                (format!("{POD_ADDR}:4143"), format!("{POD_ADDR}:80"))
            }
            (Direction::Inbound, Family::Ipv4Mapped) => (
                format!("[::ffff:{POD_ADDR}]:4143"),
                format!("[::ffff:{POD_ADDR}]:80"),
            ),
            (Direction::Inbound, Family::Ipv6) => {
                (format!("[{POD_ADDR6}]:4143"), format!("[{POD_ADDR6}]:80"))
            }
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Length of each timed run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds; each times every mode once, in rotating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Connecting threads (all on CPU 0, as the proxy).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The app's sockets and destinations.
    #[arg(long, value_enum, default_value = "ipv4")]
    family: Family,
    /// Outbound (the pod's app connects out) or inbound (its peer connects in).
    #[arg(long, value_enum, default_value = "outbound")]
    direction: Direction,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Direct,
    Ebpf,
    IptablesLegacy,
    IptablesNft,
}

const MODES: [Mode; 4] = [
    Mode::Direct,
    Mode::Ebpf,
    Mode::IptablesLegacy,
    Mode::IptablesNft,
];

struct Sample {
    conns: f64,
    failures: u64,
    rate: f64,
    /// Connect-to-first-byte latency percentiles, µs.
    p50: f64,
    p99: f64,
    p999: f64,
    /// Connections the pod's conntrack holds after the run ("-" without conntrack).
    conntrack: String,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    ensure!(
        args.seconds > 0.0 && args.rounds > 0 && args.threads > 0,
        "--seconds, --rounds and --threads must be positive"
    );
    // Ctrl-C reaches the children too (same process group); surviving it turns their deaths into
    // an error, so the pod is removed by Drop instead of being left behind.
    extern "C" fn ignore(_: libc::c_int) {}
    // SAFETY: the handler does nothing; a handler (unlike SIG_IGN) is reset for exec'd children.
    unsafe { libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t) };

    let mut pod = Pod::create("bench", Some("0"))?;
    let mut proxy = pod.probe(PROXY_UID);
    proxy
        .arg("proxy")
        .args(PROXY_LISTEN)
        .args(["--v6only", "--name", "proxy", "--inline"]);
    pod.listen(proxy)?;
    println!(
        "command: cargo xtask {}",
        env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    println!(
        "settings: --seconds {} --rounds {} --threads {} --family {} --direction {}, load generator, proxy and interceptor on CPU 0",
        args.seconds,
        args.rounds,
        args.threads,
        args.family.to_possible_value().expect("a value").get_name(),
        args.direction
            .to_possible_value()
            .expect("a value")
            .get_name()
    );
    println!(
        "machine: {} CPUs, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        fs::read_to_string("/proc/sys/kernel/osrelease")?.trim()
    );

    let mut samples: Vec<Vec<Sample>> = MODES.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        // Rotating the order cancels a drift (thermal, other load) between the modes.
        for i in 0..MODES.len() {
            let index = (i + round) % MODES.len();
            let mode = MODES[index];
            let sample = measure(&mut pod, mode, args)?;
            println!(
                "round {} {:<16} {:>9.0} conn/s {:>7.2} µs/conn  p99 {:>5.0} µs  conntrack {:>6}  ({} failures)",
                round + 1,
                mode.name(),
                sample.rate,
                1e6 / sample.rate,
                sample.p99,
                sample.conntrack,
                sample.failures
            );
            samples[index].push(sample);
        }
    }

    let med = |index: usize, f: fn(&Sample) -> f64| {
        median(&mut samples[index].iter().map(f).collect::<Vec<_>>())
    };
    let (direct_rate, direct_p99) = (med(0, |s| s.rate), med(0, |s| s.p99));
    println!(
        "\nmode             conn/s (median)  µs/conn  vs direct                         p50/p99/p99.9 µs (p99 vs direct)"
    );
    for (index, mode) in MODES.iter().enumerate() {
        let rate = med(index, |s| s.rate);
        let (p50, p99, p999) = (
            med(index, |s| s.p50),
            med(index, |s| s.p99),
            med(index, |s| s.p999),
        );
        println!(
            "{:<16} {rate:>15.0}  {:>7.2}  {:.3} of the rate, {:+.2} µs/conn  {p50:.0}/{p99:.0}/{p999:.0} ({:.2}x)",
            mode.name(),
            1e6 / rate,
            rate / direct_rate,
            1e6 / rate - 1e6 / direct_rate,
            p99 / direct_p99
        );
    }

    println!("\neBPF programs (separate run with run-time statistics on):");
    program_costs(&mut pod, args)
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Ebpf => "ebpf",
            Mode::IptablesLegacy => "iptables-legacy",
            Mode::IptablesNft => "iptables-nft",
        }
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// `interceptor run` arguments for the eBPF runs: the pod's proxy, quiet logs.
fn ebpf_args() -> Vec<&'static str> {
    PROXY_ARGS
        .into_iter()
        .chain(["--log-level", "warn"])
        .collect()
}

fn measure(pod: &mut Pod, mode: Mode, args: &Args) -> anyhow::Result<Sample> {
    let (proxy, redirected) = args.family.targets(args.direction);
    let (proxy, redirected) = (proxy.as_str(), redirected.as_str());
    match mode {
        Mode::Direct => bench(pod, proxy, args),
        Mode::Ebpf => {
            pod.mesh_ebpf(&ebpf_args())?;
            let sample = bench(pod, redirected, args);
            let status = pod.unmesh()?;
            ensure!(status.success(), "interceptor run exited with {status}");
            sample
        }
        Mode::IptablesLegacy | Mode::IptablesNft => {
            let binaries = if mode == Mode::IptablesLegacy {
                "legacy"
            } else {
                "nft"
            };
            pod.iptables(binaries, true)?;
            let sample = bench(pod, redirected, args);
            pod.iptables(binaries, false)?;
            sample
        }
    }
}

/// One timed run: the pod's app (outbound) or its peer (inbound) connects to `target`. A
/// connection answered by anything but the proxy fails the bench: a bypass must never count as
/// speed.
fn bench(pod: &Pod, target: &str, args: &Args) -> anyhow::Result<Sample> {
    let mut load = match args.direction {
        Direction::Outbound => pod.probe(APP_UID),
        Direction::Inbound => pod.peer_probe(),
    };
    let out = crate::cmd::output(load.args(["bench", target]).args([
        "--seconds",
        &args.seconds.to_string(),
        "--threads",
        &args.threads.to_string(),
    ]))?;
    let field = |key: &str| -> anyhow::Result<f64> {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .with_context(|| format!("no {key}= in netprobe's {out:?}"))
    };
    let misrouted = field("misrouted")?;
    ensure!(
        misrouted == 0.0,
        "{misrouted} connections to {target} were answered by something other than the proxy"
    );
    Ok(Sample {
        conns: field("conns")?,
        failures: field("failures")? as u64,
        rate: field("rate")?,
        p50: field("p50_us")?,
        p99: field("p99_us")?,
        p999: field("p999_us")?,
        conntrack: pod.conntrack_entries(),
    })
}

/// Per program: average run time and runs per connection, from the kernel's counters taken
/// before and after one eBPF run. The programs are those `interceptor run` holds, so the per-pod
/// sk_lookup instance, which status does not list, counts too.
fn program_costs(pod: &mut Pod, args: &Args) -> anyhow::Result<()> {
    let _stats = enable_bpf_stats()?;
    pod.mesh_ebpf(&ebpf_args())?;
    let pid = pod.meshed_pid().context("meshed")?;
    let progs: Vec<OwnedFd> = program_ids(pid)?
        .into_iter()
        .map(prog_fd)
        .collect::<anyhow::Result<_>>()?;
    let before: Vec<ProgInfo> = progs.iter().map(prog_info).collect::<anyhow::Result<_>>()?;
    let sample = bench(pod, &args.family.targets(args.direction).1, args)?;
    let after: Vec<ProgInfo> = progs.iter().map(prog_info).collect::<anyhow::Result<_>>()?;
    pod.unmesh()?;
    let mut total = 0.0;
    for (before, after) in before.iter().zip(&after) {
        let ns = (after.run_time_ns - before.run_time_ns) as f64;
        let runs = (after.run_cnt - before.run_cnt) as f64;
        let per_conn = ns / sample.conns / 1e3;
        total += per_conn;
        println!(
            "  {:<16} {:>6.0} ns/run x {:>5.2} runs/conn = {per_conn:.2} µs/conn",
            after.name,
            ns / runs.max(1.0),
            runs / sample.conns
        );
    }
    println!(
        "  total: {total:.2} µs/conn in eBPF ({:.0} conns, {} failures)",
        sample.conns, sample.failures
    );
    Ok(())
}

/// bpf(2) commands from <linux/bpf.h>; the libc crate does not define them.
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;

/// bpf(2); `attr` is the command's part of union bpf_attr (the kernel zero-extends it and may
/// write back into it).
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> anyhow::Result<libc::c_long> {
    // SAFETY: attr is valid for size_of::<T>() bytes, read and written by the kernel only.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    ensure!(
        rc >= 0,
        "bpf command {cmd}: {}",
        std::io::Error::last_os_error()
    );
    Ok(rc)
}

fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> anyhow::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: these commands return a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Turns on run_time_ns/run_cnt accounting (kernel.bpf_stats_enabled) for as long as the fd is
/// open: closing it, even by the process dying, puts the setting back as it was.
fn enable_bpf_stats() -> anyhow::Result<OwnedFd> {
    bpf_fd(BPF_ENABLE_STATS, &mut [0u32 /* BPF_STATS_RUN_TIME */])
}

fn prog_fd(id: u32) -> anyhow::Result<OwnedFd> {
    bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut [id, 0, 0])
}

/// The ids of the programs a process holds: its program and link fds name them in fdinfo.
fn program_ids(pid: u32) -> anyhow::Result<BTreeSet<u32>> {
    let mut ids = BTreeSet::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        // An fd closed since the directory was listed has no fdinfo any more.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:")?.trim().parse::<u32>().ok()),
        );
    }
    Ok(ids)
}

struct ProgInfo {
    name: String,
    run_time_ns: u64,
    run_cnt: u64,
}

fn prog_info(fd: &OwnedFd) -> anyhow::Result<ProgInfo> {
    // struct bpf_prog_info up to run_cnt; offsets from <linux/bpf.h> (the struct only grows).
    const NAME: usize = 64;
    const RUN_TIME_NS: usize = 192;
    const RUN_CNT: usize = 200;
    let mut info = [0u8; RUN_CNT + 8];
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let u64_at = |at: usize| u64::from_ne_bytes(info[at..at + 8].try_into().expect("8 bytes"));
    let name = info[NAME..NAME + 16]
        .split(|&b| b == 0)
        .next()
        .unwrap_or_default();
    Ok(ProgInfo {
        name: String::from_utf8_lossy(name).into_owned(),
        run_time_ns: u64_at(RUN_TIME_NS),
        run_cnt: u64_at(RUN_CNT),
    })
}
