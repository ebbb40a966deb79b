//! The checks, in the order they run, each concluding from what was read ([`Cluster`]).
//!
//! A node's agent status (`interceptor_api::node_status`) is trusted only while the agent's pod
//! is ready: the agent writes it when something changes, so a stopped agent leaves its last
//! words there. A node whose agent is not ready is an error where the question is whether the
//! node can mesh pods, and unknown (a warning) in the checks of what its agent reported.
use std::collections::{BTreeMap, BTreeSet};

use interceptor_api::node_status::{NODE_STATUS_ANNOTATION, NodeStatus, PodProblem};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};

use super::{
    CATEGORY, CheckResult, DAEMONSET, EXTENSION, EXTENSION_LABEL, NAMESPACE_ANNOTATIONS,
    NAMESPACE_LABELS, Outcome, Severity, cluster::Cluster, scheduling,
};
use crate::kubernetes::OWN_LABEL;

/// At most this many problems are named in a check's error; the rest are counted.
pub const MAX_NAMED: usize = 10;

/// The init container Linkerd injects in CNI mode (`linkerd-network-validator`): it exits 95
/// when the pod's outbound traffic is not redirected to the proxy.
pub const VALIDATOR: &str = "linkerd-network-validator";

/// One check.
pub struct Check {
    pub description: &'static str,
    /// What to do when it fails, in words that stand on their own: Linkerd prints it as "see
    /// <hint> for hints" to someone who may hold only the binary. `{namespace}` is replaced by
    /// the namespace checked.
    pub hint: &'static str,
    /// A failure ends the run: the checks after it would have nothing to read.
    pub fatal: bool,
    /// An error is tried again until `--wait` runs out: it clears as pods become ready.
    pub retry: bool,
    run: fn(&Cluster) -> Verdict,
}

/// What a check concluded: on success, lines of what it found.
enum Verdict {
    Success(Vec<String>),
    Failure(Severity, String),
}

impl Check {
    pub fn evaluate(&self, cluster: &Cluster) -> CheckResult {
        let (description, outcome) = match (self.run)(cluster) {
            Verdict::Success(found) => (
                std::iter::once(self.description.to_owned())
                    .chain(found.iter().map(|line| format!("\t* {line}")))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Outcome::Success,
            ),
            Verdict::Failure(severity, message) => (
                self.description.to_owned(),
                Outcome::Failure { severity, message },
            ),
        };
        CheckResult {
            category: CATEGORY,
            description,
            hint: self.hint.replace("{namespace}", &cluster.namespace),
            outcome,
        }
    }
}

pub const CHECKS: &[Check] = &[
    Check {
        description: "interceptor's DaemonSet (linkerd-cni) exists",
        hint: "the DaemonSet: `kubectl -n {namespace} get daemonset linkerd-cni --show-labels`; \
               missing, install interceptor's chart in {namespace} (or pass --cni-namespace where it \
               is); linkerd-cni's, remove the namespace's linkerd.io/extension label",
        fatal: true,
        retry: false,
        run: daemonset_exists,
    },
    Check {
        description: "interceptor's namespace is labelled for Linkerd",
        hint: "the namespace's labels: `kubectl get namespace {namespace} --show-labels`; \
               `interceptor namespace-metadata --namespace {namespace}` (the chart's hook Job) \
               gives it what is missing",
        fatal: false,
        retry: false,
        run: namespace_labelled,
    },
    Check {
        description: "agent pod is ready on every node",
        hint: "the agent's log: `kubectl -n {namespace} logs <pod> -c agent` (and -c \
               install-cni); a node whose agent is not ready cannot mesh new pods",
        fatal: false,
        retry: true,
        run: agents_ready,
    },
    Check {
        description: "every node's agent can mesh pods",
        hint: "the agent's log on that node: `kubectl -n {namespace} logs <pod> -c \
               agent`, and `interceptor status` on the node",
        fatal: false,
        retry: false,
        run: agents_can_mesh,
    },
    Check {
        description: "CNI plugin is chained on every node",
        hint: "the install-cni container's log: `kubectl -n {namespace} logs <pod> -c \
               install-cni`; usually destCNIBinDir or destCNINetDir is not where the node's CNI \
               configuration is",
        fatal: false,
        retry: false,
        run: cni_chained,
    },
    Check {
        description: "every injected pod is meshed",
        hint: "the pod's Events (`kubectl describe pod`, reason NotMeshed); deleting \
               the pod starts it again through the plugin, meshed",
        fatal: false,
        retry: false,
        run: pods_meshed,
    },
    Check {
        description: "no meshed pod's interception has drifted",
        hint: "the pod's Events (`kubectl describe pod`, reason \
               InterceptionDrifted) and `interceptor status` on its node; deleting the pod starts \
               it again with its interception as configured",
        fatal: false,
        retry: false,
        run: pods_not_drifted,
    },
];

