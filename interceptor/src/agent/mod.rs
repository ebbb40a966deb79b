//! The node agent (`interceptor daemon`): the node's programs attached once, with links pinned
//! at stable paths; pods registered and removed at run time through a Unix-socket API.
//!
//! The kernel holds the truth. Maps and links are pinned under `--bpffs` and outlive every agent
//! process: an agent that is killed leaves every pod intercepted, and the next one loads its
//! programs on the pinned maps, swaps them into the pinned links (`BPF_LINK_UPDATE`, no moment
//! without a program on a hook) and takes its pods back from the maps and the pod records
//! (`records`), keeping their slots and counters. Only `interceptor uninstall` detaches.
//!
//! Where the programs cannot load, the agent's backend is iptables instead (`--mode`, see
//! `pods`): each pod gets proxy-init's chains in its namespace, behind the same pod table, API,
//! records, restore and metrics.
pub use interceptor_api as api;
use interceptor_common::names;
mod capabilities;
mod events;
mod kube_node;
pub mod kube_pods;
mod metrics;
pub mod open_files;
mod pods;
mod reconcile;
mod records;
mod registration;
mod repair;
mod restore;
mod server;
mod teardown;
mod watch;

use std::{
    fs::{File, OpenOptions},
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use api::ErrorKind;
use nix::fcntl::{Flock, FlockArg};
use records::Records;
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
};
use tracing::{info, warn};

pub use crate::iptables::IptablesSettings;
pub use pods::BackendChoice;
pub use repair::RepairOptions;

use crate::{
    crash_points::crash_point,
    ebpf::{EbpfNode, LoadOptions},
};

/// Where the agent keeps its state.
#[derive(Clone, Debug)]
pub struct AgentPaths {
    /// Holds the API socket, the lock and the pod records.
    pub state_dir: PathBuf,
    /// On a bpffs: the pinned maps and links.
    pub bpffs: PathBuf,
}

pub const DEFAULT_STATE_DIR: &str = "/run/interceptor";
pub const DEFAULT_BPFFS: &str = "/sys/fs/bpf/interceptor";

impl AgentPaths {
    pub fn socket(&self) -> PathBuf {
        self.state_dir.join("agent.sock")
    }

    fn lock(&self) -> PathBuf {
        self.state_dir.join("agent.lock")
    }

    fn records(&self) -> PathBuf {
        self.state_dir.join("agent-pods")
    }

    /// Where the maps of one layout version are pinned (the links are pinned in `bpffs`).
    fn maps_dir(&self, layout: u32) -> PathBuf {
        self.bpffs.join(format!("maps-v{layout}"))
    }

    /// Every map directory in `bpffs`, whatever its layout version.
    fn all_maps_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.bpffs)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("maps-v"))
            .map(|e| e.path())
            .collect()
    }

    /// Takes the agent lock: one agent at a time. `wait` blocks until a running agent exits (a
    /// new agent started for an upgrade takes over as soon as the old one stops).
    fn lock_agent(&self, wait: bool) -> anyhow::Result<Option<Flock<File>>> {
        std::fs::create_dir_all(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.lock())
            .with_context(|| format!("opening {}", self.lock().display()))?;
        let arg = if wait {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockExclusiveNonblock
        };
        Ok(Flock::lock(file, arg).ok())
    }

    /// Whether an agent holds the lock.
    pub fn agent_running(&self) -> bool {
        self.lock().exists() && matches!(self.lock_agent(false), Ok(None))
    }
}

/// The agent as its tasks share it, split by what guards each part: the pod table and what is
/// kept beside it behind one lock ([`Agent`]); the Kubernetes facts (the node's pods, read
/// from the API, and those the repair gave up on) behind their own; the counters without one
/// (each is atomic). A registration takes the pod table's lock and nothing else; counting a
/// refusal or answering a pod's annotations never waits for one.
struct Shared {
    state: Mutex<Agent>,
    /// This node's pods in the Kubernetes API, when the agent was given access.
    kube: Option<Arc<kube_pods::KubePods>>,
    /// Pods Linkerd injected that the repair gave up on (reported, still failing), by UID.
    not_meshed: Mutex<std::collections::BTreeMap<String, api::node_status::PodProblem>>,
    metrics: metrics::AgentMetrics,
}

