//! The pods of this node as the Kubernetes API has them, for the CNI plugin when the container
//! runtime passed no annotations (a runtime without the `io.kubernetes.cri.pod-annotations`
//! capability): whether Linkerd injected a pod and its `config.linkerd.io/*` settings are then
//! read from here, and decided by the same function as the annotations a runtime passes.
//!
//! The plugin also asks here, for every pod Linkerd injected, for the one label a runtime does
//! not pass: `linkerd.io/control-plane-component`, which makes linkerd-cni exempt the pod's
//! connections to the API server (with the API server's ports, read from the `kubernetes`
//! Service).
//!
//! A watch of the pods on this node (`spec.nodeName`) keeps their names, UIDs, annotations and
//! that label, and whether it has a `linkerd-init` init container (nothing else: a node runs
//! hundreds of pods), so an ADD seldom waits on the API: the kubelet
//! creates the pod in the API before it asks the runtime for its sandbox, so the watch has
//! usually seen it. A pod not yet seen, or seen with another UID (a pod of the same name
//! deleted and created again), is read with a GET. When the API cannot answer in time, the
//! lookup fails and the plugin answers CNI error 11 (try again later): a pod that may need
//! meshing never starts unmeshed.
//!
//! For a pod Linkerd injected, the agent also gives its namespace's `config.linkerd.io/*`
//! annotations, which the plugin applies under the pod's own, as linkerd-cni falls back to them.
//! The Namespace is read with a GET (RBAC: `get` on `namespaces`) and kept for
//! [`NAMESPACE_TTL`]. It is read within the pod lookup's deadline; no answer in time is error 11
//! again, unless an earlier answer is kept (however old: namespace annotations seldom change). A
//! Namespace the agent may not read (forbidden) or that is not there is taken as one without
//! annotations, with a warning: the pod is meshed by its own annotations rather than held back
//! by a missing RBAC rule.
//!
//! The agent's own work never depends on the API: without it (no credentials, API down), the
//! agent runs, and only these lookups fail, each saying why.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use futures::StreamExt as _;
use interceptor_api::KubePod;
use interceptor_config::annotations::{
    self, CONFIG_PREFIX, CONTROL_PLANE_COMPONENT, DEFAULT_API_SERVER_PORTS, Decision,
    LINKERD_INIT_CONTAINER,
};
use k8s_openapi::{
    api::core::v1::{Namespace, Pod, Service},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use prometheus_client::metrics::{counter::Counter, family::Family};
use tracing::{info, warn};

/// How the agent reaches the Kubernetes API.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// A kubeconfig file; without one, the pod's service account (in-cluster), else
    /// `$KUBECONFIG` or `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (`spec.nodeName` of its pods): the watch's scope. Without it there is no
    /// watch, and every lookup is a GET.
    pub node_name: Option<String>,
}

/// How long the reads of one lookup may take: the pod and its namespace share one such
/// deadline, and for a control-plane pod the `kubernetes` Service has another. The two in a row
/// must fit inside the CNI plugin's wait for the answer, so that the plugin hears "unavailable"
/// and why rather than timing out.
const LOOKUP_DEADLINE: Duration = Duration::from_secs(3);
const _: () = assert!(
    2 * LOOKUP_DEADLINE.as_secs() < interceptor_cni::deadline::POD_ANNOTATIONS.as_secs(),
    "the plugin must wait longer for a lookup than the agent's reads take"
);

/// How long a namespace's `config.linkerd.io/*` annotations are kept: a change to them reaches
/// the pods started this long after it at the latest.
const NAMESPACE_TTL: Duration = Duration::from_secs(10);

/// What the agent keeps of a pod.
#[derive(Clone, Debug)]
struct Facts {
    uid: String,
    annotations: BTreeMap<String, String>,
    control_plane_component: Option<String>,
    linkerd_init: bool,
}

type Key = (String, String);

/// A namespace's `config.linkerd.io/*` annotations and when they were read.
type NamespaceConfig = (Instant, BTreeMap<String, String>);

pub struct KubePods {
    /// The client, or why there is none.
    client: Result<Client, String>,
    cache: Mutex<HashMap<Key, Facts>>,
    /// By namespace name.
    namespaces: Mutex<HashMap<String, NamespaceConfig>>,
    /// Lookups by where they were answered: `cache`, `api`, `failed`.
    lookups: Family<Vec<(String, String)>, Counter>,
}

