//! What hand-assembled programs are written with: the opcodes, composed from the kernel's
//! instruction classes, sizes, modes and operations (`<linux/bpf_common.h>`, `<linux/bpf.h>`, as
//! aya-obj generates them), and the return codes that no binding of userspace carries.
use aya_obj::generated::{
    BPF_ADD, BPF_ALU64, BPF_ATOMIC, BPF_CALL, BPF_DW, BPF_EXIT, BPF_IMM, BPF_JEQ, BPF_JMP, BPF_JNE,
    BPF_K, BPF_LD, BPF_LDX, BPF_MEM, BPF_MOV, BPF_RSH, BPF_ST, BPF_STX, BPF_W, BPF_X,
};

/// `dst = imm64`: the first of two instructions, the second's `imm` being the upper 32 bits.
pub const LD_IMM64: u8 = (BPF_LD | BPF_IMM | BPF_DW) as u8;
/// `dst = *(u32 *)(src + off)`.
pub const LDX_W: u8 = (BPF_LDX | BPF_MEM | BPF_W) as u8;
/// `dst = *(u64 *)(src + off)`.
pub const LDX_DW: u8 = (BPF_LDX | BPF_MEM | BPF_DW) as u8;
/// `*(u32 *)(dst + off) = imm`.
pub const ST_W: u8 = (BPF_ST | BPF_MEM | BPF_W) as u8;
/// `*(u64 *)(dst + off) = imm`.
pub const ST_DW: u8 = (BPF_ST | BPF_MEM | BPF_DW) as u8;
/// `*(u64 *)(dst + off) = src`.
pub const STX_DW: u8 = (BPF_STX | BPF_MEM | BPF_DW) as u8;
/// The atomic operation `imm` (e.g. `BPF_CMPXCHG`) on `*(u64 *)(dst + off)` with `src`.
/// Kernel >= 5.12 (`BPF_ADD` alone: 3.18).
pub const ATOMIC_DW: u8 = (BPF_STX | BPF_ATOMIC | BPF_DW) as u8;
/// `dst = src`.
pub const MOV64_REG: u8 = (BPF_ALU64 | BPF_MOV | BPF_X) as u8;
/// `dst = imm`.
pub const MOV64_IMM: u8 = (BPF_ALU64 | BPF_MOV | BPF_K) as u8;
/// `dst += imm`.
pub const ADD64_IMM: u8 = (BPF_ALU64 | BPF_ADD | BPF_K) as u8;
/// `dst >>= imm` (logical).
pub const RSH64_IMM: u8 = (BPF_ALU64 | BPF_RSH | BPF_K) as u8;
/// `if dst == imm goto pc + off`.
pub const JEQ_IMM: u8 = (BPF_JMP | BPF_JEQ | BPF_K) as u8;
/// `if dst != imm goto pc + off`.
pub const JNE_IMM: u8 = (BPF_JMP | BPF_JNE | BPF_K) as u8;
/// `call` the helper `imm` (a `bpf_func_id`).
pub const CALL: u8 = (BPF_JMP | BPF_CALL) as u8;
/// `exit`, returning r0.
pub const EXIT: u8 = (BPF_JMP | BPF_EXIT) as u8;

/// `SK_DROP` of `enum sk_action` in `<linux/bpf.h>`: an sk_lookup program's refusal. aya-obj's
/// bindings leave the enum out; the eBPF crate returns the same value from its own.
pub const SK_DROP: i32 = 0;
/// `SK_PASS` of `enum sk_action` in `<linux/bpf.h>`: an sk_lookup program's "carry on".
pub const SK_PASS: i32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    /// The encodings the kernel's instruction set document lists, as a check that each opcode
    /// is composed of the parts its name says.
    #[test]
    fn opcodes_are_the_documented_encodings() {
        assert_eq!(
            [LD_IMM64, LDX_W, LDX_DW, ST_W, ST_DW, STX_DW, ATOMIC_DW],
            [0x18, 0x61, 0x79, 0x62, 0x7a, 0x7b, 0xdb]
        );
        assert_eq!(
            [
                MOV64_REG, MOV64_IMM, ADD64_IMM, RSH64_IMM, JEQ_IMM, JNE_IMM, CALL, EXIT
            ],
            [0xbf, 0xb7, 0x07, 0x77, 0x15, 0x55, 0x85, 0x95]
        );
    }
}