/// The agent's view: the node (programs and maps) with the table of its pods, their records on
/// disk, and the node's and Kubernetes' facts the agent reports.
struct Agent {
    /// The node's one table of the pods, with the agent's facts (see [`pods::AgentPods`]).
    pods: Box<dyn pods::AgentPods>,
    /// Written from the table after each change, read back at start-up.
    records: Records,
    /// What the last check of each pod's entries found wrong (see [`Agent::recheck`]):
    /// `/ready`, polled every few seconds, answers from it instead of reading every pod's
    /// entries and pins from the kernel.
    pod_problems: std::collections::BTreeMap<interceptor_common::NetnsCookie, String>,
    /// The installer's report of the CNI chain, when readiness goes by it (`--cni-chain-report`).
    chain_report: Option<PathBuf>,
    /// The node's problems as `/ready` last found them.
    last_node_problems: Option<Vec<String>>,
    /// Wakes the task that keeps the Node's status (nothing without one).
    status_changed: kube_node::StatusChanged,
    status_writes: kube_node::StatusWrites,
    /// Posts Kubernetes Events on pods, with an API client.
    events: Option<events::Events>,
    netns_watch: watch::Watch,
    /// Where the node's programs are attached (`--cgroup`).
    cgroup: PathBuf,
}

/// How the agent runs.
pub struct AgentOptions {
    /// eBPF, or proxy-init's chains in each pod's namespace.
    pub backend: BackendChoice,
    pub cgroup: PathBuf,
    pub orig_dst_capacity: u32,
    pub reconcile_every: Duration,
    /// Serve Prometheus metrics and `/ready` here.
    pub metrics_addr: Option<SocketAddr>,
    /// The CNI installer's report of the chain (`--cni-chain-report`): ready only while it says
    /// chained. `None`: the chain is not the agent's concern.
    pub cni_chain_report: Option<PathBuf>,
    /// The taint to remove from the Node once the agent can mesh pods (`--startup-taint`);
    /// needs `kubernetes` and a node name.
    pub startup_taint: Option<String>,
    /// Pods served at most (1 to `MAX_PODS`).
    pub max_pods: u32,
    /// The map layout version to pin under (`MAP_LAYOUT_VERSION`; another value only in the
    /// tests of the migration between layouts).
    pub map_layout: u32,
    /// Read pods from the Kubernetes API for the CNI plugin, when a runtime passes no
    /// annotations.
    pub kubernetes: Option<kube_pods::KubeOptions>,
    /// Repair pods started without the CNI plugin (`None`: never); needs `kubernetes`.
    pub repair: Option<RepairOptions>,
    /// The DaemonSet the agent runs in: on termination, its removal removes what the agent
    /// installed (see [`teardown`]); needs `kubernetes`.
    pub daemonset: Option<crate::kubernetes::DaemonSetRef>,
}

/// Why the API refused a request: its kind, which the plugin acts on (retry, give up, report),
/// and what to tell the user.
#[derive(Debug)]
struct Refusal {
    kind: ErrorKind,
    message: String,
}

