//! The node's containerd as the kubelet talks to it: a CRI client on its socket, and what the
//! runtime's `Status` says about the node's network.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use k8s_cri::v1::{StatusRequest, runtime_service_client::RuntimeServiceClient};
use tonic::transport::{Channel, Endpoint, Uri};

use super::Node;

/// A channel to containerd's CRI socket, once it answers (the runtime and image services share
/// it).
pub(super) async fn connect(socket: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let path = socket.to_owned();
        let channel = Endpoint::try_from("http://[::]")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await;
        if let Ok(channel) = channel {
            let mut client = RuntimeServiceClient::new(channel.clone());
            if client
                .version(k8s_cri::v1::VersionRequest::default())
                .await
                .is_ok()
            {
                return channel;
            }
        }
        assert!(
            Instant::now() < deadline,
            "containerd's CRI never answered on {} (see containerd.log beside it)",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Node {
    /// containerd reloads its CNI configuration when it is written: waits until the CRI
    /// plugin's network has our entry (`chained`), or has not.
    pub(super) fn wait_for_network(&mut self, chained: bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = self
                .runtime
                .block_on(self.client.status(StatusRequest { verbose: true }))
                .expect("CRI Status");
            let cni = status
                .into_inner()
                .info
                .get("cniconfig")
                .cloned()
                .unwrap_or_default();
            if cni.contains("interceptor-cni") == chained {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "containerd never loaded the network (chained: {chained}): {cni}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// containerd's view of the node's network: the CRI `Status` condition `NetworkReady`
    /// (containerd 2 sets it from CNI STATUS for `cniVersion` 1.1.0 networks; 1.6 from the
    /// configuration it loaded).
    pub fn network_ready(&mut self) -> bool {
        let status = self
            .runtime
            .block_on(self.client.status(StatusRequest { verbose: false }))
            .expect("CRI Status")
            .into_inner();
        status
            .status
            .into_iter()
            .flat_map(|s| s.conditions)
            .any(|c| c.r#type == "NetworkReady" && c.status)
    }
}
