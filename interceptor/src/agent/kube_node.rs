//! What the agent tells Kubernetes about its node (with `--kubernetes` and a node name): its
//! [`NodeStatus`] in the Node's [`NODE_STATUS_ANNOTATION`], and the end of the startup taint
//! (`--startup-taint`) once it can mesh new pods.
//!
//! The status is rebuilt when something in it may have changed (the agent started, a pod was
//! registered or removed, a repair succeeded or was given up, a pod's drift was found or
//! cleared, the node's readiness changed as `/ready` saw it), never on a timer. It is written
//! only when it differs from the last one written (its `updated` time aside), at most once per
//! [`MIN_INTERVAL`]: changes meanwhile are coalesced, and the last state is always written. A
//! write is a merge patch of the Node's annotations, from a task of its own with a deadline: the
//! agent never waits for the API, and a failed write is logged, counted and tried again.
//!
//! The startup taint is what Cilium (`node.cilium.io/agent-not-ready`) and Istio
//! (`cni.istio.io/not-ready`) do: nodes are created with a taint no application pod tolerates,
//! and it goes once the node's CNI can handle pods. Both decide that from the readiness of the
//! CNI's DaemonSet pod on the node (Cilium's operator, Istio's untaint controller in istiod);
//! here the agent decides it itself from what its `/ready` answers (programs attached, the plugin
//! chained), the same condition without a controller that may read every pod. It removes every
//! taint with that key, once, with the Node's `resourceVersion` in the patch so that a taint
//! another controller changed meanwhile is not lost (a conflict reads the Node again).
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use interceptor_api::node_status::{
    ChainReport, MAX_PODS_NAMED, NODE_STATUS_ANNOTATION, NodeStatus, PodProblem,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::{sync::Notify, time::Instant};
use tracing::{debug, info, warn};

use super::{Agent, Shared, lock};

/// At most one write of the status per this long.
const MIN_INTERVAL: Duration = Duration::from_secs(2);

/// How long one request to the API may take.
const API_DEADLINE: Duration = Duration::from_secs(5);

/// The longest wait between two attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What the agent publishes on its Node, and where.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The Node's name (`--node-name`).
    pub node: String,
    /// The taint to remove once the agent can mesh pods (`--startup-taint`).
    pub startup_taint: Option<String>,
}

type Labels = Vec<(String, String)>;

/// The status's writes, for `/metrics`: `written` and `failed`.
#[derive(Clone, Default)]
pub struct StatusWrites(pub Family<Labels, Counter>);

impl StatusWrites {
    fn count(&self, result: &str) {
        self.0
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc();
    }
}

/// Wakes the status task: something in the status may have changed.
#[derive(Clone, Default)]
pub struct StatusChanged(Option<Arc<Notify>>);

impl StatusChanged {
    /// Never waits: a wake-up while one is pending is the same wake-up.
    pub fn notify(&self) {
        if let Some(notify) = &self.0 {
            notify.notify_one();
        }
    }
}