/// Problems found by a check, each an error or a warning; at most [`MAX_NAMED`] are named.
#[derive(Default)]
struct Findings {
    items: Vec<(Severity, String)>,
    /// Errors counted but not named (beyond what a node's status names).
    unnamed: u64,
}

impl Findings {
    fn error(&mut self, item: String) {
        self.items.push((Severity::Error, item));
    }

    fn warning(&mut self, item: String) {
        self.items.push((Severity::Warning, item));
    }

    /// Success with `found`, or a failure: `summary(errors, warnings)` then each item, errors
    /// first.
    fn verdict(mut self, found: Vec<String>, summary: impl FnOnce(u64, u64) -> String) -> Verdict {
        if self.items.is_empty() && self.unnamed == 0 {
            return Verdict::Success(found);
        }
        self.items
            .sort_by_key(|(severity, _)| std::cmp::Reverse(*severity));
        let count = |severity| self.items.iter().filter(|(s, _)| *s == severity).count() as u64;
        let (errors, warnings) = (
            count(Severity::Error) + self.unnamed,
            count(Severity::Warning),
        );
        let severity = if errors > 0 {
            Severity::Error
        } else {
            Severity::Warning
        };
        let mut message = summary(errors, warnings);
        for (_, item) in self.items.iter().take(MAX_NAMED) {
            message.push_str(&format!("\n\t* {item}"));
        }
        let more = (self.items.len().saturating_sub(MAX_NAMED)) as u64 + self.unnamed;
        if more > 0 {
            message.push_str(&format!("\n\t* and {more} more"));
        }
        Verdict::Failure(severity, message)
    }
}

/// `n thing` or `n things`.
fn count(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

fn daemonset_exists(cluster: &Cluster) -> Verdict {
    let namespace = &cluster.namespace;
    let daemonset = match &cluster.daemonset {
        Err(e) => return Verdict::Failure(Severity::Error, e.clone()),
        Ok(None) => {
            let mut message = format!("missing DaemonSet: {DAEMONSET} (namespace {namespace})");
            if matches!(cluster.namespace_object, Ok(None)) {
                message.push_str(&format!(
                    "; the namespace {namespace} does not exist either"
                ));
            }
            return Verdict::Failure(Severity::Error, message);
        }
        Ok(Some(daemonset)) => daemonset,
    };
    let ours = daemonset
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(OWN_LABEL.0))
        .is_some_and(|value| value == OWN_LABEL.1);
    if !ours {
        return Verdict::Failure(
            Severity::Error,
            format!(
                "DaemonSet {DAEMONSET} in {namespace} is not interceptor's (no label {}={}): \
                 linkerd-cni itself runs there; if interceptor was removed, remove the \
                 namespace's label too: kubectl label namespace {namespace} {EXTENSION_LABEL}-",
                OWN_LABEL.0, OWN_LABEL.1
            ),
        );
    }
    if daemonset.metadata.deletion_timestamp.is_some() {
        return Verdict::Failure(
            Severity::Error,
            format!("DaemonSet {DAEMONSET} in {namespace} is being deleted"),
        );
    }
    Verdict::Success(Vec::new())
}

