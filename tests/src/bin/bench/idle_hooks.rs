//! The floor of eBPF interception: a program that does nothing (returns "go on") at each hook
//! the interceptor uses, on a pod of its own. Connections go to the proxy directly, as in the
//! limit, so what it costs beyond the limit is the kernel's price for running programs at those
//! hooks at all: connect4/6, sock_ops (about ten callbacks per connection), getsockopt and
//! the pod's sk_lookup. No program of ours can cost less.
use std::{
    fs::File,
    os::fd::{AsFd as _, OwnedFd},
};

use anyhow::Context as _;
use interceptor_sys::{ProgLoad, bpf_attach_type, bpf_prog_type, insn};
use interceptor_tests::PodFixture;

/// The links of the idle programs; dropping them detaches the programs.
pub struct IdleHooks {
    _links: Vec<OwnedFd>,
}

impl IdleHooks {
    pub fn attach(pod: &PodFixture) -> anyhow::Result<Self> {
        let cgroup = File::open(&pod.cgroup.path)
            .with_context(|| format!("opening {}", pod.cgroup.path.display()))?;
        let netns = File::open(pod.pod.path())
            .with_context(|| format!("opening {}", pod.pod.path().display()))?;
        use bpf_attach_type as at;
        use bpf_prog_type as pt;
        let hooks = [
            (
                pt::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                Some(at::BPF_CGROUP_INET4_CONNECT),
                &cgroup,
            ),
            (
                pt::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                Some(at::BPF_CGROUP_INET6_CONNECT),
                &cgroup,
            ),
            (pt::BPF_PROG_TYPE_SOCK_OPS, None, &cgroup),
            (
                pt::BPF_PROG_TYPE_CGROUP_SOCKOPT,
                Some(at::BPF_CGROUP_GETSOCKOPT),
                &cgroup,
            ),
            (pt::BPF_PROG_TYPE_SK_LOOKUP, Some(at::BPF_SK_LOOKUP), &netns),
        ];
        // `r0 = 1; exit`: allow the connect, keep the socket option's answer, pass the lookup on.
        let go_on = [insn(0xb7, 0, 0, 0, 1), insn(0x95, 0, 0, 0, 0)];
        let mut links = Vec::new();
        for (prog_type, expected, target) in hooks {
            let prog = interceptor_sys::prog_load(&ProgLoad {
                prog_type,
                expected_attach_type: expected,
                name: "bench_idle",
                insns: &go_on,
                license: c"GPL",
            })
            .with_context(|| format!("loading an idle {prog_type:?} program"))?;
            let attach = expected.unwrap_or(at::BPF_CGROUP_SOCK_OPS);
            links.push(
                interceptor_sys::link_create(prog.as_fd(), target.as_fd(), attach)
                    .with_context(|| format!("attaching an idle program at {attach:?}"))?,
            );
        }
        Ok(Self { _links: links })
    }
}
