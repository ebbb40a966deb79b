//! The agent's end when its DaemonSet goes (`--daemonset`): `helm uninstall`, or `helm upgrade`
//! back to linkerd2-cni's chart. It then removes what it installed on the node, as `interceptor
//! uninstall` would, so that the node is left with no pinned program or map; while the DaemonSet
//! is still ours (a rolling update, the node shutting down), everything stays pinned for the next
//! agent.
//!
//! This is the decision Istio's CNI agent makes on the same question (is this pod being replaced
//! by another of the same DaemonSet, or is the DaemonSet going?), read from the API the same way
//! the CNI installer reads it beside us: both containers of the pod come to the same answer.
use anyhow::Context as _;
use tracing::info;

use super::{AgentPaths, kube_pods::KubeOptions};
use crate::kubernetes::{DaemonSetRef, Installed};

/// What the agent removes or keeps on termination, in the log's words.
pub const INSTALLED: Installed = Installed {
    what: "the pinned programs and maps",
    kept: "the programs and maps stay pinned for the next agent",
    unknown: "the programs and maps stay pinned (the pods meshed so far stay intercepted); if it was deleted, run `interceptor uninstall` on this node",
};

/// The agent's DaemonSet (see [`crate::kubernetes::Owner`]) and its node, whose status
/// annotation goes with the agent.
pub struct Owner {
    owner: crate::kubernetes::Owner,
    node: Option<String>,
}

impl Owner {
    pub async fn start(daemonset: DaemonSetRef, kube: &KubeOptions) -> anyhow::Result<Self> {
        let owner =
            crate::kubernetes::Owner::start(daemonset, kube.kubeconfig.as_deref(), &INSTALLED)
                .await
                .map_err(anyhow::Error::msg)?;
        Ok(Self {
            owner,
            node: kube.node_name.clone(),
        })
    }

    /// Why the agent is to remove what it installed, or `None` to leave it; says which.
    pub async fn removal_reason(&self) -> Option<&'static str> {
        self.owner.removal_reason(&INSTALLED).await
    }

    /// Removes the agent's status annotation from its Node (best effort, within the deadline):
    /// nothing of the agent is left on a node it was removed from.
    pub async fn forget_node_status(&self) {
        if let Some(node) = &self.node {
            super::kube_node::forget(self.owner.client().clone(), node).await;
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
