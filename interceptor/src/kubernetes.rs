//! The Kubernetes API, as the agent and the CNI installer use it: one way to build a client, and
//! what the API says of a DaemonSet (the installer asks about its own when it is told to stop).
use std::{fmt, path::Path, str::FromStr, time::Duration};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// A client from `kubeconfig`; without one, the pod's service account (in-cluster), else
/// `$KUBECONFIG` or `~/.kube/config`. Nothing is asked of the API yet.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("reading the kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("the kubeconfig {}: {e}", path.display()))?
        }
        None => Config::infer().await.map_err(|e| {
            format!("no in-cluster service account, $KUBECONFIG or ~/.kube/config: {e}")
        })?,
    };
    Client::try_from(config).map_err(|e| format!("a Kubernetes client: {e}"))
}

/// A DaemonSet, as `NAMESPACE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetRef {
    pub namespace: String,
    pub name: String,
}

impl FromStr for DaemonSetRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
        }
    }
}

impl fmt::Display for DaemonSetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The label that marks a DaemonSet as ours (the chart sets it on the DaemonSet's metadata).
/// `helm upgrade` to linkerd2-cni's chart keeps the DaemonSet's name but drops the label: the
/// pod being stopped is then replaced by linkerd-cni's, not by another of ours.
pub const OWN_LABEL: (&str, &str) = ("app.kubernetes.io/name", "interceptor");

/// What the API answered about a DaemonSet.
#[derive(Debug, PartialEq, Eq)]
pub enum DaemonSetState {
    /// There, ours, and not being deleted.
    Present,
    /// There, but no longer ours (no [`OWN_LABEL`]): another chart took the name over, as
    /// `helm upgrade linkerd2-cni linkerd/linkerd2-cni` does on the way back to linkerd-cni.
    Replaced,
    /// Being deleted: its `deletionTimestamp` is set (a foreground deletion waits for its pods).
    Deleting,
    /// Not there (`NotFound`).
    Gone,
    /// The API refused the credentials (401) or the access (403), saying why.
    Refused(String),
    /// No answer in time, or another error: the API's state is unknown.
    Unknown(String),
}

impl DaemonSetState {
    /// Whether the API answered about the DaemonSet itself.
    pub fn answered(&self) -> bool {
        matches!(
            self,
            Self::Present | Self::Replaced | Self::Deleting | Self::Gone
        )
    }
}

/// One GET of the DaemonSet, given up after `deadline`.
pub async fn daemonset_state(
    client: &Client,
    daemonset: &DaemonSetRef,
    deadline: Duration,
) -> DaemonSetState {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), &daemonset.namespace);
    match tokio::time::timeout(deadline, api.get(&daemonset.name)).await {
        Err(_) => DaemonSetState::Unknown(format!(
            "the Kubernetes API did not answer within {} s",
            deadline.as_secs()
        )),
        Ok(Ok(found)) if found.metadata.deletion_timestamp.is_some() => DaemonSetState::Deleting,
        Ok(Ok(found))
            if found
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(OWN_LABEL.0))
                .is_none_or(|value| value != OWN_LABEL.1) =>
        {
            DaemonSetState::Replaced
        }
        Ok(Ok(_)) => DaemonSetState::Present,
        // Only a NotFound that names the DaemonSet: a path the server does not serve is also a
        // NotFound, without details, and says nothing about it.
        Ok(Err(kube::Error::Api(status)))
            if status.is_not_found()
                && status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.kind == "daemonsets" && d.name == daemonset.name) =>
        {
            DaemonSetState::Gone
        }
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 401 | 403) => {
            DaemonSetState::Refused(format!(
                "{} {}: {}",
                status.code, status.reason, status.message
            ))
        }
        Ok(Err(e)) => DaemonSetState::Unknown(format!("the Kubernetes API: {e}")),
    }
}

/// Whether the API has answered about the DaemonSet since this process started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Confirmed,
    Unconfirmed,
}

/// What the end of this DaemonSet's pod means for the node, from the API's answer at that
/// moment.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The DaemonSet is going away or was replaced by another chart's: remove what this pod
    /// installed on the node, for the reason given.
    Removal(&'static str),
    /// This pod is being replaced by another of ours (a rolling update, the node shutting
    /// down): keep everything, the next pod takes over.
    Succession,
    /// The API cannot tell (no answer, or a refusal without a prior answer): keep everything,
    /// failing closed, and say why.
    Unknown(String),
}

/// Decides [`Ending`] from the DaemonSet's `state` at termination. A refusal (401 or 403) after
/// the API had answered counts as removal: the account or role was deleted with the DaemonSet
/// (`helm uninstall` and `kubectl delete -f` remove them together), which a rolling update never
/// does.
pub fn ending(state: DaemonSetState, access: Access) -> Ending {
    match state {
        DaemonSetState::Gone => Ending::Removal("the DaemonSet is gone"),
        DaemonSetState::Deleting => Ending::Removal("the DaemonSet is being deleted"),
        DaemonSetState::Replaced => Ending::Removal(
            "the DaemonSet is no longer ours (another chart, such as linkerd2-cni's, took it over)",
        ),
        DaemonSetState::Refused(_) if access == Access::Confirmed => {
            Ending::Removal("the access to the DaemonSet was withdrawn")
        }
        DaemonSetState::Present => Ending::Succession,
        DaemonSetState::Refused(e) | DaemonSetState::Unknown(e) => Ending::Unknown(e),
    }
}