impl Refusal {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// Runs the agent until SIGINT/SIGTERM; interception stays in force after it exits.
pub async fn run(paths: AgentPaths, options: AgentOptions) -> anyhow::Result<()> {
    let _lock = take_agent_lock(&paths)?;
    let records = Records::open(&paths.records())
        .with_context(|| format!("opening {}", paths.records().display()))?;
    let (pods, before) = pick_backend(&paths, &options)?;
    // The pins are the node programs': their directory exists once the programs are loaded.
    let pins = pods.programs().is_some().then_some(paths.bpffs.as_path());
    let (netns_watch, mut events) = watch::Watch::start(pins)?;
    let mut agent = Agent {
        pods,
        records,
        pod_problems: Default::default(),
        chain_report: options.cni_chain_report.clone(),
        last_node_problems: None,
        status_changed: Default::default(),
        status_writes: Default::default(),
        events: None,
        netns_watch,
        cgroup: options.cgroup.clone(),
    };
    take_back_pods(&mut agent, &options.cgroup, &before)?;
    let owner = match (&options.daemonset, &options.kubernetes) {
        (Some(daemonset), Some(kube)) => {
            Some(teardown::Owner::start(daemonset.clone(), kube).await?)
        }
        _ => None,
    };
    let agent = start_kubernetes(agent, &options).await;
    if let Some(addr) = options.metrics_addr {
        metrics::serve(addr, agent.clone())?;
    }
    let (socket, listener) = bind_api(&paths)?;
    let (backend, pods) = {
        let agent = lock(&agent);
        (agent.pods.kind(), agent.pods.len())
    };
    info!(
        socket = %socket.display(),
        %backend,
        cgroup = %options.cgroup.display(),
        bpffs = %paths.bpffs.display(),
        pods,
        "agent ready"
    );
    kube_node::publish(&agent, options.startup_taint.clone());

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let reconciler = reconcile::Reconciler::start(agent.clone());
    let mut sweep = reconcile::Sweep::new(options.reconcile_every);
    let mut unheard = tokio::time::interval(reconcile::UNHEARD_EVERY);
    unheard.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tokio::time::sleep_until(sweep.next_at()) => sweep.step(&agent, &reconciler),
            _ = unheard.tick() => reconciler.check_unheard(lock(&agent).netns_watch.unheard()),
            Some(event) = events.recv() => reconciler.on(event),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => drop(tokio::spawn(server::serve(agent.clone(), stream))),
                Err(e) => warn!(error = %e, "accepting an API connection"),
            },
        }
    }
    let _ = std::fs::remove_file(&socket);
    if let Some(owner) = owner
        && let Some(reason) = owner.removal_reason().await
    {
        teardown::remove_from_node(&paths, reason)?;
        owner.forget_node_status().await;
        return Ok(());
    }
    info!(
        pods = lock(&agent).pods.len(),
        "agent exiting; interception stays in force (pinned) until the next agent takes over"
    );
    Ok(())
}

/// One agent at a time: a new one started for an upgrade waits for the running one to exit.
fn take_agent_lock(paths: &AgentPaths) -> anyhow::Result<Flock<File>> {
    if let Some(lock) = paths.lock_agent(false)? {
        return Ok(lock);
    }
    info!(lock = %paths.lock().display(), "another agent is running: waiting for it to exit, then taking over");
    paths.lock_agent(true)?.context("taking the agent lock")
}

/// The one place that picks a backend: the table over it, and what an earlier agent left
/// pinned that the programs do not load on.
fn pick_backend(
    paths: &AgentPaths,
    options: &AgentOptions,
) -> anyhow::Result<(Box<dyn pods::AgentPods>, MapsBefore)> {
    Ok(match options.backend {
        BackendChoice::Ebpf => {
            let (node, before) = load_ebpf(paths, options)?;
            (pods::pods_over(node), before)
        }
        BackendChoice::Iptables(settings) => {
            if paths.bpffs.join("link_icpt_connect4").exists() || !paths.all_maps_dirs().is_empty()
            {
                warn!(bpffs = %paths.bpffs.display(), "an eBPF agent's pinned programs and maps are here: left alone (their programs keep intercepting the pods whose entries they hold); `interceptor uninstall` removes them");
            }
            let backend = crate::iptables::IptablesBackend::new(settings, options.max_pods);
            (pods::pods_over(backend), MapsBefore::default())
        }
    })
}

