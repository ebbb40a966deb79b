//! The agent's Prometheus endpoint (`--metrics-addr`): `/metrics` in the text format, rendered
//! from the kernel's counters at each scrape, and `/ready`, which answers once the programs are
//! attached and the pods restored (the server starts only then), and only while the agent can
//! mesh new pods: 503, with what is wrong, when a node link is missing or attached elsewhere
//! than `--cgroup`, or the CNI installer reports the plugin not chained (`--cni-chain-report`).
//! A pod whose interception drifted is that pod's problem, not the node's: it is in
//! `interceptor_pods_drifted`, `status`, an Event and the node's status, and `/ready` stays 200
//! (the DaemonSet's readiness is what `linkerd check` waits on).
use std::{net::SocketAddr, sync::Arc};

use anyhow::Context as _;
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::Shared;
use crate::{
    config::annotations::SkipReason,
    netns::{Dump, dump_failures as dump_failures_of, dump_messages_skipped},
};

type Labels = Vec<(String, String)>;

/// The agent's counters and histograms: each is atomic, so they are kept outside the agent's
/// lock and counted without it.
#[derive(Clone)]
pub struct AgentMetrics {
    pub registration_seconds: Histogram,
    /// Pods the CNI plugin let through unmeshed, by reason.
    pub pods_skipped: PodsSkipped,
    /// Registrations refused, by the API's error kind.
    pub registrations_refused: RegistrationsRefused,
    /// Times the CNI installer chained the plugin again after the primary CNI dropped it.
    pub cni_chain_restored: Counter,
    /// Pods checked against their namespaces, by trigger.
    pub pod_checks: PodChecks,
    /// What the repair of pods started without the CNI plugin did, when it is on.
    pub repairs: Option<Repairs>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self {
            registration_seconds: registration_histogram(),
            pods_skipped: PodsSkipped::default(),
            registrations_refused: RegistrationsRefused::default(),
            cni_chain_restored: Counter::default(),
            pod_checks: PodChecks::default(),
            repairs: None,
        }
    }
}

/// Registration latency buckets: 100 µs to about 1.6 s.
fn registration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 15,
    ))
}

/// Pods the CNI plugin let through unmeshed, by reason. The reasons come from the plugin: only
/// the known ones become labels, so a client cannot grow the series without bound.
#[derive(Clone, Default)]
pub struct PodsSkipped(Family<Labels, Counter>);

impl PodsSkipped {
    pub fn count(&self, reason: &str) {
        let known = SkipReason::ALL
            .into_iter()
            .map(SkipReason::label)
            .find(|label| *label == reason)
            .unwrap_or("other");
        self.0
            .get_or_create(&vec![("reason".to_owned(), known.to_owned())])
            .inc();
    }
}

/// Registrations (`pod add`, the CNI plugin's ADD) refused, by the API's error kind: a label
/// set as bounded as the kinds.
#[derive(Clone, Default)]
pub struct RegistrationsRefused(Family<Labels, Counter>);

impl RegistrationsRefused {
    pub fn count(&self, kind: super::api::ErrorKind) {
        let kind = serde_json::to_value(kind)
            .ok()
            .and_then(|kind| kind.as_str().map(str::to_owned))
            .unwrap_or_default();
        self.0.get_or_create(&vec![("kind".to_owned(), kind)]).inc();
    }
}

/// Pods checked against their namespace (gone, replaced, new addresses), by what asked for the
/// check: an event (`event`; `lost` when notifications were lost and every pod is checked) or
/// the safety sweep (`sweep`). At rest only the sweep checks pods, one at a time.
#[derive(Clone, Default)]
pub struct PodChecks(Family<Labels, Counter>);

impl PodChecks {
    pub fn count(&self, trigger: &'static str) {
        self.0
            .get_or_create(&vec![("trigger".to_owned(), trigger.to_owned())])
            .inc();
    }
}

/// What the repair of pods started without the CNI plugin did (see `repair`).
#[derive(Clone, Default)]
pub struct Repairs {
    pub repaired: Counter,
    /// Pods reported as not repairable (after their retries), by reason.
    failed: Family<Labels, Counter>,
}

impl Repairs {
    pub fn failed(&self, reason: &'static str) {
        self.failed
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }
}

