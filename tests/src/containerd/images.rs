//! Images in the node's containerd as a cluster's operator puts them there (`ctr -n k8s.io
//! images import`, `ctr images mount`), and containers of them as the kubelet runs them: it asks
//! `ImageStatus` first and, for `IfNotPresent` or `Never`, pulls nothing when the image is there.
use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, ImageStatusRequest, StartContainerRequest,
};

use super::{Node, Pod};

/// How a container of the node ended: its exit code and what it wrote.
pub struct Exited {
    pub exit_code: i32,
    /// stdout and stderr, from the CRI log (`<time> <stream> <tag> <line>` a line).
    pub output: String,
}

impl Node {
    /// `ctr` on this node's containerd, in the CRI plugin's namespace `k8s.io`, with `args`.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut ctr = Command::new("ctr");
        ctr.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args);
        ctr
    }

    /// `ctr -n k8s.io images import <archive>`, as the docs tell an operator to load the image.
    pub fn import_image(&self, archive: &Path) -> String {
        let out = self
            .ctr(&["images", "import"])
            .arg(archive)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether the CRI's `ImageStatus` finds `reference` (what the kubelet asks before it
    /// pulls).
    pub fn image_present(&mut self, reference: &str) -> bool {
        self.runtime
            .block_on(self.images.image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: reference.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            }))
            .expect("ImageStatus")
            .into_inner()
            .image
            .is_some()
    }

    /// `CreateContainer` and `StartContainer` of `image` with `args` in `pod`, as the kubelet
    /// runs a container (the image's entrypoint, these arguments); waits until it exits.
    pub fn run_to_exit(&mut self, pod: &Pod, name: &str, image: &str, args: &[&str]) -> Exited {
        let log_path = format!("{name}.log");
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            log_path: log_path.clone(),
            ..Default::default()
        };
        let id = self
            .runtime
            .block_on(self.client.create_container(CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            }))
            .unwrap_or_else(|e| panic!("CreateContainer of {image}: {e}"))
            .into_inner()
            .container_id;
        self.runtime
            .block_on(self.client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }))
            .unwrap_or_else(|e| panic!("StartContainer of {image}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let status = self
                .runtime
                .block_on(self.client.container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                }))
                .expect("ContainerStatus")
                .into_inner()
                .status
                .expect("a container status");
            if status.state == ContainerState::ContainerExited as i32 {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "container {name} of {image} never exited: {status:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = Path::new(&pod.config.log_directory).join(log_path);
        let output = std::fs::read_to_string(&log)
            .unwrap_or_else(|e| panic!("{}: {e}", log.display()))
            .lines()
            .filter_map(|line| line.splitn(4, ' ').nth(3))
            .collect::<Vec<_>>()
            .join("\n");
        Exited {
            exit_code: status.exit_code,
            output,
        }
    }
}
