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

/// What the API answered about a DaemonSet.
#[derive(Debug, PartialEq, Eq)]
pub enum DaemonSetState {
    /// There, and not being deleted.
    Present,
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
        matches!(self, Self::Present | Self::Deleting | Self::Gone)
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
