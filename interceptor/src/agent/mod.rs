//! The node agent (`interceptor daemon`): the node's programs attached once, with links pinned
//! at stable paths; pods registered and removed at run time through a Unix-socket API.
//!
//! The kernel holds the truth. Maps and links are pinned under `--bpffs` and outlive every agent
//! process: an agent that is killed leaves every pod intercepted, and the next one loads its
//! programs on the pinned maps, swaps them into the pinned links (`BPF_LINK_UPDATE`, no moment
//! without a program on a hook) and takes its pods back from the maps and the pod records
//! (`records`), keeping their slots and counters. Only `interceptor uninstall` detaches.
pub use interceptor_api as api;
mod metrics;
mod records;
mod watch;

use std::{
    collections::BTreeMap,
    fs::{File, OpenOptions},
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use api::{ErrorKind, PodAdd, PodInfo, Request, Response};
use nix::fcntl::{Flock, FlockArg};
use records::{PodRecord, Records};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    signal::unix::{SignalKind, signal},
};
use tracing::{info, warn};

use crate::{
    cli::parse_pod_config,
    ebpf::{EbpfError, EbpfNode, LoadOptions, PodSpec},
    netns::PodNetns,
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

/// The agent's view: the node (programs and maps) and what it knows of each pod.
struct Agent {
    node: EbpfNode,
    records: Records,
    pods: BTreeMap<u64, PodRecord>,
    registration_seconds: prometheus_client::metrics::histogram::Histogram,
    netns_watch: watch::NetnsWatch,
}

/// How the agent runs.
pub struct AgentOptions {
    pub cgroup: PathBuf,
    pub orig_dst_capacity: u32,
    pub reconcile_every: Duration,
    /// Serve Prometheus metrics and `/ready` here.
    pub metrics_addr: Option<SocketAddr>,
    /// Pods served at most (1 to `MAX_PODS`).
    pub max_pods: u32,
    /// The map layout version to pin under (`MAP_LAYOUT_VERSION`; another value only in the
    /// tests of the migration between layouts).
    pub map_layout: u32,
}

type Refusal = (ErrorKind, String);

/// Runs the agent until SIGINT/SIGTERM; interception stays in force after it exits.
pub async fn run(paths: AgentPaths, options: AgentOptions) -> anyhow::Result<()> {
    let cgroup = options.cgroup.as_path();
    let _lock = match paths.lock_agent(false)? {
        Some(lock) => lock,
        None => {
            info!(lock = %paths.lock().display(), "another agent is running: waiting for it to exit, then taking over");
            paths.lock_agent(true)?.context("taking the agent lock")?
        }
    };
    let bpffs_root = paths.bpffs.parent().unwrap_or(Path::new("/"));
    crate::state::ensure_bpffs(bpffs_root)?;
    let maps_dir = paths.maps_dir(options.map_layout);
    // Maps of another layout: the previous agent's programs run on them until ours replace
    // them in the links, so ours must find every pod in the new maps before that. (Ours may
    // exist already: a migration that was cut short is simply done again.)
    let older: Vec<PathBuf> = paths
        .all_maps_dirs()
        .into_iter()
        .filter(|d| *d != maps_dir)
        .collect();
    let migrating = !older.is_empty();
    let node = EbpfNode::load(LoadOptions {
        orig_dst_capacity: options.orig_dst_capacity,
        pin_dir: maps_dir.clone(),
        links_dir: paths.bpffs.clone(),
        persistent: true,
        max_pods: options.max_pods,
    })
    .context("loading the eBPF programs")?;
    let records = Records::open(&paths.records())
        .with_context(|| format!("opening {}", paths.records().display()))?;
    let (netns_watch, mut deleted) = watch::NetnsWatch::start()?;
    let mut agent = Agent {
        node,
        records,
        pods: BTreeMap::new(),
        registration_seconds: metrics::registration_histogram(),
        netns_watch,
    };
    // Original destinations the replaced programs record until the switch: copied before it,
    // and again after it for those recorded meanwhile.
    let import_in_flight = |agent: &mut Agent| {
        older
            .iter()
            .map(|dir| agent.node.pods().import_in_flight(dir))
            .sum::<usize>()
    };
    if migrating {
        info!(from = ?older, to = %maps_dir.display(), "the map layout changed: building new maps from the pod records, then switching the links over");
        agent.restore();
        import_in_flight(&mut agent);
    }
    agent
        .node
        .attach(cgroup)
        .with_context(|| format!("attaching to cgroup {}", cgroup.display()))?;
    if migrating {
        let copied = import_in_flight(&mut agent);
        for dir in &older {
            remove_maps_dir(dir);
        }
        info!(in_flight_copied = copied, "map layout migration done");
    } else {
        agent.restore();
    }
    let agent = Arc::new(Mutex::new(agent));
    if let Some(addr) = options.metrics_addr {
        metrics::serve(addr, agent.clone())?;
    }

    let socket = paths.socket();
    let _ = std::fs::remove_file(&socket);
    let listener =
        UnixListener::bind(&socket).with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", socket.display()))?;
    info!(
        socket = %socket.display(),
        cgroup = %cgroup.display(),
        bpffs = %paths.bpffs.display(),
        pods = lock(&agent).pods.len(),
        "agent ready"
    );

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut reconcile = tokio::time::interval(options.reconcile_every);
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = reconcile.tick() => lock(&agent).reconcile(),
            Some(()) = deleted.recv() => lock(&agent).reconcile(),
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => serve(&agent, stream).await,
                Err(e) => warn!(error = %e, "accepting an API connection"),
            },
        }
    }
    let _ = std::fs::remove_file(&socket);
    info!(
        pods = lock(&agent).pods.len(),
        "agent exiting; interception stays in force (pinned) until the next agent takes over"
    );
    Ok(())
}