/// Starts what reads the Kubernetes API, when the agent was given access: the node's pods (for
/// the plugin and the repair), the repair, the Events; returns the agent as its tasks share it.
async fn start_kubernetes(mut agent: Agent, options: &AgentOptions) -> Arc<Shared> {
    let (changes, repair_changes) = match &options.repair {
        Some(_) => {
            let (changes, receiver) = tokio::sync::mpsc::unbounded_channel();
            (Some(changes), Some(receiver))
        }
        None => (None, None),
    };
    let kube = match options.kubernetes.clone() {
        Some(kube) => Some(kube_pods::KubePods::start(kube, changes).await),
        None => None,
    };
    let enabled = repair::enabled(kube.as_deref(), options.repair.as_ref());
    let mut metrics = metrics::AgentMetrics::default();
    let repair = match (
        enabled,
        kube.clone(),
        options.repair.clone(),
        repair_changes,
    ) {
        (true, Some(kube), Some(options), Some(changes)) => {
            let repairs = metrics::Repairs::default();
            metrics.repairs = Some(repairs.clone());
            Some((kube, options, repairs, changes))
        }
        _ => None,
    };
    agent.events = kube.as_deref().and_then(events::Events::for_pods);
    let agent = Arc::new(Shared {
        state: Mutex::new(agent),
        kube,
        not_meshed: Mutex::default(),
        metrics,
    });
    if let Some((kube, options, metrics, changes)) = repair {
        let repair = repair::Repair::new(agent.clone(), kube, options, metrics);
        tokio::spawn(repair.run(changes));
    }
    agent
}

/// The API's socket, for this node's root only.
fn bind_api(paths: &AgentPaths) -> anyhow::Result<(PathBuf, UnixListener)> {
    let socket = paths.socket();
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", socket.display()))?;
    Ok((socket, listener))
}

/// What an earlier agent left pinned that the programs do not load on.
#[derive(Default)]
struct MapsBefore {
    /// The directories of older map layouts (to migrate from).
    older: Vec<PathBuf>,
    /// The node's links are pinned but this layout's maps are not (their pins were removed
    /// while the links' programs held them): the maps are new and empty.
    lost: bool,
}

impl MapsBefore {
    /// Whether the maps the programs load on are new while earlier programs still run in the
    /// links: the pods must be in them before the links are switched over.
    fn new_maps(&self) -> bool {
        !self.older.is_empty() || self.lost
    }
}

/// Loads the programs on the pinned maps. Returns the node and what else was pinned.
fn load_ebpf(paths: &AgentPaths, options: &AgentOptions) -> anyhow::Result<(EbpfNode, MapsBefore)> {
    let bpffs_root = paths.bpffs.parent().unwrap_or(Path::new("/"));
    crate::bpffs::ensure_bpffs(bpffs_root)?;
    let maps_dir = paths.maps_dir(options.map_layout);
    // Maps of another layout: the previous agent's programs run on them until ours replace
    // them in the links, so ours must find every pod in the new maps before that. (Ours may
    // exist already: a migration that was cut short is simply done again.)
    let older: Vec<PathBuf> = paths
        .all_maps_dirs()
        .into_iter()
        .filter(|d| *d != maps_dir)
        .collect();
    if !older.is_empty() {
        info!(from = ?older, to = %maps_dir.display(), "the map layout changed: building new maps from the pod records, then switching the links over");
    }
    let lost = older.is_empty()
        && !maps_dir.exists()
        && paths
            .bpffs
            .join(format!("link_{}", names::PROG_CONNECT4))
            .exists();
    if lost {
        warn!(maps = %maps_dir.display(), "the node's links are pinned but not their maps (removed while an agent ran?): building new maps from the pod records, then switching the links over; connections in flight at the switch lose their original destination and are refused by their proxy");
    }
    let node = EbpfNode::load(LoadOptions {
        orig_dst_capacity: options.orig_dst_capacity,
        pin_dir: maps_dir,
        links_dir: paths.bpffs.clone(),
        persistent: true,
        max_pods: options.max_pods,
    })
    .context("loading the eBPF programs")?;
    Ok((node, MapsBefore { older, lost }))
}