impl Agent {
    /// What keeps new pods from being meshed: the node's links (eBPF), and the CNI plugin not
    /// chained when the installer reports it (`--cni-chain-report`). Pods' drift is not here:
    /// it is theirs alone.
    pub(super) fn node_problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .pods
            .programs()
            .map(|programs| programs.link_problems(&self.cgroup))
            .unwrap_or_default();
        if let Some(problem) = self
            .chain_report
            .as_deref()
            .and_then(ChainReport::problem_at)
        {
            problems.push(problem);
        }
        problems
    }

    /// `/ready`'s answer, noted: a change of the node's problems changes its status.
    pub(super) fn readiness(&mut self) -> Vec<String> {
        let problems = self.node_problems();
        if self.last_node_problems.as_ref() != Some(&problems) {
            self.last_node_problems = Some(problems.clone());
            self.status_changed.notify();
        }
        problems
    }

    /// The pods the last checks found not in force as configured, by their names.
    fn drifted(&self) -> Vec<PodProblem> {
        self.pod_problems
            .iter()
            .filter_map(|(cookie, problem)| {
                let facts = self.pods.facts(*cookie)?;
                let netns = self.pods.netns(*cookie)?;
                Some(PodProblem {
                    namespace: facts.meta.namespace.clone().unwrap_or_default(),
                    name: facts
                        .meta
                        .name
                        .clone()
                        .unwrap_or_else(|| netns.display().to_string()),
                    reason: problem.clone(),
                })
            })
            .collect()
    }

    /// How many registered pods' interception drifted (`interceptor_pods_drifted`).
    pub(super) fn drifted_count(&self) -> usize {
        self.pod_problems
            .keys()
            .filter(|cookie| self.pods.facts(**cookie).is_some())
            .count()
    }

    /// The node's status as of now.
    pub(super) fn node_status(&mut self, not_meshed: &BTreeMap<String, PodProblem>) -> NodeStatus {
        let problems = self.readiness();
        let variants = self
            .pods
            .programs()
            .map(|programs| programs.variants())
            .unwrap_or_default();
        // Unknown (absent) while the installer has not reported: `problems` says why.
        let chained = self
            .chain_report
            .as_deref()
            .and_then(|path| ChainReport::read(path).ok())
            .map(|report| report.chained);
        let (drifted, drifted_total) = capped(self.drifted());
        let (not_meshed, not_meshed_total) = capped(not_meshed.values().cloned().collect());
        NodeStatus {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            backend: self.pods.kind(),
            variants,
            can_mesh: problems.is_empty(),
            problems,
            chained,
            meshed: u32::try_from(self.pods.len()).unwrap_or(u32::MAX),
            not_meshed,
            not_meshed_total,
            drifted,
            drifted_total,
            updated: now_rfc3339(),
        }
    }
}

/// The first [`MAX_PODS_NAMED`] of `pods`, and how many there are.
fn capped(mut pods: Vec<PodProblem>) -> (Vec<PodProblem>, u32) {
    let total = u32::try_from(pods.len()).unwrap_or(u32::MAX);
    pods.truncate(MAX_PODS_NAMED);
    (pods, total)
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// When to write the status: only what differs from the last written (its time aside), at most
/// once per interval.
#[derive(Debug)]
struct Coalescer {
    interval: Duration,
    written: Option<NodeStatus>,
    last_attempt: Option<Instant>,
}

impl Coalescer {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            written: None,
            last_attempt: None,
        }
    }

    /// How long to wait before the next write may go, at `now`.
    fn wait(&self, now: Instant) -> Duration {
        self.last_attempt
            .map(|last| (last + self.interval).saturating_duration_since(now))
            .unwrap_or_default()
    }

    /// Whether `status` says something the last written one did not.
    fn differs(&self, status: &NodeStatus) -> bool {
        self.written.as_ref().is_none_or(|written| {
            written
                != &NodeStatus {
                    updated: written.updated.clone(),
                    ..status.clone()
                }
        })
    }

    fn attempted(&mut self, now: Instant) {
        self.last_attempt = Some(now);
    }

    fn written(&mut self, status: NodeStatus) {
        self.written = Some(status);
    }
}

/// Starts keeping the Node's status (and removing `startup_taint`) for an agent that reads the
/// API with a node name; says why not for one that does not.
pub(super) fn publish(agent: &Arc<Shared>, startup_taint: Option<String>) {
    let kube = agent.kube.clone();
    let Some(kube) = kube else { return };
    let (Some(client), Some(node)) = (kube.client(), kube.node_name()) else {
        let why = match kube.no_client() {
            Some(why) => format!("no Kubernetes client: {why}"),
            None => "no node name (--node-name, NODE_NAME)".to_owned(),
        };
        match startup_taint {
            Some(taint) => {
                warn!(%taint, "the startup taint cannot be removed ({why}): pods that do not tolerate it are not scheduled on this node")
            }
            None => info!("this node's status is not published on its Node ({why})"),
        }
        return;
    };
    let options = NodeOptions {
        node: node.to_owned(),
        startup_taint,
    };
    let writes = lock(agent).status_writes.clone();
    let changed = start(agent.clone(), client, options, writes);
    lock(agent).status_changed = changed;
}

