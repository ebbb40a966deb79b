//! The node agent as the number of pods grows: the per-connection cost of one pod among 1, 100
//! and 1,000 registered (against the limit, interleaved), how long each registration takes
//! through the agent's API (what the CNI plugin waits for), the agent's memory, and its own CPU
//! time at rest (pods registered, nothing connecting).
use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use interceptor::config::InterceptionConfig;
use interceptor_tests::{
    PodFixture,
    agent_home::{Agent, AgentHome, PROXY_FLAGS},
    fixture::Namespaces,
};

use super::{
    load::{self, Case, Mode, Sample},
    report::Spread,
};

/// The agent's results at one pod count.
pub struct PodsPoint {
    pub pods: usize,
    /// Per case: (limit samples, eBPF samples), repetition by repetition.
    pub cases: Vec<(Case, Vec<Sample>, Vec<Sample>)>,
    /// The agent's resident memory, MiB.
    pub rss_mib: f64,
}

/// The agent at rest with some pods registered: nothing connects, no registration comes.
pub struct AtRest {
    pub pods: usize,
    /// The agent's user and system time over the window, as a share of one CPU, %.
    pub cpu_percent: f64,
    pub window: Duration,
    /// What one clock tick of CPU time, the unit of `/proc/PID/stat`, is over the window, %.
    pub tick_percent: f64,
    /// The agent's resident memory at the end of the window, MiB.
    pub rss_mib: f64,
}

pub struct PodsSweep {
    /// The flags the agent ran with beyond its places (state directory, bpffs, cgroup, mode,
    /// log level).
    pub agent_flags: Vec<&'static str>,
    pub points: Vec<PodsPoint>,
    /// At each count of pods asked for, ascending.
    pub at_rest: Vec<AtRest>,
    /// Every registration's round trip through the API, ms, in order, the bench's JSON work
    /// included.
    pub registration_ms: Vec<f64>,
    /// Every registration as the agent timed it (its `pod registered` log line: from the request
    /// read to interception in force), ms, in order.
    pub agent_registration_ms: Vec<f64>,
    /// Round trips of a request that does next to nothing ([`AgentHome::ask_nothing`]), ms,
    /// with every pod registered: the floor under the registrations' round trip.
    pub nothing_ms: Vec<f64>,
}

/// How many requests that do nothing measure the floor of a round trip.
const NOTHING_REQUESTS: usize = 1000;

/// (median and range, p99) of `values`.
pub fn percentiles(values: &[f64]) -> (Spread, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted[((sorted.len() as f64 * 0.99).ceil() as usize).clamp(1, sorted.len()) - 1];
    (Spread::of(&sorted), p99)
}

/// The registration times the agent logged in `log` (JSON lines), ms, in order.
fn logged_registrations_ms(log: &Path) -> anyhow::Result<Vec<f64>> {
    let log = fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["message"] == "pod registered")
        .filter_map(|entry| entry["micros"].as_f64())
        .map(|micros| micros / 1e3)
        .collect())
}

/// What the agent ran with: JSON lines for [`logged_registrations_ms`]; everything else at the
/// daemon's defaults (the safety sweep's round among them, as the test kit's agents too).
const AGENT_FLAGS: [&str; 2] = ["--log-format", "json"];

/// How long the agent is left alone before its CPU time is counted: the tail of a burst of
/// registrations (and the check it triggers) is not rest.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The agent's user and system time and its RSS over `window`, with `pods` registered.
fn at_rest(agent: &Agent, pods: usize, window: Duration) -> anyhow::Result<AtRest> {
    std::thread::sleep(SETTLE);
    let pid = agent.child.id();
    let (before, started) = (cpu_ticks(pid)?, Instant::now());
    std::thread::sleep(window);
    let (after, window) = (cpu_ticks(pid)?, started.elapsed());
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(AtRest {
        pods,
        cpu_percent: (after - before) as f64 / ticks_per_second / window.as_secs_f64() * 100.0,
        window,
        tick_percent: 100.0 / ticks_per_second / window.as_secs_f64(),
        rss_mib: agent.rss_kib() as f64 / 1024.0,
    })
}

