//! The Kubernetes API, as the agent uses it: one way to build a client.
use std::path::Path;

use kube::{
    Client, Config,
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
