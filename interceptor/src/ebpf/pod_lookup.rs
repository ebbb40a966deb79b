//! Each pod's own sk_lookup program: eighteen instructions, assembled here and loaded with a raw
//! BPF_PROG_LOAD, that record which pod the lookup is for and tail-call the shared sk_lookup
//! program (`interceptor-ebpf/src/inbound.rs`).
//!
//! sk_lookup programs attach to a network namespace and cannot ask which one they run in, so each
//! pod needs a program of its own. Loading a copy of the whole sk_lookup program per pod meant
//! parsing the object and verifying it again for every registration (about 2 ms here, most of a
//! registration); this program verifies in microseconds, and the shared one is verified once.
use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

use interceptor_common::names;

use super::links;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_TYPE_SK_LOOKUP: u32 = 30;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_TAIL_CALL: i32 = 12;
/// `src_reg` of a 64-bit immediate load whose value is a map fd (`BPF_PSEUDO_MAP_FD`).
const PSEUDO_MAP_FD: u8 = 1;
const SK_DROP: i32 = 0;

/// One `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    /// dst_reg in the low nibble, src_reg in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// `dst = imm64` as its two instructions.
const fn ld_imm64(dst: u8, src: u8, imm: u64) -> [Insn; 2] {
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
fn instructions(lookup_pod_map: i32, programs_map: i32, netns_cookie: u64) -> Vec<Insn> {
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
    prog.extend(ld_imm64(1, 0, netns_cookie));
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
            links::open_pinned(&path)?.ok_or_else(|| {
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

    /// Loads (and so verifies) the lookup program of the pod with `netns_cookie`.
    pub(super) fn load(&self, netns_cookie: u64) -> io::Result<OwnedFd> {
        let prog = instructions(
            self.lookup_pod.as_raw_fd(),
            self.programs.as_raw_fd(),
            netns_cookie,
        );
        let license = c"GPL";
        let mut log = vec![0u8; 4096];
        // union bpf_attr, prog_load (offsets from <linux/bpf.h>): prog_type, insn_cnt, insns,
        // license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name[16],
        // prog_ifindex, expected_attach_type; the rest zero.
        let mut attr = [0u8; 128];
        let mut put = |at: usize, bytes: &[u8]| attr[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &BPF_PROG_TYPE_SK_LOOKUP.to_ne_bytes());
        put(4, &(prog.len() as u32).to_ne_bytes());
        put(8, &(prog.as_ptr() as u64).to_ne_bytes());
        put(16, &(license.as_ptr() as u64).to_ne_bytes());
        put(24, &1u32.to_ne_bytes());
        put(28, &(log.len() as u32).to_ne_bytes());
        put(32, &(log.as_mut_ptr() as u64).to_ne_bytes());
        put(48, names::PROG_POD_LOOKUP.as_bytes());
        put(68, &links::attach_type::SK_LOOKUP.to_ne_bytes());
        match links::bpf(BPF_PROG_LOAD, &mut attr) {
            // SAFETY: BPF_PROG_LOAD returned a new fd that nothing else owns.
            Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) => {
                let log = String::from_utf8_lossy(&log);
                let log = log.trim_end_matches('\0').trim();
                Err(io::Error::new(
                    e.kind(),
                    format!("loading {}: {e}: {log}", names::PROG_POD_LOOKUP),
                ))
            }
        }
    }
}

/// The kernel's id of a loaded program.
pub(super) fn program_id(program: BorrowedFd<'_>) -> io::Result<u32> {
    // struct bpf_prog_info starts with type (u32) and id (u32).
    let mut info = [0u32; 2];
    // obj_get_info_by_fd: bpf_fd, info_len, info (u64).
    let mut attr = [0u64; 2];
    attr[0] = u64::from(program.as_raw_fd() as u32) | (8u64 << 32);
    attr[1] = info.as_mut_ptr() as u64;
    links::bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_null_check_jumps_to_the_refusal() {
        let prog = instructions(3, 4, 0x1122_3344_5566_7788);
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
        let prog = instructions(3, 4, 0x1122_3344_5566_7788);
        assert_eq!(prog[8].imm as u32, 0x5566_7788);
        assert_eq!(prog[9].imm as u32, 0x1122_3344);
        assert_eq!(prog[4].regs, 0x11, "r1 = map fd (src_reg 1: pseudo map fd)");
        assert_eq!(prog[4].imm, 3);
        assert_eq!(prog[12].imm, 4);
    }

    #[test]
    fn the_name_fits_the_kernel_limit() {
        assert!(names::PROG_POD_LOOKUP.len() < 16);
    }
}
