//! `cargo xtask bench`: what interception costs per connection on this machine, eBPF and
//! iptables side by side in one run.
//!
//! Every mode has a throwaway pod of its own (the kit's `PodFixture`), set up once: nothing
//! attached (the limit: the client connects to the proxy itself), eBPF (`interceptor run`),
//! iptables-legacy and iptables-nft (the chains proxy-init writes, installed as
//! `interceptor run --mode iptables` does). Pods never switch modes, so no mode inherits
//! another's state (iptables leaves conntrack behind in a namespace). `connload`, a lean load
//! generator and proxy, connects, accepts, asks SO_ORIGINAL_DST and checks it on every
//! connection. The modes of a case run at once, one connload process each, taking turns in
//! 20 ms slices (`load::measure_interleaved`); the slices are grouped into repetitions, and the
//! report gives medians of the per-repetition ratios to the limit with their range.
//!
//! Timings never fail the bench: these machines are shared and noisy, compare the ratios of one
//! run. A connection that fails or reaches the proxy with a wrong original destination does.
mod agent_sweep;
mod load;
mod outside;
mod progstats;
mod report;

use std::{
    any::Any,
    collections::BTreeMap,
    env,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context as _, ensure};
use clap::Parser as _;
use interceptor::{config::InterceptionConfig, iptables::IptablesMode};
use interceptor_tests::{
    Cgroup, PodFixture,
    agent_home::PROXY_FLAGS,
    iptables_backend::Iptables,
    meshed::{self, Meshed},
    probe::sibling_binary,
    program,
    scenario::Backend as _,
};

