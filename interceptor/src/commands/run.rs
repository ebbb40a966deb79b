//! `interceptor run`: mesh one pod until SIGINT/SIGTERM.
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{debug, info, warn};

use crate::{
    cgroup,
    cli::{Mode, RunArgs},
    config::InterceptionConfig,
    ebpf::{EbpfPods, LoadOptions},
    iptables,
    netns::{Change, LocalChanges, PodNetns},
    node::Wanted,
    state::{InstanceLock, InstancePaths, InstanceState, PodState},
};

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.interception.config.clone();
    let backend = super::choose_backend(args.mode);
    match backend {
        Mode::Iptables => run_iptables(&config, &args),
        _ => run_ebpf(config, args).await,
    }
}

/// Writes proxy-init's chains and returns, as proxy-init does.
fn run_iptables(config: &InterceptionConfig, args: &RunArgs) -> anyhow::Result<()> {
    let options = iptables::IptablesOptions {
        mode: args.iptables.iptables_mode,
        wait: args.iptables.use_wait_flag,
        ipv6: config.ipv6,
        netns: Some(args.netns.clone()),
    };
    if args.simulate {
        println!("# simulate: nothing is changed");
        for command in iptables::simulate(config, &options)? {
            println!("{command}");
        }
        return Ok(());
    }
    // The kernel would refuse the owner match with a bare "Invalid argument".
    PodNetns::open(&args.netns)?.users()?.host_ids(config)?;
    let ran = iptables::install(config, &options)?;
    for command in &ran {
        debug!(%command, "ran");
    }
    info!(netns = %args.netns.display(), config = %config, commands = ran.len(), "iptables interception installed");
    Ok(())
}

async fn run_ebpf(config: InterceptionConfig, args: RunArgs) -> anyhow::Result<()> {
    if crate::agent::api::agent_running(&args.agent_socket) {
        return run_with_agent(config, args).await;
    }
    let cgroup = match args.cgroup {
        Some(path) => path,
        None => cgroup::cgroup2_root()?,
    };
    let paths = InstancePaths::new(&args.instance)?;
    if args.simulate {
        print_plan(&config, &args.netns, &cgroup, &paths);
        return Ok(());
    }

    // Registered before anything is set up: a SIGTERM while loading is then handled by the
    // detach below instead of killing the process with its state half-written.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let netns = PodNetns::open(&args.netns)?;
    // Listening before the first read: a change made after it is heard.
    let local_changes = netns.local_changes()?;
    let (cookie, local) = netns.cookie_and_local()?;
    // The proxy's ids as the programs compare them: the host's, for a pod with a user
    // namespace of its own.
    let host_ids = netns.users()?.host_ids(&config)?;
    cgroup::open_cgroup2(&cgroup)?;

    let lock = InstanceLock::acquire(paths)?;
    let options = LoadOptions {
        orig_dst_capacity: args.orig_dst_capacity,
        pin_dir: lock.generation_dir(),
        links_dir: lock.generation_dir(),
        persistent: false,
        max_pods: interceptor_common::MAX_PODS,
    };
    let mut pods: EbpfPods = EbpfPods::load(options).context("loading the eBPF programs")?;
    let wanted = Wanted {
        netns: &netns,
        config: &config,
        host_ids,
        local: &local,
    };
    pods.add(cookie, &args.netns, &wanted, ())
        .context("registering the pod")?;
    pods.attach(&cgroup)
        .with_context(|| format!("attaching to cgroup {}", cgroup.display()))?;
    let mut state = InstanceState {
        instance: lock.paths().name.clone(),
        pid: std::process::id(),
        pin_dir: lock.generation_dir(),
        backend: "ebpf".into(),
        cgroup: cgroup.clone(),
        started_at_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        programs: pods.backend().programs(),
        pods: vec![pod_state(&pods, cookie)],
    };
    // Our programs are attached: detach a dead run's before the state file says we run, so
    // whoever sees this run as running never also sees the dead run's programs in force.
    for stale in lock.take_over() {
        warn!(generation = %stale.display(), "took over from an earlier run of this instance that did not detach; its programs are detached now");
    }
    lock.write_state(&state)?;
    info!(
        netns = %args.netns.display(),
        netns_cookie = %cookie,
        cgroup = %cgroup.display(),
        instance = %lock.paths().name,
        %config,
        "interception active"
    );

    let mut changes = watch(local_changes, args.netns.clone());
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            Some(()) = changes.recv() => {
                let local = netns.local_destinations()?;
                if pods.get(cookie).is_some_and(|entry| entry.pod.local == local) {
                    continue;
                }
                info!(netns = %args.netns.display(), addresses = ?local.addresses, local_routes = ?local.routes, "pod addresses or local routes changed");
                pods.set_local(cookie, &local)?;
                state.pods = vec![pod_state(&pods, cookie)];
                lock.write_state(&state)?;
            }
        }
    }
    info!("detaching");
    pods.remove(cookie)?;
    drop(pods);
    drop(lock);
    info!("detached");
    Ok(())
}

