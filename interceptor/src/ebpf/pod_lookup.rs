//! Each pod's own sk_lookup program: thirty-five instructions, assembled here and loaded with a
//! raw BPF_PROG_LOAD, that let loopback connections through and, for any other, record which pod
//! the lookup is for and tail-call the shared sk_lookup program (`interceptor-ebpf/src/inbound.rs`).
//!
//! sk_lookup programs attach to a network namespace and cannot ask which one they run in, so each
//! pod needs a program of its own. Loading a copy of the whole sk_lookup program per pod meant
//! parsing the object and verifying it again for every registration (about 2 ms here, most of a
//! registration); this program verifies in microseconds, and the shared one is verified once.
//!
//! Loopback is the pod talking to itself, which is never steered (the shared program's first
//! rule): every redirected outbound connection reaches the proxy that way, so deciding it here,
//! before the tail call and the pod lookup, took 65 ns off each (131 -> 66 ns per run with
//! `kernel.bpf_stats_enabled`, whose own overhead is most of what is left).
//!
//! The tail call's index is read from the context (the protocol shifted right by eight: 0 for
//! TCP and UDP, the only protocols sk_lookup runs for) rather than written as a constant. With a
//! constant the JIT patches a direct jump into the program and the kernel tracks it in the
//! program array: the patch stops every CPU of the node (text_poke's IPIs), which was 120 of
//! the 310 µs a load took here, and each pod's program is patched again whenever the shared
//! program is replaced. An index the verifier cannot know makes an indirect tail call: a
//! bounds check and an indirect jump more per lookup, and registration that touches no other
//! CPU.
use interceptor_common::{NetnsCookie, PodSlot, counters::Decision, sk_lookup_ctx};
use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    path::Path,
};

use interceptor_common::names;
use interceptor_sys::{
    BPF_PSEUDO_MAP_FD, ProgLoad,
    asm::{
        ADD64_IMM, CALL, EXIT, JEQ_IMM, JNE_IMM, LD_IMM64, LDX_DW, LDX_W, MOV64_IMM, MOV64_REG,
        RSH64_IMM, SK_DROP, SK_PASS, ST_W, STX_DW,
    },
    bpf_attach_type, bpf_func_id, bpf_insn as Insn, bpf_prog_type, insn,
    netns::LOOPBACK_IFINDEX,
};

const MAP_LOOKUP_ELEM: i32 = bpf_func_id::BPF_FUNC_map_lookup_elem as i32;
const TAIL_CALL: i32 = bpf_func_id::BPF_FUNC_tail_call as i32;
/// `src_reg` of a 64-bit immediate load whose value is a map fd.
const PSEUDO_MAP_FD: u8 = BPF_PSEUDO_MAP_FD as u8;