/// The agent, shared with the metrics thread. A panic while it was held must not stop the agent
/// from serving: the maps it guards are consistent after every single operation.
fn lock(agent: &Mutex<Agent>) -> std::sync::MutexGuard<'_, Agent> {
    agent
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One request, one response. A request is small; the read is bounded.
async fn serve(agent: &Mutex<Agent>, stream: UnixStream) {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        BufReader::new(read.take(1 << 20)).read_line(&mut line),
    )
    .await;
    // The socket is mode 0600 already; the peer's credentials are checked too, in case it is
    // reached through a descriptor passed on.
    let response = if uid != Some(0) {
        refuse((
            ErrorKind::PermissionDenied,
            "the interceptor agent's API is for root only".into(),
        ))
    } else {
        match read {
            Ok(Ok(n)) if n > 0 => match serde_json::from_str::<Request>(&line) {
                Ok(request) => lock(agent).handle(request),
                Err(e) => refuse((ErrorKind::BadRequest, format!("not a request: {e}"))),
            },
            _ => refuse((ErrorKind::BadRequest, "no request read".into())),
        }
    };
    let mut out = serde_json::to_string(&response).unwrap_or_default();
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
}

fn refuse((kind, message): Refusal) -> Response {
    Response::Error { kind, message }
}

impl Agent {
    fn handle(&mut self, request: Request) -> Response {
        let result = match request {
            Request::Add(add) => self.add(add),
            Request::Remove { netns } => self.remove_by_path(&netns),
            Request::List => Ok(self.all_info()),
            Request::Get { netns } => self
                .find(&netns)
                .map(|c| self.info(c).into_iter().collect()),
        };
        match result {
            Ok(pods) => Response::Ok { pods },
            Err(refusal) => refuse(refusal),
        }
    }

    fn add(&mut self, add: PodAdd) -> Result<Vec<PodInfo>, Refusal> {
        let started = std::time::Instant::now();
        let config =
            parse_pod_config(&add.args).map_err(|message| (ErrorKind::InvalidConfig, message))?;
        let unknown = |e: crate::netns::NetnsError| (ErrorKind::UnknownNetns, e.to_string());
        let netns = PodNetns::open(&add.netns).map_err(unknown)?;
        let (cookie, addresses) = netns.cookie_and_addresses().map_err(unknown)?;
        let spec = PodSpec {
            netns_path: add.netns.clone(),
            netns_cookie: cookie,
            addresses,
            config,
        };
        let record = PodRecord {
            netns: add.netns.clone(),
            netns_cookie: cookie,
            meta: add.meta.clone(),
            args: add.args.clone(),
        };
        if let Some(existing) = self.pods.get(&cookie) {
            let same = parse_pod_config(&existing.args).ok().as_ref() == Some(&spec.config);
            if same && existing.meta == record.meta {
                if add.takeover_iptables {
                    take_over_from_iptables(&add.netns)?;
                }
                return Ok(self.info(cookie).into_iter().collect());
            }
            if !same && !add.update {
                return Err((
                    ErrorKind::Conflict,
                    format!(
                        "pod {} is already registered with another configuration ({}); pass --update to apply the new one in place",
                        add.netns.display(),
                        existing.args.join(" ")
                    ),
                ));
            }
        }
        // The same path with another cookie: the namespace was replaced, the old pod is gone.
        if let Some(stale) = self
            .pods
            .values()
            .find(|r| r.netns == add.netns && r.netns_cookie != cookie)
            .map(|r| r.netns_cookie)
        {
            self.forget(stale, "its network namespace was replaced");
        }
        let is_new = !self.pods.contains_key(&cookie);
        self.records
            .save(&record)
            .map_err(|e| (ErrorKind::Internal, format!("saving the pod record: {e}")))?;
        let registered = if is_new {
            self.node.pods().add(&spec)
        } else {
            self.node.pods().update(&spec)
        };
        if let Err(e) = registered {
            if is_new {
                let _ = self.records.remove(cookie);
            }
            let kind = match e {
                EbpfError::NoFreeSlot(_) => ErrorKind::PodTableFull,
                EbpfError::Netns(_) => ErrorKind::UnknownNetns,
                _ => ErrorKind::Internal,
            };
            return Err((kind, e.to_string()));
        }
        self.netns_watch.watch(&add.netns);
        self.pods.insert(cookie, record);
        self.registration_seconds
            .observe(started.elapsed().as_secs_f64());
        if add.takeover_iptables {
            take_over_from_iptables(&add.netns)?;
        }
        info!(
            netns = %add.netns.display(),
            netns_cookie = cookie,
            name = add.meta.name.as_deref().unwrap_or("-"),
            namespace = add.meta.namespace.as_deref().unwrap_or("-"),
            config = %spec.config,
            micros = started.elapsed().as_micros() as u64,
            "pod registered"
        );
        Ok(self.info(cookie).into_iter().collect())
    }