/// Starts the task that keeps the Node's status (and removes the startup taint); returns what
/// wakes it. The first status is built at once.
fn start(
    agent: Arc<Shared>,
    client: kube::Client,
    options: NodeOptions,
    writes: StatusWrites,
) -> StatusChanged {
    let changed = Arc::new(Notify::new());
    changed.notify_one();
    let wake = changed.clone();
    let api: Api<Node> = Api::all(client);
    tokio::spawn(async move {
        let mut coalescer = Coalescer::new(MIN_INTERVAL);
        let mut taint = options.startup_taint;
        let mut backoff = MIN_INTERVAL;
        loop {
            changed.notified().await;
            tokio::time::sleep(coalescer.wait(Instant::now())).await;
            let building = agent.clone();
            let Ok(status) = tokio::task::spawn_blocking(move || {
                let mut state = lock(&building);
                state.node_status(&building.not_meshed())
            })
            .await
            else {
                continue;
            };
            if status.can_mesh
                && let Some(key) = taint.take()
            {
                tokio::spawn(remove_taint(api.clone(), options.node.clone(), key));
            }
            if !coalescer.differs(&status) {
                continue;
            }
            coalescer.attempted(Instant::now());
            match write(&api, &options.node, &status).await {
                Ok(()) => {
                    debug!(node = %options.node, can_mesh = status.can_mesh, meshed = status.meshed, "node status written");
                    writes.count("written");
                    coalescer.written(status);
                    backoff = MIN_INTERVAL;
                }
                Err(e) => {
                    warn!(node = %options.node, error = %e, retry_s = backoff.as_secs(), "writing this node's status annotation ({NODE_STATUS_ANNOTATION})");
                    writes.count("failed");
                    let retry = changed.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(backoff).await;
                        retry.notify_one();
                    });
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    });
    StatusChanged(Some(wake))
}

/// The status as a merge patch of the Node's annotations.
async fn write(api: &Api<Node>, node: &str, status: &NodeStatus) -> Result<(), String> {
    let json = serde_json::to_string(status).map_err(|e| e.to_string())?;
    patch_status(api, node, Some(json)).await
}

/// Removes the status from the Node, once: nothing of an agent removed from its node is left
/// on the Node (see `teardown`). Logged either way; the agent is exiting.
pub(super) async fn forget(client: kube::Client, node: &str) {
    match patch_status(&Api::all(client), node, None).await {
        Ok(()) => info!(node, "the node's status annotation removed"),
        Err(e) => warn!(node, error = %e, "removing the node's status annotation"),
    }
}

/// Sets (`Some`) or removes (`None`) the status annotation with a merge patch, within
/// [`API_DEADLINE`].
async fn patch_status(api: &Api<Node>, node: &str, json: Option<String>) -> Result<(), String> {
    let patch = serde_json::json!({
        "metadata": { "annotations": { NODE_STATUS_ANNOTATION: json } },
    });
    match tokio::time::timeout(
        API_DEADLINE,
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", API_DEADLINE.as_secs())),
    }
}

/// What one attempt at the taint found.
enum Untainted {
    Removed(usize),
    Absent,
}

/// Removes every taint with `key` from `node`, trying until it is done.
async fn remove_taint(api: Api<Node>, node: String, key: String) {
    let mut delay = Duration::from_millis(200);
    let mut failures = 0;
    loop {
        match remove_taint_once(&api, &node, &key).await {
            Ok(Untainted::Removed(count)) => {
                info!(%node, taint = %key, count, "this node can mesh pods: its startup taint is removed");
                return;
            }
            Ok(Untainted::Absent) => {
                info!(%node, taint = %key, "this node can mesh pods; it has no startup taint to remove");
                return;
            }
            Err(TaintError::Conflict) => {
                debug!(%node, "the Node changed while its taint was being removed: reading it again");
            }
            Err(TaintError::Other(e)) => {
                failures += 1;
                if failures == 1 {
                    warn!(%node, taint = %key, error = %e, "removing this node's startup taint; trying again");
                } else {
                    debug!(%node, taint = %key, error = %e, failures, "removing this node's startup taint; trying again");
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

enum TaintError {
    /// The Node's resourceVersion moved since it was read.
    Conflict,
    Other(String),
}

async fn remove_taint_once(
    api: &Api<Node>,
    node: &str,
    key: &str,
) -> Result<Untainted, TaintError> {
    let timed = |e: tokio::time::error::Elapsed| {
        TaintError::Other(format!(
            "{e}: no answer within {} s",
            API_DEADLINE.as_secs()
        ))
    };
    let found = tokio::time::timeout(API_DEADLINE, api.get(node))
        .await
        .map_err(timed)?
        .map_err(|e| TaintError::Other(e.to_string()))?;
    let taints = found
        .spec
        .as_ref()
        .and_then(|spec| spec.taints.clone())
        .unwrap_or_default();
    let kept: Vec<_> = taints.iter().filter(|t| t.key != key).cloned().collect();
    let removed = taints.len() - kept.len();
    if removed == 0 {
        return Ok(Untainted::Absent);
    }
    // The resourceVersion makes the patch conditional: the server refuses it (409) if the Node
    // changed since it was read, so the list written is never built on a stale one.
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": found.metadata.resource_version },
        "spec": { "taints": kept },
    });
    match tokio::time::timeout(
        API_DEADLINE,
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await
    .map_err(timed)?
    {
        Ok(_) => Ok(Untainted::Removed(removed)),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(TaintError::Conflict),
        Err(e) => Err(TaintError::Other(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(meshed: u32, updated: &str) -> NodeStatus {
        NodeStatus {
            version: "0.1.0".into(),
            can_mesh: true,
            meshed,
            updated: updated.into(),
            ..NodeStatus::default()
        }
    }

    #[test]
    fn only_a_changed_status_is_written_and_at_most_once_per_interval() {
        let start = Instant::now();
        let mut coalescer = Coalescer::new(MIN_INTERVAL);
        // Nothing written yet: the first status goes at once.
        assert!(coalescer.differs(&status(0, "t0")));
        assert_eq!(coalescer.wait(start), Duration::ZERO);
        coalescer.attempted(start);
        coalescer.written(status(0, "t0"));
        // The same status at a later time is not written again.
        assert!(!coalescer.differs(&status(0, "t1")));
        // A change is, once the interval since the last write has passed.
        assert!(coalescer.differs(&status(1, "t1")));
        assert_eq!(coalescer.wait(start), MIN_INTERVAL);
        assert_eq!(
            coalescer.wait(start + Duration::from_millis(500)),
            MIN_INTERVAL - Duration::from_millis(500)
        );
        assert_eq!(coalescer.wait(start + MIN_INTERVAL * 3), Duration::ZERO);
        // A failed write leaves the last written in place: the change is still to be written.
        coalescer.attempted(start + MIN_INTERVAL);
        assert!(coalescer.differs(&status(1, "t2")));
        coalescer.written(status(1, "t2"));
        assert!(!coalescer.differs(&status(1, "t3")));
        // Any field counts, not only the counts.
        let mut other = status(1, "t3");
        other.problems.push("link missing".into());
        assert!(coalescer.differs(&other));
    }

    #[test]
    fn lists_name_at_most_the_cap_and_count_all() {
        let pods: Vec<PodProblem> = (0..MAX_PODS_NAMED + 5)
            .map(|i| PodProblem {
                namespace: "shop".into(),
                name: format!("web-{i}"),
                reason: "no_cgroup".into(),
            })
            .collect();
        let (named, total) = capped(pods);
        assert_eq!(named.len(), MAX_PODS_NAMED);
        assert_eq!(total as usize, MAX_PODS_NAMED + 5);
        assert!(now_rfc3339().ends_with('Z') && now_rfc3339().len() == 20);
    }
}
