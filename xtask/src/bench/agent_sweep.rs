//! The node agent as the number of pods grows: the per-connection cost of one pod among 1, 100
//! and 1,000 registered (against the limit, interleaved), how long each registration takes
//! through the agent's API (what the CNI plugin waits for), and the agent's memory.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use interceptor_api::{PodAdd, PodMeta, Request};

use super::{
    load::{self, Case, Mode, Sample},
    report::Spread,
};
use crate::{
    cmd,
    sandbox::{Binaries, PROXY_ARGS, Pod},
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
    /// Every registration's round trip through the API, ms, in order. The bench is a debug
    /// build: its JSON work is part of this.
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

/// An agent of the bench's own (state directory, bpffs directory, the pod's cgroup), stopped and
/// uninstalled when dropped, with the filler namespaces it was given.
struct BenchAgent {
    interceptor: PathBuf,
    location: Vec<String>,
    /// The agent's log (JSON lines), for its own registration times.
    log: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    fillers: Vec<String>,
}

impl BenchAgent {
    fn start(interceptor: &Path, cgroup: &Path) -> anyhow::Result<Self> {
        let name = format!("interceptor-bench-agent-{}", std::process::id());
        let state_dir = std::env::temp_dir().join(&name);
        let bpffs = Path::new("/sys/fs/bpf").join(&name);
        let location = vec![
            "--state-dir".to_owned(),
            state_dir.display().to_string(),
            "--bpffs".to_owned(),
            bpffs.display().to_string(),
        ];
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let child = Command::new(interceptor)
            .arg("daemon")
            .args(&location)
            .arg("--cgroup")
            .arg(cgroup)
            .args(["--log-level", "info", "--log-format", "json"])
            .stdin(Stdio::null())
            .stderr(fs::File::create(&log).context("creating the agent's log")?)
            .spawn()
            .context("starting interceptor daemon")?;
        let mut agent = Self {
            interceptor: interceptor.to_owned(),
            location,
            log,
            socket: state_dir.join("agent.sock"),
            child: Some(child),
            fillers: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !interceptor_api::agent_running(&agent.socket) {
            if let Some(status) = agent.child.as_mut().expect("started").try_wait()? {
                bail!("interceptor daemon exited early ({status})");
            }
            ensure!(
                Instant::now() < deadline,
                "interceptor daemon did not answer in 30 s"
            );
            sleep(Duration::from_millis(50));
        }
        Ok(agent)
    }

    /// Registers the pod in `netns` with the bench's proxy flags; returns the round trip, ms.
    fn add(&self, netns: &Path) -> anyhow::Result<f64> {
        let request = Request::Add(PodAdd {
            netns: netns.to_owned(),
            meta: PodMeta::default(),
            config: Some(
                interceptor_api::InterceptionConfig::from_proxy_init_args(
                    &PROXY_ARGS.iter().map(|&a| a.to_owned()).collect::<Vec<_>>(),
                )
                .context("the bench's proxy flags")?,
            ),
            args: Vec::new(),
            update: false,
            takeover_iptables: false,
        });
        let started = Instant::now();
        interceptor_api::call(&self.socket, &request)
            .with_context(|| format!("registering {}", netns.display()))?;
        Ok(started.elapsed().as_secs_f64() * 1e3)
    }

    /// Creates filler namespaces (empty pods) with one `ip -batch` and registers them.
    fn add_fillers(&mut self, count: usize, registration_ms: &mut Vec<f64>) -> anyhow::Result<()> {
        let names: Vec<String> = (self.fillers.len()..self.fillers.len() + count)
            .map(|i| format!("interceptor-bench-fill-{}-{i}", std::process::id()))
            .collect();
        ip_batch(&names, "add")?;
        self.fillers.extend(names.iter().cloned());
        for name in &names {
            registration_ms.push(self.add(&Path::new("/run/netns").join(name))?);
        }
        Ok(())
    }

    /// The registration times the agent logged, ms, in order.
    fn logged_registrations_ms(&self) -> anyhow::Result<Vec<f64>> {
        let log = fs::read_to_string(&self.log)
            .with_context(|| format!("reading {}", self.log.display()))?;
        Ok(log
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|entry| entry["message"] == "pod registered")
            .filter_map(|entry| entry["micros"].as_f64())
            .map(|micros| micros / 1e3)
            .collect())
    }

    fn rss_mib(&self) -> anyhow::Result<f64> {
        let pid = self.child.as_ref().context("agent stopped")?.id();
        let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS")?;
        Ok(kib / 1024.0)
    }
}

impl Drop for BenchAgent {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = crate::sandbox::stop(child);
        }
        let _ = Command::new(&self.interceptor)
            .arg("uninstall")
            .args(&self.location)
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .status();
        let _ = ip_batch(&self.fillers, "del");
        let _ = fs::remove_file(&self.log);
    }
}

/// `ip netns add|del` for many names in one process.
fn ip_batch(names: &[String], verb: &str) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let batch = std::env::temp_dir().join(format!("interceptor-bench-{}.ip", std::process::id()));
    fs::write(
        &batch,
        names
            .iter()
            .map(|n| format!("netns {verb} {n}\n"))
            .collect::<String>(),
    )?;
    let result = cmd::run(Command::new("ip").arg("-batch").arg(&batch));
    let _ = fs::remove_file(&batch);
    result
}

/// Measures `cases` with the bench pod registered among `counts` pods (ascending), interleaved
/// with the limit pod.
#[allow(clippy::too_many_arguments)]
pub fn run(
    binaries: &Binaries,
    limit_pod: &Pod,
    client_cgroup: &Path,
    cases: &[Case],
    counts: &[usize],
    repetitions: usize,
    seconds: f64,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<PodsSweep> {
    let pod = Pod::with_binaries(binaries, "bench-agent", None)?;
    let mut agent = BenchAgent::start(&binaries.interceptor, &pod.cgroup)?;
    let mut registration_ms = vec![agent.add(&pod.netns)?];
    let mut points = Vec::new();
    for &count in counts {
        let missing = count.saturating_sub(1 + agent.fillers.len());
        agent.add_fillers(missing, &mut registration_ms)?;
        let mut point = PodsPoint {
            pods: count,
            cases: Vec::new(),
            rss_mib: agent.rss_mib()?,
        };
        for case in cases {
            let mut samples = load::measure_interleaved(
                &binaries.connload,
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
        agent_registration_ms: agent.logged_registrations_ms()?,
        registration_ms,
    })
}