fn namespace_labelled(cluster: &Cluster) -> Verdict {
    let namespace = &cluster.namespace;
    let mut findings = Findings::default();
    match &cluster.namespace_object {
        Err(e) => findings.warning(e.clone()),
        Ok(None) => findings.warning(format!("namespace {namespace} not found")),
        Ok(Some(object)) => {
            let meta = &object.metadata;
            for (map, what, expected) in [
                (&meta.labels, "label", NAMESPACE_LABELS),
                (&meta.annotations, "annotation", NAMESPACE_ANNOTATIONS),
            ] {
                for (key, value, why) in expected {
                    let found = map.as_ref().and_then(|m| m.get(*key));
                    if found.is_none_or(|v| v != value) {
                        let found = found.map_or("missing".to_owned(), |v| format!("{v:?}"));
                        findings.warning(format!("{what} {key}={value} is {found} ({why})"));
                    }
                }
            }
        }
    }
    if cluster.labelled_namespaces.len() > 1 {
        findings.warning(format!(
            "the label {EXTENSION_LABEL}={EXTENSION} is on several namespaces ({}): this one was \
             checked",
            cluster.labelled_namespaces.join(", ")
        ));
    }
    findings.verdict(Vec::new(), |_, _| {
        format!(
            "namespace {namespace} lacks what `interceptor namespace-metadata` (the chart's hook) \
             gives it"
        )
    })
}

/// A node the DaemonSet should run on, its agent and what the agent last published.
struct NodeView<'a> {
    name: &'a str,
    node_ready: bool,
    agent: Agent<'a>,
    status: Published,
}

enum Agent<'a> {
    Ready,
    NotReady(&'a Pod),
    Missing,
}

enum Published {
    Status(Box<NodeStatus>),
    Unreadable(String),
    Absent,
}

impl NodeView<'_> {
    /// The agent's status, only while its pod is ready.
    fn trusted(&self) -> Option<&NodeStatus> {
        match (&self.agent, &self.status) {
            (Agent::Ready, Published::Status(status)) => Some(status),
            _ => None,
        }
    }

    fn agent_ready(&self) -> bool {
        matches!(self.agent, Agent::Ready)
    }
}

fn condition_true(conditions: Option<&[impl Condition]>, kind: &str) -> bool {
    conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.kind() == kind && c.status() == "True")
}

/// Pod and node conditions alike.
trait Condition {
    fn kind(&self) -> &str;
    fn status(&self) -> &str;
}

impl Condition for k8s_openapi::api::core::v1::PodCondition {
    fn kind(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}

impl Condition for k8s_openapi::api::core::v1::NodeCondition {
    fn kind(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}

fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && condition_true(
            pod.status.as_ref().and_then(|s| s.conditions.as_deref()),
            "Ready",
        )
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The nodes the DaemonSet should run on (by its template, or because it has a pod there),
/// with their agents; an error when what they need could not be read.
fn node_views(cluster: &Cluster) -> Result<Vec<NodeView<'_>>, String> {
    let daemonset = match &cluster.daemonset {
        Ok(Some(daemonset)) => daemonset,
        Ok(None) => return Err(format!("missing DaemonSet: {DAEMONSET}")),
        Err(e) => return Err(e.clone()),
    };
    let nodes = cluster.nodes.as_ref().map_err(Clone::clone)?;
    let agents = cluster.agents.as_ref().map_err(Clone::clone)?;
    let template: Option<&PodSpec> = daemonset
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref());
    let mut views = Vec::new();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let here: Vec<&Pod> = agents
            .iter()
            .filter(|pod| node_of(pod) == Some(name))
            .collect();
        if here.is_empty() && !template.is_some_and(|t| scheduling::should_run(t, node)) {
            continue;
        }
        let agent = if here.iter().any(|pod| pod_ready(pod)) {
            Agent::Ready
        } else {
            // The pod not being deleted, if there is one.
            here.iter()
                .find(|pod| pod.metadata.deletion_timestamp.is_none())
                .or(here.first())
                .map_or(Agent::Missing, |pod| Agent::NotReady(pod))
        };
        views.push(NodeView {
            name,
            node_ready: condition_true(
                node.status.as_ref().and_then(|s| s.conditions.as_deref()),
                "Ready",
            ),
            agent,
            status: published(node),
        });
    }
    Ok(views)
}

