//! `interceptor daemon`, `interceptor pod ...` and `interceptor uninstall`.
use std::{path::Path, time::Duration};

use anyhow::{Context as _, bail};

use crate::{
    agent::{
        self, AgentPaths, BackendChoice, IptablesSettings,
        api::{self, ClientError, PodAdd, PodInfo, PodMeta, Request},
    },
    cgroup,
    cli::{AgentLocationArgs, DaemonArgs, Mode, PodArgs, PodCommand},
};

pub async fn daemon(args: DaemonArgs) -> anyhow::Result<()> {
    crate::crash_points::arm();
    // Requests run on a few blocking threads: keep them from holding an arena each.
    interceptor_sys::limit_malloc_arenas(2);
    let startup_taint = startup_taint(&args)?;
    let repair = repair_options(&args)?;
    if args.daemonset.is_some() && !args.kubernetes && args.kubeconfig.is_none() {
        bail!("--daemonset needs the Kubernetes API: add --kubernetes (or --kubeconfig)");
    }
    let (backend, cgroup) = match super::choose_backend(args.mode) {
        Mode::Iptables => (
            BackendChoice::Iptables(IptablesSettings {
                mode: args.iptables.iptables_mode,
                wait: args.iptables.use_wait_flag,
            }),
            // Nothing is attached to a cgroup: proxy-init's chains live in each pod's namespace.
            args.cgroup.unwrap_or_default(),
        ),
        _ => {
            let cgroup = match (args.cgroup, args.kubepods_under) {
                (Some(path), _) => path,
                (None, Some(dir)) => {
                    let dir = cgroup::cgroup2_at(&dir)?;
                    let search = cgroup::find_kubepods(&dir);
                    let cgroup = search.attach_at(&dir);
                    tracing::info!(cgroup = %cgroup.display(), under = %dir.display(), reason = %search, "attaching to this cgroup");
                    cgroup
                }
                (None, None) => cgroup::cgroup2_root()?,
            };
            cgroup::open_cgroup2(&cgroup)?;
            (BackendChoice::Ebpf, cgroup)
        }
    };
    let options = agent::AgentOptions {
        backend,
        cgroup,
        orig_dst_capacity: args.orig_dst_capacity,
        reconcile_every: Duration::from_millis(args.reconcile_ms),
        metrics_addr: args.metrics_addr,
        cni_chain_report: args.cni_chain_report.clone(),
        startup_taint,
        map_layout: args.map_layout_version,
        max_pods: args.max_pods,
        kubernetes: (args.kubernetes || args.kubeconfig.is_some()).then(|| {
            agent::kube_pods::KubeOptions {
                kubeconfig: args.kubeconfig,
                node_name: args.node_name.filter(|n| !n.is_empty()),
            }
        }),
        repair,
        daemonset: args.daemonset,
    };
    agent::run(args.location.paths(), options).await
}

/// `--startup-taint`, which only an agent that reads the API as its node's can remove.
fn startup_taint(args: &DaemonArgs) -> anyhow::Result<Option<String>> {
    let Some(key) = &args.startup_taint else {
        return Ok(None);
    };
    if key.is_empty() {
        bail!("--startup-taint needs a taint key");
    }
    if !args.kubernetes && args.kubeconfig.is_none() {
        bail!(
            "--startup-taint {key} needs the Kubernetes API to remove the taint from this node's Node: add --kubernetes (or --kubeconfig)"
        );
    }
    if args.node_name.as_deref().is_none_or(str::is_empty) {
        bail!(
            "--startup-taint {key} needs this node's name (--node-name, or NODE_NAME from spec.nodeName)"
        );
    }
    Ok(Some(key.clone()))
}