/// Takes the pods back into the backend and, where it has node programs, swaps them into the
/// pinned links; with new maps (older map layouts, or this layout's pins lost), builds them
/// first and copies what is in flight from the older ones.
fn take_back_pods(agent: &mut Agent, cgroup: &Path, before: &MapsBefore) -> anyhow::Result<()> {
    let migrating = before.new_maps();
    let older = &before.older;
    // Original destinations the replaced programs record until the switch: copied before it,
    // and again after it for those recorded meanwhile.
    let import_in_flight = |agent: &mut Agent| {
        agent
            .pods
            .programs_mut()
            .map_or(0, |programs| programs.import_in_flight(older))
    };
    if migrating {
        agent.restore(true)?;
        import_in_flight(agent);
        crash_point!("migration-built");
    }
    if let Some(programs) = agent.pods.programs_mut() {
        programs
            .attach(cgroup)
            .with_context(|| format!("attaching to cgroup {}", cgroup.display()))?;
    }
    if migrating {
        crash_point!("migration-switched");
        let copied = import_in_flight(agent);
        for dir in older {
            remove_maps_dir(dir);
        }
        if before.lost {
            info!("the new maps hold every pod and the links use them");
        } else {
            info!(in_flight_copied = copied, "map layout migration done");
        }
    } else {
        agent.restore(false)?;
    }
    agent.take_over_iptables_pods();
    agent.recheck_all();
    Ok(())
}

/// The agent, shared by the API's handlers, the reconciliation and the metrics thread. A panic
/// while it was held must not stop the agent from serving: the maps it guards are consistent
/// after every single operation.
fn lock(agent: &Shared) -> std::sync::MutexGuard<'_, Agent> {
    agent
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// The pods the repair gave up on; taken after the pod table's lock where both are held.
    fn not_meshed(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, api::node_status::PodProblem>>
    {
        self.not_meshed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every map name a layout's directory may hold: this layout's, and those only earlier layouts
/// pinned.
fn pinned_map_names() -> impl Iterator<Item = &'static str> {
    names::SHARED_MAPS.into_iter().chain(names::RETIRED_MAPS)
}

/// Unpins an older layout's maps: they go once no program (the replaced ones) holds them.
fn remove_maps_dir(dir: &Path) {
    for map in pinned_map_names() {
        let _ = std::fs::remove_file(dir.join(map));
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        warn!(dir = %dir.display(), error = %e, "removing an older map layout's directory");
    }
}

/// Removes what an agent pinned and wrote, and nothing else: the pinned links first (the
/// programs detach as the last reference goes), then the maps, the chains the iptables backend
/// wrote in pods that still exist, the pod records, the socket and the lock. A pin that is not ours (checked as the agent checks it before use) stops the
/// uninstall with an error naming it, and is left in place. Returns what was removed.
pub fn uninstall(paths: &AgentPaths) -> anyhow::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let links: Vec<PathBuf> = std::fs::read_dir(&paths.bpffs)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("link_icpt_"))
        .map(|e| e.path())
        .collect();
    let maps = paths
        .all_maps_dirs()
        .into_iter()
        .flat_map(|dir| pinned_map_names().map(move |map| dir.join(map)));
    for pin in links.into_iter().chain(maps) {
        if crate::ebpf::remove_ours(&pin)? {
            removed.push(pin);
        }
    }
    for dir in paths.all_maps_dirs() {
        let _ = std::fs::remove_dir(&dir);
    }
    let mut remove = |path: PathBuf| -> std::io::Result<()> {
        match std::fs::remove_file(&path) {
            Ok(()) => {
                removed.push(path);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    };
    let records = Records::open(&paths.records())?;
    for record in records.load_all() {
        // What a backend wrote in a pod that still exists (iptables: its chains) goes too.
        if record.netns.exists() {
            pods::remove_recorded(&record)?;
        }
        remove(
            paths
                .records()
                .join(format!("{}.json", record.netns_cookie)),
        )?;
    }
    remove(paths.socket())?;
    remove(paths.lock())?;
    // Directories only when we emptied them: `run` instances keep theirs under the same roots.
    let _ = std::fs::remove_dir(paths.records());
    let _ = std::fs::remove_dir(&paths.bpffs);
    Ok(removed)
}