    fn find(&self, netns: &Path) -> Result<u64, Refusal> {
        self.pods
            .values()
            .find(|r| r.netns == netns)
            .map(|r| r.netns_cookie)
            .ok_or_else(|| {
                (
                    ErrorKind::UnknownNetns,
                    format!("no pod is registered for {}", netns.display()),
                )
            })
    }

    fn remove_by_path(&mut self, netns: &Path) -> Result<Vec<PodInfo>, Refusal> {
        if let Ok(cookie) = self.find(netns) {
            let info = self.info(cookie);
            self.node
                .pods()
                .remove(cookie)
                .map_err(|e| (ErrorKind::Internal, e.to_string()))?;
            let _ = self.records.remove(cookie);
            self.pods.remove(&cookie);
            info!(netns = %netns.display(), netns_cookie = cookie, "pod removed");
            return Ok(info.into_iter().collect());
        }
        Ok(Vec::new())
    }

    /// Removes a pod whose namespace is gone, whatever state it is in.
    fn forget(&mut self, cookie: u64, why: &str) {
        if let Err(e) = self.node.pods().remove(cookie) {
            warn!(netns_cookie = cookie, error = %e, "removing a pod's map entries");
        }
        let _ = self.records.remove(cookie);
        if let Some(record) = self.pods.remove(&cookie) {
            warn!(netns = %record.netns.display(), netns_cookie = cookie, "pod removed: {why}");
        }
    }

    /// Every pod's information; the listener map is walked once, not once per pod.
    fn all_info(&self) -> Vec<PodInfo> {
        let listening = self.node.pods_ref().listening_cookies();
        self.pods
            .keys()
            .filter_map(|c| self.info_with(*c, &listening))
            .collect()
    }

    fn info(&self, cookie: u64) -> Option<PodInfo> {
        self.info_with(cookie, &self.node.pods_ref().listening_cookies())
    }

    fn info_with(
        &self,
        cookie: u64,
        listening: &std::collections::BTreeSet<u64>,
    ) -> Option<PodInfo> {
        let record = self.pods.get(&cookie)?;
        let config = parse_pod_config(&record.args).ok()?;
        let pods = self.node.pods_ref();
        let counters = pods
            .counters(cookie)
            .ok()
            .flatten()
            .map(|c| c.named().map(|(k, v)| (k.to_owned(), v)).collect())
            .unwrap_or_default();
        Some(PodInfo {
            netns: record.netns.clone(),
            netns_cookie: cookie,
            meta: record.meta.clone(),
            slot: pods.slot(cookie)?,
            args: record.args.clone(),
            config: config.summary(),
            addresses: pods
                .addresses(cookie)
                .iter()
                .map(ToString::to_string)
                .collect(),
            inbound_listener: listening.contains(&cookie),
            counters,
        })
    }