/// [`ending`] from the DaemonSet's state now, asked within [`OWNER_DEADLINE`]. A refusal after
/// the API had answered is also logged: the pod's account or role was deleted with it.
pub async fn ending_now(client: &Client, daemonset: &DaemonSetRef, access: Access) -> Ending {
    let state = daemonset_state(client, daemonset, OWNER_DEADLINE).await;
    if let DaemonSetState::Refused(e) = &state
        && access == Access::Confirmed
    {
        tracing::warn!(%daemonset, error = %e, "the Kubernetes API no longer lets this pod read its DaemonSet, which it did before");
    }
    ending(state, access)
}

/// Asks the API for the DaemonSet until it answers once (with backoff, up to a minute apart),
/// logging what a termination would then do to `what` ("the CNI plugin", "the pinned programs
/// and maps"). Its return confirms [`Access`].
pub async fn confirm_access(client: &Client, daemonset: &DaemonSetRef, what: &str) {
    let mut delay = Duration::from_secs(1);
    loop {
        let state = daemonset_state(client, daemonset, OWNER_DEADLINE).await;
        match &state {
            DaemonSetState::Present => tracing::info!(
                %daemonset,
                "DaemonSet found: on termination {what} stays unless the DaemonSet is being deleted, gone or taken over by another chart"
            ),
            DaemonSetState::Replaced | DaemonSetState::Deleting | DaemonSetState::Gone => {
                tracing::warn!(
                    %daemonset, state = ?state,
                    "DaemonSet not found, being deleted or not ours: on termination {what} is removed"
                )
            }
            DaemonSetState::Refused(e) => tracing::error!(
                %daemonset, error = %e,
                "the Kubernetes API refuses this pod its DaemonSet (it needs get on daemonsets, for this name): on termination {what} would stay; retrying"
            ),
            DaemonSetState::Unknown(e) => {
                tracing::warn!(%daemonset, error = %e, "reading the DaemonSet; retrying")
            }
        }
        if state.answered() {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(60));
    }
}

/// How long the API may take to answer for the DaemonSet: the pod's grace period is 10 s.
pub const OWNER_DEADLINE: Duration = Duration::from_secs(5);

/// The DaemonSet a process of ours runs in, and whether the API has answered about it since the
/// process started: the one decision, for the agent and the CNI installer alike (Istio's CNI
/// agent asks the same question), of whether a termination is the DaemonSet going or this pod
/// being replaced. Both containers of the pod come to the same answer.
pub struct Owner {
    daemonset: DaemonSetRef,
    client: Client,
    confirmed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a process says of what it installed on the node, at termination.
pub struct Installed {
    /// What it installed, for the log ("the CNI plugin", "the pinned programs and maps").
    pub what: &'static str,
    /// What stays for the next pod when this one is being replaced.
    pub kept: &'static str,
    /// What stays, and what an operator does, when the API cannot tell.
    pub unknown: &'static str,
}

impl Owner {
    /// A client for the API, and a task on the current runtime asking it for the DaemonSet
    /// until it answers once (then a refusal at termination means access was withdrawn, not
    /// never granted). A kubeconfig that cannot be read is refused now.
    pub async fn start(
        daemonset: DaemonSetRef,
        kubeconfig: Option<&Path>,
        installed: &Installed,
    ) -> Result<Self, String> {
        let client = client(kubeconfig)
            .await
            .map_err(|e| format!("--daemonset {daemonset}: {e}"))?;
        let confirmed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (task_client, task_daemonset, task_confirmed, what) = (
            client.clone(),
            daemonset.clone(),
            confirmed.clone(),
            installed.what,
        );
        tokio::spawn(async move {
            confirm_access(&task_client, &task_daemonset, what).await;
            task_confirmed.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        Ok(Self {
            daemonset,
            client,
            confirmed,
        })
    }

    pub fn daemonset(&self) -> &DaemonSetRef {
        &self.daemonset
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Why what was installed is to be removed now, or `None` to keep it; says which in the log.
    pub async fn removal_reason(&self, installed: &Installed) -> Option<&'static str> {
        let access = if self.confirmed.load(std::sync::atomic::Ordering::Relaxed) {
            Access::Confirmed
        } else {
            Access::Unconfirmed
        };
        let daemonset = &self.daemonset;
        match ending_now(&self.client, daemonset, access).await {
            Ending::Removal(reason) => Some(reason),
            Ending::Succession => {
                tracing::info!(%daemonset, "the DaemonSet remains: this pod is being replaced (a rolling update, the node shutting down); {}", installed.kept);
                None
            }
            // Fail closed: what was installed stays; an operator can remove it by hand.
            Ending::Unknown(e) => {
                tracing::error!(%daemonset, error = %e, "cannot tell whether the DaemonSet is being deleted: {}", installed.unknown);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_successor_keeps_the_node_as_it_is() {
        use Access::*;
        assert_eq!(
            ending(DaemonSetState::Present, Confirmed),
            Ending::Succession
        );
        for state in [
            DaemonSetState::Gone,
            DaemonSetState::Deleting,
            DaemonSetState::Replaced,
        ] {
            assert!(matches!(ending(state, Unconfirmed), Ending::Removal(_)));
        }
        assert!(matches!(
            ending(DaemonSetState::Refused("403".into()), Confirmed),
            Ending::Removal(_)
        ));
        // Never answered: the role may never have been granted, so nothing says it was deleted.
        assert!(matches!(
            ending(DaemonSetState::Refused("403".into()), Unconfirmed),
            Ending::Unknown(_)
        ));
        assert!(matches!(
            ending(DaemonSetState::Unknown("timeout".into()), Confirmed),
            Ending::Unknown(_)
        ));
    }
}
