//! Traffic between the node and its pods: the servers a test runs, and what it asserts about
//! where their connections land.
use super::{GATEWAY, Node, Pod};
use crate::{
    Probe,
    probe::Listener,
    scenario::{APP_UID, PROXY_UID},
};

/// The node's server ([`Node::serve_on_node`]) as pods connect to it, through the gateway.
pub fn to_node() -> String {
    format!("{GATEWAY}:1404")
}

impl Node {
    /// A stand-in proxy (outbound 4140, inbound 4143) and the app's servers on 8080 and 9090.
    pub fn serve(&self, pod: &Pod, app: &str) -> Vec<Listener> {
        let proxy = self.in_pod(pod, PROXY_UID);
        vec![
            proxy.listen(&["proxy", "127.0.0.1:4140", "--name", "outbound"]),
            proxy.listen(&["proxy", "0.0.0.0:4143", "--name", "inbound"]),
            self.in_pod(pod, APP_UID).listen(&[
                "server",
                "0.0.0.0:8080",
                "0.0.0.0:9090",
                "--name",
                app,
            ]),
        ]
    }

    /// A client on the node (source address the gateway's).
    pub fn on_node(&self) -> Probe {
        Probe::new().netns(&self.netns.path())
    }

    /// The node's own server, `node-server`, where pods reach it: [`to_node`].
    pub fn serve_on_node(&self) -> Listener {
        self.on_node()
            .listen(&["server", "0.0.0.0:1404", "--name", "node-server"])
    }

    /// Asserts that the app of `pod` connecting to the node's server lands on its proxy, with
    /// the original destination.
    pub fn assert_outbound_on_proxy(&self, pod: &Pod) {
        let to_node = to_node();
        assert_eq!(
            self.in_pod(pod, APP_UID)
                .connect(&to_node)
                .proxy_orig()
                .to_string(),
            to_node
        );
    }

    /// Asserts that `pod` is meshed both ways: its app's connection to the node's server, and
    /// the node's to its app's port 8080, land on its proxy with their original destination.
    pub fn assert_meshed(&self, pod: &Pod) {
        self.assert_outbound_on_proxy(pod);
        let to_pod = format!("{}:8080", pod.ip);
        assert_eq!(
            self.on_node().connect(&to_pod).proxy_orig().to_string(),
            to_pod
        );
    }

    /// Asserts that the app of `pod` connecting to the node's server reaches it, untouched.
    pub fn assert_outbound_passes(&self, pod: &Pod) {
        assert_eq!(
            self.in_pod(pod, APP_UID).connect(&to_node()).server_name(),
            "node-server"
        );
    }
}