/// utime + stime of process `pid` (all its threads, those gone included), in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The fields after the command name, which may hold spaces and parentheses: state is
    // field 3, utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("field {n} of {path}: {stat:?}"))
    };
    Ok(field(14)? + field(15)?)
}

/// Measures `cases` with the bench pod registered among `counts` pods, interleaved with the
/// limit pod, and the agent at rest for `rest_window` with each of `rest_counts` pods
/// registered (the bench pod first, then empty ones).
#[allow(
    clippy::too_many_arguments,
    reason = "the sweep's inputs, each set once by the bench's main"
)]
pub fn run(
    interceptor: &Path,
    connload: &Path,
    limit_pod: &PodFixture,
    client_cgroup: &Path,
    cases: &[Case],
    counts: &[usize],
    rest_counts: &[usize],
    rest_window: Duration,
    repetitions: usize,
    seconds: f64,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<PodsSweep> {
    let config = InterceptionConfig::from_proxy_init_args(&PROXY_FLAGS.map(String::from))
        .context("the bench's proxy flags")?;
    let pod = PodFixture::new("bench-agent");
    // Empty pods; deleted after the agent has stopped, so it does not remove them one by one.
    let mut fillers = Namespaces::new("bench-fill", 0);
    // Its state on a tmpfs, as a node's `/run/interceptor`: a pod record is a file created.
    let home = AgentHome::new(&pod.cgroup.path)
        .with_binary(interceptor.to_owned())
        .with_state_on_tmpfs();
    let log = home.log_path();
    // The periodic check at its default, as on a node.
    let agent = home.agent().args(&AGENT_FLAGS).log_to(&log).start();
    let mut registration_ms = Vec::new();
    let mut points = Vec::new();
    let mut rests = Vec::new();
    let mut all_counts: Vec<usize> = counts.iter().chain(rest_counts).copied().collect();
    all_counts.sort_unstable();
    all_counts.dedup();
    for count in all_counts {
        if count > 0 && registration_ms.is_empty() {
            registration_ms.push(ms(home.register(&pod.pod.path(), &config)));
        }
        let missing = count.saturating_sub(registration_ms.len());
        for netns in fillers.add(missing) {
            registration_ms.push(ms(home.register(&netns, &config)));
        }
        if rest_counts.contains(&count) {
            let rest = at_rest(&agent, count, rest_window)?;
            progress(&format!(
                "{count:>5} pods  at rest: agent {:.2} % of one CPU over {:.0} s, RSS {:.1} MiB",
                rest.cpu_percent,
                rest.window.as_secs_f64(),
                rest.rss_mib
            ));
            rests.push(rest);
        }
        if !counts.contains(&count) {
            continue;
        }
        let mut point = PodsPoint {
            pods: count,
            cases: Vec::new(),
            rss_mib: agent.rss_kib() as f64 / 1024.0,
        };
        for case in cases {
            let mut samples = load::measure_interleaved(
                connload,
                &[(Mode::Limit, limit_pod), (Mode::Ebpf, &pod)],
                client_cgroup,
                case,
                repetitions as f64 * seconds * 2.0,
                repetitions,
            )?;
            let (ebpf, limit) = (samples.pop().expect("two"), samples.pop().expect("two"));
            let ratio = Spread::of(
                &ebpf
                    .iter()
                    .zip(&limit)
                    .map(|(e, l)| e.rate / l.rate)
                    .collect::<Vec<_>>(),
            );
            progress(&format!(
                "{count:>5} pods  {case}: eBPF {:.3} of the limit ({:.3}-{:.3}), agent RSS {:.1} MiB",
                ratio.median, ratio.min, ratio.max, point.rss_mib
            ));
            point.cases.push((*case, limit, ebpf));
        }
        points.push(point);
    }
    let nothing_ms = (0..NOTHING_REQUESTS)
        .map(|_| ms(home.ask_nothing()))
        .collect();
    Ok(PodsSweep {
        agent_flags: AGENT_FLAGS.to_vec(),
        points,
        at_rest: rests,
        agent_registration_ms: logged_registrations_ms(&log)?,
        registration_ms,
        nothing_ms,
    })
}

fn ms(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
