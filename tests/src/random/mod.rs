//! The randomized behaviour table: seeded random proxy-init configurations ([`config`]), each
//! with random probes ([`probes`]) run on every backend in a pod of its own ([`pod`]), and
//! what each probe came to ([`outcome`]) compared with iptables-legacy's, which is proxy-init's
//! own behaviour. `tests/tests/behaviour_random.rs` runs it.
//!
//! Everything of a configuration comes from its seed (the configuration, then its probes), so
//! one seed reproduces one configuration alone.
pub mod config;
pub mod outcome;
pub mod pod;
pub mod probes;

use interceptor::{config::InterceptionConfig, iptables::IptablesMode};

use crate::{ebpf_backend::Ebpf, iptables_backend::Iptables, scenario::Backend};
use outcome::Outcome;
use pod::RandomPod;
use probes::{Place, RandomProbe};

/// Probes per configuration, from the pod and into it.
pub const OUTBOUND_PROBES: usize = 50;
pub const INBOUND_PROBES: usize = 30;

/// A configuration and its probes, drawn from one seed.
pub struct Drawn {
    pub seed: u64,
    pub config: InterceptionConfig,
    pub probes: Vec<RandomProbe>,
}

impl Drawn {
    pub fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let config = config::draw(&mut rng);
        let mut probes = probes::outbound(&mut rng, &config, OUTBOUND_PROBES);
        probes.extend(probes::inbound(&mut rng, &config, INBOUND_PROBES));
        Self {
            seed,
            config,
            probes,
        }
    }

    /// The configuration as proxy-init's flags.
    pub fn flags(&self) -> String {
        self.config.to_args().join(" ")
    }
}

/// The backends, the reference (proxy-init's own) first.
pub const BACKENDS: [&str; 3] = ["iptables-legacy", "iptables-nft", "ebpf"];

fn backend(name: &str) -> Box<dyn Backend> {
    match name {
        "iptables-legacy" => Box::new(Iptables(IptablesMode::Legacy)),
        "iptables-nft" => Box::new(Iptables(IptablesMode::Nft)),
        "ebpf" => Box::new(Ebpf),
        _ => unreachable!("no backend {name}"),
    }
}

/// Every probe of `drawn` on one backend, in a fresh pod: what each came to, in order.
pub fn run_on(name: &str, drawn: &Drawn) -> Vec<Outcome> {
    let pod = RandomPod::new(&drawn.config);
    let _attached = backend(name).attach(&pod.fixture, &drawn.config);
    let batch = |place: Place| {
        let lines: String = drawn
            .probes
            .iter()
            .filter(|p| p.place == place)
            .map(|p| format!("{}\n", p.line))
            .collect();
        let process = match place {
            Place::Pod => pod.fixture.in_pod(),
            Place::Remote => pod.fixture.on_remote(),
        };
        let out = process.run_with_input(&["probes"], &lines);
        assert_eq!(
            out.len(),
            lines.lines().count(),
            "netprobe probes: one line per probe"
        );
        out.into_iter()
    };
    let (mut from_pod, mut from_remote) = (batch(Place::Pod), batch(Place::Remote));
    drawn
        .probes
        .iter()
        .map(|p| {
            let line = match p.place {
                Place::Pod => from_pod.next(),
                Place::Remote => from_remote.next(),
            };
            Outcome::parse(&line.expect("a line per probe"))
        })
        .collect()
}

/// What running one configuration on every backend found.
pub struct Compared {
    /// What disagrees with the reference, one report per probe; a backend that could not run
    /// the configuration at all is one report.
    pub reports: Vec<String>,
    /// Where the reference's probes landed, by kind (`proxy:outbound 12, server:pod 30, ...`),
    /// to show what a run covered.
    pub landings: String,
}

/// Runs `drawn` on every backend at once, each in its own pod and cgroup.
pub fn compare(drawn: &Drawn) -> Compared {
    let mut landings = String::new();
    let reports = disagreements(drawn, &mut landings);
    Compared { reports, landings }
}

fn disagreements(drawn: &Drawn, landings: &mut String) -> Vec<String> {
    let results: Vec<(&str, std::thread::Result<Vec<Outcome>>)> = std::thread::scope(|scope| {
        let runs: Vec<_> = BACKENDS
            .iter()
            .map(|name| (*name, scope.spawn(move || run_on(name, drawn))))
            .collect();
        runs.into_iter().map(|(n, run)| (n, run.join())).collect()
    });
    let mut reports = Vec::new();
    let mut outcomes = Vec::new();
    for (name, result) in results {
        match result {
            Ok(o) => outcomes.push((name, o)),
            Err(panic) => reports.push(format!(
                "{name} could not run the configuration: {}",
                panic_message(&*panic)
            )),
        }
    }
    if !reports.is_empty() {
        return reports;
    }
    let (reference, others) = outcomes.split_first().expect("backends");
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for o in &reference.1 {
        let kind = match o.landing.split(' ').next() {
            Some(error) if error.starts_with("error=") => "error",
            kind => kind.unwrap_or("?"),
        };
        *counts.entry(kind).or_default() += 1;
    }
    *landings = counts
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    // Every probe and what each backend made of it, to see what a seed covers.
    let verbose = std::env::var_os("INTERCEPTOR_RANDOM_VERBOSE").is_some();
    let task_ids = ebpf_tells_the_proxy_by_task_ids();
    let mut not_compared = 0;
    for (i, probe) in drawn.probes.iter().enumerate() {
        let expected = &reference.1[i];
        // Known to land otherwise under the `task IDs` variant (`interceptor kernel` says so):
        // eBPF's result is not compared, and the count is said.
        let skip_ebpf = task_ids.is_some() && probe.task_ids_differ;
        not_compared += usize::from(skip_ebpf);
        if verbose {
            let each: Vec<String> = outcomes
                .iter()
                .map(|(n, o)| format!("{n}: {}", o[i]))
                .collect();
            eprintln!(
                "seed {} probe {probe}\n    {}",
                drawn.seed,
                each.join("\n    ")
            );
        }
        if others
            .iter()
            .all(|(n, o)| o[i] == *expected || (skip_ebpf && *n == "ebpf"))
        {
            continue;
        }
        let mut report = format!("probe {probe}:");
        for (name, o) in &outcomes {
            let same = *name != reference.0 && o[i] == *expected;
            let what = if same {
                "the same".to_owned()
            } else {
                o[i].to_string()
            };
            report.push_str(&format!("\n      {name:<16} {what}"));
        }
        reports.push(report);
    }
    if task_ids.is_some() && not_compared > 0 {
        landings.push_str(&format!(
            "; {not_compared} not compared on eBPF: its `task IDs` connect programs tell the proxy by the task's real IDs, not the socket creator's (`interceptor kernel`)"
        ));
    }
    reports
}

/// How the connect programs this kernel runs differ from proxy-init's owner match, if they do
/// (the `task IDs` variant, chosen where the kernel has no BTF access to a socket's creator or
/// `INTERCEPTOR_KERNEL_FEATURES` takes it away).
fn ebpf_tells_the_proxy_by_task_ids() -> Option<&'static str> {
    use interceptor::ebpf::{features::KernelFeatures, variants};
    let chosen = variants::choose(KernelFeatures::get()).ok()?;
    chosen
        .iter()
        .find(|(hook, _, _)| *hook == variants::Hook::Connect4)
        .and_then(|(_, variant, _)| variant.differs)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".into())
}
