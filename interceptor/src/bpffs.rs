//! The bpffs the pins live on: where it is, mounting one when the machine has none, and
//! removing a directory of pins.
use std::{
    fs::{self, File},
    io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

pub const BPFFS_ROOT: &str = "/sys/fs/bpf";

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
            .is_some_and(|fs| fs.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
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

/// Unpinning a link detaches its program (once no process holds it); unpinning a map only drops
/// the name, the map lives on while programs use it.
pub(crate) fn remove_pins(pin_dir: &Path) {
    if let Ok(entries) = fs::read_dir(pin_dir) {
        for entry in entries.flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
    let _ = fs::remove_dir(pin_dir);
}
