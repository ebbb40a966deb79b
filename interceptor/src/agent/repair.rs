//! Repair in place. A pod Linkerd injected whose sandbox was created while the CNI plugin was not
//! chained (a primary CNI rewrote its configuration, or the installer had not run yet on a
//! booting node) runs with a proxy and no interception; under linkerd-cni its
//! `linkerd-network-validator` exits 95 until someone deletes the pod. The agent finds such a
//! pod in its watch of the node's pods and registers it as the plugin's ADD would have: its
//! connections opened before stay as they were, every later one is intercepted, and the
//! validator passes at its next retry.
//!
//! Which pods: those the plugin would have meshed, decided by the function the plugin decides
//! with (`interceptor_config::mesh::pod_plan`) on the same facts (the pod's annotations, its namespace's, the
//! `linkerd-init` and control-plane rules) and the same `linkerd` block (`--linkerd`, the
//! installer's value); not `hostNetwork`; whose sandbox exists with its ADD over (a container
//! of it has an ID, which the kubelet gets only after `RunPodSandbox` answered, so a pod whose
//! ADD is in flight is never repaired: registering a namespace twice is idempotent anyway); and
//! that no registration names (by UID, or by namespace and name for one registered without a
//! UID).
//!
//! Where its network namespace is, whatever the runtime: its UID names its cgroup under the
//! kubelet's pod cgroup, a process in that cgroup (the agent shares the host's PID namespace)
//! has it at `/proc/PID/ns/net`. The registration keeps the runtime's name for it in
//! `/run/netns` when there is one: unlike the process, that lasts as long as the namespace, and
//! the agent restores its pods by that path after a restart.
//!
//! When: at once for a change the watch reports of such a pod, and every `--repair-interval`
//! for all of them. A pass reads the watch's cache and the agent's registrations, nothing else:
//! an agent whose pods are all registered does no work per pod. A pod that cannot be repaired
//! (no process yet, its namespace gone, the registration refused) is tried again at the next
//! passes, and after [`REPORT_AFTER`] failed attempts reported once: a warning naming it and
//! why, and `interceptor_pods_repair_failed_total{reason}`. It is never half-registered (a
//! registration is complete or has no effect).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    Refusal, Shared,
    api::{ErrorKind, PodAdd, PodMeta, node_status::PodProblem},
    events::Occurrence,
    kube_pods::{Change, KubePods, PodRef},
    lock,
    metrics::Repairs,
    registration,
};
use crate::{
    cgroup,
    config::{
        InterceptionConfig,
        mesh::{Plan, PodSettings, Pods, pod_plan},
    },
    netns::{NAMED_NETNS_DIRS, NsId, named_path},
};

/// Failed attempts after which a pod that cannot be repaired is reported (it is still tried at
/// every periodic pass).
pub const REPORT_AFTER: u32 = 3;

/// How many of a pod's processes are looked at for its oldest one: a pod has a few, a bound on
/// one that forks without end.
const PROCESSES_LOOKED_AT: usize = 256;

/// How the agent repairs pods.
#[derive(Clone, Debug)]
pub struct RepairOptions {
    /// How often every pod is checked (`--repair-interval`).
    pub interval: Duration,
    /// The plugin's settings before a pod's annotations: its `linkerd` block (`--linkerd`).
    pub settings: PodSettings,
    /// Where the pods' cgroups are: the kubelet's pod cgroup.
    pub pods_cgroup: PathBuf,
}

/// Why a pod could not be repaired; [`Self::label`] is its metric label.
#[derive(Debug)]
enum Failure {
    /// Its namespace's annotations could not be read.
    Api(String),
    /// Its annotations or its namespace's are not a valid configuration.
    InvalidConfig(String),
    NoCgroup(PathBuf),
    NoProcess(PathBuf),
    /// Its processes are in the node's network namespace.
    HostNetwork,
    /// Its processes exited, or its namespace went, before it could be registered.
    NetnsGone(String),
    /// The agent refused the registration (its pod table full, its proxy's listener not
    /// adoptable, ...).
    Refused(String),
}