    /// Takes back the pods of the previous agent: every record whose namespace still exists
    /// with the same cookie keeps its slot and counters; the others, and map entries of pods
    /// without a record (a registration that never returned), are removed.
    fn restore(&mut self) {
        let mut in_maps = self.node.pods_ref().in_maps();
        for record in self.records.load_all() {
            let cookie = record.netns_cookie;
            let restored = parse_pod_config(&record.args)
                .map_err(|e| format!("its configuration no longer parses: {e}"))
                .and_then(|config| {
                    let netns = PodNetns::open(&record.netns).map_err(|e| e.to_string())?;
                    if netns.cookie().map_err(|e| e.to_string())? != cookie {
                        return Err("its network namespace was replaced".into());
                    }
                    let spec = PodSpec {
                        netns_path: record.netns.clone(),
                        netns_cookie: cookie,
                        addresses: netns.addresses().map_err(|e| e.to_string())?,
                        config,
                    };
                    self.node
                        .pods()
                        .restore(&spec, &mut in_maps)
                        .map_err(|e| e.to_string())
                });
            match restored {
                Ok(_) => {
                    self.netns_watch.watch(&record.netns);
                    self.pods.insert(cookie, record);
                }
                Err(why) => {
                    warn!(netns = %record.netns.display(), netns_cookie = cookie, "not restoring pod: {why}");
                    let _ = self.node.pods().purge(cookie);
                    let _ = self.records.remove(cookie);
                }
            }
        }
        for cookie in self.node.pods_ref().cookies_in_maps() {
            if !self.pods.contains_key(&cookie) {
                warn!(
                    netns_cookie = cookie,
                    "removing a pod the maps hold without a record"
                );
                let _ = self.node.pods().purge(cookie);
            }
        }
        info!(pods = self.pods.len(), "pods restored from the pinned maps");
    }

    /// Pods whose network namespace disappeared (or was replaced: another cookie at the same
    /// path) are removed; address changes are applied. Runs periodically, and at once when a
    /// watched namespace directory loses an entry.
    fn reconcile(&mut self) {
        let cookies: Vec<u64> = self.pods.keys().copied().collect();
        for cookie in cookies {
            let Some(path) = self.pods.get(&cookie).map(|r| r.netns.clone()) else {
                continue;
            };
            // One switch into the namespace for both; a failed address dump alone must not pass
            // for a gone namespace.
            let current = PodNetns::open(&path).and_then(|n| match n.cookie_and_addresses() {
                Ok((c, addresses)) => Ok((c, Some(addresses))),
                Err(_) => n.cookie().map(|c| (c, None)),
            });
            match current {
                Ok((c, addresses)) if c == cookie => {
                    let pods = self.node.pods();
                    if let Some(addresses) = addresses
                        && pods.addresses(cookie) != addresses
                        && let Err(e) = pods.set_addresses(cookie, &addresses)
                    {
                        warn!(netns = %path.display(), error = %e, "updating pod addresses");
                    }
                }
                Ok(_) => self.forget(cookie, "its network namespace was replaced"),
                Err(_) => self.forget(cookie, "its network namespace is gone"),
            }
        }
    }
}

/// Called once the pod is intercepted by the programs: its iptables chains can go.
fn take_over_from_iptables(netns: &Path) -> Result<(), Refusal> {
    remove_iptables_chains(netns).map_err(|e| {
        (
            ErrorKind::Internal,
            format!("the pod is registered and intercepted, but removing its iptables chains failed: {e}"),
        )
    })
}

/// Removes proxy-init's chains from a pod, whichever binaries wrote them; modes whose binaries
/// are not installed cannot have written any.
fn remove_iptables_chains(netns: &Path) -> Result<(), crate::iptables::IptablesError> {
    use crate::iptables::{IptablesError, IptablesMode, IptablesOptions, cleanup};
    for mode in [IptablesMode::Legacy, IptablesMode::Nft] {
        let options = IptablesOptions {
            mode,
            wait: true,
            ipv6: true,
            netns: Some(netns.to_owned()),
        };
        match cleanup(&options) {
            Ok(ran) if !ran.is_empty() => {
                info!(netns = %netns.display(), ?mode, commands = ran.len(), "took over from iptables: chains removed");
            }
            Ok(_) | Err(IptablesError::MissingBinary { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Unpins an older layout's maps: they go once no program (the replaced ones) holds them.
fn remove_maps_dir(dir: &Path) {
    for map in interceptor_common::names::SHARED_MAPS {
        let _ = std::fs::remove_file(dir.join(map));
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        warn!(dir = %dir.display(), error = %e, "removing an older map layout's directory");
    }
}

/// Removes what an agent pinned and wrote, and nothing else: the pinned links first (the
/// programs detach as the last reference goes), then the maps, the pod records, the socket and
/// the lock. Returns what was removed.
pub fn uninstall(paths: &AgentPaths) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
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
    let links: Vec<PathBuf> = std::fs::read_dir(&paths.bpffs)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("link_icpt_"))
        .map(|e| e.path())
        .collect();
    for link in links {
        remove(link)?;
    }
    for dir in paths.all_maps_dirs() {
        for map in interceptor_common::names::SHARED_MAPS {
            remove(dir.join(map))?;
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let records = Records::open(&paths.records())?;
    for record in records.load_all() {
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
