//! What the node agent reads of Kubernetes' objects, and what it decides from them: the few
//! fields of a Pod, a Namespace and the `kubernetes` Service its watch and lookups use (as
//! their JSON has them; every other field is ignored), the [`PodFacts`] it keeps of each pod,
//! and the decisions it takes from those facts before the CNI plugin's own decision
//! ([`crate::mesh::pod_plan`]): whether to read the pod's
//! namespace, whether a pod started without the plugin is to be repaired.
//!
//! The agent decodes the API's objects with `k8s-openapi` and reads them through these (its
//! objects' JSON form), so what a fuzz target feeds here is what the agent runs.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::IgnoredAny};

use crate::annotations::{self, CONFIG_PREFIX, CONTROL_PLANE_COMPONENT, Decision};

/// A Pod, as far as the agent reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default)]
    pub metadata: Option<Metadata>,
    #[serde(default)]
    pub spec: Option<PodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// A Namespace, as far as the agent reads it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

/// An object's `metadata`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Set once the object is being deleted; its value is not read.
    #[serde(default)]
    pub deletion_timestamp: Option<IgnoredAny>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub init_containers: Option<Vec<Container>>,
    #[serde(default)]
    pub host_network: Option<bool>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub init_container_statuses: Option<Vec<ContainerStatus>>,
    #[serde(default)]
    pub container_statuses: Option<Vec<ContainerStatus>>,
    #[serde(default)]
    pub ephemeral_container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    /// The runtime's ID of the container (`containerd://...`), once it was created.
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
}

/// A Service, as far as the agent reads the `kubernetes` one (the API server's ports).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    #[serde(default)]
    pub spec: Option<ServiceSpec>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default)]
    pub ports: Option<Vec<ServicePort>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default)]
    pub port: i64,
    #[serde(default)]
    pub target_port: Option<IntOrString>,
}

/// A port given as a number or a named port.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum IntOrString {
    Int(i64),
    String(String),
}

impl Service {
    /// Its ports and numeric target ports, as linkerd-cni reads the `kubernetes` Service for a
    /// control-plane pod; those that are no port number are left out. Empty when it has none
    /// (the agent then uses [`annotations::DEFAULT_API_SERVER_PORTS`]).
    pub fn api_server_ports(&self) -> Vec<u16> {
        let mut ports = Vec::new();
        for port in self.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
            ports.extend(u16::try_from(port.port));
            if let Some(IntOrString::Int(target)) = port.target_port {
                ports.extend(u16::try_from(target));
            }
        }
        ports
    }
}

impl Namespace {
    /// Its `config.linkerd.io/*` annotations: the only ones it gives its pods.
    pub fn config_annotations(&self) -> BTreeMap<String, String> {
        self.metadata
            .iter()
            .flat_map(|m| m.annotations.iter().flatten())
            .filter(|(name, _)| name.starts_with(CONFIG_PREFIX))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect()
    }
}

/// What the CNI plugin needs of a Kubernetes pod, from the agent's view of the API.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubePod {
    pub annotations: BTreeMap<String, String>,
    /// Its `linkerd.io/control-plane-component` label: a pod of Linkerd's control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_component: Option<String>,
    /// For a control-plane pod: the Kubernetes API server's ports (the `kubernetes` Service's
    /// port and target port, or 443 and 6443 when it cannot be read, as linkerd-cni does).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_server_ports: Vec<u16>,
    /// It has a `linkerd-init` init container, which writes iptables rules for its proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub linkerd_init: bool,
    /// Its namespace's `config.linkerd.io/*` annotations, for those the pod does not set (as
    /// linkerd-cni falls back to them); read for a pod Linkerd injected.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub namespace_annotations: BTreeMap<String, String>,
}

impl KubePod {
    /// What the agent answers of a pod from its [`PodFacts`]: `namespace_annotations` (its
    /// namespace's `config.linkerd.io/*` ones, read when [`PodFacts::needs_namespace`]) and
    /// `api_server_ports` (read when [`PodFacts::needs_api_server_ports`]).
    pub fn from_facts(
        facts: PodFacts,
        namespace_annotations: BTreeMap<String, String>,
        api_server_ports: Vec<u16>,
    ) -> Self {
        Self {
            annotations: facts.annotations,
            control_plane_component: facts.control_plane_component,
            api_server_ports,
            linkerd_init: facts.linkerd_init,
            namespace_annotations,
        }
    }