use self::{
    load::{Case, Close, Direction, Family, MODES, Mode},
    report::{CaseResult, Spread},
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
    /// About a minute: outbound and inbound with one pinned worker, plus 3,000 ignored ports and
    /// sockets outside meshed pods; no worker/pinning/close matrix, no pod sweep.
    #[arg(long)]
    quick: bool,
    /// Only the node agent's pod sweep: 1, 100 and 1,000 registered pods, registration time and
    /// memory (about a minute).
    #[arg(long, conflicts_with = "quick")]
    pods_only: bool,
    /// Seconds per mode and repetition: a case runs for repetitions x seconds x modes.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Samples per mode and case, each from its own stretch of time [default: 5 with --quick,
    /// 7 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    repetitions: Option<u32>,
    /// The app's sockets and destinations.
    #[arg(long, value_enum, default_value = "ipv4")]
    family: Family,
    /// Where results.md and the charts go [default: target/bench/<UTC time>].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A mode's pod and what intercepts its connections.
struct ModePod {
    /// Detached before the pod is removed.
    interception: Interception,
    pod: PodFixture,
}

enum Interception {
    None,
    Ebpf(Meshed),
    Iptables {
        /// Only held: the chains are removed when it is dropped.
        _chains: Box<dyn Any>,
    },
}

/// The pods of one run, one per (mode, ignored ports), created when first needed and removed
/// when the run ends.
struct Lab {
    /// The release `interceptor` binary.
    interceptor: PathBuf,
    connload: PathBuf,
    /// Where inbound clients' sockets are made: a cgroup nothing is attached to.
    client_cgroup: Cgroup,
    pods: BTreeMap<(usize, usize), ModePod>,
}

impl Lab {
    fn new() -> Self {
        Self {
            interceptor: sibling_binary("interceptor"),
            connload: sibling_binary("connload"),
            client_cgroup: Cgroup::new("bench-clients"),
            pods: BTreeMap::new(),
        }
    }

    /// The key of a mode's pod: the limit ignores nothing whatever the case, one pod serves
    /// every case.
    fn key(mode: Mode, ignored_ports: usize) -> (usize, usize) {
        let index = MODES.iter().position(|&m| m == mode).expect("a mode");
        (
            index,
            if mode == Mode::Limit {
                0
            } else {
                ignored_ports
            },
        )
    }

    /// A pod [`Self::pod`] already created.
    fn existing_pod(&self, mode: Mode, ignored_ports: usize) -> &ModePod {
        &self.pods[&Self::key(mode, ignored_ports)]
    }

    fn pod(&mut self, mode: Mode, ignored_ports: usize) -> anyhow::Result<&ModePod> {
        let key = Self::key(mode, ignored_ports);
        if !self.pods.contains_key(&key) {
            let pod = self.create_pod(mode, key.1)?;
            self.pods.insert(key, pod);
        }
        Ok(&self.pods[&key])
    }

    fn create_pod(&self, mode: Mode, ignored_ports: usize) -> anyhow::Result<ModePod> {
        let slug = match mode {
            Mode::Limit => "limit",
            Mode::Ebpf => "ebpf",
            Mode::IptablesLegacy => "legacy",
            Mode::IptablesNft => "nft",
        };
        let pod = PodFixture::new(&format!("bench-{slug}-{ignored_ports}"));
        let mut flags: Vec<String> = PROXY_FLAGS.map(String::from).to_vec();
        flags.extend(ignore_flags(ignored_ports));
        let iptables = |mode| -> anyhow::Result<Interception> {
            let config = InterceptionConfig::from_proxy_init_args(&flags)
                .context("the bench's proxy flags")?;
            Ok(Interception::Iptables {
                _chains: Iptables(mode).attach(&pod, &config),
            })
        };
        let interception = match mode {
            Mode::Limit => Interception::None,
            Mode::Ebpf => {
                let instance = pod.pod.name.clone();
                let mut args = meshed::run_args(&pod, &instance);
                args.extend(["--mode", "ebpf", "--log-level", "warn"].map(String::from));
                args.extend(flags.iter().cloned());
                Interception::Ebpf(Meshed::start(
                    &self.interceptor,
                    &instance,
                    &args,
                    Stdio::inherit(),
                ))
            }
            Mode::IptablesLegacy => iptables(IptablesMode::Legacy)?,
            Mode::IptablesNft => iptables(IptablesMode::Nft)?,
        };
        Ok(ModePod { interception, pod })
    }

    fn measure(&mut self, case: &Case, mode: Mode, seconds: f64) -> anyhow::Result<load::Sample> {
        self.pod(mode, case.ignored_ports)?;
        let pod = &self.existing_pod(mode, case.ignored_ports).pod;
        load::measure(
            &self.connload,
            pod,
            &self.client_cgroup.path,
            case,
            mode,
            seconds,
        )
    }
}

/// `n` ports in both ignore lists: even ports from 10000, so none can merge into a range (one
/// iptables rule per 15 of them, as proxy-init writes).
fn ignore_flags(n: usize) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    let ports = (0..n)
        .map(|i| (10_000 + 2 * i).to_string())
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "--outbound-ports-to-ignore".into(),
        ports.clone(),
        "--inbound-ports-to-ignore".into(),
        ports,
    ]
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

const DIRECTIONS: [Direction; 2] = [Direction::Outbound, Direction::Inbound];
const IGNORED_PORTS: [usize; 4] = [1, 15, 200, 3000];
const POD_COUNTS: [usize; 3] = [1, 100, 1000];

