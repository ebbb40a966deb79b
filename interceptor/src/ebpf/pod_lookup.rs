//! Each pod's own sk_lookup program: eighteen instructions, assembled here and loaded with a raw
//! BPF_PROG_LOAD, that record which pod the lookup is for and tail-call the shared sk_lookup
//! program (`interceptor-ebpf/src/inbound.rs`).
//!
//! sk_lookup programs attach to a network namespace and cannot ask which one they run in, so each
//! pod needs a program of its own. Loading a copy of the whole sk_lookup program per pod meant
//! parsing the object and verifying it again for every registration (about 2 ms here, most of a
//! registration); this program verifies in microseconds, and the shared one is verified once.
use interceptor_common::NetnsCookie;
use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
    path::Path,
};

use interceptor_common::names;
use interceptor_sys::{
    BPF_PSEUDO_MAP_FD, ProgLoad, bpf_attach_type, bpf_insn as Insn, bpf_prog_type, insn,
};

const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_TAIL_CALL: i32 = 12;
/// `src_reg` of a 64-bit immediate load whose value is a map fd.
const PSEUDO_MAP_FD: u8 = BPF_PSEUDO_MAP_FD as u8;
const SK_DROP: i32 = 0;

/// `dst = imm64` as its two instructions.
fn ld_imm64(dst: u8, src: u8, imm: u64) -> [Insn; 2] {
    [
        insn(0x18, dst, src, 0, imm as u32 as i32),
        insn(0, 0, 0, 0, (imm >> 32) as u32 as i32),
    ]
}

/// The program for the pod with `netns_cookie`:
///
/// ```text
///  0: r6 = r1                      ; keep the context for the tail call
///  1: *(u32 *)(r10 - 4) = 0        ; key 0
///  2: r2 = r10
///  3: r2 += -4
///  4: r1 = map ICPT_LOOKUP_POD     ; (two instructions)
///  6: call bpf_map_lookup_elem
///  7: if r0 == 0 goto 16
///  8: r1 = netns_cookie            ; (two instructions)
/// 10: *(u64 *)(r0 + 0) = r1        ; this CPU's slot: the pod being looked up
/// 11: r1 = r6
/// 12: r2 = map ICPT_SK_LOOKUP      ; (two instructions)
/// 14: r3 = 0
/// 15: call bpf_tail_call           ; does not return when the shared program is there
/// 16: r0 = SK_DROP                 ; it is not: refuse rather than let the app be reached
/// 17: exit                         ;   around the proxy
/// ```
fn instructions(lookup_pod_map: i32, programs_map: i32, netns_cookie: NetnsCookie) -> Vec<Insn> {
    let mut prog = vec![
        insn(0xbf, 6, 1, 0, 0),
        insn(0x62, 10, 0, -4, 0),
        insn(0xbf, 2, 10, 0, 0),
        insn(0x07, 2, 0, 0, -4),
    ];
    prog.extend(ld_imm64(1, PSEUDO_MAP_FD, lookup_pod_map as u32 as u64));
    prog.extend([
        insn(0x85, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        insn(0x15, 0, 0, 8, 0),
    ]);
    prog.extend(ld_imm64(1, 0, netns_cookie.0));
    prog.extend([insn(0x7b, 0, 1, 0, 0), insn(0xbf, 1, 6, 0, 0)]);
    prog.extend(ld_imm64(2, PSEUDO_MAP_FD, programs_map as u32 as u64));
    prog.extend([
        insn(0xb7, 3, 0, 0, 0),
        insn(0x85, 0, 0, 0, BPF_FUNC_TAIL_CALL),
        insn(0xb7, 0, 0, 0, SK_DROP),
        insn(0x95, 0, 0, 0, 0),
    ]);
    prog
}

/// Loads pods' lookup programs against the node's pinned `ICPT_LOOKUP_POD` and
/// `ICPT_SK_LOOKUP` maps.
pub(super) struct PodLookupLoader {
    lookup_pod: OwnedFd,
    programs: OwnedFd,
}

impl PodLookupLoader {
    pub(super) fn new(pin_dir: &Path) -> io::Result<Self> {
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
        })
    }

    /// Loads (and so verifies) the lookup program of the pod with `netns_cookie`. Kernel >= 5.9.
    pub(super) fn load(&self, netns_cookie: NetnsCookie) -> io::Result<OwnedFd> {
        let insns = instructions(
            self.lookup_pod.as_raw_fd(),
            self.programs.as_raw_fd(),
            netns_cookie,
        );
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

    #[test]
    fn the_null_check_jumps_to_the_refusal() {
        let prog = instructions(3, 4, NetnsCookie(0x1122_3344_5566_7788));
        assert_eq!(prog.len(), 18);
        let jump = 7;
        assert_eq!(prog[jump].code, 0x15);
        let target = jump as i16 + 1 + prog[jump].off;
        assert_eq!(prog[target as usize].code, 0xb7);
        assert_eq!(prog[target as usize].imm, SK_DROP);
        assert_eq!(prog[17].code, 0x95);
    }

    #[test]
    fn the_cookie_is_split_low_word_first() {
        let prog = instructions(3, 4, NetnsCookie(0x1122_3344_5566_7788));
        assert_eq!(prog[8].imm as u32, 0x5566_7788);
        assert_eq!(prog[9].imm as u32, 0x1122_3344);
        assert_eq!(
            (prog[4].dst_reg(), prog[4].src_reg()),
            (1, 1),
            "r1 = map fd (src_reg 1: pseudo map fd)"
        );
        assert_eq!(prog[4].imm, 3);
        assert_eq!(prog[12].imm, 4);
    }

    #[test]
    fn the_name_fits_the_kernel_limit() {
        assert!(names::PROG_POD_LOOKUP.len() < 16);
    }
}
