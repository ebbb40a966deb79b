//! The bpffs the pins live on: where it is, and mounting one when the machine has none.
use std::{
    fs::{self, File},
    io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

pub const BPFFS_ROOT: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum BpffsError {
    #[error("creating {path}: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("mounting a bpffs on {path}: {source} (mount one: mount -t bpf bpf {path})")]
    Mount { path: PathBuf, source: nix::Error },
}

/// Mounts a bpffs on `path` unless one is there already; whether it mounted one.
pub fn ensure_bpffs(path: &Path) -> Result<bool, BpffsError> {
    let is_bpffs = |p: &Path| {
        File::open(p)
            .ok()
            .and_then(|f| nix::sys::statfs::fstatfs(f.as_fd()).ok())
            .is_some_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
    };
    if is_bpffs(path) {
        return Ok(false);
    }
    fs::create_dir_all(path).map_err(|source| BpffsError::Create {
        path: path.to_owned(),
        source,
    })?;
    nix::mount::mount(
        Some("bpf"),
        path,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| BpffsError::Mount {
        path: path.to_owned(),
        source,
    })?;
    Ok(true)
}
