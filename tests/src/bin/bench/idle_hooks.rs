//! The floor of eBPF interception: a program that does nothing (returns "go on") at each hook
//! the interceptor uses, on a pod of its own. Connections go to the proxy directly, as in the
//! limit, so what it costs beyond the limit is the kernel's price for running programs at those
//! hooks at all: connect4/6, sock_ops (about ten callbacks per connection), getsockopt,
//! getpeername4/6 (an accept that asks for the peer's address runs it) and the pod's sk_lookup.
//! No program of ours can cost less.
//!
//! [`Watch::Close`] adds what answering `SO_ORIGINAL_DST` for a connection's whole life without
//! conntrack needs at the least: the proxy side of a connection on loopback (an outbound one)
//! asks for its state changes when established, as ours does to free its entry when it closes,
//! and sock_ops then runs for each of them (11 runs a connection with RST close instead of 9).
use std::{
    fs::File,
    os::fd::{AsFd as _, OwnedFd},
};

use anyhow::Context as _;
use interceptor_sys::{
    BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB_FLAG, ProgLoad,
    asm::{CALL, EXIT, JEQ_IMM, JNE_IMM, LDX_W, MOV64_IMM},
    bpf_attach_type, bpf_func_id, bpf_insn, bpf_prog_type, insn,
};
use interceptor_tests::PodFixture;

/// Whether the idle sock_ops program asks for the state changes of redirected connections.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Watch {
    Nothing,
    Close,
}

/// `struct bpf_sock_ops` offsets the watching program reads (the uapi struct is not among the
/// generated bindings).
const OPS_OP: i16 = 0;
const OPS_LOCAL_IP4: i16 = 28;
const OPS_LOCAL_IP6: i16 = 48;
const PASSIVE_ESTABLISHED_CB: i32 = BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB as i32;
const STATE_CB_FLAG: i32 = BPF_SOCK_OPS_STATE_CB_FLAG as i32;
const FUNC_SOCK_OPS_CB_FLAGS_SET: i32 = bpf_func_id::BPF_FUNC_sock_ops_cb_flags_set as i32;
/// 127.0.0.1 and the last word of ::1 as the context holds them (network order), read as u32.
const LOCALHOST_BE: i32 = i32::from_ne_bytes([127, 0, 0, 1]);
const IP6_LOOPBACK_LAST_BE: i32 = i32::from_ne_bytes([0, 0, 0, 1]);

/// sock_ops for [`Watch::Close`]: at a passive establishment on 127.0.0.1 or ::1 (where
/// connect4/6 send redirected connections), set `BPF_SOCK_OPS_STATE_CB_FLAG`; go on.
///
/// Runs before 2026-11-26 13:00 UTC had every jump one instruction short: each callback but
/// the one watched called `bpf_sock_ops_cb_flags_set` with whatever `r2` held, and the proxy
/// side of every connection got every callback flag (RTT, header options and all), 15 sock_ops
/// runs a connection where ours has 11. That floor read 0.8 to 3.8 % below the one without
/// watching; it was not the least watching close costs.
fn watching_sock_ops() -> Vec<bpf_insn> {
    // Where the jumps go: a jump's offset counts from the instruction after it.
    const WATCH: i16 = 12;
    const GO_ON: i16 = 14;
    let to = |from: i16, target: i16| target - from - 1;
    vec![
        insn(LDX_W, 2, 1, OPS_OP, 0),
        insn(JNE_IMM, 2, 0, to(1, GO_ON), PASSIVE_ESTABLISHED_CB),
        insn(LDX_W, 2, 1, OPS_LOCAL_IP4, 0),
        insn(JEQ_IMM, 2, 0, to(3, WATCH), LOCALHOST_BE),
        insn(LDX_W, 2, 1, OPS_LOCAL_IP6, 0),
        insn(JNE_IMM, 2, 0, to(5, GO_ON), 0),
        insn(LDX_W, 2, 1, OPS_LOCAL_IP6 + 4, 0),
        insn(JNE_IMM, 2, 0, to(7, GO_ON), 0),
        insn(LDX_W, 2, 1, OPS_LOCAL_IP6 + 8, 0),
        insn(JNE_IMM, 2, 0, to(9, GO_ON), 0),
        insn(LDX_W, 2, 1, OPS_LOCAL_IP6 + 12, 0),
        insn(JNE_IMM, 2, 0, to(11, GO_ON), IP6_LOOPBACK_LAST_BE),
        // WATCH: r1 is still the context.
        insn(MOV64_IMM, 2, 0, 0, STATE_CB_FLAG),
        insn(CALL, 0, 0, 0, FUNC_SOCK_OPS_CB_FLAGS_SET),
        // GO_ON
        insn(MOV64_IMM, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The links of the idle programs; dropping them detaches the programs.
pub struct IdleHooks {
    _links: Vec<OwnedFd>,
}

impl IdleHooks {
    pub fn attach(pod: &PodFixture, watch: Watch) -> anyhow::Result<Self> {
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
            (
                pt::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                Some(at::BPF_CGROUP_INET4_GETPEERNAME),
                &cgroup,
            ),
            (
                pt::BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                Some(at::BPF_CGROUP_INET6_GETPEERNAME),
                &cgroup,
            ),
            (pt::BPF_PROG_TYPE_SK_LOOKUP, Some(at::BPF_SK_LOOKUP), &netns),
        ];
        // `r0 = 1; exit`: allow the connect, keep the socket option's and the peer name's
        // answers, pass the lookup on.
        let go_on = vec![insn(MOV64_IMM, 0, 0, 0, 1), insn(EXIT, 0, 0, 0, 0)];
        let sock_ops = match watch {
            Watch::Nothing => go_on.clone(),
            Watch::Close => watching_sock_ops(),
        };
        let mut links = Vec::new();
        for (prog_type, expected, target) in hooks {
            let insns = if prog_type == pt::BPF_PROG_TYPE_SOCK_OPS {
                &sock_ops
            } else {
                &go_on
            };
            let prog = interceptor_sys::prog_load(&ProgLoad {
                prog_type,
                expected_attach_type: expected,
                name: "bench_idle",
                insns,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every jump of the watching program lands on setting the flag or on going on, and the
    /// helper is reached only with the flag in `r2`.
    #[test]
    fn the_watching_programs_jumps_land_where_they_are_meant_to() {
        let prog = watching_sock_ops();
        let sets_flag = |i: usize| prog[i].code == MOV64_IMM && prog[i].dst_reg() == 2;
        let goes_on =
            |i: usize| prog[i].code == MOV64_IMM && prog[i].dst_reg() == 0 && prog[i].imm == 1;
        let mut jumps = 0;
        for (i, jump) in prog.iter().enumerate() {
            if jump.code != JEQ_IMM && jump.code != JNE_IMM {
                continue;
            }
            jumps += 1;
            let target = (i as i64 + 1 + i64::from(jump.off)) as usize;
            assert!(
                sets_flag(target) || goes_on(target),
                "the jump at {i} lands on {target}: {:?}",
                prog[target]
            );
        }
        assert_eq!(jumps, 6);
        let call = prog.iter().position(|i| i.code == CALL).unwrap();
        assert!(sets_flag(call - 1) && prog[call - 1].imm == STATE_CB_FLAG);
    }
}
