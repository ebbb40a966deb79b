//! The node's pods as the kubelet runs and deletes them through the CRI, and processes in
//! them.
use std::{collections::HashMap, path::PathBuf, process::Command};

use k8s_cri::v1::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StopPodSandboxRequest,
};
use serde_json::Value;

use super::{Layout, Node, POD_NAMESPACE};
use crate::{Probe, agent_home::interceptor_bin, scenario::APP_UID};

/// A pod sandbox that containerd started.
pub struct Pod {
    pub id: String,
    pub netns: PathBuf,
    pub ip: String,
    pub uid: String,
    /// Its sandbox's process.
    pub pid: u32,
    /// Where the test's processes of the pod run.
    pub cgroup: PathBuf,
    /// What `RunPodSandbox` was sent, which `CreateContainer` sends again.
    pub(super) config: PodSandboxConfig,
}

/// The UID of the node's pod `name`.
pub fn pod_uid(name: &str) -> String {
    format!("{}-{name}", std::process::id())
}

impl Node {
    /// `RunPodSandbox` of pod `name` in namespace `shop` with `annotations`, as the kubelet
    /// sends it; then where its network namespace is and its address.
    pub fn run_pod(
        &mut self,
        name: &str,
        annotations: &[(&str, &str)],
    ) -> Result<Pod, tonic::Status> {
        self.run_pod_with(name, annotations, false)
    }

    /// [`Self::run_pod`], in the node's network namespace with `host_network`, as the kubelet
    /// runs a `hostNetwork` pod (no CNI).
    pub fn run_pod_with(
        &mut self,
        name: &str,
        annotations: &[(&str, &str)],
        host_network: bool,
    ) -> Result<Pod, tonic::Status> {
        let uid = pod_uid(name);
        let cgroup_parent = match self.layout {
            Layout::Flat => self.cgroup_parent.clone(),
            Layout::Kubepods => format!("{}/kubepods/besteffort/pod{uid}", self.cgroup_parent),
        };
        let security_context = host_network.then(|| LinuxSandboxSecurityContext {
            namespace_options: Some(NamespaceOption {
                network: NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        let log_directory = self.dir.join("pods").join(name);
        std::fs::create_dir_all(&log_directory).unwrap();
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: POD_NAMESPACE.to_owned(),
                attempt: 0,
            }),
            // As the kubelet: a hostNetwork pod shares the node's UTS namespace and name.
            hostname: if host_network {
                String::new()
            } else {
                name.to_owned()
            },
            log_directory: log_directory.display().to_string(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent,
                security_context,
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .runtime
            .block_on(self.client.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }))?
            .into_inner()
            .pod_sandbox_id;
        self.sandboxes.push(id.clone());
        let status = self
            .runtime
            .block_on(self.client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: true,
            }))
            .expect("PodSandboxStatus")
            .into_inner();
        let ip = status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .expect("the pod's address");
        let info: Value = serde_json::from_str(status.info.get("info").expect("verbose info"))
            .expect("verbose info is JSON");
        let netns = if host_network {
            self.netns.path()
        } else {
            info["runtimeSpec"]["linux"]["namespaces"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|ns| ns["type"] == "network")
                .and_then(|ns| ns["path"].as_str())
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("no network namespace in {info}"))
        };
        let pid = info["pid"]
            .as_u64()
            .and_then(|pid| u32::try_from(pid).ok())
            .unwrap_or_else(|| panic!("no sandbox pid in {info}"));
        let cgroup = match self.layout {
            Layout::Flat => self.cgroup.path.clone(),
            // Beside the sandbox's, as a container's: not in the pod's cgroup itself, which
            // may not hold processes once it has children with controllers.
            Layout::Kubepods => {
                let cgroup = self
                    .cgroup
                    .path
                    .join(format!("kubepods/besteffort/pod{uid}/test-processes"));
                std::fs::create_dir_all(&cgroup).unwrap();
                cgroup
            }
        };
        Ok(Pod {
            id,
            netns,
            ip,
            uid,
            pid,
            cgroup,
            config,
        })
    }

    /// `StopPodSandbox` then `RemovePodSandbox`, as the kubelet deletes a pod.
    pub fn remove_pod(&mut self, id: &str) {
        self.runtime
            .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .expect("StopPodSandbox");
        self.runtime
            .block_on(self.client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            }))
            .expect("RemovePodSandbox");
        self.sandboxes.retain(|s| s != id);
    }

    /// A process of `pod` as `uid`, in its cgroup as the pod's containers are.
    pub fn in_pod(&self, pod: &Pod, uid: u32) -> Probe {
        Probe::new().netns(&pod.netns).cgroup(&pod.cgroup).uid(uid)
    }

    /// `interceptor validate` in `pod` as its `linkerd-network-validator` runs (its namespace
    /// and cgroup, an app UID): its exit code and line.
    pub fn validate(&self, pod: &Pod) -> (Option<i32>, String) {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec nsenter --net={} setpriv --reuid {APP_UID} --regid {APP_UID} --clear-groups {interceptor} validate --timeout-ms 2000",
            pod.cgroup.display(),
            pod.netns.display(),
            interceptor = interceptor_bin().display(),
        );
        let out = Command::new("sh").args(["-c", &script]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    }

    /// Stops and removes every sandbox the node still has, ignoring errors (the node is going).
    pub(super) fn remove_sandboxes(&mut self) {
        for id in std::mem::take(&mut self.sandboxes) {
            let _ = self
                .runtime
                .block_on(self.client.stop_pod_sandbox(StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                }));
            let _ = self.runtime.block_on(
                self.client
                    .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }),
            );
        }
    }
}
