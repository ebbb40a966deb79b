//! The eBPF backend, driven in-process through the same library calls `interceptor run` makes.
use interceptor::{
    config::InterceptionConfig,
    ebpf::{EbpfPods, LoadOptions},
    netns::PodNetns,
    node::Wanted,
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

/// The node's programs and maps, with an empty pod table.
pub fn load(options: LoadOptions) -> EbpfPods {
    EbpfPods::load(options).unwrap_or_else(|e| panic!("load eBPF: {e}"))
}

/// Registers the pod, as `interceptor run` does; returns its netns cookie.
pub fn register(
    node: &mut EbpfPods,
    netns: &Netns,
    config: &InterceptionConfig,
) -> interceptor_common::NetnsCookie {
    let path = netns.path();
    let pod = PodNetns::open(&path).expect("open pod netns");
    let (cookie, local) = pod
        .cookie_and_local()
        .expect("netns cookie, pod addresses and local routes");
    let wanted = Wanted {
        netns: &pod,
        config,
        host_ids: pod
            .users()
            .expect("the pod's user namespace")
            .host_ids(config)
            .unwrap_or_else(|e| panic!("{e}")),
        local: &local,
    };
    node.add(cookie, &path, &wanted, ())
        .unwrap_or_else(|e| panic!("register pod: {e}"));
    cookie
}

pub fn attach(node: &mut EbpfPods, cgroup: &std::path::Path) {
    node.attach(cgroup)
        .unwrap_or_else(|e| panic!("attach: {e}"));
}

/// A connect4 program of someone else's, as another product would load it.
pub fn foreign_program() -> std::os::fd::OwnedFd {
    use interceptor_sys::{ProgLoad, bpf_attach_type, bpf_prog_type, insn};
    let insns = [insn(0xb7, 0, 0, 0, 1), insn(0x95, 0, 0, 0, 0)];
    interceptor_sys::prog_load(&ProgLoad {
        prog_type: bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        expected_attach_type: Some(bpf_attach_type::BPF_CGROUP_INET4_CONNECT),
        name: "foreign_allow",
        insns: &insns,
        license: c"GPL",
    })
    .expect("load the foreign program")
}