/// A node agent runs: register the pod with it, and remove it on SIGINT/SIGTERM. The pod's
/// programs and maps are the agent's; the pod stays intercepted if this process is killed, until
/// its namespace goes away (a `/proc/PID/ns/net` path goes with its process).
async fn run_with_agent(config: InterceptionConfig, args: RunArgs) -> anyhow::Result<()> {
    use crate::agent::api::{self, PodAdd, PodMeta, Request};
    // The agent opens the path in its own context: name this process's namespace by pid.
    let netns = match args.netns.strip_prefix("/proc/self") {
        Ok(rest) => Path::new("/proc")
            .join(std::process::id().to_string())
            .join(rest),
        Err(_) => args.netns.clone(),
    };
    if args.simulate {
        println!("# simulate: nothing is changed");
        println!(
            "register pod {} ({config}) with the node agent at {}",
            netns.display(),
            args.agent_socket.display()
        );
        return Ok(());
    }
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let request = Request::Add(PodAdd {
        netns: netns.clone(),
        meta: PodMeta::default(),
        config: config.clone(),
        update: true,
        takeover_iptables: false,
    });
    api::call(&args.agent_socket, &request).context("registering the pod with the node agent")?;
    info!(netns = %netns.display(), agent = %args.agent_socket.display(), config = %config, "interception active (registered with the node agent)");
    tokio::select! {
        _ = sigint.recv() => {},
        _ = sigterm.recv() => {},
    }
    api::call(
        &args.agent_socket,
        &Request::Remove {
            netns: netns.clone(),
        },
    )
    .context("removing the pod from the node agent")?;
    info!(netns = %netns.display(), "pod removed from the node agent");
    Ok(())
}

/// Wakes the async loop, which reads the namespace again, on a change of what the pod delivers
/// over lo, or after changes were lost. A wake-up already pending stands for any number of
/// changes: a burst is read once, not once a change.
fn watch(mut changes: LocalChanges, netns: PathBuf) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(1);
    std::thread::spawn(move || {
        loop {
            match changes.wait() {
                Ok(Change::Local) => {}
                Ok(Change::Other) => continue,
                Ok(Change::Lost) => {
                    warn!(netns = %netns.display(), "route or address notifications were lost (a burst overflowed the socket's buffer): reading the namespace again");
                }
                Err(e) => {
                    warn!(netns = %netns.display(), error = %e, "reading the pod's route and address notifications failed: later changes of its addresses and local routes are not applied until this run is restarted");
                    return;
                }
            }
            if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                return;
            }
        }
    });
    rx
}

/// The pod's state for the instance's state file, from its table entry.
fn pod_state(pods: &EbpfPods, cookie: interceptor_common::NetnsCookie) -> PodState {
    let entry = pods.get(cookie).expect("run's pod is registered");
    PodState {
        sk_lookup: pods.inbound_program(cookie),
        netns: entry.pod.netns.clone(),
        netns_cookie: cookie,
        slot: entry.pod.written.slot(),
        addresses: entry
            .pod
            .local
            .addresses
            .iter()
            .map(IpAddr::to_string)
            .collect(),
        config: entry.pod.config.clone(),
    }
}

fn print_plan(config: &InterceptionConfig, netns: &Path, cgroup: &Path, paths: &InstancePaths) {
    println!("# simulate: nothing is changed");
    println!("load eBPF programs: cgroup/connect4, cgroup/connect6, sock_ops, cgroup/getsockopt");
    println!("pin their maps under {}", paths.pin_dir.display());
    println!("register pod {} ({config})", netns.display());
    println!("attach sk_lookup to network namespace {}", netns.display());
    println!("attach them to cgroup {}", cgroup.display());
}
