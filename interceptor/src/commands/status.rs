//! `interceptor status`: what is attached, which pods, their counters. Reads the state files and
//! the pinned maps, so it works from any process.
use aya::maps::{HashMap, Map, MapData, PerCpuArray, SockHash};
use interceptor_common::NetnsCookie;
use interceptor_common::{
    ListenerKey, PendingKey, PendingSlot, PodCounters, addr::family, counters::Decision, names,
};
use serde::Serialize;

use crate::{
    cli::StatusArgs,
    ebpf::read_counters,
    state::{InstancePaths, InstanceState},
};

#[derive(Serialize)]
struct InstanceReport {
    instance: String,
    running: bool,
    #[serde(flatten)]
    state: Option<InstanceState>,
    pending_orig_dst: Option<usize>,
    counters: Vec<PodCountersReport>,
}

#[derive(Serialize)]
struct PodCountersReport {
    netns_cookie: NetnsCookie,
    /// Whether the proxy's inbound listener is known to steering (else inbound is dropped).
    inbound_listener: bool,
    /// Which of its sockets: "IPv4", "IPv6" (a dual-stack `[::]` one also takes IPv4).
    inbound_listener_families: Vec<String>,
    counters: std::collections::BTreeMap<&'static str, u64>,
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    let instances = match &args.instance {
        Some(name) => vec![InstancePaths::new(name)?],
        None => InstancePaths::all(),
    };
    let reports: Vec<InstanceReport> = instances.iter().map(report).collect();
    // The node agent's pods, when one answers (its API is root-only, as status is in practice).
    let socket = args.agent_state_dir.join("agent.sock");
    let agent = crate::agent::api::call(&socket, &crate::agent::api::Request::List).ok();
    let health = agent
        .as_ref()
        .map(|_| crate::agent::api::health(&socket).map_err(|e| e.to_string()));
    // What the kernel runs at each hook, from the agent's pinned links: there with or without
    // a running agent.
    let agent_programs = crate::ebpf::pinned_programs(&args.agent_bpffs);
    if args.json {
        let agent = agent.map(|pods| {
            serde_json::json!({
                "socket": socket,
                "pods": pods,
                "programs": agent_programs,
                "problems": match &health {
                    Some(Ok(health)) => health.problems.clone(),
                    Some(Err(e)) => vec![format!("asking the agent: {e}")],
                    None => Vec::new(),
                },
                "backend": health.as_ref().and_then(|h| h.as_ref().ok()).map(|h| h.backend),
                "notes": health.as_ref().and_then(|h| h.as_ref().ok()).map(|h| h.notes.clone()).unwrap_or_default(),
            })
        });
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "instances": reports, "agent": agent })
            )?
        );
        return Ok(());
    }
    if let Some(pods) = &agent {
        match &health {
            Some(Ok(health)) => println!(
                "node agent at {} (backend {}): {} pods",
                socket.display(),
                health.backend,
                pods.len()
            ),
            _ => println!("node agent at {}: {} pods", socket.display(), pods.len()),
        }
        match &health {
            Some(Ok(health)) if health.problems.is_empty() => {
                println!("  interception in force as configured");
            }
            Some(Ok(health)) => {
                println!("  DEGRADED: not in force as configured:");
                for problem in &health.problems {
                    println!("  - {problem}");
                }
            }
            Some(Err(e)) => println!("  health unknown: {e}"),
            None => {}
        }
        if let Some(Ok(health)) = &health {
            for note in &health.notes {
                println!("  note: {note}");
            }
        }
        for p in &agent_programs {
            print_program(p);
        }
        crate::commands::agent::print_pods(pods, false);
        for pod in pods {
            println!("  {}:", pod.netns.display());
            for (name, value) in pod.counters.iter().flatten() {
                println!("    {name:<34} {value}");
            }
        }
    }
    if reports.is_empty() && agent.is_none() {
        println!("no interceptor instance or agent is running");
    }
    for r in &reports {
        print_report(r);
    }
    Ok(())
}

