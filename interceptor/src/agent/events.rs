//! Kubernetes Events on the pods whose meshing the agent decided without their CNI ADD, so that
//! `kubectl describe pod` says what happened to them (events.k8s.io/v1, reporting controller
//! [`CONTROLLER`], instance the node's name), as linkerd-cni's repair controller and Istio's
//! `cni-repair` post theirs.
//!
//! Posting never holds anything up: each event goes into a bounded queue ([`QUEUE`]) that one
//! task empties, each post with its own deadline ([`POST_DEADLINE`]). A full queue drops the
//! event, and a post that fails or times out is given up; both are logged and counted in
//! `interceptor_events_failed_total{cause}`. The agent posts once per occurrence (a repair, a
//! pod given up on, a drift found), never on a timer; the recorder turns a repeat of the same
//! event on the same pod within minutes into one Event with a count.
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::mpsc::{self, error::TrySendError};
use tracing::{debug, warn};

use super::kube_pods::{KubePods, PodRef};

/// The Events' reporting controller.
pub const CONTROLLER: &str = "interceptor.linkerd.io/agent";

/// Events waiting to be posted, at most: beyond that (an API server that does not answer, a
/// node whose pods all drift at once) they are dropped, and counted.
const QUEUE: usize = 64;

/// How long one post may take.
const POST_DEADLINE: Duration = Duration::from_secs(5);

// The reasons name what happened to the pod, where linkerd-cni's `LinkerdCNINotConfigured`
// names a cause: our repair meshes the pod in place rather than deleting it, a pod is left
// unmeshed for one of several causes, and the note says which. They are stable: alerts and
// `kubectl get events --field-selector reason=...` select on them.

/// The pod started before the CNI plugin was chained and the agent meshed it in place.
pub const MESHED_IN_PLACE: &str = "MeshedInPlace";
/// The pod Linkerd injected runs without interception: the agent could not mesh it.
pub const NOT_MESHED: &str = "NotMeshed";
/// A meshed pod's interception is not what was written, and the agent could not put it back.
pub const INTERCEPTION_DRIFTED: &str = "InterceptionDrifted";

/// What happened to a pod.
#[derive(Clone, Debug)]
pub enum Occurrence {
    MeshedInPlace,
    NotMeshed { reason: String },
    InterceptionDrifted { problem: String },
}

impl Occurrence {
    fn event(&self) -> Event {
        let (type_, reason, action, note) = match self {
            Self::MeshedInPlace => (
                EventType::Normal,
                MESHED_IN_PLACE,
                "Mesh",
                "The pod started before the CNI plugin was chained into this node's network configuration, so it ran without interception; it is now meshed in place. Connections it opened before stay as they were (not through the proxy); every new one is intercepted.".to_owned(),
            ),
            Self::NotMeshed { reason } => (
                EventType::Warning,
                NOT_MESHED,
                "Mesh",
                format!(
                    "The pod started without the CNI plugin and runs without interception: {reason}. The agent keeps trying; deleting the pod starts it again through the plugin."
                ),
            ),
            Self::InterceptionDrifted { problem } => (
                EventType::Warning,
                INTERCEPTION_DRIFTED,
                "Check",
                format!(
                    "The pod's interception is not what the agent wrote, and it could not be put back: {problem}. Registering the pod again (or restarting it) writes it again."
                ),
            ),
        };
        Event {
            type_,
            reason: reason.to_owned(),
            note: Some(fit_note(note)),
            action: action.to_owned(),
            secondary: None,
        }
    }

    fn reason(&self) -> &'static str {
        match self {
            Self::MeshedInPlace => MESHED_IN_PLACE,
            Self::NotMeshed { .. } => NOT_MESHED,
            Self::InterceptionDrifted { .. } => INTERCEPTION_DRIFTED,
        }
    }
}

/// The API server refuses an Event whose note is longer than this (bytes).
const MAX_NOTE: usize = 1024;

