//! `cargo xtask bench`: what interception costs per connection on this machine, eBPF and
//! iptables side by side in one run.
//!
//! Every mode has a throwaway pod of its own (the kit's `PodFixture`), set up once: nothing
//! attached (the limit: the client connects to the proxy itself), eBPF (`interceptor run`),
//! iptables-legacy and iptables-nft (the chains proxy-init writes, installed as
//! `interceptor run --mode iptables` does); in the headline cases also eBPF with the program
//! variants the loader picks on older kernels (`INTERCEPTOR_KERNEL_FEATURES`). Pods never
//! switch modes, so no mode inherits another's state (iptables leaves conntrack behind in a
//! namespace). `connload`, a lean load generator and proxy, connects, accepts, asks
//! SO_ORIGINAL_DST and checks it on every connection. The modes of a case run at once, one connload process each, taking turns in
//! 20 ms slices (`load::measure_interleaved`); the slices are grouped into repetitions, and the
//! report gives medians of the per-repetition ratios to the limit with their range.
//!
//! Timings never fail the bench: these machines are shared and noisy, compare the ratios of one
//! run. A connection that fails or reaches the proxy with a wrong original destination does.
//!
//! One module per job: `lab` the pods, `matrix` the per-connection and ignored-ports cases,
//! `outside` sockets outside meshed pods, `progstats` where the eBPF time goes, `agent_sweep`
//! the node agent's pods, `results` results.md; `run` puts them in order.
mod agent_sweep;
mod idle_hooks;
mod lab;
mod load;
mod matrix;
mod outside;
mod progstats;
mod report;
mod results;

use std::{
    env,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::{Context as _, ensure};
use clap::Parser as _;
use interceptor_tests::program;

use self::{
    lab::Lab,
    load::{Case, Close, Direction, Family, HEADLINE_MODES, Mode},
    matrix::DIRECTIONS,
    outside::OutsideResult,
    results::Results,
};

fn main() -> ExitCode {
    program::main(|| run(&Args::parse()))
}

#[derive(clap::Parser)]
#[command(
    name = "cargo xtask bench",
    about = "Measure what interception costs per connection, eBPF next to iptables (results in target/bench/, see docs/BENCHMARKS.md). Needs root."
)]
struct Args {
    /// About three minutes: outbound and inbound with one pinned worker (every program variant
    /// and the floor), plus 3,000 ignored ports and sockets outside meshed pods; no
    /// worker/pinning/close matrix, no pod sweep.
    #[arg(long)]
    quick: bool,
    /// Only the node agent's pod sweep: 1, 100 and 1,000 registered pods, registration time,
    /// memory, and CPU at rest with 0, 100 and 1,000 (about two minutes).
    #[arg(long, conflicts_with = "quick")]
    pods_only: bool,
    /// Seconds per mode and repetition: a case runs for repetitions x seconds x modes.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Samples per mode and case, each from its own stretch of time [default: 5 with --quick,
    /// 7 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    repetitions: Option<u32>,
    /// Seconds the node agent's CPU time is counted at rest, at each pod count [default: 10
    /// with --pods-only, 30 otherwise; no pod sweep with --quick].
    #[arg(long)]
    rest_seconds: Option<f64>,
    /// The app's sockets and destinations.
    #[arg(long, value_enum, default_value = "ipv4")]
    family: Family,
    /// Where results.md and the charts go [default: target/bench/<UTC time>].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// How long each measurement runs, from the arguments.
pub struct Settings {
    /// Samples per mode and case (three times as many for the one-worker cases).
    pub repetitions: usize,
    /// Seconds per mode and repetition.
    pub seconds: f64,
    /// How long the node agent's CPU time is counted at rest.
    pub rest_window: Duration,
}

impl Settings {
    fn of(args: &Args) -> Self {
        Self {
            repetitions: args.repetitions.unwrap_or(if args.quick { 5 } else { 7 }) as usize,
            seconds: args.seconds,
            rest_window: Duration::from_secs_f64(args.rest_seconds.unwrap_or(if args.pods_only {
                10.0
            } else {
                30.0
            })),
        }
    }
}

fn base_case(direction: Direction, family: Family) -> Case {
    Case {
        direction,
        family,
        workers: 1,
        pinned: true,
        close: Close::Rst,
        ignored_ports: 0,
    }
}

const POD_COUNTS: [usize; 3] = [1, 100, 1000];
/// The node agent at rest: with no pod, and with as many as the sweep registers.
const REST_COUNTS: [usize; 3] = [0, 100, 1000];

fn run(args: &Args) -> anyhow::Result<()> {
    survive_ctrl_c();
    let settings = Settings::of(args);
    let out_dir = out_dir(args)?;
    let mut lab = Lab::new();
    let header = header(args, &settings)?;
    println!("{header}");
    let results = measure(&mut lab, args, &settings)?;
    results::write(&out_dir, &header, &results, &settings)
}

/// Ctrl-C reaches the children too (same process group); surviving it turns their deaths into
/// an error, so the pods are removed by Drop instead of being left behind.
fn survive_ctrl_c() {
    extern "C" fn ignore(_: libc::c_int) {}
    // SAFETY: the handler does nothing; a handler (unlike SIG_IGN) is reset for exec'd children.
    unsafe { libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t) };
}

