//! The node agent as the number of pods grows: the per-connection cost of one pod among 1, 100
//! and 1,000 registered (against the limit, interleaved), how long each registration takes
//! through the agent's API (what the CNI plugin waits for), and the agent's memory.
use std::{fs, path::Path};

use anyhow::Context as _;
use interceptor::config::InterceptionConfig;
use interceptor_tests::{
    PodFixture,
    agent_home::{AgentHome, PROXY_FLAGS},
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

pub struct PodsSweep {
    pub points: Vec<PodsPoint>,
    /// Every registration's round trip through the API, ms, in order, the bench's JSON work
    /// included.
    pub registration_ms: Vec<f64>,
    /// Every registration as the agent timed it (its `pod registered` log line: from the request
    /// read to interception in force), ms, in order.
    pub agent_registration_ms: Vec<f64>,
}

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

/// Measures `cases` with the bench pod registered among `counts` pods (ascending), interleaved
/// with the limit pod.
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
    repetitions: usize,
    seconds: f64,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<PodsSweep> {
    let config = InterceptionConfig::from_proxy_init_args(&PROXY_FLAGS.map(String::from))
        .context("the bench's proxy flags")?;
    let pod = PodFixture::new("bench-agent");
    // Empty pods; deleted after the agent has stopped, so it does not remove them one by one.
    let mut fillers = Namespaces::new("bench-fill", 0);
    let home = AgentHome::new(&pod.cgroup.path).with_binary(interceptor.to_owned());
    let log = home.log_path();
    // The periodic check at its default, as on a node.
    let agent = home.start_logged(&log, &["--log-format", "json", "--reconcile-ms", "1000"]);
    let mut registration_ms = vec![ms(home.register(&pod.pod.path(), &config))];
    let mut points = Vec::new();
    for &count in counts {
        let missing = count.saturating_sub(1 + fillers.len());
        for netns in fillers.add(missing) {
            registration_ms.push(ms(home.register(&netns, &config)));
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
    Ok(PodsSweep {
        points,
        agent_registration_ms: logged_registrations_ms(&log)?,
        registration_ms,
    })
}

fn ms(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
