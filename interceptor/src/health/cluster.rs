//! What the checks read from the Kubernetes API, read once per run (and again for each retry):
//! the namespace, the DaemonSet, the nodes (with each agent's status annotation), the
//! DaemonSet's pods, and the pods Linkerd injected. Each read keeps its own error, so that a
//! refusal of one (a role without `list` on nodes) fails only the checks that need it.
use std::{collections::BTreeMap, future::Future, time::Duration};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, Node, Pod},
};
use kube::{Api, Client, api::ListParams};

use super::{DAEMONSET, DEFAULT_NAMESPACE, EXTENSION, EXTENSION_LABEL, INJECTED_LABEL};

/// How long one request may take, as Linkerd's `RequestTimeout`
/// (`pkg/healthcheck/healthcheck.go:210`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The DaemonSet's pods when it cannot be read: linkerd-cni's selector, which the chart keeps.
const DEFAULT_SELECTOR: &str = "k8s-app=linkerd-cni";

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// The namespace interceptor is installed in; `None`: the one labelled
    /// `linkerd.io/extension=interceptor`, else [`DEFAULT_NAMESPACE`].
    pub install_namespace: Option<String>,
    /// Only pods of this namespace are named by the pod checks.
    pub pods_namespace: Option<String>,
}

/// The API's answers.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The namespace looked in.
    pub namespace: String,
    /// Every namespace labelled `linkerd.io/extension=interceptor` (when it was asked).
    pub labelled_namespaces: Vec<String>,
    pub namespace_object: Result<Option<Namespace>, String>,
    pub daemonset: Result<Option<DaemonSet>, String>,
    pub nodes: Result<Vec<Node>, String>,
    /// The DaemonSet's pods (by its selector).
    pub agents: Result<Vec<Pod>, String>,
    /// Pods labelled `linkerd.io/control-plane-ns` (in the pods' namespace, if one is given).
    pub injected: Result<Vec<Pod>, String>,
    pub pods_namespace: Option<String>,
}

/// `request`, given up after [`REQUEST_TIMEOUT`], its error in words.
async fn ask<T>(what: &str, request: impl Future<Output = kube::Result<T>>) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Err(_) => Err(format!(
            "{what}: the Kubernetes API did not answer within {} s",
            REQUEST_TIMEOUT.as_secs()
        )),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(kube::Error::Api(status))) => Err(format!(
            "{what}: {} {}: {}",
            status.code, status.reason, status.message
        )),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
    }
}

/// `matchLabels` as a label selector (`matchExpressions` are not read: the chart has none).
fn selector(daemonset: &DaemonSet) -> Option<String> {
    let labels: &BTreeMap<String, String> =
        daemonset.spec.as_ref()?.selector.match_labels.as_ref()?;
    (!labels.is_empty()).then(|| {
        labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

impl Cluster {
    pub async fn read(client: &Client, scope: &Scope) -> Self {
        let mut labelled_namespaces = Vec::new();
        let namespace = match &scope.install_namespace {
            Some(namespace) => namespace.clone(),
            None => {
                let namespaces: Api<Namespace> = Api::all(client.clone());
                let params =
                    ListParams::default().labels(&format!("{EXTENSION_LABEL}={EXTENSION}"));
                match ask("listing namespaces", namespaces.list(&params)).await {
                    Ok(list) => {
                        labelled_namespaces = list
                            .items
                            .into_iter()
                            .filter_map(|ns| ns.metadata.name)
                            .collect();
                        labelled_namespaces.sort();
                    }
                    // The reads below say it again, where it matters.
                    Err(e) => tracing::debug!(error = %e, "finding the extension's namespace"),
                }
                // Where several are labelled, the default one if it is among them.
                if labelled_namespaces.len() == 1
                    || (!labelled_namespaces.is_empty()
                        && !labelled_namespaces.iter().any(|n| n == DEFAULT_NAMESPACE))
                {
                    labelled_namespaces[0].clone()
                } else {
                    DEFAULT_NAMESPACE.to_owned()
                }
            }
        };
        tracing::debug!(%namespace, "reading the extension's objects");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
        let nodes: Api<Node> = Api::all(client.clone());
        let injected_pods: Api<Pod> = match &scope.pods_namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let injected_params = ListParams::default().labels(INJECTED_LABEL);
        let all = ListParams::default();
        let (read_namespace, read_daemonset) = (
            format!("reading namespace {namespace}"),
            format!("reading DaemonSet {DAEMONSET}"),
        );
        let (namespace_object, daemonset, nodes, injected) = futures::join!(
            ask(&read_namespace, namespaces.get_opt(&namespace)),
            ask(&read_daemonset, daemonsets.get_opt(DAEMONSET)),
            ask("listing nodes", nodes.list(&all)),
            ask(
                "listing the pods Linkerd injected",
                injected_pods.list(&injected_params)
            ),
        );
        let agent_selector = daemonset
            .as_ref()
            .ok()
            .and_then(|ds| ds.as_ref())
            .and_then(selector)
            .unwrap_or_else(|| DEFAULT_SELECTOR.to_owned());
        let agent_pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let agents = ask(
            &format!("listing the DaemonSet's pods ({agent_selector})"),
            agent_pods.list(&ListParams::default().labels(&agent_selector)),
        )
        .await;
        Self {
            namespace,
            labelled_namespaces,
            namespace_object,
            daemonset,
            nodes: nodes.map(|list| list.items),
            agents: agents.map(|list| list.items),
            injected: injected.map(|list| list.items),
            pods_namespace: scope.pods_namespace.clone(),
        }
    }
}
