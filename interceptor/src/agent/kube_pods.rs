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
//! that label, whether it has a `linkerd-init` init container, and the two facts of the repair
//! below (nothing else: a node runs hundreds of pods), so an ADD seldom waits on the API: the
//! kubelet creates the pod in the API before it asks the runtime for its sandbox, so the watch
//! has usually seen it. A pod not yet seen, or seen with another UID (a pod of the same name
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
//! The watch also keeps what the agent's repair needs (see `repair`): whether the pod runs in
//! the node's network namespace (`hostNetwork`), and whether its sandbox exists with its CNI ADD
//! over. It tells the repair of every change to a pod that may need it.
//!
//! The agent's own work never depends on the API: without it (no credentials, API down), the
//! agent runs, and only these lookups fail, each saying why.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::mpsc, time::Instant};

use futures::StreamExt as _;
use interceptor_config::kube::KubePod;
use interceptor_config::kube::{self as objects, PodFacts as Facts};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
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
    2 * LOOKUP_DEADLINE.as_secs() < interceptor_api::deadline::POD_ANNOTATIONS.as_secs(),
    "the plugin must wait longer for a lookup than the agent's reads take"
);

/// How long a namespace's `config.linkerd.io/*` annotations are kept: a change to them reaches
/// the pods started this long after it at the latest.
const NAMESPACE_TTL: Duration = Duration::from_secs(10);

type Key = (String, String);

/// A pod of this node, as the repair names it.
#[derive(Clone, Debug)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} (uid {})", self.namespace, self.name, self.uid)
    }
}

/// What the watch tells the repair.
#[derive(Debug)]
pub enum Change {
    /// This pod (namespace and name) changed, and may need a repair.
    Pod(String, String),
    /// The node's pods were listed again: every one may need one.
    Listed,
}

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
    /// Whether a watch keeps `cache` (a client and a node name).
    watching: bool,
    /// This node's name, when the agent was given one.
    node_name: Option<String>,
}