impl KubePods {
    /// Connects (without waiting for the API) and starts the watch of this node's pods.
    pub async fn start(options: KubeOptions) -> Arc<Self> {
        let client = match crate::kubernetes::client(options.kubeconfig.as_deref()).await {
            Ok(client) => Ok(client),
            Err(e) => {
                warn!(error = %e, "no Kubernetes API: pods whose runtime passes no annotations cannot be looked up");
                Err(e)
            }
        };
        let pods = Arc::new(Self {
            client,
            cache: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(HashMap::new()),
            lookups: Family::default(),
        });
        match (&pods.client, options.node_name) {
            (Ok(client), Some(node)) => {
                tokio::spawn(watch(pods.clone(), client.clone(), node));
            }
            (Ok(_), None) => {
                warn!("no node name (--node-name, NODE_NAME): no watch, every lookup asks the API")
            }
            (Err(_), _) => {}
        }
        pods
    }

    /// Why this agent has no Kubernetes client (no credentials, a bad kubeconfig), if it has
    /// none: it then cannot read the API at all, which is not the API failing to answer.
    pub fn no_client(&self) -> Option<&str> {
        self.client.as_ref().err().map(String::as_str)
    }

    /// The pod's annotations and control-plane label: from the watch's cache when it has the
    /// pod (with this `uid`, if given), else from the API. For a pod Linkerd injected, its
    /// namespace's `config.linkerd.io/*` annotations; for a control-plane pod, the API server's
    /// ports too.
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<KubePod, String> {
        let deadline = Instant::now() + LOOKUP_DEADLINE;
        let key = (namespace.to_owned(), name.to_owned());
        let cached = lock(&self.cache).get(&key).cloned();
        let facts = match cached.filter(|f| uid.is_none_or(|uid| uid == f.uid)) {
            Some(facts) => {
                self.count("cache");
                facts
            }
            None => {
                let answer = self.get(namespace, name, uid, deadline).await;
                self.count(if answer.is_ok() { "api" } else { "failed" });
                answer?
            }
        };
        // Only for a pod that will be meshed: one that is not is never held up by the API.
        let namespace_annotations =
            match annotations::decide_with_containers(&facts.annotations, facts.linkerd_init) {
                Decision::Mesh => self.namespace_config(namespace, deadline).await?,
                Decision::Skip { .. } => BTreeMap::new(),
            };
        let api_server_ports = match facts.control_plane_component {
            Some(_) => self.api_server_ports().await,
            None => Vec::new(),
        };
        Ok(KubePod {
            annotations: facts.annotations,
            control_plane_component: facts.control_plane_component,
            api_server_ports,
            linkerd_init: facts.linkerd_init,
            namespace_annotations,
        })
    }

