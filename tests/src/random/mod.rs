//! The randomized behaviour table: seeded random proxy-init configurations ([`config`]), each
//! with random probes ([`probes`]) run on every backend in a pod of its own ([`pod`]), and
//! what each probe came to ([`outcome`]) compared with proxy-init's own rules: the commands of
//! the transcription of proxy-init (`crate::proxy_init`), run with iptables-legacy as proxy-init
//! runs them. Our iptables backend's nat table (legacy and nft) must also be the one proxy-init
//! leaves, rule for rule. `tests/tests/behaviour_random.rs` runs it.
//!
//! Everything of a configuration comes from its seed (the configuration, the pod's draws, then
//! its probes), so one seed reproduces one configuration alone.
pub mod config;
pub mod outcome;
pub mod pod;
pub mod probes;

use interceptor::{config::InterceptionConfig, iptables::IptablesMode};

use crate::{ebpf_backend::Following, iptables_backend::Iptables, proxy_init, scenario::Backend};
use outcome::Outcome;
use pod::{LATE_ROUTES, RandomPod};
use probes::{Place, RandomProbe};

/// Probes per configuration, from the pod and into it.
pub const OUTBOUND_PROBES: usize = 50;
pub const INBOUND_PROBES: usize = 30;

/// Probes of the second pod, when there is one.
pub const SECOND_OUTBOUND_PROBES: usize = 20;
pub const SECOND_INBOUND_PROBES: usize = 10;

/// A configuration, its pod and its probes, drawn from one seed.
pub struct Drawn {
    pub seed: u64,
    /// proxy-init's flags, as a user gives them to it (or to `interceptor run`).
    pub args: Vec<String>,
    /// What we read from them.
    pub config: InterceptionConfig,
    /// Whether the proxy listens on its inbound port: without it, what is steered inbound must
    /// fail on every backend (fail closed).
    pub inbound_listening: bool,
    /// Now and then a second pod on the node, meshed with another configuration (its flags and
    /// ours): same addresses, another namespace, the same cgroup; neither pod's configuration
    /// may apply to the other's connections.
    pub second: Option<(Vec<String>, InterceptionConfig)>,
    pub probes: Vec<RandomProbe>,
    /// Now and then the (first) pod has a user namespace of its own (`hostUsers: false`): its
    /// processes, the probes' ids and the configuration's are the pod's, and proxy-init's rules
    /// are written as its `linkerd-init` would write them, from inside it.
    pub own_users: bool,
}

impl Drawn {
    pub fn new(seed: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (args, config) = config::draw(&mut rng);
        let inbound_listening = rng.u8(..8) != 0;
        let second = (rng.u8(..3) == 0).then(|| config::draw(&mut rng));
        let other = second.as_ref().map(|(_, c)| c);
        let mut probes = probes::outbound(&mut rng, Place::Pod, &config, other, OUTBOUND_PROBES);
        probes.extend(probes::inbound(
            &mut rng,
            Place::Remote,
            &config,
            other,
            INBOUND_PROBES,
        ));
        if let Some((_, second)) = &second {
            probes.extend(probes::outbound(
                &mut rng,
                Place::SecondPod,
                second,
                Some(&config),
                SECOND_OUTBOUND_PROBES,
            ));
            probes.extend(probes::inbound(
                &mut rng,
                Place::SecondRemote,
                second,
                Some(&config),
                SECOND_INBOUND_PROBES,
            ));
        }
        // Drawn last, so the draws above are those a seed gave before it existed.
        let own_users = rng.u8(..4) == 0;
        Self {
            seed,
            args,
            config,
            inbound_listening,
            second,
            probes,
            own_users,
        }
    }

    /// The configuration as proxy-init's flags, and what of the pod was drawn.
    pub fn flags(&self) -> String {
        let mut flags = self.args.join(" ");
        if !self.inbound_listening {
            flags.push_str(" (the proxy's inbound port not listening)");
        }
        if self.own_users {
            flags.push_str(" (the pod in a user namespace of its own)");
        }
        if let Some((args, _)) = &self.second {
            flags.push_str(&format!("; a second pod: {}", args.join(" ")));
        }
        flags
    }
}

/// The backends, the reference (proxy-init's own rules) first.
pub const BACKENDS: [&str; 4] = ["proxy-init", "iptables-legacy", "iptables-nft", "ebpf"];

/// What a backend holds in force in its pods while the probes run.
enum Attached {
    ProxyInit,
    /// Removed when dropped.
    Ours {
        _installed: Vec<Box<dyn std::any::Any>>,
    },
    Ebpf(Following),
}

/// A backend on every pod of the node: each pod with its flags and configuration.
fn attach(name: &str, pods: &[(&RandomPod, &[String], &InterceptionConfig)]) -> Attached {
    let ours = |mode| Attached::Ours {
        _installed: pods
            .iter()
            .map(|(pod, _, config)| Iptables(mode).attach(&pod.fixture, config))
            .collect(),
    };
    match name {
        "proxy-init" => {
            for (pod, args, _) in pods {
                // `-w` as linkerd-cni's `use-wait-flag`: the legacy lock is the machine's, and
                // other tests take it meanwhile.
                let mut args = args.to_vec();
                args.push("--use-wait-flag".into());
                proxy_init::configure(&pod.fixture.pod.path(), &args)
                    .unwrap_or_else(|e| panic!("proxy-init's rules: {e}"));
            }
            Attached::ProxyInit
        }
        "iptables-legacy" => ours(IptablesMode::Legacy),
        "iptables-nft" => ours(IptablesMode::Nft),
        "ebpf" => {
            let pods: Vec<_> = pods
                .iter()
                .map(|(pod, _, config)| (&pod.fixture, *config))
                .collect();
            Attached::Ebpf(Following::attach(&pods))
        }
        _ => unreachable!("no backend {name}"),
    }
}

