//! The eBPF backend, driven in-process through the same library calls `interceptor run` makes.
use interceptor::{
    config::InterceptionConfig,
    ebpf::{EbpfNode, LoadOptions, PodSpec},
    netns::PodNetns,
};

use crate::{Netns, PodFixture, scenario::Backend};

pub struct Ebpf;

impl Backend for Ebpf {
    fn attach(&self, fixture: &PodFixture, config: &InterceptionConfig) -> Box<dyn std::any::Any> {
        let mut node = load(options());
        register(&mut node, &fixture.pod, config);
        attach(&mut node, &fixture.cgroup.path);
        Box::new(node)
    }

    fn inbound_keeps_local_address(&self) -> bool {
        true
    }
}

/// Default options with a pin directory of this test's own (the node removes it when dropped).
pub fn options() -> LoadOptions {
    let bpffs = std::path::Path::new(interceptor::state::BPFFS_ROOT);
    interceptor::state::ensure_bpffs(bpffs).expect("a bpffs on /sys/fs/bpf");
    LoadOptions::new(
        bpffs
            .join("interceptor-tests")
            .join(crate::unique_name("pins")),
    )
}

pub fn load(options: LoadOptions) -> EbpfNode {
    EbpfNode::load(options).unwrap_or_else(|e| panic!("load eBPF: {e}"))
}

pub fn pod_spec(netns: &Netns, config: &InterceptionConfig) -> PodSpec {
    let pod = PodNetns::open(&netns.path()).expect("open pod netns");
    PodSpec {
        netns_path: netns.path(),
        netns_cookie: pod.cookie().expect("netns cookie"),
        addresses: pod.addresses().expect("pod addresses"),
        config: config.clone(),
    }
}

/// Registers the pod; returns its netns cookie.
pub fn register(
    node: &mut EbpfNode,
    netns: &Netns,
    config: &InterceptionConfig,
) -> interceptor_common::NetnsCookie {
    let spec = pod_spec(netns, config);
    node.pods()
        .add(&spec)
        .unwrap_or_else(|e| panic!("register pod: {e}"));
    spec.netns_cookie
}

pub fn attach(node: &mut EbpfNode, cgroup: &std::path::Path) {
    node.attach(cgroup)
        .unwrap_or_else(|e| panic!("attach: {e}"));
}