/// `dst = imm64` as its two instructions.
fn ld_imm64(dst: u8, src: u8, imm: u64) -> [Insn; 2] {
    [
        insn(LD_IMM64, dst, src, 0, imm as u32 as i32),
        insn(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}

/// `r0 = bpf_map_lookup_elem(map, &key)` for a `u32` key, through the stack slot at r10 - 4,
/// as its six instructions.
fn lookup_u32(map_fd: i32, key: i32) -> [Insn; 6] {
    let [load_lo, load_hi] = ld_imm64(1, PSEUDO_MAP_FD, map_fd as u32 as u64);
    [
        insn(ST_W, 10, 0, -4, key),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -4),
        load_lo,
        load_hi,
        insn(CALL, 0, 0, 0, MAP_LOOKUP_ELEM),
    ]
}

/// The maps a pod's program uses, as fds of the loading process.
struct Maps {
    lookup_pod: i32,
    programs: i32,
    counters: i32,
}

/// The program for the pod with `netns_cookie`, whose counters are at `slot`:
///
/// ```text
///  0: r2 = *(u32 *)(r1 + ingress_ifindex)
///  1: if r2 != LOOPBACK goto 16
///  2: r2 = *(u32 *)(r1 + protocol)
///  3: if r2 != TCP goto 14         ; only TCP is counted, as in the shared program
///  4: *(u32 *)(r10 - 4) = slot
///  5: r2 = r10
///  6: r2 += -4
///  7: r1 = map ICPT_COUNTERS       ; (two instructions)
///  9: call bpf_map_lookup_elem
/// 10: if r0 == 0 goto 14
/// 11: r1 = *(u64 *)(r0 + from_pod) ; this CPU's inbound_exempt_from_pod += 1
/// 12: r1 += 1
/// 13: *(u64 *)(r0 + from_pod) = r1
/// 14: r0 = SK_PASS                 ; the kernel's own lookup decides
/// 15: exit
/// 16: r6 = r1                      ; keep the context for the tail call
/// 17: *(u32 *)(r10 - 4) = 0        ; key 0
/// 18: r2 = r10
/// 19: r2 += -4
/// 20: r1 = map ICPT_LOOKUP_POD     ; (two instructions)
/// 22: call bpf_map_lookup_elem
/// 23: if r0 == 0 goto 33
/// 24: r1 = netns_cookie            ; (two instructions)
/// 26: *(u64 *)(r0 + 0) = r1        ; this CPU's slot: the pod being looked up
/// 27: r1 = r6
/// 28: r2 = map ICPT_SK_LOOKUP      ; (two instructions)
/// 30: r3 = *(u32 *)(r6 + protocol) ; index 0, unknown to the verifier (see the module's doc)
/// 31: r3 >>= 8
/// 32: call bpf_tail_call           ; does not return when the shared program is there
/// 33: r0 = SK_DROP                 ; it is not: refuse rather than let the app be reached
/// 34: exit                         ;   around the proxy
/// ```
///
/// Without `loopback_by_ifindex` (kernels before 5.17 have no `ingress_ifindex` in the context,
/// and the verifier refuses the read) it is instructions 16 to 34: the shared program tells
/// loopback by the source address.
fn instructions(
    maps: &Maps,
    netns_cookie: NetnsCookie,
    slot: PodSlot,
    loopback_by_ifindex: bool,
) -> Vec<Insn> {
    let mut prog = Vec::new();
    if loopback_by_ifindex {
        prog.extend(let_loopback_through(maps, slot));
    }
    prog.push(insn(MOV64_REG, 6, 1, 0, 0));
    prog.extend(lookup_u32(maps.lookup_pod, 0));
    prog.push(insn(JEQ_IMM, 0, 0, 9, 0));
    prog.extend(ld_imm64(1, 0, netns_cookie.0));
    prog.extend([insn(STX_DW, 0, 1, 0, 0), insn(MOV64_REG, 1, 6, 0, 0)]);
    prog.extend(ld_imm64(2, PSEUDO_MAP_FD, maps.programs as u32 as u64));
    prog.extend([
        insn(LDX_W, 3, 6, sk_lookup_ctx::PROTOCOL, 0),
        insn(RSH64_IMM, 3, 0, 0, 8),
        insn(CALL, 0, 0, 0, TAIL_CALL),
        insn(MOV64_IMM, 0, 0, 0, SK_DROP),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    prog
}

/// Instructions 0 to 15 above.
fn let_loopback_through(maps: &Maps, slot: PodSlot) -> Vec<Insn> {
    let from_pod = (Decision::InboundFromPod as usize * size_of::<u64>()) as i16;
    let mut prog = vec![
        insn(LDX_W, 2, 1, sk_lookup_ctx::INGRESS_IFINDEX, 0),
        insn(JNE_IMM, 2, 0, 14, LOOPBACK_IFINDEX as i32),
        insn(LDX_W, 2, 1, sk_lookup_ctx::PROTOCOL, 0),
        insn(JNE_IMM, 2, 0, 10, libc::IPPROTO_TCP),
    ];
    prog.extend(lookup_u32(maps.counters, slot.0 as i32));
    prog.extend([
        insn(JEQ_IMM, 0, 0, 3, 0),
        insn(LDX_DW, 1, 0, from_pod, 0),
        insn(ADD64_IMM, 1, 0, 0, 1),
        insn(STX_DW, 0, 1, from_pod, 0),
        insn(MOV64_IMM, 0, 0, 0, SK_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    prog
}

/// Loads pods' lookup programs against the node's pinned `ICPT_LOOKUP_POD`, `ICPT_SK_LOOKUP`
/// and `ICPT_COUNTERS` maps.
pub(super) struct PodLookupLoader {
    lookup_pod: OwnedFd,
    programs: OwnedFd,
    counters: OwnedFd,
    /// Whether the kernel's sk_lookup context has `ingress_ifindex` (and the shared program
    /// uses it).
    loopback_by_ifindex: bool,
}

impl PodLookupLoader {
    pub(super) fn new(pin_dir: &Path, loopback_by_ifindex: bool) -> io::Result<Self> {
        let open = |name: &str| {
            let path = pin_dir.join(name);
            interceptor_sys::obj_get(&path)?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no map pinned at {}", path.display()),
                )
            })
        };
        Ok(Self {
            lookup_pod: open(names::MAP_LOOKUP_POD)?,
            programs: open(names::MAP_SK_LOOKUP_PROG)?,
            counters: open(names::MAP_COUNTERS)?,
            loopback_by_ifindex,
        })
    }

    /// Which program it loads: `ifindex` lets loopback through itself, `address` leaves that to
    /// the shared program.
    pub(super) fn variant(&self) -> &'static str {
        if self.loopback_by_ifindex {
            "ifindex"
        } else {
            "address"
        }
    }

    /// Loads (and so verifies) the lookup program of the pod with `netns_cookie`, whose counters
    /// are at `slot` (a pod keeps its slot while registered). Kernel >= 5.9.
    pub(super) fn load(&self, netns_cookie: NetnsCookie, slot: PodSlot) -> io::Result<OwnedFd> {
        let maps = Maps {
            lookup_pod: self.lookup_pod.as_raw_fd(),
            programs: self.programs.as_raw_fd(),
            counters: self.counters.as_raw_fd(),
        };
        let insns = instructions(&maps, netns_cookie, slot, self.loopback_by_ifindex);
        interceptor_sys::prog_load(&ProgLoad {
            prog_type: bpf_prog_type::BPF_PROG_TYPE_SK_LOOKUP,
            expected_attach_type: Some(bpf_attach_type::BPF_SK_LOOKUP),
            name: names::PROG_POD_LOOKUP,
            insns: &insns,
            license: c"GPL",
        })
    }
}

/// The kernel's id of a loaded program.
pub(super) fn program_id(program: BorrowedFd<'_>) -> io::Result<u32> {
    interceptor_sys::prog_info(program).map(|info| info.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: Maps = Maps {
        lookup_pod: 3,
        programs: 4,
        counters: 5,
    };

    fn program() -> Vec<Insn> {
        instructions(&MAPS, NetnsCookie(0x1122_3344_5566_7788), PodSlot(7), true)
    }

    #[test]
    fn without_ingress_ifindex_it_is_the_tail_call_alone() {
        let with = program();
        let without = instructions(&MAPS, NetnsCookie(0x1122_3344_5566_7788), PodSlot(7), false);
        assert_eq!(without.len(), 19);
        let same = |a: &Insn, b: &Insn| {
            (a.code, a.dst_reg(), a.src_reg(), a.off, a.imm)
                == (b.code, b.dst_reg(), b.src_reg(), b.off, b.imm)
        };
        assert!(with[16..].iter().zip(&without).all(|(a, b)| same(a, b)));
        assert!(
            without
                .iter()
                .all(|i| !(i.code == LDX_W && i.off == sk_lookup_ctx::INGRESS_IFINDEX)),
            "reads no ingress_ifindex"
        );
    }

    /// Where the conditional jump at `at` goes when taken.
    fn target(prog: &[Insn], at: usize) -> usize {
        (at as i16 + 1 + prog[at].off) as usize
    }

    #[test]
    fn loopback_passes_and_everything_else_reaches_the_tail_call() {
        let prog = program();
        assert_eq!(prog.len(), 35);
        assert_eq!(
            (prog[1].code, prog[1].imm),
            (JNE_IMM, LOOPBACK_IFINDEX as i32)
        );
        let not_loopback = target(&prog, 1);
        assert_eq!(
            (prog[not_loopback].code, prog[not_loopback].src_reg()),
            (MOV64_REG, 1)
        );
        assert_eq!((prog[3].code, prog[3].imm), (JNE_IMM, libc::IPPROTO_TCP));
        for jump in [3, 10] {
            let to = target(&prog, jump);
            assert_eq!(
                (prog[to].code, prog[to].imm),
                (MOV64_IMM, SK_PASS),
                "jump at {jump}"
            );
            assert_eq!(prog[to + 1].code, EXIT);
        }
    }

    #[test]
    fn loopback_is_counted_in_the_pods_slot() {
        let prog = program();
        assert_eq!((prog[4].code, prog[4].imm), (ST_W, 7), "key: the slot");
        assert_eq!(
            (prog[7].src_reg(), prog[7].imm),
            (1, 5),
            "r1 = counters map fd"
        );
        let from_pod = Decision::InboundFromPod as i16 * 8;
        assert_eq!((prog[11].code, prog[11].off), (LDX_DW, from_pod));
        assert_eq!((prog[13].code, prog[13].off), (STX_DW, from_pod));
    }

    #[test]
    fn the_null_check_jumps_to_the_refusal() {
        let prog = program();
        let jump = 23;
        assert_eq!(prog[jump].code, JEQ_IMM);
        let to = target(&prog, jump);
        assert_eq!((prog[to].code, prog[to].imm), (MOV64_IMM, SK_DROP));
        assert_eq!(prog[34].code, EXIT);
    }

    /// A constant index would make the JIT patch a direct jump, stopping every CPU at each load.
    #[test]
    fn the_tail_calls_index_is_read_from_the_context_not_a_constant() {
        let prog = program();
        assert_eq!((prog[32].code, prog[32].imm), (CALL, TAIL_CALL));
        assert_eq!(
            (
                prog[30].code,
                prog[30].dst_reg(),
                prog[30].src_reg(),
                prog[30].off
            ),
            (LDX_W, 3, 6, sk_lookup_ctx::PROTOCOL)
        );
        assert_eq!(
            (prog[31].code, prog[31].dst_reg(), prog[31].imm),
            (RSH64_IMM, 3, 8)
        );
        // 0 for both protocols sk_lookup runs for.
        assert_eq!([libc::IPPROTO_TCP >> 8, libc::IPPROTO_UDP >> 8], [0, 0]);
        assert!(
            prog.iter()
                .all(|i| !(i.code == MOV64_IMM && i.dst_reg() == 3))
        );
    }

    #[test]
    fn the_cookie_is_split_low_word_first() {
        let prog = program();
        assert_eq!(prog[24].imm as u32, 0x5566_7788);
        assert_eq!(prog[25].imm as u32, 0x1122_3344);
        assert_eq!(
            (prog[20].dst_reg(), prog[20].src_reg()),
            (1, 1),
            "r1 = map fd (src_reg 1: pseudo map fd)"
        );
        assert_eq!(prog[20].imm, 3);
        assert_eq!(prog[28].imm, 4);
    }

    #[test]
    fn the_name_fits_the_kernel_limit() {
        assert!(names::PROG_POD_LOOKUP.len() < 16);
    }
}