fn run(args: &Args) -> anyhow::Result<()> {
    // Ctrl-C reaches the children too (same process group); surviving it turns their deaths into
    // an error, so the pods are removed by Drop instead of being left behind.
    extern "C" fn ignore(_: libc::c_int) {}
    // SAFETY: the handler does nothing; a handler (unlike SIG_IGN) is reset for exec'd children.
    unsafe { libc::signal(libc::SIGINT, ignore as *const () as libc::sighandler_t) };

    let seconds = args.seconds;
    let repetitions = args.repetitions.unwrap_or(if args.quick { 5 } else { 7 }) as usize;
    let out_dir = match &args.out {
        Some(dir) => dir.clone(),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ sits inside the workspace root")
            .join("target/bench")
            .join(utc_stamp("%Y%m%d-%H%M%S")?),
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;

    let mut lab = Lab::new();
    let mut md = header(args, repetitions, seconds)?;
    println!("{md}");

    // The comparison matrix.
    let matrix: Vec<Case> = if args.pods_only {
        Vec::new()
    } else if args.quick {
        DIRECTIONS.map(|d| base_case(d, args.family)).to_vec()
    } else {
        let mut cases = Vec::new();
        for direction in DIRECTIONS {
            for close in [Close::Rst, Close::Fin] {
                for workers in [1, 2] {
                    for pinned in [true, false] {
                        cases.push(Case {
                            workers,
                            pinned,
                            close,
                            ..base_case(direction, args.family)
                        });
                    }
                }
            }
        }
        cases
    };
    // FIN cases after the RST ones and the sweeps: the TIME_WAIT sockets and conntrack entries
    // they leave behind for a minute would slow whatever runs after them.
    let (rst, fin): (Vec<Case>, Vec<Case>) = matrix.iter().partition(|c| c.close == Close::Rst);
    // The two cases the targets are about get three times the repetitions: their medians are
    // the headline, and a single run here varies by several percent.
    let mut matrix_results = rst
        .iter()
        .map(|case| {
            let headline = *case == base_case(case.direction, case.family);
            run_case(
                &mut lab,
                case,
                repetitions * if headline { 3 } else { 1 },
                seconds,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    // Ignored ports.
    let sweep: Vec<Case> = if args.pods_only {
        Vec::new()
    } else if args.quick {
        vec![Case {
            ignored_ports: 3000,
            ..base_case(Direction::Outbound, args.family)
        }]
    } else {
        DIRECTIONS
            .iter()
            .flat_map(|&d| {
                IGNORED_PORTS.iter().map(move |&n| Case {
                    ignored_ports: n,
                    ..base_case(d, args.family)
                })
            })
            .collect()
    };
    let sweep_results = sweep
        .iter()
        .map(|case| run_case(&mut lab, case, repetitions, seconds))
        .collect::<anyhow::Result<Vec<_>>>()?;

    // Sockets outside meshed pods, in the cgroup the eBPF pod's programs are attached to.
    let outside_results = if args.pods_only {
        Vec::new()
    } else {
        let attached = lab.pod(Mode::Ebpf, 0)?.pod.cgroup.path.clone();
        outside::run(
            &lab.connload,
            &attached,
            &lab.client_cgroup.path,
            repetitions,
            seconds,
            |line| println!("{line}"),
        )?
    };

    for case in &fin {
        matrix_results.push(run_case(&mut lab, case, repetitions, seconds)?);
    }

    // Where the eBPF time goes, before the pod sweep (see there).
    let mut costs_md = String::new();
    if !args.pods_only {
        costs_md.push_str("\n## Where the eBPF time goes\n\nA separate run with the kernel's per-program statistics on (`kernel.bpf_stats_enabled`; they slow every program run, so these runs are not in the tables).\n\n| case | program | ns/run | runs/conn | µs/conn |\n|---|---|---:|---:|---:|\n");
        for direction in DIRECTIONS {
            let case = base_case(direction, args.family);
            let Interception::Ebpf(meshed) = &lab.pod(Mode::Ebpf, 0)?.interception else {
                unreachable!("the eBPF pod is meshed by interceptor run");
            };
            let pid = meshed.child.id();
            let costs = progstats::program_costs(pid, || {
                Ok(lab.measure(&case, Mode::Ebpf, seconds.max(1.0))?.conns)
            })?;
            let total: f64 = costs.iter().map(progstats::ProgramCost::us_per_conn).sum();
            for cost in &costs {
                let _ = writeln!(
                    costs_md,
                    "| {case} | {} | {:.0} | {:.2} | {:.2} |",
                    cost.name,
                    cost.ns_per_run,
                    cost.runs_per_conn,
                    cost.us_per_conn()
                );
            }
            let _ = writeln!(costs_md, "| {case} | **total** | | | **{total:.2}** |");
        }
    }

    let program_costs_md = costs_md;
    // Registered pods last: the agent's 1,000 namespaces are deleted at its end, and the kernel
    // takes a while to clean them up, which would slow whatever runs next.
    let pods = if args.quick {
        None
    } else {
        let cases = DIRECTIONS.map(|d| base_case(d, args.family));
        lab.pod(Mode::Limit, 0)?;
        Some(agent_sweep::run(
            &lab.interceptor,
            &lab.connload,
            &lab.existing_pod(Mode::Limit, 0).pod,
            &lab.client_cgroup.path,
            &cases,
            &POD_COUNTS,
            repetitions,
            seconds,
            |line| println!("{line}"),
        )?)
    };

    if !matrix_results.is_empty() {
        let refs: Vec<&CaseResult> = matrix_results.iter().collect();
        report::ratio_chart(
            &out_dir.join("per-connection.svg"),
            "Connection rate, interception vs none",
            &refs,
        )?;
        let _ = write!(
            md,
            "\n## Per-connection cost\n\nThe modes of a case take turns in 20 ms slices, grouped into {repetitions} repetitions of {seconds} s per mode ({} for the first case of each direction, the targets' cases); \"vs limit\" is the connection rate over the rate with no interception in the same repetition (median, and min-max over repetitions); +µs/conn is the wall-clock time one connection takes more.\n\n{}\n![per-connection](per-connection.svg)\n",
            repetitions * 3,
            report::table(&refs)
        );
    }
    if !sweep_results.is_empty() {
        let refs: Vec<&CaseResult> = sweep_results.iter().collect();
        let mut lines = Vec::new();
        for direction in DIRECTIONS {
            for &mode in &MODES[1..] {
                let points: Vec<(f64, Spread)> = sweep_results
                    .iter()
                    .filter(|r| r.case.direction == direction)
                    .filter_map(|r| Some((r.case.ignored_ports as f64, r.summary(mode)?.ratio)))
                    .collect();
                if points.len() > 1 {
                    lines.push((mode, format!("{} {direction:?}", mode.name()), points));
                }
            }
        }
        if !lines.is_empty() {
            report::sweep_chart(
                &out_dir.join("ignored-ports.svg"),
                "Connection rate as ignored ports grow",
                "ports in each ignore list",
                &lines,
            )?;
        }
        let _ = write!(
            md,
            "\n## Ignored ports\n\nThe same ports in both ignore lists; the connections go to a port that is not ignored, so every rule is passed.\n\n{}{}",
            report::table(&refs),
            if lines.is_empty() {
                ""
            } else {
                "\n![ignored ports](ignored-ports.svg)\n"
            }
        );
    }
    if !outside_results.is_empty() {
        md.push_str(&outside::section(&outside_results));
    }
    if let Some(sweep) = &pods {
        md.push_str(&pods_section(sweep, &out_dir)?);
    }

    // Where the eBPF time goes.
    md.push_str(&program_costs_md);

    md.push_str(&targets_section(
        &matrix_results,
        &sweep_results,
        pods.as_ref(),
    ));
    fs::write(out_dir.join("results.md"), &md)?;
    println!("\n{md}\nwritten to {}", out_dir.display());
    Ok(())
}

/// Every mode interleaved in slices for `repetitions` × `seconds` each, grouped into
/// `repetitions` samples.
fn run_case(
    lab: &mut Lab,
    case: &Case,
    repetitions: usize,
    seconds: f64,
) -> anyhow::Result<CaseResult> {
    for mode in MODES {
        lab.pod(mode, case.ignored_ports)?;
    }
    let pods: Vec<(Mode, &PodFixture)> = MODES
        .iter()
        .map(|&mode| (mode, &lab.existing_pod(mode, case.ignored_ports).pod))
        .collect();
    let samples = load::measure_interleaved(
        &lab.connload,
        &pods,
        &lab.client_cgroup.path,
        case,
        repetitions as f64 * seconds * MODES.len() as f64,
        repetitions,
    )?;
    let result = CaseResult {
        case: *case,
        modes: MODES.to_vec(),
        samples,
    };
    let line = result
        .summaries()
        .iter()
        .skip(1)
        .map(|s| format!("{} {:.3}", s.mode.name(), s.ratio.median))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "{case}: {:.0} conn/s with no interception; {line}",
        result.summaries()[0].rate
    );
    Ok(result)
}

fn pods_section(sweep: &agent_sweep::PodsSweep, out_dir: &Path) -> anyhow::Result<String> {
    let mut md = String::from(
        "\n## Registered pods (node agent)\n\nOne agent (`interceptor daemon`), the measured pod registered first, empty pods added through the API up to each count; the limit and the agent's pod taking turns in 20 ms slices.\n\n| pods | case | eBPF vs limit (min-max) | +µs/conn | p99 vs limit | agent RSS MiB |\n|---:|---|---|---:|---:|---:|\n",
    );
    let mut lines: BTreeMap<String, Vec<(f64, Spread)>> = BTreeMap::new();
    for point in &sweep.points {
        for (case, limit, ebpf) in &point.cases {
            let result = CaseResult {
                case: *case,
                modes: vec![Mode::Limit, Mode::Ebpf],
                samples: vec![limit.clone(), ebpf.clone()],
            };
            let s = result.summary(Mode::Ebpf).expect("measured");
            let _ = writeln!(
                md,
                "| {} | {case} | **{:.3}** ({:.3}-{:.3}) | {:+.2} | {:.2}x | {:.1} |",
                point.pods,
                s.ratio.median,
                s.ratio.min,
                s.ratio.max,
                s.extra_us,
                s.p99_ratio,
                point.rss_mib
            );
            lines
                .entry(format!("eBPF {:?}", case.direction))
                .or_default()
                .push((point.pods as f64, s.ratio));
        }
    }
    let (round_trip, round_trip_p99) = agent_sweep::percentiles(&sweep.registration_ms);
    let (inside, inside_p99) = agent_sweep::percentiles(&sweep.agent_registration_ms);
    let _ = write!(
        md,
        "\nPod registration, {} pods one after another, request to interception in force: inside the agent (its log) p50 {:.2} ms, p99 {inside_p99:.2} ms, max {:.2} ms; round trip through the API from the bench (its JSON work included) p50 {:.2} ms, p99 {round_trip_p99:.2} ms, max {:.2} ms.\n\n![pods](pods.svg)\n",
        sweep.registration_ms.len(),
        inside.median,
        inside.max,
        round_trip.median,
        round_trip.max
    );
    let lines: Vec<_> = lines
        .into_iter()
        .map(|(label, points)| (Mode::Ebpf, label, points))
        .collect();
    report::sweep_chart(
        &out_dir.join("pods.svg"),
        "Connection rate as registered pods grow",
        "pods registered with the agent",
        &lines,
    )?;
    Ok(md)
}

/// The performance targets set for interception (rate and p99 against the limit, iptables
/// beaten, no conntrack, flat in ignored ports and registered pods, registration time, agent
/// memory), each with what this run measured.
fn targets_section(
    matrix: &[CaseResult],
    sweep: &[CaseResult],
    pods: Option<&agent_sweep::PodsSweep>,
) -> String {
    let mut md = String::from("\n## Targets\n\n| target | measured | met |\n|---|---|---|\n");
    let mut row = |target: &str, measured: String, met: bool| {
        let _ = writeln!(
            md,
            "| {target} | {measured} | {} |",
            if met { "yes" } else { "**no**" }
        );
    };
    let base = |direction| {
        matrix
            .iter()
            .find(|r| r.case == base_case(direction, r.case.family))
    };
    for (direction, goal) in [(Direction::Outbound, 0.95), (Direction::Inbound, 0.97)] {
        if let Some(s) = base(direction).and_then(|r| r.summary(Mode::Ebpf)) {
            row(
                &format!("eBPF {direction:?} >= {goal} of the limit"),
                format!("{:.3}", s.ratio.median),
                s.ratio.median >= goal,
            );
            row(
                &format!("eBPF {direction:?} p99 <= 1.10x the limit's"),
                format!("{:.2}x", s.p99_ratio),
                s.p99_ratio <= 1.10,
            );
        }
    }
    let all: Vec<&CaseResult> = matrix.iter().chain(sweep).collect();
    let behind: Vec<String> = all
        .iter()
        .filter(|r| {
            let e = r.summary(Mode::Ebpf).map_or(0.0, |s| s.ratio.median);
            [Mode::IptablesLegacy, Mode::IptablesNft]
                .iter()
                .any(|&m| r.summary(m).is_some_and(|s| s.ratio.median >= e))
        })
        .map(|r| r.case.to_string())
        .collect();
    row(
        "eBPF ahead of both iptables modes in every case",
        if behind.is_empty() {
            format!("{} of {} cases", all.len(), all.len())
        } else {
            format!("behind in: {}", behind.join("; "))
        },
        behind.is_empty(),
    );
    let conntrack = all
        .iter()
        .filter_map(|r| r.summary(Mode::Ebpf))
        .map(|s| s.conntrack)
        .max()
        .unwrap_or(0);
    row(
        "eBPF leaves 0 conntrack entries",
        conntrack.to_string(),
        conntrack == 0,
    );
    for direction in DIRECTIONS {
        let ratio_at = |n: usize| {
            sweep
                .iter()
                .find(|r| r.case.direction == direction && r.case.ignored_ports == n)
                .and_then(|r| r.summary(Mode::Ebpf))
                .map(|s| s.ratio.median)
        };
        if let (Some(one), Some(many)) = (ratio_at(1), ratio_at(3000)) {
            let change = many / one - 1.0;
            row(
                &format!("eBPF {direction:?} flat within 3% from 1 to 3,000 ignored ports"),
                format!("{:+.1}%", change * 100.0),
                change.abs() <= 0.03,
            );
        }
    }
    if let Some(pods) = pods {
        for direction in DIRECTIONS {
            let ratio_at = |n: usize| {
                let point = pods.points.iter().find(|p| p.pods == n)?;
                let (_, limit, ebpf) = point.cases.iter().find(|c| c.0.direction == direction)?;
                let ratios: Vec<f64> = ebpf
                    .iter()
                    .zip(limit)
                    .map(|(e, l)| e.rate / l.rate)
                    .collect();
                Some(Spread::of(&ratios).median)
            };
            if let (Some(one), Some(many)) = (ratio_at(1), ratio_at(1000)) {
                let change = many / one - 1.0;
                row(
                    &format!("eBPF {direction:?} flat within 3% from 1 to 1,000 pods"),
                    format!("{:+.1}%", change * 100.0),
                    change.abs() <= 0.03,
                );
            }
        }
        let (_, inside_p99) = agent_sweep::percentiles(&pods.agent_registration_ms);
        let (_, round_trip_p99) = agent_sweep::percentiles(&pods.registration_ms);
        row(
            "pod registration p99 < 1 ms (inside the agent; round trip from the bench)",
            format!("{inside_p99:.2} ms ({round_trip_p99:.2} ms)"),
            inside_p99 < 1.0,
        );
        if let Some(last) = pods.points.last() {
            row(
                &format!("agent RSS < 30 MB at {} pods", last.pods),
                format!("{:.1} MiB", last.rss_mib),
                last.rss_mib * 1.048_576 < 30.0,
            );
        }
    }
    md
}

fn header(args: &Args, repetitions: usize, seconds: f64) -> anyhow::Result<String> {
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
        "# interceptor bench, {}\n\n- command: `cargo xtask {}`\n- machine: {} CPUs ({model}), Linux {}\n- settings: {} repetitions of {seconds} s per mode and case, {:?} sockets; `connload` connects, accepts, asks SO_ORIGINAL_DST (checked on every connection), echoes one byte and closes; pinned = load generator and proxy on CPU 0\n",
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