impl Failure {
    fn label(&self) -> &'static str {
        match self {
            Self::Api(_) => "kubernetes_api",
            Self::InvalidConfig(_) => "invalid_config",
            Self::NoCgroup(_) => "no_cgroup",
            Self::NoProcess(_) => "no_process",
            Self::HostNetwork => "host_network",
            Self::NetnsGone(_) => "netns_gone",
            Self::Refused(_) => "refused",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Api(e) => write!(f, "its namespace's annotations could not be read: {e}"),
            Self::InvalidConfig(e) => write!(
                f,
                "invalid linkerd annotation on the pod or its namespace: {e}"
            ),
            Self::NoCgroup(under) => write!(f, "no cgroup of the pod under {}", under.display()),
            Self::NoProcess(cgroup) => {
                write!(f, "no process in its cgroup {} yet", cgroup.display())
            }
            Self::HostNetwork => f.write_str("its processes are in the node's network namespace"),
            Self::NetnsGone(e) => write!(
                f,
                "its network namespace went before it could be registered: {e}"
            ),
            Self::Refused(e) => write!(f, "the registration was refused: {e}"),
        }
    }
}

/// A pod that failed to be repaired.
struct Failing {
    attempts: u32,
    /// Once reported, the pod as the node's status names it (with the last failure).
    reported: Option<PodProblem>,
}

pub(super) struct Repair {
    agent: Arc<Shared>,
    kube: Arc<KubePods>,
    options: RepairOptions,
    metrics: Repairs,
    /// By UID.
    failing: HashMap<String, Failing>,
}

impl Repair {
    pub(super) fn new(
        agent: Arc<Shared>,
        kube: Arc<KubePods>,
        options: RepairOptions,
        metrics: Repairs,
    ) -> Self {
        Self {
            agent,
            kube,
            options,
            metrics,
            failing: HashMap::new(),
        }
    }