fn report(paths: &InstancePaths) -> InstanceReport {
    let running = paths.is_running();
    let state = paths.read_state();
    // The maps are readable as long as they are pinned, also after the process died (its
    // programs then keep running on them).
    let open = |name: &str| -> Option<Map> {
        let pin_dir = &state.as_ref()?.pin_dir;
        Map::from_map_data(MapData::from_pin(pin_dir.join(name)).ok()?).ok()
    };
    let listeners: Vec<ListenerKey> = open(names::MAP_LISTENERS)
        .and_then(|m| SockHash::<MapData, ListenerKey>::try_from(m).ok())
        .map(|m| m.keys().filter_map(Result::ok).collect())
        .unwrap_or_default();
    let mut counters = Vec::new();
    if let (Some(state), Some(map)) = (&state, open(names::MAP_COUNTERS))
        && let Ok(array) = PerCpuArray::<MapData, PodCounters>::try_from(map)
    {
        for pod in &state.pods {
            if let Ok(c) = read_counters(&array, pod.slot) {
                counters.push(PodCountersReport {
                    netns_cookie: pod.netns_cookie,
                    inbound_listener: listeners
                        .iter()
                        .any(|k| k.netns_cookie == pod.netns_cookie.0),
                    inbound_listener_families: listener_families(&listeners, pod.netns_cookie),
                    counters: c.named().collect(),
                });
            }
        }
    }
    let pending_orig_dst = open(names::MAP_PENDING)
        .and_then(|m| HashMap::<MapData, PendingKey, PendingSlot>::try_from(m).ok())
        .map(|m| m.keys().filter(Result::is_ok).count());
    InstanceReport {
        instance: paths.name.clone(),
        running,
        state,
        pending_orig_dst,
        counters,
    }
}

/// The families the pod's proxy is known to listen with: "IPv4" (an `AF_INET` socket), "IPv6"
/// (an `AF_INET6` one, which also takes IPv4 when it is dual-stack).
fn listener_families(listeners: &[ListenerKey], netns_cookie: NetnsCookie) -> Vec<String> {
    [(family::IPV4, "IPv4"), (family::IPV6, "IPv6")]
        .into_iter()
        .filter(|(f, _)| {
            listeners
                .iter()
                .any(|k| k.netns_cookie == netns_cookie.0 && k.family == *f)
        })
        .map(|(_, name)| name.to_owned())
        .collect()
}

fn print_report(r: &InstanceReport) {
    let Some(state) = &r.state else {
        println!("instance {}: no state (not running)", r.instance);
        return;
    };
    let liveness = match (r.running, r.counters.is_empty()) {
        (true, _) => "running",
        (false, false) => {
            "NOT running: its programs stay attached and intercepting (fail closed) until this \
             instance runs again, which takes over, and stops"
        }
        (false, true) => "NOT running, nothing attached (stale state)",
    };
    println!(
        "instance {}: {} backend, pid {} {}, cgroup {}",
        r.instance,
        state.backend,
        state.pid,
        liveness,
        state.cgroup.display()
    );
    for p in &state.programs {
        print_program(p);
    }
    if let Some(pending) = r.pending_orig_dst {
        println!("  original destinations waiting for the proxy: {pending}");
    }
    for pod in &state.pods {
        // The configuration as the agent's log lines spell it (only what is set).
        println!(
            "  pod {} (netns cookie {}, addresses {}): {}",
            pod.netns.display(),
            pod.netns_cookie,
            pod.addresses.join(","),
            pod.config,
        );
        if let Some(counters) = r
            .counters
            .iter()
            .find(|x| x.netns_cookie == pod.netns_cookie)
        {
            let listener = if counters.inbound_listener {
                format!(
                    "listening on {} (inbound steered to it)",
                    counters.inbound_listener_families.join(" and ")
                )
            } else {
                "NOT listening (inbound to steered ports is refused)".into()
            };
            println!("    proxy inbound listener: {listener}");
            println!(
                "    native IPv6: {}",
                if pod.config.ipv6 {
                    "intercepted"
                } else {
                    "left alone (--ipv6=false; IPv4 on IPv6 sockets is intercepted)"
                }
            );
            if let Some(p) = &pod.sk_lookup {
                println!(
                    "    program {:<16} id {:<6} {} (this pod's namespace)",
                    p.name, p.id, p.attach_type
                );
            }
            for decision in Decision::ALL {
                let value = counters.counters.get(decision.name()).copied().unwrap_or(0);
                println!("    {:<34} {value}", decision.name());
            }
        }
    }
}

/// One program and its variant, with why that one where it is not the hook's first choice.
pub(crate) fn print_program(p: &crate::ebpf::ProgramState) {
    let variant = if p.variant.is_empty() {
        String::new()
    } else if p.reason.is_empty() {
        format!(" variant {}", p.variant)
    } else {
        format!(" variant {} ({})", p.variant, p.reason)
    };
    println!(
        "  program {:<16} id {:<6} {}{variant}",
        p.name, p.id, p.attach_type
    );
}