/// `note`, cut to [`MAX_NOTE`] bytes at a character's boundary (a refusal's message can be
/// long).
fn fit_note(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut end = MAX_NOTE - '…'.len_utf8();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push('…');
    }
    note
}

type Labels = Vec<(String, String)>;

/// What became of the events, for `/metrics`.
#[derive(Clone, Default)]
pub struct EventMetrics {
    /// Posted, by reason.
    pub posted: Family<Labels, Counter>,
    /// Not posted, by cause: `queue_full`, `timeout`, `api`.
    pub failed: Family<Labels, Counter>,
}

impl EventMetrics {
    fn count(family: &Family<Labels, Counter>, label: &str, value: &str) {
        family
            .get_or_create(&vec![(label.to_owned(), value.to_owned())])
            .inc();
    }
}

/// Hands events to the task that posts them.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Occurrence)>,
    pub metrics: EventMetrics,
}

impl Events {
    /// Starts the task that posts events with `client`, as the agent of `node` (the instance;
    /// none without a node name).
    pub fn start(client: kube::Client, node: Option<String>) -> Self {
        let (queue, mut waiting) = mpsc::channel::<(ObjectReference, Occurrence)>(QUEUE);
        let metrics = EventMetrics::default();
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER.to_owned(),
                instance: node,
            },
        );
        let task_metrics = metrics.clone();
        tokio::spawn(async move {
            while let Some((pod, occurrence)) = waiting.recv().await {
                let event = occurrence.event();
                let name = pod.name.as_deref().unwrap_or_default();
                let namespace = pod.namespace.as_deref().unwrap_or_default();
                let cause = match tokio::time::timeout(
                    POST_DEADLINE,
                    recorder.publish(&event, &pod),
                )
                .await
                {
                    Ok(Ok(())) => {
                        debug!(namespace, name, reason = event.reason, "event posted");
                        EventMetrics::count(&task_metrics.posted, "reason", occurrence.reason());
                        continue;
                    }
                    Ok(Err(e)) => {
                        warn!(namespace, name, reason = event.reason, error = %e, "posting an event on the pod");
                        "api"
                    }
                    Err(_) => {
                        warn!(
                            namespace,
                            name,
                            reason = event.reason,
                            deadline_s = POST_DEADLINE.as_secs(),
                            "posting an event on the pod: no answer in time"
                        );
                        "timeout"
                    }
                };
                EventMetrics::count(&task_metrics.failed, "cause", cause);
            }
        });
        Self { queue, metrics }
    }

    /// The events of an agent reading the API through `kube`, as its node's; `None` without a
    /// client.
    pub fn for_pods(kube: &KubePods) -> Option<Self> {
        Some(Self::start(
            kube.client()?,
            kube.node_name().map(str::to_owned),
        ))
    }

    /// Queues an event on `pod`; never waits.
    pub fn post(&self, pod: &PodRef, occurrence: Occurrence) {
        let reference = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: Some(pod.uid.clone()).filter(|uid| !uid.is_empty()),
            ..ObjectReference::default()
        };
        match self.queue.try_send((reference, occurrence)) {
            Ok(()) => {}
            Err(TrySendError::Full((_, occurrence)) | TrySendError::Closed((_, occurrence))) => {
                warn!(pod = %pod, reason = occurrence.reason(), waiting = QUEUE, "event dropped: earlier ones are still waiting to be posted");
                EventMetrics::count(&self.metrics.failed, "cause", "queue_full");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_to_what_the_api_server_takes() {
        let short = "a".repeat(MAX_NOTE);
        assert_eq!(fit_note(short.clone()), short);
        let long = "é".repeat(MAX_NOTE);
        let cut = fit_note(long);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with('…'), "{}", cut.len());
        let event = Occurrence::NotMeshed {
            reason: "x".repeat(4 * MAX_NOTE),
        }
        .event();
        assert_eq!(event.reason, NOT_MESHED);
        assert!(event.note.unwrap().len() <= MAX_NOTE);
    }
}
