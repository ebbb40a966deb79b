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
mod tests {
    use serde_json::json;

    use super::*;
    use crate::annotations::{PROXY_VERSION, SkipReason};

    /// A pod as the API server returns it once the kubelet reported it (the test kit's
    /// `fake_api::pod` and `reported`).
    fn pod(annotations: serde_json::Value, init: &[&str], phase: &str, started: &[&str]) -> Pod {
        let init: Vec<_> = init
            .iter()
            .map(|n| json!({"name": n, "image": "i:1"}))
            .collect();
        let statuses: Vec<_> = started
            .iter()
            .map(|n| json!({"name": n, "containerID": format!("containerd://{n}"), "ready": false}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "uid-1",
                "resourceVersion": "11",
                "annotations": annotations,
            },
            "spec": {
                "nodeName": "node-1",
                "initContainers": init,
                "containers": [{"name": "app", "image": "app:1"}],
            },
            "status": {"phase": phase, "containerStatuses": statuses, "qosClass": "BestEffort"},
        }))
        .unwrap()
    }

    #[test]
    fn an_injected_pod_whose_sandbox_runs_is_to_repair() {
        let facts = PodFacts::of(&pod(
            json!({PROXY_VERSION: "edge"}),
            &["linkerd-network-validator"],
            "Running",
            &["app"],
        ));
        assert_eq!(facts.uid, "uid-1");
        assert!(facts.sandbox_started && !facts.linkerd_init && !facts.host_network);
        assert!(facts.needs_namespace());
        assert!(facts.to_repair());
        assert_eq!(
            key(&pod(json!({}), &[], "Pending", &[])),
            Some(("shop".into(), "web".into()))
        );
    }

    #[test]
    fn what_keeps_a_pod_from_repair() {
        let injected = json!({PROXY_VERSION: "edge"});
        // No container has an ID yet: its CNI ADD may be running.
        assert!(!PodFacts::of(&pod(injected.clone(), &[], "Pending", &[])).to_repair());
        // An empty ID is none.
        let mut empty = pod(injected.clone(), &[], "Pending", &[]);
        empty.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            container_id: Some(String::new()),
        }]);
        assert!(!PodFacts::of(&empty).sandbox_started);
        // Finished, or being deleted.
        for phase in ["Succeeded", "Failed"] {
            assert!(!PodFacts::of(&pod(injected.clone(), &[], phase, &["app"])).to_repair());
        }
        let mut deleted = pod(injected.clone(), &[], "Running", &["app"]);
        deleted.metadata.as_mut().unwrap().deletion_timestamp = Some(IgnoredAny);
        assert!(!PodFacts::of(&deleted).to_repair());
        // In the node's network namespace.
        let mut host = pod(injected.clone(), &[], "Running", &["app"]);
        host.spec.as_mut().unwrap().host_network = Some(true);
        assert!(!PodFacts::of(&host).to_repair());
        // Left to its linkerd-init, or not injected: and then its namespace is not read.
        let init = PodFacts::of(&pod(injected, &["linkerd-init"], "Running", &["app"]));
        assert_eq!(
            init.decision(),
            Decision::Skip {
                reason: SkipReason::LinkerdInit
            }
        );
        assert!(!init.to_repair() && !init.needs_namespace());
        let plain = PodFacts::of(&pod(json!({}), &[], "Running", &["app"]));
        assert!(!plain.to_repair() && !plain.needs_namespace());
    }

    #[test]
    fn the_control_plane_label_counts_when_it_is_not_empty() {
        let mut p = pod(json!({}), &[], "Running", &[]);
        let labels = |value: &str| {
            Some(BTreeMap::from([(
                CONTROL_PLANE_COMPONENT.into(),
                value.into(),
            )]))
        };
        p.metadata.as_mut().unwrap().labels = labels("destination");
        let facts = PodFacts::of(&p);
        assert_eq!(
            facts.control_plane_component.as_deref(),
            Some("destination")
        );
        assert!(facts.needs_api_server_ports());
        p.metadata.as_mut().unwrap().labels = labels("");
        assert!(!PodFacts::of(&p).needs_api_server_ports());
    }

    #[test]
    fn an_object_with_nulls_or_missing_parts_has_no_facts() {
        for object in [
            json!({}),
            json!({"metadata": null, "spec": null, "status": null}),
            json!({"metadata": {"annotations": null, "labels": null, "deletionTimestamp": null},
               "spec": {"initContainers": null, "hostNetwork": null},
               "status": {"containerStatuses": null, "phase": null}}),
        ] {
            let pod: Pod = serde_json::from_value(object.clone()).unwrap();
            assert_eq!(PodFacts::of(&pod), PodFacts::default(), "{object}");
            assert_eq!(key(&pod), None);
        }
    }

    #[test]
    fn a_namespace_gives_only_its_config_annotations() {
        let namespace: Namespace = serde_json::from_value(json!({
            "metadata": {"name": "shop", "annotations": {
                "config.linkerd.io/skip-outbound-ports": "25",
                "linkerd.io/inject": "enabled",
            }},
            "spec": {"finalizers": ["kubernetes"]},
        }))
        .unwrap();
        assert_eq!(
            namespace.config_annotations(),
            BTreeMap::from([("config.linkerd.io/skip-outbound-ports".into(), "25".into())])
        );
        assert!(Namespace::default().config_annotations().is_empty());
    }

    #[test]
    fn the_api_servers_ports_are_its_ports_and_numeric_target_ports() {
        let service: Service = serde_json::from_value(json!({
            "spec": {"ports": [
                {"name": "https", "port": 443, "targetPort": 6443},
                {"port": 8443, "targetPort": "https"},
                {"port": 70000, "targetPort": -1},
            ]}
        }))
        .unwrap();
        assert_eq!(service.api_server_ports(), [443, 6443, 8443]);
        assert!(Service::default().api_server_ports().is_empty());
    }

    /// `KubePod::complete`, with lookups that answer at once: one poll.
    fn complete(
        facts: PodFacts,
        namespace: Result<BTreeMap<String, String>, String>,
        service: Result<Vec<u16>, String>,
    ) -> (Result<KubePod, String>, [bool; 2], Option<String>) {
        use std::task::{Context, Poll, Waker};
        let (mut asked_namespace, mut asked_service, mut fell_back) = (false, false, None);
        let answer = KubePod::complete(
            facts,
            || {
                asked_namespace = true;
                std::future::ready(namespace)
            },
            || {
                asked_service = true;
                std::future::ready(service)
            },
            |why: &str| fell_back = Some(why.to_owned()),
        );
        let Poll::Ready(answer) =
            std::pin::pin!(answer).poll(&mut Context::from_waker(Waker::noop()))
        else {
            panic!("the lookups answered at once");
        };
        (answer, [asked_namespace, asked_service], fell_back)
    }

    /// The answer about a pod asks only what its facts need: the namespace for a pod Linkerd
    /// injected (its error fails the answer), the Service for a control-plane pod (443 and 6443
    /// when it cannot be read, saying why).
    #[test]
    fn a_pod_is_completed_with_only_the_lookups_it_needs() {
        let injected = PodFacts {
            annotations: BTreeMap::from([(PROXY_VERSION.to_owned(), "stable".to_owned())]),
            ..PodFacts::default()
        };
        let annotations = BTreeMap::from([(
            format!("{CONFIG_PREFIX}skip-outbound-ports"),
            "25".to_owned(),
        )]);
        let (answer, asked, _) = complete(injected.clone(), Ok(annotations.clone()), Ok(vec![]));
        assert_eq!(asked, [true, false]);
        assert_eq!(answer.unwrap().namespace_annotations, annotations);
        let (answer, _, _) = complete(injected.clone(), Err("no answer".into()), Ok(vec![]));
        assert_eq!(answer, Err("no answer".into()));

        let control_plane = PodFacts {
            control_plane_component: Some("destination".into()),
            ..injected
        };
        let (answer, asked, fell_back) =
            complete(control_plane.clone(), Ok(BTreeMap::new()), Ok(vec![8443]));
        assert_eq!(asked, [true, true]);
        assert_eq!(
            (answer.unwrap().api_server_ports, fell_back),
            (vec![8443], None)
        );
        let (answer, _, fell_back) =
            complete(control_plane, Ok(BTreeMap::new()), Err("403".into()));
        assert_eq!(
            answer.unwrap().api_server_ports,
            annotations::DEFAULT_API_SERVER_PORTS
        );
        assert_eq!(fell_back.as_deref(), Some("403"));

        let (answer, asked, _) = complete(PodFacts::default(), Err("x".into()), Err("x".into()));
        assert_eq!(asked, [false, false], "a pod not meshed is never held up");
        assert!(answer.is_ok());
    }
}