    /// The `config.linkerd.io/*` annotations of `namespace`: kept for [`NAMESPACE_TTL`], else
    /// read by `deadline`. A namespace this agent may not read, or that is not there, has none
    /// (with a warning). When the API does not answer, what it said last, however old; without
    /// that, an error.
    async fn namespace_config(
        &self,
        namespace: &str,
        deadline: Instant,
    ) -> Result<BTreeMap<String, String>, String> {
        let kept = lock(&self.namespaces).get(namespace).cloned();
        if let Some((read, annotations)) = &kept
            && read.elapsed() < NAMESPACE_TTL
        {
            return Ok(annotations.clone());
        }
        let api: Api<Namespace> = Api::all(self.client.clone()?);
        let answer = match tokio::time::timeout_at(deadline, api.get(namespace)).await {
            Err(_) => Err(format!(
                "the Kubernetes API did not answer within {} s for namespace {namespace}",
                LOOKUP_DEADLINE.as_secs()
            )),
            Ok(Err(kube::Error::Api(status))) if status.is_forbidden() || status.is_not_found() => {
                warn!(namespace, error = %status, "cannot read the namespace's config.linkerd.io annotations: its pods get their own only (the agent's role needs get on namespaces)");
                Ok(BTreeMap::new())
            }
            Ok(Err(e)) => Err(format!(
                "the Kubernetes API could not give namespace {namespace}: {e}"
            )),
            Ok(Ok(object)) => Ok(object
                .metadata
                .annotations
                .unwrap_or_default()
                .into_iter()
                .filter(|(name, _)| name.starts_with(CONFIG_PREFIX))
                .collect()),
        };
        match (answer, kept) {
            (Ok(annotations), _) => {
                lock(&self.namespaces)
                    .insert(namespace.to_owned(), (Instant::now(), annotations.clone()));
                Ok(annotations)
            }
            (Err(e), Some((_, annotations))) => {
                warn!(namespace, error = %e, "using the namespace's config.linkerd.io annotations as last read");
                Ok(annotations)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// The `kubernetes` Service's ports and target ports, as linkerd-cni reads them for a
    /// control-plane pod; 443 and 6443 when it cannot be read, as linkerd-cni falls back.
    async fn api_server_ports(&self) -> Vec<u16> {
        let read = async {
            let api: Api<Service> = Api::namespaced(self.client.clone()?, "default");
            let service = tokio::time::timeout(LOOKUP_DEADLINE, api.get("kubernetes"))
                .await
                .map_err(|_| "no answer in time".to_owned())?
                .map_err(|e| e.to_string())?;
            let mut ports = Vec::new();
            for port in service.spec.and_then(|s| s.ports).unwrap_or_default() {
                ports.extend(u16::try_from(port.port));
                if let Some(IntOrString::Int(target)) = port.target_port {
                    ports.extend(u16::try_from(target));
                }
            }
            Ok::<_, String>(ports)
        };
        match read.await {
            Ok(ports) if !ports.is_empty() => ports,
            answer => {
                let why = answer.err().unwrap_or_else(|| "it has no ports".into());
                warn!(error = %why, "reading the kubernetes Service's ports for a control-plane pod: using 443 and 6443");
                DEFAULT_API_SERVER_PORTS.to_vec()
            }
        }
    }

    async fn get(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        deadline: Instant,
    ) -> Result<Facts, String> {
        let client = self.client.clone()?;
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let pod = match tokio::time::timeout_at(deadline, api.get_opt(name)).await {
            Err(_) => {
                return Err(format!(
                    "the Kubernetes API did not answer within {} s for pod {namespace}/{name}",
                    LOOKUP_DEADLINE.as_secs()
                ));
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "the Kubernetes API could not give pod {namespace}/{name}: {e}"
                ));
            }
            Ok(Ok(None)) => {
                return Err(format!(
                    "pod {namespace}/{name} is not in the Kubernetes API (yet)"
                ));
            }
            Ok(Ok(Some(pod))) => pod,
        };
        let facts = facts(&pod);
        if let Some(uid) = uid.filter(|uid| *uid != facts.uid) {
            return Err(format!(
                "pod {namespace}/{name} in the Kubernetes API has UID {}, not {uid} (the pod of that name was replaced)",
                facts.uid
            ));
        }
        Ok(facts)
    }

    fn count(&self, source: &str) {
        self.lookups
            .get_or_create(&vec![("source".to_owned(), source.to_owned())])
            .inc();
    }

    /// For `/metrics`: lookups by where they were answered.
    pub fn lookups(&self) -> Family<Vec<(String, String)>, Counter> {
        self.lookups.clone()
    }
}

fn facts(pod: &Pod) -> Facts {
    Facts {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        control_plane_component: pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(CONTROL_PLANE_COMPONENT))
            .filter(|component| !component.is_empty())
            .cloned(),
        linkerd_init: pod
            .spec
            .as_ref()
            .and_then(|spec| spec.init_containers.as_ref())
            .is_some_and(|init| init.iter().any(|c| c.name == LINKERD_INIT_CONTAINER)),
    }
}

fn key(pod: &Pod) -> Option<Key> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// Keeps the cache to the pods on `node`; a watch that ends is listed and watched again, with
/// backoff, and the cache replaced by the new list once it is complete.
async fn watch(pods: Arc<KubePods>, client: Client, node: String) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .boxed();
    let mut listing: HashMap<Key, Facts> = HashMap::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(key) = key(&pod) {
                    lock(&pods.cache).insert(key, facts(&pod));
                }
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(key) = key(&pod) {
                    lock(&pods.cache).remove(&key);
                }
            }
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(key) = key(&pod) {
                    // Visible at once: a pod being started may be waiting for it.
                    lock(&pods.cache).insert(key.clone(), facts(&pod));
                    listing.insert(key, facts(&pod));
                }
            }
            Ok(watcher::Event::InitDone) => {
                let count = listing.len();
                *lock(&pods.cache) = std::mem::take(&mut listing);
                info!(node = %node, pods = count, "watching this node's pods in the Kubernetes API");
            }
            Err(e) => warn!(error = %e, "watching this node's pods in the Kubernetes API"),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
