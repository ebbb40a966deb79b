//! Linkerd's pod annotations (`config.linkerd.io/*`, pod over namespace) into the pod's
//! `InterceptionConfig`, through the decision the CNI plugin's ADD and the agent's repair share
//! (`interceptor_config::mesh::pod_plan`).
//!
//! Input: `key=value` lines of the pod's annotations, then after a `---` line its namespace's.
//! A line `!linkerd-init` gives the pod a `linkerd-init` container, `!control-plane=443,6443`
//! makes it a control-plane pod with those API server ports.
#![no_main]

use std::collections::BTreeMap;

use interceptor_api::KubePod;
use interceptor_config::InterceptionConfig;
use interceptor_config::mesh::{Plan, PodSettings, Pods, pod_plan};
use interceptor_fuzz::assert_round_trips;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut pod = KubePod::default();
    let mut namespace = false;
    for line in text.lines() {
        if line == "---" {
            namespace = true;
        } else if line == "!linkerd-init" {
            pod.linkerd_init = true;
        } else if let Some(ports) = line.strip_prefix("!control-plane=") {
            pod.control_plane_component = Some("destination".into());
            pod.api_server_ports = ports.split(',').filter_map(|p| p.parse().ok()).collect();
        } else if let Some((key, value)) = line.split_once('=') {
            let annotations: &mut BTreeMap<String, String> = if namespace {
                &mut pod.namespace_annotations
            } else {
                &mut pod.annotations
            };
            annotations.insert(key.to_owned(), value.to_owned());
        }
    }
    let base = PodSettings {
        config: InterceptionConfig::linkerd(),
        simulate: false,
    };
    for pods in [Pods::Injected, Pods::All] {
        match pod_plan(base.clone(), pods, &pod) {
            Ok(Plan::Mesh(settings)) => {
                assert_round_trips(&settings.config, "an annotated configuration");
            }
            Ok(Plan::Skip(reason)) => {
                assert_eq!(pods, Pods::Injected, "all pods are meshed with \"all\"");
                assert!(!reason.label().is_empty());
            }
            Err(e) => assert!(!e.to_string().is_empty(), "a refusal says why"),
        }
    }
});
