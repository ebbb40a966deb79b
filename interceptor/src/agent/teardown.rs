//! The agent's end when its DaemonSet goes (`--daemonset`): `helm uninstall`, or `helm upgrade`
//! back to linkerd2-cni's chart. It then removes what it installed on the node, as `interceptor
//! uninstall` would, so that the node is left with no pinned program or map; while the DaemonSet
//! is still ours (a rolling update, the node shutting down), everything stays pinned for the next
//! agent.
//!
//! This is the decision Istio's CNI agent makes on the same question (is this pod being replaced
//! by another of the same DaemonSet, or is the DaemonSet going?), read from the API the same way
//! the CNI installer reads it beside us: both containers of the pod come to the same answer.
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use anyhow::Context as _;
use tracing::{error, info};

use super::{AgentPaths, kube_pods::KubeOptions};
use crate::kubernetes::{self, Access, DaemonSetRef, Ending};

/// What the agent removes or keeps on termination, in the log's words.
const INSTALLED: &str = "the pinned programs and maps";

/// The agent's DaemonSet, and whether the API has answered about it since the agent started.
pub struct Owner {
    daemonset: DaemonSetRef,
    client: kube::Client,
    confirmed: Arc<AtomicBool>,
    /// The agent's node, whose status annotation goes with the agent.
    node: Option<String>,
}

impl Owner {
    /// A client for the API, and a task asking it for the DaemonSet until it answers once.
    pub async fn start(daemonset: DaemonSetRef, kube: &KubeOptions) -> anyhow::Result<Self> {
        let client = kubernetes::client(kube.kubeconfig.as_deref())
            .await
            .map_err(|e| anyhow::anyhow!("--daemonset {daemonset}: {e}"))?;
        let confirmed = Arc::new(AtomicBool::new(false));
        let (task_client, task_daemonset, task_confirmed) =
            (client.clone(), daemonset.clone(), confirmed.clone());
        tokio::spawn(async move {
            kubernetes::confirm_access(&task_client, &task_daemonset, INSTALLED).await;
            task_confirmed.store(true, Ordering::Relaxed);
        });
        Ok(Self {
            daemonset,
            client,
            confirmed,
            node: kube.node_name.clone(),
        })
    }

    /// Why the agent is to remove what it installed, or `None` to leave it; says which.
    pub async fn removal_reason(&self) -> Option<&'static str> {
        let access = if self.confirmed.load(Ordering::Relaxed) {
            Access::Confirmed
        } else {
            Access::Unconfirmed
        };
        let daemonset = &self.daemonset;
        match kubernetes::ending_now(&self.client, daemonset, access).await {
            Ending::Removal(reason) => Some(reason),
            Ending::Succession => {
                info!(%daemonset, "the DaemonSet remains: this pod is being replaced; the programs and maps stay pinned for the next agent");
                None
            }
            Ending::Unknown(e) => {
                error!(
                    %daemonset, error = %e,
                    "cannot tell whether the DaemonSet is being deleted: the programs and maps stay pinned (the pods meshed so far stay intercepted); if it was deleted, run `interceptor uninstall` on this node"
                );
                None
            }
        }
    }

    /// Removes the agent's status annotation from its Node (best effort, within the deadline):
    /// nothing of the agent is left on a node it was removed from.
    pub async fn forget_node_status(&self) {
        if let Some(node) = &self.node {
            super::kube_node::forget(self.client.clone(), node).await;
        }
    }
}

/// Removes the agent's pins, records and the chains it wrote, as `interceptor uninstall` does.
/// The programs detach when this process, which holds the last references, exits right after.
pub fn remove_from_node(paths: &AgentPaths, reason: &'static str) -> anyhow::Result<()> {
    let removed = super::uninstall(paths)
        .with_context(|| format!("removing the agent from the node ({reason})"))?;
    info!(
        reason,
        removed = removed.len(),
        "the DaemonSet is going: programs detached, pins, records and chains removed; the pods meshed so far are no longer intercepted"
    );
    Ok(())
}