fn published(node: &Node) -> Published {
    match node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_STATUS_ANNOTATION))
    {
        None => Published::Absent,
        Some(json) => match serde_json::from_str(json) {
            Ok(status) => Published::Status(Box::new(status)),
            Err(e) => Published::Unreadable(e.to_string()),
        },
    }
}

/// Why a pod is not ready, in a few words.
fn why_not_ready(pod: &Pod, node_ready: bool) -> String {
    let mut reasons = Vec::new();
    if !node_ready {
        reasons.push("the node is not ready".to_owned());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        reasons.push("being deleted".to_owned());
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    if phase != "Running" {
        reasons.push(format!("phase {phase}"));
    }
    let containers = status
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .filter(|c| !c.ready);
    for container in containers {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = waiting.reason.as_deref().unwrap_or("waiting");
            reasons.push(format!("container {}: {reason}", container.name));
        } else if let Some(terminated) = state.and_then(|s| s.terminated.as_ref()) {
            if terminated.exit_code != 0 {
                reasons.push(format!(
                    "container {}: exited {}",
                    container.name, terminated.exit_code
                ));
            }
        } else if state.is_some_and(|s| s.running.is_some()) {
            reasons.push(format!("container {}: running, not ready", container.name));
        }
    }
    if reasons.is_empty() {
        reasons.push("not ready".to_owned());
    }
    reasons.join(", ")
}

fn agents_ready(cluster: &Cluster) -> Verdict {
    let views = match node_views(cluster) {
        Ok(views) => views,
        Err(e) => return Verdict::Failure(Severity::Error, e),
    };
    let nodes = views.len() as u64;
    if views.is_empty() {
        return Verdict::Failure(
            Severity::Error,
            "the DaemonSet runs on no node: its node selector, affinity or tolerations match none"
                .to_owned(),
        );
    }
    let mut findings = Findings::default();
    for view in &views {
        match view.agent {
            Agent::Ready => {}
            Agent::NotReady(pod) => findings.error(format!(
                "{}: pod {} is not ready ({})",
                view.name,
                pod.metadata.name.as_deref().unwrap_or_default(),
                why_not_ready(pod, view.node_ready)
            )),
            Agent::Missing => findings.error(format!(
                "{}: no agent pod{}",
                view.name,
                if view.node_ready {
                    ""
                } else {
                    " (the node is not ready)"
                }
            )),
        }
    }
    // What the controller counts, in case a node escaped the reckoning above.
    let status = cluster
        .daemonset
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .and_then(|d| d.status.as_ref());
    if let Some(status) = status
        && findings.items.is_empty()
        && status.number_ready < status.desired_number_scheduled
    {
        findings.error(format!(
            "the DaemonSet's status: {} of {} pods ready",
            status.number_ready, status.desired_number_scheduled
        ));
    }
    let not_ready = findings.items.len() as u64;
    findings.verdict(Vec::new(), |_, _| {
        format!(
            "{} of {} without a ready agent: pods Linkerd injects there wait until one is",
            not_ready.min(nodes),
            count(nodes, "node")
        )
    })
}

/// `ebpf (connect4=icpt_connect4, ...)`, `iptables`.
fn mechanism(status: &NodeStatus) -> String {
    if status.variants.is_empty() {
        status.backend.name().to_owned()
    } else {
        format!("{} ({})", status.backend.name(), status.variants.join(", "))
    }
}

/// At most [`MAX_NAMED`] names, then how many more.
fn names(names: &[&str]) -> String {
    let mut listed = names
        .iter()
        .take(MAX_NAMED)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_NAMED {
        listed.push_str(&format!(" and {} more", names.len() - MAX_NAMED));
    }
    listed
}

/// What a published status said, for a node where it is not trusted.
fn last_words(status: &Published) -> String {
    match status {
        Published::Status(s) => format!(
            "; it last said at {}: {}, {}",
            s.updated,
            if s.can_mesh {
                "can mesh"
            } else {
                "cannot mesh"
            },
            s.backend.name()
        ),
        Published::Unreadable(_) | Published::Absent => String::new(),
    }
}

