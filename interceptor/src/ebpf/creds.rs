//! Where a socket's creator credentials are in this kernel (`interceptor_common::CredOffsets`),
//! read from its BTF for the connect programs' `.rodata`.
use std::{path::Path, sync::OnceLock};

use anyhow::{Context as _, bail, ensure};
use btf_rs::{Btf, Member, Type};
use interceptor_common::CredOffsets;

/// The running kernel's own types.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// This kernel's offsets, read once per process; `None` where it has no BTF or its structures
/// lack a field (the connect programs then tell the proxy by the task's IDs).
pub fn offsets() -> Option<&'static CredOffsets> {
    static OFFSETS: OnceLock<Option<CredOffsets>> = OnceLock::new();
    OFFSETS
        .get_or_init(|| match read(Path::new(VMLINUX_BTF)) {
            Ok(offsets) => Some(offsets),
            Err(error) => {
                tracing::debug!(error = format!("{error:#}"), "no socket creator offsets");
                None
            }
        })
        .as_ref()
}

fn read(path: &Path) -> anyhow::Result<CredOffsets> {
    let btf = Btf::from_file(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(CredOffsets {
        sock_socket: member_offset(&btf, "sock", "sk_socket")?,
        socket_file: member_offset(&btf, "socket", "file")?,
        file_cred: member_offset(&btf, "file", "f_cred")?,
        cred_fsuid: member_offset(&btf, "cred", "fsuid")?,
        cred_fsgid: member_offset(&btf, "cred", "fsgid")?,
        _pad: 0,
    })
}

/// The byte offset of `member` in `struct name`, looking into its anonymous structs and unions
/// (where a kernel may move a field without renaming it).
fn member_offset(btf: &Btf, name: &str, member: &str) -> anyhow::Result<u32> {
    for ty in btf.resolve_types_by_name(name).unwrap_or_default() {
        if let Type::Struct(s) = ty
            && let Some(bits) = find(btf, &s.members, member)?
        {
            ensure!(bits % 8 == 0, "struct {name}'s {member} is a bit field");
            return Ok(bits / 8);
        }
    }
    bail!("this kernel's BTF has no struct {name} with a member {member}")
}

/// The bit offset of `name` among `members`, in their anonymous members too.
fn find(btf: &Btf, members: &[Member], name: &str) -> anyhow::Result<Option<u32>> {
    for m in members {
        let member_name = btf.resolve_name(m).unwrap_or_default();
        if member_name == name {
            return Ok(Some(m.bit_offset()));
        }
        if member_name.is_empty() {
            let mut ty = btf.resolve_chained_type(m)?;
            // Through typedefs and qualifiers to the anonymous struct or union itself.
            while let Type::Typedef(_) | Type::Const(_) | Type::Volatile(_) = ty {
                let Some(inner) = ty.as_btf_type() else { break };
                ty = btf.resolve_chained_type(inner)?;
            }
            if let Type::Struct(s) | Type::Union(s) = ty
                && let Some(bits) = find(btf, &s.members, name)?
            {
                return Ok(Some(m.bit_offset() + bits));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machine's kernel has BTF (every kernel the project supports with eBPF does).
    #[test]
    fn this_kernels_offsets_are_found() {
        let offsets = read(Path::new(VMLINUX_BTF)).expect("offsets");
        // `fsgid` follows `fsuid` in `struct cred` on every kernel since 2.6.
        assert_eq!(offsets.cred_fsgid, offsets.cred_fsuid + 4);
        assert!(offsets.sock_socket > 0 && offsets.file_cred > 0);
    }
}