    /// The agent's answer about a pod ([`Self::from_facts`]), each lookup made only when its
    /// facts need it, so that a pod that will not be meshed is never held up by the API: its
    /// namespace's annotations (`namespace`), whose error fails the answer; the API server's
    /// ports (`service`, the `kubernetes` Service's), 443 and 6443 when it has none or cannot be
    /// read, as linkerd-cni falls back, and `fell_back` is told why.
    pub async fn complete<N, S>(
        facts: PodFacts,
        namespace: impl FnOnce() -> N,
        service: impl FnOnce() -> S,
        fell_back: impl FnOnce(&str),
    ) -> Result<Self, String>
    where
        N: Future<Output = Result<BTreeMap<String, String>, String>>,
        S: Future<Output = Result<Vec<u16>, String>>,
    {
        let namespace_annotations = if facts.needs_namespace() {
            namespace().await?
        } else {
            BTreeMap::new()
        };
        let api_server_ports = if facts.needs_api_server_ports() {
            match service().await {
                Ok(ports) if !ports.is_empty() => ports,
                read => {
                    fell_back(&read.err().unwrap_or_else(|| "it has no ports".into()));
                    annotations::DEFAULT_API_SERVER_PORTS.to_vec()
                }
            }
        } else {
            Vec::new()
        };
        Ok(Self::from_facts(
            facts,
            namespace_annotations,
            api_server_ports,
        ))
    }
}

/// What the agent keeps of a pod of its node: a node runs hundreds, so nothing else.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub annotations: BTreeMap<String, String>,
    /// Its `linkerd.io/control-plane-component` label, when set and not empty.
    pub control_plane_component: Option<String>,
    /// It has an init container named [`annotations::LINKERD_INIT_CONTAINER`].
    pub linkerd_init: bool,
    /// It runs in the node's network namespace: there is nothing of its own to mesh.
    pub host_network: bool,
    /// Its sandbox exists and the CNI ADD that made it is over: a container of it (an init
    /// container too, such as a crash-looping `linkerd-network-validator`) has an ID, which
    /// the kubelet gets only after `RunPodSandbox` answered; and it has neither finished nor is
    /// being deleted.
    pub sandbox_started: bool,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> Self {
        let metadata = pod.metadata.as_ref();
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let finished = status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"));
        let has_container = status.is_some_and(|s| {
            [
                &s.init_container_statuses,
                &s.container_statuses,
                &s.ephemeral_container_statuses,
            ]
            .into_iter()
            .flatten()
            .flatten()
            .any(|c| c.container_id.as_deref().is_some_and(|id| !id.is_empty()))
        });
        let deleted = metadata.is_some_and(|m| m.deletion_timestamp.is_some());
        Self {
            uid: metadata.and_then(|m| m.uid.clone()).unwrap_or_default(),
            annotations: metadata
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default(),
            control_plane_component: metadata
                .and_then(|m| m.labels.as_ref())
                .and_then(|labels| labels.get(CONTROL_PLANE_COMPONENT))
                .filter(|component| !component.is_empty())
                .cloned(),
            linkerd_init: spec
                .and_then(|spec| spec.init_containers.as_ref())
                .is_some_and(|init| {
                    init.iter()
                        .any(|c| c.name == annotations::LINKERD_INIT_CONTAINER)
                }),
            host_network: spec.and_then(|spec| spec.host_network) == Some(true),
            sandbox_started: has_container && !finished && !deleted,
        }
    }

    /// linkerd-cni's decision on the pod ([`annotations::decide_with_containers`]).
    pub fn decision(&self) -> Decision {
        annotations::decide_with_containers(&self.annotations, self.linkerd_init)
    }

    /// Whether its namespace's annotations are read for it: only for a pod that will be
    /// meshed, so that one that is not is never held up by the API.
    pub fn needs_namespace(&self) -> bool {
        self.decision() == Decision::Mesh
    }

    /// Whether the API server's ports are read for it: a pod of Linkerd's control plane.
    pub fn needs_api_server_ports(&self) -> bool {
        self.control_plane_component.is_some()
    }

    /// Whether the CNI plugin would have meshed the pod (linkerd-cni's decision, as the plugin
    /// makes it from the same facts) and its sandbox exists: if it is not registered, it
    /// started without the plugin, and the agent's repair meshes it.
    pub fn to_repair(&self) -> bool {
        self.sandbox_started && !self.host_network && self.decision() == Decision::Mesh
    }
}

/// A pod's key in the agent's cache: its namespace and name, when it has both.
pub fn key(pod: &Pod) -> Option<(String, String)> {
    let metadata = pod.metadata.as_ref()?;
    Some((metadata.namespace.clone()?, metadata.name.clone()?))
}

#[cfg(test)]
#[path = "kube_tests.rs"]
mod tests;