impl KubePods {
    /// Connects (without waiting for the API) and starts the watch of this node's pods, which
    /// tells `changes` of each change to a pod that may need a repair.
    pub async fn start(
        options: KubeOptions,
        changes: Option<mpsc::UnboundedSender<Change>>,
    ) -> Arc<Self> {
        let client = match crate::kubernetes::client(options.kubeconfig.as_deref()).await {
            Ok(client) => Ok(client),
            Err(e) => {
                warn!(error = %e, "no Kubernetes API: pods whose runtime passes no annotations cannot be looked up");
                Err(e)
            }
        };
        let watching = client.is_ok() && options.node_name.is_some();
        let pods = Arc::new(Self {
            client,
            cache: Mutex::new(HashMap::new()),
            namespaces: Mutex::new(HashMap::new()),
            lookups: Family::default(),
            watching,
            node_name: options.node_name.clone(),
        });
        match (&pods.client, options.node_name) {
            (Ok(client), Some(node)) => {
                tokio::spawn(watch(pods.clone(), client.clone(), node, changes));
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

    /// Whether a watch keeps this node's pods.
    pub fn watching(&self) -> bool {
        self.watching
    }

    /// The client, for the agent's other requests (events, its Node); `None` without one.
    pub fn client(&self) -> Option<Client> {
        self.client.as_ref().ok().cloned()
    }

    /// This node's name, when the agent was given one.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// The pods the watch reports that the CNI plugin would have meshed and whose sandbox
    /// exists (see [`Facts::to_repair`]); with `only`, that one pod if it is such a pod. Read
    /// from the cache alone.
    pub fn to_repair(&self, only: Option<(&str, &str)>) -> Vec<PodRef> {
        let cache = lock(&self.cache);
        let pod_ref = |(namespace, name): &Key, facts: &Facts| PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: facts.uid.clone(),
        };
        match only {
            Some((namespace, name)) => {
                let key = (namespace.to_owned(), name.to_owned());
                cache
                    .get(&key)
                    .filter(|facts| facts.to_repair())
                    .map(|facts| pod_ref(&key, facts))
                    .into_iter()
                    .collect()
            }
            None => cache
                .iter()
                .filter(|(_, facts)| facts.to_repair())
                .map(|(key, facts)| pod_ref(key, facts))
                .collect(),
        }
    }

    /// What the plugin would have been told of `pod` ([`Self::pod`]'s answer), from the cache
    /// only: `None` once the watch no longer has the pod with that UID (deleted, or replaced
    /// by one of the same name).
    pub async fn pod_to_repair(&self, pod: &PodRef) -> Option<Result<KubePod, String>> {
        let key = (pod.namespace.clone(), pod.name.clone());
        let facts = lock(&self.cache)
            .get(&key)
            .filter(|facts| facts.uid == pod.uid)
            .cloned()?;
        let deadline = Instant::now() + LOOKUP_DEADLINE;
        Some(self.complete(&pod.namespace, facts, deadline).await)
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
        self.complete(namespace, facts, deadline).await
    }

    /// The pod's [`KubePod`] from its facts: for a pod Linkerd injected, its namespace's
    /// `config.linkerd.io/*` annotations; for a control-plane pod, the API server's ports
    /// (`KubePod::complete` decides which it needs, the code the `kube_pod` fuzz target drives).
    async fn complete(
        &self,
        namespace: &str,
        facts: Facts,
        deadline: Instant,
    ) -> Result<KubePod, String> {
        KubePod::complete(
            facts,
            || self.namespace_config(namespace, deadline),
            || self.api_server_ports(),
            |why| warn!(error = %why, "reading the kubernetes Service's ports for a control-plane pod: using 443 and 6443"),
        )
        .await
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
            Ok(Ok(object)) => Ok(read_as::<objects::Namespace>(&object).config_annotations()),
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
    /// control-plane pod.
    async fn api_server_ports(&self) -> Result<Vec<u16>, String> {
        let api: Api<Service> = Api::namespaced(self.client.clone()?, "default");
        let service = tokio::time::timeout(LOOKUP_DEADLINE, api.get("kubernetes"))
            .await
            .map_err(|_| "no answer in time".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(read_as::<objects::Service>(&service).api_server_ports())
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

/// What the agent keeps of `pod` ([`Facts::of`], on the pod's JSON form).
fn facts(pod: &Pod) -> Facts {
    Facts::of(&read_as(pod))
}

/// What the agent reads of a Kubernetes object, through its JSON form: the fields
/// `interceptor_config::kube` declares (the code the `kube_pod` fuzz target drives). A typed
/// object always has that form; were it refused, the object would be taken as one without any
/// of them, with a warning.
fn read_as<T: Default + serde::de::DeserializeOwned>(object: &impl serde::Serialize) -> T {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .unwrap_or_else(|e| {
            warn!(error = %e, "reading a Kubernetes object's fields");
            T::default()
        })
}

fn key(pod: &Pod) -> Option<Key> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// Keeps the cache to the pods on `node`; a watch that ends is listed and watched again, with
/// backoff, and the cache replaced by the new list once it is complete.
async fn watch(
    pods: Arc<KubePods>,
    client: Client,
    node: String,
    changes: Option<mpsc::UnboundedSender<Change>>,
) {
    let tell = |change: Change| {
        if let Some(changes) = &changes {
            let _ = changes.send(change);
        }
    };
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher(Api::<Pod>::all(client), config)
        .default_backoff()
        .boxed();
    let mut listing: HashMap<Key, Facts> = HashMap::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) => {
                if let Some(key) = key(&pod) {
                    let facts = facts(&pod);
                    let to_repair = facts.to_repair();
                    lock(&pods.cache).insert(key.clone(), facts);
                    if to_repair {
                        tell(Change::Pod(key.0, key.1));
                    }
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
                tell(Change::Listed);
            }
            Err(e) => warn!(error = %e, "watching this node's pods in the Kubernetes API"),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