    /// Repairs what the watch reports in `changes`, and every pod at each interval.
    pub(super) async fn run(mut self, mut changes: mpsc::UnboundedReceiver<Change>) {
        let mut tick = tokio::time::interval(self.options.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is now: the watch's first listing starts the first pass instead.
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => self.pass(None, true).await,
                change = changes.recv() => {
                    let Some(change) = change else { return };
                    // What piled up meanwhile, once each.
                    let mut pods = BTreeSet::new();
                    let mut listed = false;
                    let mut note = |change| match change {
                        Change::Pod(namespace, name) => {
                            pods.insert((namespace, name));
                        }
                        Change::Listed => listed = true,
                    };
                    note(change);
                    while let Ok(change) = changes.try_recv() {
                        note(change);
                    }
                    if listed {
                        self.pass(None, true).await;
                    } else {
                        for (namespace, name) in &pods {
                            self.pass(Some((namespace, name)), false).await;
                        }
                    }
                }
            }
        }
    }

    /// Registers the unregistered pods among those to repair (`only` that one). A pod that
    /// failed before is tried again only in a `full` pass: its retries are paced by the
    /// interval, not by its status changes.
    async fn pass(&mut self, only: Option<(&str, &str)>, full: bool) {
        let candidates = self.kube.to_repair(only);
        if full {
            let uids: HashSet<&str> = candidates.iter().map(|p| p.uid.as_str()).collect();
            self.failing.retain(|uid, _| uids.contains(uid.as_str()));
        }
        for pod in self.unregistered(candidates) {
            if !full && self.failing.contains_key(&pod.uid) {
                continue;
            }
            let result = self.repair(&pod).await;
            self.account(&pod, result);
        }
        self.publish_not_meshed();
    }

    /// Hands the pods given up on to the agent (metrics, the node's status), when they changed.
    fn publish_not_meshed(&self) {
        let not_meshed: BTreeMap<String, PodProblem> = self
            .failing
            .iter()
            .filter_map(|(uid, failing)| Some((uid.clone(), failing.reported.clone()?)))
            .collect();
        let mut now = self.agent.not_meshed();
        if *now != not_meshed {
            *now = not_meshed;
            drop(now);
            lock(&self.agent).status_changed.notify();
        }
    }

    /// Posts an event on `pod`, when the agent can.
    fn post(&self, pod: &PodRef, occurrence: Occurrence) {
        if let Some(events) = &lock(&self.agent).events {
            events.post(pod, occurrence);
        }
    }

    /// The pods no registration names.
    fn unregistered(&mut self, candidates: Vec<PodRef>) -> Vec<PodRef> {
        if candidates.is_empty() {
            return candidates;
        }
        let agent = lock(&self.agent);
        let mut uids = HashSet::new();
        let mut names = HashSet::new();
        for (_, _, facts) in agent.pods.registered() {
            match (&facts.meta.uid, &facts.meta.namespace, &facts.meta.name) {
                (Some(uid), _, _) => {
                    uids.insert(uid.clone());
                }
                (None, Some(namespace), Some(name)) => {
                    names.insert((namespace.clone(), name.clone()));
                }
                (None, _, _) => {}
            }
        }
        drop(agent);
        let (registered, unregistered): (Vec<PodRef>, Vec<PodRef>) =
            candidates.into_iter().partition(|pod| {
                uids.contains(&pod.uid)
                    || names.contains(&(pod.namespace.clone(), pod.name.clone()))
            });
        for pod in registered {
            self.failing.remove(&pod.uid);
        }
        unregistered
    }

    /// Registers `pod` as the plugin's ADD would have; `Ok(None)` when it is no longer one to
    /// repair (gone from the watch, or no longer to be meshed).
    async fn repair(&self, pod: &PodRef) -> Result<Option<PathBuf>, Failure> {
        let Some(answer) = self.kube.pod_to_repair(pod).await else {
            return Ok(None);
        };
        let kube_pod = answer.map_err(Failure::Api)?;
        let settings = match pod_plan(self.options.settings.clone(), Pods::Injected, &kube_pod) {
            Ok(Plan::Mesh(settings)) => settings,
            Ok(Plan::Skip(_)) => return Ok(None),
            Err(e) => return Err(Failure::InvalidConfig(e.to_string())),
        };
        let (agent, pods_cgroup, pod) = (
            self.agent.clone(),
            self.options.pods_cgroup.clone(),
            pod.clone(),
        );
        tokio::task::spawn_blocking(move || register(&agent, &pods_cgroup, &pod, settings.config))
            .await
            .unwrap_or_else(|e| Err(Failure::Refused(format!("the registration failed: {e}"))))
            .map(Some)
    }

    fn account(&mut self, pod: &PodRef, result: Result<Option<PathBuf>, Failure>) {
        match result {
            Ok(None) => {
                self.failing.remove(&pod.uid);
            }
            Ok(Some(netns)) => {
                self.failing.remove(&pod.uid);
                self.metrics.repaired.inc();
                self.post(pod, Occurrence::MeshedInPlace);
                warn!(
                    namespace = %pod.namespace,
                    name = %pod.name,
                    uid = %pod.uid,
                    netns = %netns.display(),
                    "pod repaired: it started without the CNI plugin (not chained when its sandbox was created) and is now registered in place; the connections it opened before stay as they were, every new one is intercepted"
                );
            }
            Err(failure) => {
                let failing = self.failing.entry(pod.uid.clone()).or_insert(Failing {
                    attempts: 0,
                    reported: None,
                });
                failing.attempts += 1;
                debug!(pod = %pod, attempts = failing.attempts, reason = failure.label(), "pod not repaired yet: {failure}");
                let problem = PodProblem {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    reason: failure.to_string(),
                };
                if let Some(reported) = &mut failing.reported {
                    // Still given up on, for the reason it fails with now.
                    *reported = problem;
                } else if failing.attempts >= REPORT_AFTER {
                    failing.reported = Some(problem);
                    let attempts = failing.attempts;
                    self.metrics.failed(failure.label());
                    self.post(
                        pod,
                        Occurrence::NotMeshed {
                            reason: failure.to_string(),
                        },
                    );
                    warn!(
                        namespace = %pod.namespace,
                        name = %pod.name,
                        uid = %pod.uid,
                        reason = failure.label(),
                        attempts,
                        "pod started without the CNI plugin and cannot be repaired: {failure}; it runs without interception, and is tried again every {} s (deleted, it starts again through the plugin once the plugin is chained)",
                        self.options.interval.as_secs()
                    );
                }
            }
        }
    }
}

/// Finds the pod's network namespace and registers it; returns the path registered.
fn register(
    agent: &Shared,
    pods_cgroup: &Path,
    pod: &PodRef,
    config: InterceptionConfig,
) -> Result<PathBuf, Failure> {
    let netns = locate(pods_cgroup, &pod.uid)?;
    let add = PodAdd {
        netns: netns.clone(),
        meta: PodMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            // The sandbox's ID is unknown here; the plugin's GC removes only pods that have
            // one, so a guess could have the pod removed.
            container_id: None,
            uid: Some(pod.uid.clone()),
        },
        config,
        // As the plugin registers: an ADD racing this one applies the same configuration.
        update: true,
        takeover_iptables: false,
    };
    match registration::add(agent, add) {
        Ok(_) => Ok(netns),
        Err(Refusal {
            kind: ErrorKind::UnknownNetns,
            message,
        }) => Err(Failure::NetnsGone(message)),
        Err(Refusal {
            kind: ErrorKind::InvalidConfig,
            message,
        }) => Err(Failure::InvalidConfig(message)),
        Err(Refusal { kind, message }) => Err(Failure::Refused(format!("{kind:?}: {message}"))),
    }
}