fn agents_can_mesh(cluster: &Cluster) -> Verdict {
    let views = match node_views(cluster) {
        Ok(views) => views,
        Err(e) => return Verdict::Failure(Severity::Error, e),
    };
    let mut findings = Findings::default();
    // Nodes by what meshes their pods, for the success's lines.
    let mut by_mechanism: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for view in &views {
        match (&view.agent, &view.status) {
            (Agent::Ready, Published::Status(status)) if status.can_mesh => {
                by_mechanism
                    .entry(format!(
                        "{}, interceptor {}",
                        mechanism(status),
                        status.version
                    ))
                    .or_default()
                    .push(view.name);
            }
            (Agent::Ready, Published::Status(status)) => findings.error(format!(
                "{}: its agent cannot mesh pods: {}",
                view.name,
                if status.problems.is_empty() {
                    "it gives no reason".to_owned()
                } else {
                    status.problems.join("; ")
                }
            )),
            (Agent::Ready, Published::Absent) => findings.warning(format!(
                "{}: its agent is ready but publishes no status (annotation {NODE_STATUS_ANNOTATION}): \
                 an older agent, or one its role does not let patch its node",
                view.name
            )),
            (Agent::Ready, Published::Unreadable(e)) => findings.warning(format!(
                "{}: its status (annotation {NODE_STATUS_ANNOTATION}) does not parse: {e}",
                view.name
            )),
            (Agent::NotReady(_) | Agent::Missing, status) => findings.error(format!(
                "{}: its agent is not ready, so its last status is not trusted{}",
                view.name,
                last_words(status)
            )),
        }
    }
    let found = by_mechanism
        .iter()
        .map(|(how, nodes)| format!("{}: {how}", names(nodes)))
        .collect();
    findings.verdict(found, |errors, warnings| {
        if errors > 0 {
            format!("{} cannot be shown to mesh pods", count(errors, "node"))
        } else {
            format!(
                "{} with an agent status that cannot be read",
                count(warnings, "node")
            )
        }
    })
}

fn cni_chained(cluster: &Cluster) -> Verdict {
    let views = match node_views(cluster) {
        Ok(views) => views,
        Err(e) => return Verdict::Failure(Severity::Error, e),
    };
    let mut findings = Findings::default();
    for view in &views {
        match view.trusted() {
            Some(status) => match status.chained {
                Some(true) => {}
                Some(false) => findings.error(format!(
                    "{}: the CNI plugin is not in the node's primary network configuration: pods \
                     started there are not meshed by it",
                    view.name
                )),
                None => findings.warning(format!(
                    "{}: the installer has not reported whether the plugin is chained",
                    view.name
                )),
            },
            None if view.agent_ready() => findings.warning(format!(
                "{}: not known, its agent publishes no readable status",
                view.name
            )),
            None => findings.warning(format!("{}: not known, its agent is not ready", view.name)),
        }
    }
    findings.verdict(Vec::new(), |errors, warnings| {
        if errors > 0 {
            format!("the CNI plugin is not chained on {}", count(errors, "node"))
        } else {
            format!("not known on {}", count(warnings, "node"))
        }
    })
}

/// The validator's failure: its exit code, when it ended non-zero (and is not running again).
pub fn validator_failure(pod: &Pod) -> Option<i32> {
    let status = pod
        .status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == VALIDATOR)?;
    let state = status.state.as_ref()?;
    if let Some(terminated) = &state.terminated {
        return (terminated.exit_code != 0).then_some(terminated.exit_code);
    }
    // Waiting to be restarted (CrashLoopBackOff): how its last run ended.
    if state.waiting.is_some() {
        let last = status.last_state.as_ref()?.terminated.as_ref()?;
        return (last.exit_code != 0).then_some(last.exit_code);
    }
    None
}

/// A pod named in a node's status, if the pods' namespace (when given) is its.
fn in_scope(cluster: &Cluster, namespace: &str) -> bool {
    cluster
        .pods_namespace
        .as_deref()
        .is_none_or(|ns| ns == namespace)
}