/// `--out`, or target/bench/<UTC time>, created.
fn out_dir(args: &Args) -> anyhow::Result<PathBuf> {
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ sits inside the workspace root")
            .join("target/bench")
            .join(utc_stamp("%Y%m%d-%H%M%S")?),
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    Ok(out_dir)
}

/// Every measurement the arguments ask for, in an order that keeps each from slowing the next.
fn measure(lab: &mut Lab, args: &Args, settings: &Settings) -> anyhow::Result<Results> {
    // FIN cases after the RST ones and the sweeps: the TIME_WAIT sockets and conntrack entries
    // they leave behind for a minute would slow whatever runs after them.
    let (rst, fin): (Vec<Case>, Vec<Case>) = matrix::per_connection_cases(args)
        .into_iter()
        .partition(|c| c.close == Close::Rst);
    let mut per_connection = matrix::run_cases(lab, &rst, settings)?;
    let ignored_ports = matrix::run_cases(lab, &matrix::ignored_port_cases(args), settings)?;
    let outside = if args.pods_only {
        Vec::new()
    } else {
        sockets_outside_pods(lab, settings)?
    };
    per_connection.extend(matrix::run_cases(lab, &fin, settings)?);
    // Before the pod sweep (see there).
    let program_costs = if args.pods_only {
        Vec::new()
    } else {
        progstats::measure(lab, args.family, settings.seconds)?
    };
    // Registered pods last: the agent's 1,000 namespaces are deleted at its end, and the kernel
    // takes a while to clean them up, which would slow whatever runs next.
    let pods = if args.quick {
        None
    } else {
        Some(pod_sweep(lab, args.family, settings)?)
    };
    let variants = HEADLINE_MODES
        .into_iter()
        .filter_map(|mode| Some((mode, lab.variants(mode)?.to_owned())))
        .collect();
    Ok(Results {
        variants,
        per_connection,
        ignored_ports,
        outside,
        program_costs,
        pods,
    })
}

/// Sockets outside meshed pods, in the cgroup the eBPF pod's programs are attached to.
fn sockets_outside_pods(lab: &mut Lab, settings: &Settings) -> anyhow::Result<Vec<OutsideResult>> {
    let attached = lab.pod(Mode::Ebpf, 0)?.pod.cgroup.path.clone();
    outside::run(
        &lab.connload,
        &attached,
        &lab.client_cgroup.path,
        settings.repetitions,
        settings.seconds,
        |line| println!("{line}"),
    )
}

/// The node agent with 1, 100 and 1,000 pods registered, its pod against the limit's, and at
/// rest with 0, 100 and 1,000.
fn pod_sweep(
    lab: &mut Lab,
    family: Family,
    settings: &Settings,
) -> anyhow::Result<agent_sweep::PodsSweep> {
    let cases = DIRECTIONS.map(|d| base_case(d, family));
    lab.pod(Mode::Limit, 0)?;
    agent_sweep::run(
        &lab.interceptor,
        &lab.connload,
        &lab.existing_pod(Mode::Limit, 0).pod,
        &lab.client_cgroup.path,
        &cases,
        &POD_COUNTS,
        &REST_COUNTS,
        settings.rest_window,
        settings.repetitions,
        settings.seconds,
        |line| println!("{line}"),
    )
}

fn header(args: &Args, settings: &Settings) -> anyhow::Result<String> {
    let Settings {
        repetitions,
        seconds,
        ..
    } = *settings;
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim())
        })
        .unwrap_or("unknown CPU");
    let mut md = format!(
        "# interceptor bench, {}\n\n- command: `cargo xtask {}`\n- machine: {} CPUs ({model}), Linux {}\n- settings: {} repetitions of {seconds} s per mode and case, {:?} sockets; `connload` connects, accepts (with the peer's address, as a proxy's runtime does), asks SO_ORIGINAL_DST (checked on every connection), echoes one byte and closes; pinned = load generator and proxy on CPU 0\n",
        utc_stamp("%Y-%m-%d %H:%M UTC")?,
        std::iter::once("bench".to_owned())
            .chain(env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        fs::read_to_string("/proc/sys/kernel/osrelease")?.trim(),
        repetitions,
        args.family,
    );
    if let Ok(mitigations) =
        fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow")
    {
        let _ = writeln!(md, "- spec_rstack_overflow: {}", mitigations.trim());
    }
    Ok(md)
}

/// The time now in UTC, as `date -u +FORMAT` writes it.
fn utc_stamp(format: &str) -> anyhow::Result<String> {
    let date = Command::new("date")
        .arg("-u")
        .arg(format!("+{format}"))
        .output()
        .context("could not start `date`")?;
    ensure!(date.status.success(), "`date -u +{format}` failed");
    Ok(String::from_utf8_lossy(&date.stdout).trim().to_owned())
}