/// The network namespace of the pod with `uid`: its cgroup below `pods_cgroup`, a process in
/// it, that process's namespace by the runtime's name for it, else by `/proc/PID/ns/net` of the
/// pod's oldest process (its sandbox's, which lives as long as the pod; a container's may be
/// one that exits and restarts, such as a crash-looping init container).
fn locate(pods_cgroup: &Path, uid: &str) -> Result<PathBuf, Failure> {
    let cgroup = cgroup::find_pod_cgroup(pods_cgroup, uid)
        .ok_or_else(|| Failure::NoCgroup(pods_cgroup.to_owned()))?;
    let mut oldest_first: Vec<(u64, u32)> = cgroup::processes_in(&cgroup)
        .take(PROCESSES_LOOKED_AT)
        .filter_map(|pid| Some((start_time(pid)?, pid)))
        .collect();
    if oldest_first.is_empty() {
        return Err(Failure::NoProcess(cgroup));
    }
    oldest_first.sort_unstable();
    // The agent runs in the node's namespace (hostNetwork), as does PID 1 of the host.
    let host: Vec<NsId> = ["/proc/self/ns/net", "/proc/1/ns/net"]
        .into_iter()
        .filter_map(|path| NsId::of(Path::new(path)).ok())
        .collect();
    let mut exited = String::new();
    for (_, pid) in oldest_first {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let id = match NsId::of(&path) {
            Ok(id) => id,
            Err(e) => {
                exited = format!("{}: {e}", path.display());
                continue;
            }
        };
        if host.contains(&id) {
            return Err(Failure::HostNetwork);
        }
        let named: Vec<&Path> = NAMED_NETNS_DIRS.iter().map(Path::new).collect();
        return Ok(named_path(id, &named).unwrap_or(path));
    }
    Err(Failure::NetnsGone(exited))
}

/// When process `pid` started, in clock ticks since boot (`/proc/PID/stat`'s 22nd field);
/// `None` once it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, second, is in parentheses and may hold anything: count after it.
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Whether pods started without the CNI plugin are repaired by an agent with `kube` (`None`:
/// without `--kubernetes`) and `options` (`None`: `--repair-interval 0`); says which, and why
/// not, once at start.
pub(super) fn enabled(kube: Option<&KubePods>, options: Option<&RepairOptions>) -> bool {
    let off = |why: &str, unusable: bool| {
        let consequence = "a pod Linkerd injected whose sandbox is created while the CNI plugin is not chained runs without interception until it is restarted";
        if unusable {
            warn!("pod repair is off ({why}): {consequence}");
        } else {
            info!("pod repair is off ({why}): {consequence}");
        }
        false
    };
    let Some(options) = options else {
        return off("--repair-interval is 0", false);
    };
    let Some(kube) = kube else {
        return off(
            "the agent does not read the Kubernetes API: no --kubernetes",
            false,
        );
    };
    if let Some(why) = kube.no_client() {
        return off(&format!("no Kubernetes client: {why}"), true);
    }
    if !kube.watching() {
        return off(
            "no node name (--node-name, NODE_NAME), so no watch of this node's pods",
            true,
        );
    }
    if options.settings.simulate {
        return off(
            "the linkerd block says simulate: the plugin registers nothing either",
            false,
        );
    }
    info!(
        interval_s = options.interval.as_secs(),
        pods_cgroup = %options.pods_cgroup.display(),
        "pods started without the CNI plugin are repaired in place: at once when the Kubernetes API reports them, and at every interval"
    );
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_start_time_is_read_past_any_command_name() {
        let own = super::start_time(std::process::id()).expect("this process's start time");
        let parent = super::start_time(std::os::unix::process::parent_id()).expect("its parent's");
        assert!(parent <= own, "a parent starts first: {parent} > {own}");
        assert_eq!(super::start_time(u32::MAX), None);
    }
}