fn named(problem: &PodProblem, node: &str) -> String {
    format!(
        "{}/{} on {node}: {}",
        problem.namespace, problem.name, problem.reason
    )
}

fn pods_meshed(cluster: &Cluster) -> Verdict {
    let views = match node_views(cluster) {
        Ok(views) => views,
        Err(e) => return Verdict::Failure(Severity::Error, e),
    };
    let mut findings = Findings::default();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for view in &views {
        let Some(status) = view.trusted() else {
            continue;
        };
        let listed: Vec<&PodProblem> = status
            .not_meshed
            .iter()
            .filter(|p| in_scope(cluster, &p.namespace))
            .collect();
        for problem in &listed {
            seen.insert(format!("{}/{}", problem.namespace, problem.name));
            findings.error(named(problem, view.name));
        }
        // Named only up to the status' limit; the rest counted, unless only one namespace's
        // pods are asked for (the count does not say whose they are).
        if cluster.pods_namespace.is_none() {
            findings.unnamed +=
                u64::from(status.not_meshed_total).saturating_sub(status.not_meshed.len() as u64);
        }
    }
    match &cluster.injected {
        Err(e) => findings.error(e.clone()),
        Ok(pods) => {
            let agent_ready: BTreeMap<&str, bool> =
                views.iter().map(|v| (v.name, v.agent_ready())).collect();
            for pod in pods {
                let status = pod.status.as_ref();
                let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or_default();
                let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
                if pod.metadata.deletion_timestamp.is_some()
                    || host_network
                    || matches!(phase, "Succeeded" | "Failed")
                {
                    continue;
                }
                let name = pod_name(pod);
                if seen.contains(&name) {
                    continue;
                }
                let node = node_of(pod).unwrap_or("no node");
                if let Some(code) = validator_failure(pod) {
                    let meaning = if code == 95 {
                        " (its traffic is not redirected to the proxy)"
                    } else {
                        ""
                    };
                    let covered = if agent_ready.contains_key(node) {
                        ""
                    } else {
                        ", a node interceptor does not run on"
                    };
                    findings.error(format!(
                        "{name} on {node}{covered}: {VALIDATOR} exited {code}{meaning}"
                    ));
                } else if phase == "Running" && agent_ready.get(node) == Some(&false) {
                    findings.warning(format!(
                        "{name} on {node}: running while the node's agent is not ready: not verified"
                    ));
                }
            }
        }
    }
    findings.verdict(Vec::new(), |errors, warnings| {
        let mut summary = Vec::new();
        if errors > 0 {
            summary.push(format!(
                "{} Linkerd injected not meshed",
                count(errors, "pod")
            ));
        }
        if warnings > 0 {
            summary.push(format!("{} not verified", count(warnings, "pod")));
        }
        summary.join(", ")
    })
}

fn pods_not_drifted(cluster: &Cluster) -> Verdict {
    let views = match node_views(cluster) {
        Ok(views) => views,
        Err(e) => return Verdict::Failure(Severity::Error, e),
    };
    let mut findings = Findings::default();
    for view in &views {
        let Some(status) = view.trusted() else {
            findings.warning(format!(
                "{}: not known, its agent {}",
                view.name,
                if view.agent_ready() {
                    "publishes no readable status"
                } else {
                    "is not ready"
                }
            ));
            continue;
        };
        for problem in status
            .drifted
            .iter()
            .filter(|p| in_scope(cluster, &p.namespace))
        {
            findings.error(named(problem, view.name));
        }
        if cluster.pods_namespace.is_none() {
            findings.unnamed +=
                u64::from(status.drifted_total).saturating_sub(status.drifted.len() as u64);
        }
    }
    findings.verdict(Vec::new(), |errors, warnings| {
        if errors > 0 {
            format!(
                "{} whose interception is not as configured (the agent could not repair it)",
                count(errors, "pod")
            )
        } else {
            format!("not known on {}", count(warnings, "node"))
        }
    })
}