/// The repair's options: its interval, the plugin's settings from `--linkerd` (checked here,
/// as the plugin checks them), and the kubelet's pod cgroup, found as `--kubepods-under` finds
/// it (else `--cgroup`, else under the cgroup2 mount). `None` for `--repair-interval 0`.
fn repair_options(args: &DaemonArgs) -> anyhow::Result<Option<agent::RepairOptions>> {
    let invalid =
        |reason: String| anyhow::anyhow!("--linkerd={:?} is not valid: {reason}", args.linkerd);
    let linkerd = serde_json::from_str(&args.linkerd)
        .map_err(|e| invalid(format!("not a JSON object: {e}")))?;
    let settings = crate::config::mesh::linkerd_settings(&linkerd).map_err(invalid)?;
    if args.repair_interval == 0 {
        return Ok(None);
    }
    let pods_cgroup = match (&args.kubepods_under, &args.cgroup) {
        (Some(dir), _) => {
            let dir = cgroup::cgroup2_at(dir)?;
            cgroup::find_kubepods(&dir).attach_at(&dir)
        }
        (None, Some(cgroup)) => cgroup.clone(),
        (None, None) => {
            // Without a cgroup2 mount (the iptables backend needs none), pods are not found:
            // each repair says where it looked.
            let root = cgroup::cgroup2_root().unwrap_or_else(|_| "/sys/fs/cgroup".into());
            cgroup::find_kubepods(&root).attach_at(&root)
        }
    };
    Ok(Some(agent::RepairOptions {
        interval: Duration::from_secs(args.repair_interval),
        settings,
        pods_cgroup,
    }))
}

pub fn pod(args: PodArgs) -> anyhow::Result<()> {
    let socket = args.location.paths().socket();
    match args.command {
        PodCommand::Add {
            netns,
            name,
            namespace,
            container_id,
            uid,
            update,
            takeover_iptables,
            config,
        } => {
            let request = Request::Add(PodAdd {
                netns,
                meta: PodMeta {
                    name,
                    namespace,
                    container_id,
                    uid,
                },
                // Parsed with the command line: a bad one never reaches the agent.
                config: config.config,
                update,
                takeover_iptables,
            });
            print_pods(&call(&socket, &request)?, false);
        }
        PodCommand::Remove { netns } => {
            call(&socket, &Request::Remove { netns })?;
        }
        PodCommand::List { json } => print_pods(&call(&socket, &Request::List)?, json),
        PodCommand::Get { netns, json } => {
            let pods = call(&socket, &Request::Get { netns })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pods.first())?);
            } else {
                print_pods(&pods, false);
                for pod in &pods {
                    for (name, value) in pod.counters.iter().flatten() {
                        println!("    {name:<34} {value}");
                    }
                }
            }
        }
    }
    Ok(())
}

fn call(socket: &Path, request: &Request) -> anyhow::Result<Vec<PodInfo>> {
    api::call(socket, request).map_err(|e| match e {
        ClientError::Refused { kind, message } => {
            anyhow::anyhow!("the agent refused ({kind:?}): {message}")
        }
        e => e.into(),
    })
}

pub fn print_pods(pods: &[PodInfo], json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(pods).unwrap_or_default());
        return;
    }
    for pod in pods {
        let name = match (&pod.meta.namespace, &pod.meta.name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.clone(),
            _ => "-".into(),
        };
        let name = match &pod.meta.uid {
            Some(uid) => format!("{name} (uid {uid})"),
            None => name,
        };
        // What the iptables backend does not have is not shown.
        let slot = pod.slot.map(|s| format!(" slot {s}")).unwrap_or_default();
        let listener = match pod.inbound_listener {
            Some(true) => " listener yes",
            Some(false) => " listener no",
            None => "",
        };
        println!(
            "{} {name} netns cookie {} backend {}{slot}{listener} addresses {}: {}",
            pod.netns.display(),
            pod.netns_cookie,
            pod.backend,
            pod.addresses.join(","),
            pod.args.join(" ")
        );
        if let Some(problem) = &pod.problem {
            println!("  problem: {problem}");
        }
    }
}

/// Removes the agent's pinned links (detaching its programs), maps, pod records and socket.
/// Refuses while an agent runs: it would keep the programs attached through its own handles.
pub fn uninstall(args: AgentLocationArgs) -> anyhow::Result<()> {
    let paths: AgentPaths = args.paths();
    if paths.agent_running() {
        bail!(
            "an agent is running (lock {} is held): stop it first, then uninstall",
            paths.state_dir.join("agent.lock").display()
        );
    }
    let removed = agent::uninstall(&paths).context("uninstalling")?;
    for path in &removed {
        println!("removed {}", path.display());
    }
    tracing::info!(removed = removed.len(), "agent uninstalled");
    Ok(())
}