/// Serves `/metrics`, `/ready` and `/live` on `addr` from a thread of its own.
pub fn serve(addr: SocketAddr, agent: Arc<Shared>) -> anyhow::Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("serving metrics on {addr}"))?;
    std::thread::spawn(move || {
        for request in server.incoming_requests() {
            let response = match request.url() {
                "/metrics" => {
                    let body = render(&agent);
                    tiny_http::Response::from_string(body).with_header(
                        tiny_http::Header::from_bytes(
                            "Content-Type",
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )
                        .expect("a valid header"),
                    )
                }
                "/ready" => {
                    let problems = super::lock(&agent).readiness();
                    if problems.is_empty() {
                        tiny_http::Response::from_string("ready\n")
                    } else {
                        let mut body = String::from("cannot mesh new pods:\n");
                        for problem in &problems {
                            body.push_str(&format!("- {problem}\n"));
                        }
                        tiny_http::Response::from_string(body).with_status_code(503)
                    }
                }
                // The liveness probe: answered once the agent's state can be locked, so an agent
                // stuck holding it (it would serve no registration either) is restarted, and
                // one that is merely not ready (a node link drifted, the plugin not chained) is
                // not.
                "/live" => {
                    drop(super::lock(&agent));
                    tiny_http::Response::from_string("live\n")
                }
                _ => tiny_http::Response::from_string("not found\n").with_status_code(404),
            };
            let _ = request.respond(response);
        }
    });
    Ok(())
}

/// The counter's direction and reason from its stable name (`outbound_exempt_proxy_uid` is
/// direction `outbound`, reason `exempt_proxy_uid`; `orig_dst_served` counts outbound).
fn direction_and_reason(name: &str) -> (&str, &str) {
    for direction in ["outbound", "inbound"] {
        if let Some(reason) = name
            .strip_prefix(direction)
            .and_then(|r| r.strip_prefix('_'))
        {
            return (direction, reason);
        }
    }
    ("outbound", name)
}