/// What one backend made of a configuration.
pub struct Run {
    /// What each probe came to, in order.
    pub outcomes: Vec<Outcome>,
    /// The pod's nat tables (`iptables-save -t nat`, then ip6tables' with `--ipv6`) once the
    /// backend wrote them, normalized ([`proxy_init::normalized_save`]); none for eBPF.
    pub nat: Option<String>,
}

/// Every probe of `drawn` on one backend, in fresh pods.
pub fn run_on(name: &str, drawn: &Drawn) -> Run {
    let first = RandomPod::new(&drawn.config, drawn.inbound_listening, drawn.own_users);
    let second = drawn
        .second
        .as_ref()
        .map(|(args, config)| (RandomPod::next_to(&first, config), args, config));
    let mut pods = vec![(&first, &drawn.args[..], &drawn.config)];
    pods.extend(
        second
            .iter()
            .map(|(pod, args, config)| (pod, &args[..], *config)),
    );
    let attached = attach(name, &pods);
    let nat = nat_tables(name, &pods);
    for (pod, _, _) in &pods {
        pod.add_late_route();
    }
    if let Attached::Ebpf(following) = &attached {
        let late: Vec<ipnet::IpNet> = LATE_ROUTES
            .iter()
            .map(|r| r.parse().expect("a CIDR"))
            .collect();
        crate::eventually(
            "the eBPF backend learns the local routes added after the pods were meshed",
            std::time::Duration::from_secs(30),
            || {
                (0..pods.len()).all(|i| {
                    let routes = following.local_routes(i);
                    late.iter().all(|r| routes.contains(r))
                })
            },
        );
    }
    let batch = |place: Place| {
        let lines: String = drawn
            .probes
            .iter()
            .filter(|p| p.place == place)
            .map(|p| format!("{}\n", p.line))
            .collect();
        if lines.is_empty() {
            return Vec::new().into_iter();
        }
        let fixture = match place {
            Place::Pod | Place::Remote => &first.fixture,
            Place::SecondPod | Place::SecondRemote => {
                &second
                    .as_ref()
                    .expect("probes of a second pod, which was drawn")
                    .0
                    .fixture
            }
        };
        let process = match place {
            Place::Pod | Place::SecondPod => fixture.in_pod(),
            Place::Remote | Place::SecondRemote => fixture.on_remote(),
        };
        let out = process.run_with_input(&["probes"], &lines);
        assert_eq!(
            out.len(),
            lines.lines().count(),
            "netprobe probes: one line per probe"
        );
        out.into_iter()
    };
    let mut results: Vec<(Place, std::vec::IntoIter<String>)> = Place::ALL
        .iter()
        .map(|place| (*place, batch(*place)))
        .collect();
    let outcomes = drawn
        .probes
        .iter()
        .map(|p| {
            let (_, from) = results
                .iter_mut()
                .find(|(place, _)| *place == p.place)
                .expect("every place");
            Outcome::parse(&from.next().expect("a line per probe"))
        })
        .collect();
    drop(attached);
    Run { outcomes, nat }
}

/// Each pod's nat tables, one pod after the other.
fn nat_tables(name: &str, pods: &[(&RandomPod, &[String], &InterceptionConfig)]) -> Option<String> {
    let saves = match name {
        "proxy-init" | "iptables-legacy" => ["iptables-legacy-save", "ip6tables-legacy-save"],
        "iptables-nft" => ["iptables-nft-save", "ip6tables-nft-save"],
        _ => return None,
    };
    let mut tables = String::new();
    for (i, (pod, _, config)) in pods.iter().enumerate() {
        let netns = pod.fixture.pod.path();
        let families = if config.ipv6 { &saves[..] } else { &saves[..1] };
        tables.push_str(&format!("# pod {}\n", i + 1));
        for save in families {
            tables.push_str(&proxy_init::normalized_save(&proxy_init::save_nat(
                &netns, save,
            )));
        }
    }
    Some(tables)
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
    let results: Vec<(&str, std::thread::Result<Run>)> = std::thread::scope(|scope| {
        let runs: Vec<_> = BACKENDS
            .iter()
            .map(|name| (*name, scope.spawn(move || run_on(name, drawn))))
            .collect();
        runs.into_iter().map(|(n, run)| (n, run.join())).collect()
    });
    let mut reports = Vec::new();
    let mut outcomes = Vec::new();
    let mut tables = Vec::new();
    for (name, result) in results {
        match result {
            Ok(run) => {
                outcomes.push((name, run.outcomes));
                tables.push((name, run.nat));
            }
            Err(panic) => reports.push(format!(
                "{name} could not run the configuration: {}",
                panic_message(&*panic)
            )),
        }
    }
    if !reports.is_empty() {
        return reports;
    }
    // Our chains, on either iptables, are proxy-init's, rule for rule.
    let (_, proxy_init_nat) = &tables[0];
    for (name, nat) in &tables[1..] {
        if nat.is_some() && nat != proxy_init_nat {
            reports.push(format!(
                "{name}'s nat table is not the one proxy-init's rules leave:\n--- proxy-init\n{}--- {name}\n{}",
                proxy_init_nat.as_deref().unwrap_or_default(),
                nat.as_deref().unwrap_or_default()
            ));
        }
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
