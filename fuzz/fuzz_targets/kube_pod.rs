//! The Kubernetes objects the agent's watch and lookups decode (`interceptor_config::kube`: a
//! Pod, its Namespace, the `kubernetes` Service), through what the agent decides from them (the
//! facts it keeps, whether it reads the namespace and the API server's ports, whether a pod
//! started without the plugin is repaired) and the answer it gives the CNI plugin
//! (`interceptor_api::KubePod`, through its JSON form), to the plugin's decision on whether and
//! how to mesh the pod (`interceptor_config::mesh::pod_plan`: annotations pod over namespace,
//! which pods are meshed).
//!
//! The agent's answer is built by its own code (`KubePod::complete`, which `KubePods` calls
//! with its lookups of the namespace and the Service), the lookups answered by the input.
//!
//! Input: the Pod's JSON, then optionally a line `---` and the Namespace's JSON (none, or not
//! one: the agent takes it as one without annotations, as when it may not read it; `error`:
//! the API does not answer), then optionally another `---` line and the Service's JSON (none:
//! it cannot be read; no ports: 443 and 6443).
#![no_main]

use std::task::{Context, Poll, Waker};

use interceptor_api::{KubePod, Response};
use interceptor_config::mesh::{Plan, PodSettings, Pods, pod_plan};
use interceptor_config::{
    ConfigError, InterceptionConfig,
    annotations::{CONFIG_PREFIX, DEFAULT_API_SERVER_PORTS, Decision},
    kube::{self, PodFacts},
};
use interceptor_fuzz::assert_round_trips;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut parts = text.split("\n---\n");
    let Ok(pod) = serde_json::from_str::<kube::Pod>(parts.next().unwrap_or_default()) else {
        return;
    };
    let namespace: Result<kube::Namespace, String> = match parts.next() {
        Some("error") => Err("the Kubernetes API did not answer".into()),
        json => Ok(json
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default()),
    };
    let service: Result<kube::Service, String> = parts
        .next()
        .map(|json| serde_json::from_str(json).map_err(|e| e.to_string()))
        .unwrap_or_else(|| Err("not read".into()));

    let facts = PodFacts::of(&pod);
    if let Some((namespace, name)) = kube::key(&pod) {
        let metadata = pod.metadata.as_ref().expect("a key is the metadata's");
        assert_eq!(metadata.namespace.as_ref(), Some(&namespace));
        assert_eq!(metadata.name.as_ref(), Some(&name));
    }
    assert_eq!(facts.needs_namespace(), facts.decision() == Decision::Mesh);
    if facts.to_repair() {
        assert!(facts.needs_namespace() && facts.sandbox_started && !facts.host_network);
    }
    if facts.control_plane_component.is_some() {
        assert_ne!(facts.control_plane_component.as_deref(), Some(""));
    }

    // The agent's answer, by its own code; each lookup is made only when the facts need it.
    let (mut asked_namespace, mut asked_service, mut fell_back) = (false, false, None);
    let completed = KubePod::complete(
        facts.clone(),
        || {
            asked_namespace = true;
            std::future::ready(namespace.clone().map(|n| n.config_annotations()))
        },
        || {
            asked_service = true;
            std::future::ready(service.clone().map(|s| s.api_server_ports()))
        },
        |why: &str| fell_back = Some(why.to_owned()),
    );
    // The lookups answer at once: one poll.
    let Poll::Ready(completed) =
        std::pin::pin!(completed).poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("the answer waits for nothing");
    };
    assert_eq!(
        asked_namespace,
        facts.needs_namespace(),
        "the namespace only when meshed"
    );
    assert_eq!(asked_service, facts.needs_api_server_ports());
    let answer = match completed {
        Ok(answer) => answer,
        Err(e) => {
            assert!(
                asked_namespace && namespace.is_err(),
                "only the namespace fails it: {e}"
            );
            return;
        }
    };
    assert!(
        answer
            .namespace_annotations
            .keys()
            .all(|name| name.starts_with(CONFIG_PREFIX)),
        "a namespace gives only config.linkerd.io annotations"
    );
    if asked_service {
        let read = service
            .as_ref()
            .map(|s| s.api_server_ports())
            .unwrap_or_default();
        if read.is_empty() {
            assert_eq!(answer.api_server_ports, DEFAULT_API_SERVER_PORTS);
            assert!(
                fell_back.is_some_and(|why| !why.is_empty()),
                "a fallback says why"
            );
        } else {
            assert_eq!(answer.api_server_ports, read);
            assert!(fell_back.is_none());
        }
    } else {
        assert!(answer.api_server_ports.is_empty());
    }
    // Through the API's JSON form, as the plugin reads it.
    let json = serde_json::to_string(&Response::Annotations(answer.clone()))
        .expect("an answer serializes");
    let pod = match serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("{json} of the agent's answer: {e}"))
    {
        Response::Annotations(pod) => pod,
        other => panic!("{json} reads as {other:?}"),
    };
    assert_eq!(pod, answer, "the answer reads back the same");

    let base = PodSettings {
        config: InterceptionConfig::linkerd(),
        simulate: false,
    };
    for pods in [Pods::Injected, Pods::All] {
        match pod_plan(base.clone(), pods, &pod) {
            Ok(Plan::Mesh(settings)) => {
                if pods == Pods::Injected {
                    assert_eq!(facts.decision(), Decision::Mesh, "only an injected pod");
                }
                let config = settings.config;
                assert_round_trips(&config, "a pod's configuration");
                if pod.control_plane_component.is_some() {
                    for port in pod.api_server_ports.iter().filter(|p| **p != 0) {
                        assert!(
                            config.outbound_ports_to_ignore.contains(*port),
                            "a control-plane pod reaches the API server on {port} around its proxy"
                        );
                    }
                }
            }
            Ok(Plan::Skip(reason)) => {
                assert_eq!(pods, Pods::Injected, "all pods are meshed with \"all\"");
                assert_eq!(facts.decision(), Decision::Skip { reason });
                assert!(
                    !facts.to_repair(),
                    "the repair meshes what the plugin would"
                );
            }
            Err(e) => {
                assert!(
                    matches!(&e, ConfigError::Invalid { setting, .. } if setting.starts_with(CONFIG_PREFIX)),
                    "a refusal names the annotation: {e:?}"
                );
                assert!(!e.to_string().is_empty(), "a refusal says why");
            }
        }
    }
});