fn render(shared: &Shared) -> String {
    let agent = &*super::lock(shared);
    let counts = &shared.metrics;
    let mut registry = Registry::with_prefix("interceptor");
    let decisions = Family::<Labels, Counter>::default();
    for info in agent.all_info() {
        let pod = match (&info.meta.namespace, &info.meta.name) {
            (Some(ns), Some(name)) => vec![
                ("namespace".to_owned(), ns.clone()),
                ("pod".to_owned(), name.clone()),
            ],
            (None, Some(name)) => vec![("pod".to_owned(), name.clone())],
            _ => vec![("netns".to_owned(), info.netns.display().to_string())],
        };
        // Pods the iptables backend meshes have no counters: no series, rather than zeros.
        for (name, value) in info.counters.iter().flatten() {
            let (direction, reason) = direction_and_reason(name);
            let mut labels = pod.clone();
            labels.push(("direction".into(), direction.into()));
            labels.push(("reason".into(), reason.into()));
            decisions.get_or_create(&labels).inc_by(*value);
        }
    }
    registry.register(
        "decisions",
        "Connections decided per pod, direction and reason (from the kernel's per-CPU counters)",
        decisions,
    );
    let backend = agent.pods.kind().name();
    let info = Family::<Labels, Gauge<i64>>::default();
    info.get_or_create(&vec![("backend".to_owned(), backend.to_owned())])
        .set(1);
    registry.register(
        "backend_info",
        "The agent's interception backend: ebpf (the programs) or iptables (proxy-init's chains in each pod's namespace)",
        info,
    );
    // The series whose meaning depends on the backend carry it as a label.
    let by_backend = registry.sub_registry_with_label(("backend".into(), backend.into()));
    let pods = Gauge::<i64>::default();
    pods.set(agent.pods.len() as i64);
    by_backend.register("pods_registered", "Pods registered with this agent", pods);
    by_backend.register(
        "pod_registration_seconds",
        "Time from a pod add request to its interception being in force",
        counts.registration_seconds.clone(),
    );
    registry.register(
        "pod_registrations_refused",
        "Pod registrations refused, by the API's error kind (table_full: a map the kernel found full too; unavailable: a namespace that could not be read, a map update short of memory; internal: a pod record that could not be written, among others); each is logged with the pod and the reason",
        counts.registrations_refused.0.clone(),
    );
    registry.register(
        "cni_pods_skipped",
        "Pods the CNI plugin let through without meshing them, by reason",
        counts.pods_skipped.0.clone(),
    );
    if let Some(repairs) = &counts.repairs {
        registry.register(
            "pods_repaired",
            "Pods that started without the CNI plugin (not chained when their sandbox was created) and that the agent registered in place",
            repairs.repaired.clone(),
        );
        registry.register(
            "pods_repair_failed",
            "Pods that started without the CNI plugin and that the agent could not register after retrying, by reason (counted once per pod; it keeps trying)",
            repairs.failed.clone(),
        );
    }
    let drifted = Gauge::<i64>::default();
    drifted.set(agent.drifted_count() as i64);
    registry.register(
        "pods_drifted",
        "Registered pods whose interception the last check found not in force as configured (a link or entry not what was written), which the agent could not put back; `interceptor status` names them",
        drifted,
    );
    let not_meshed = Gauge::<i64>::default();
    not_meshed.set(shared.not_meshed().len() as i64);
    registry.register(
        "pods_not_meshed",
        "Pods Linkerd injected that started without the CNI plugin and that the agent could not mesh after retrying (it keeps trying)",
        not_meshed,
    );
    if let Some(events) = &agent.events {
        registry.register(
            "events_posted",
            "Kubernetes Events posted on pods, by reason (MeshedInPlace, NotMeshed, InterceptionDrifted)",
            events.metrics.posted.clone(),
        );
        registry.register(
            "events_failed",
            "Kubernetes Events not posted, by cause: queue_full (dropped: earlier ones still waiting), timeout, api (refused or failed)",
            events.metrics.failed.clone(),
        );
    }
    registry.register(
        "node_status_writes",
        "Writes of this node's status annotation on its Node, by result (written, failed)",
        agent.status_writes.0.clone(),
    );
    registry.register(
        "pod_checks",
        "Pods checked against their network namespace (gone, replaced, addresses changed), by trigger: event (a namespace removed, an address notification), lost (notifications were lost: every pod) sweep (the safety sweep, one pod at a time over --reconcile-ms) or unheard (every 2 s, the pods whose changes the agent cannot hear: no CAP_NET_BROADCAST, or a namespace without an id)",
        counts.pod_checks.0.clone(),
    );
    let dump_failures = Family::<Labels, Counter>::default();
    for what in Dump::ALL {
        dump_failures
            .get_or_create(&vec![("what".to_owned(), what.label().to_owned())])
            .inc_by(dump_failures_of(what));
    }
    registry.register(
        "netlink_dump_failures",
        "Netlink dumps of a pod's network namespace that failed, by what they read (addresses, routes): a registration refused as unavailable, a restore or check that kept what was in force",
        dump_failures,
    );
    let skipped = Counter::<u64>::default();
    skipped.inc_by(dump_messages_skipped());
    registry.register(
        "netlink_messages_skipped",
        "Messages of netlink dumps that did not parse (a kind or attribute this agent does not know) and were skipped",
        skipped,
    );
    registry.register(
        "cni_chain_restored",
        "Times the CNI installer chained the plugin again into the node's primary network configuration, which the primary CNI had rewritten without it (as the installer reported them)",
        counts.cni_chain_restored.clone(),
    );
    if let Some(kube) = &shared.kube {
        registry.register(
            "kubernetes_pod_lookups",
            "Pods looked up for the CNI plugin (their annotations when the runtime passed none; the control-plane label and init containers of every pod Linkerd injected), by where the answer came from (cache, api, failed)",
            kube.lookups(),
        );
    }
    if let Some(programs) = agent.pods.programs() {
        let fill = Family::<Labels, Gauge<i64>>::default();
        for (map, entries) in programs.map_entries() {
            fill.get_or_create(&vec![("map".to_owned(), map.to_owned())])
                .set(entries as i64);
        }
        registry.register(
            "map_entries",
            "Entries in the agent's maps (original destinations of connections whose proxy side has not closed, in their slots and in the LRU map behind them; connects in progress whose slot was taken, in the LRU map behind the slots; proxy listeners)",
            fill,
        );
    }
    let build = Family::<Labels, Gauge<i64>>::default();
    build.get_or_create(&build_labels()).set(1);
    registry.register(
        "build_info",
        "The agent's version (the release, docs/releasing.md) and the map layout it pins",
        build,
    );
    let mut out = String::new();
    let _ = encode(&mut out, &registry);
    out
}

/// `interceptor_build_info`'s labels: what an upgrade changes.
fn build_labels() -> Labels {
    vec![
        ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        (
            "map_layout".to_owned(),
            interceptor_common::MAP_LAYOUT_VERSION.to_string(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn build_info_names_the_release_and_map_layout() {
        let labels = super::build_labels();
        let label = |name: &str| {
            labels
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(label("version"), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(
            label("map_layout"),
            Some(interceptor_common::MAP_LAYOUT_VERSION.to_string().as_str())
        );
    }

    #[test]
    fn counter_names_split_into_direction_and_reason() {
        use super::direction_and_reason as split;
        assert_eq!(split("outbound_redirected"), ("outbound", "redirected"));
        assert_eq!(
            split("outbound_exempt_proxy_uid"),
            ("outbound", "exempt_proxy_uid")
        );
        assert_eq!(split("inbound_steered"), ("inbound", "steered"));
        assert_eq!(split("orig_dst_served"), ("outbound", "orig_dst_served"));
    }
}
