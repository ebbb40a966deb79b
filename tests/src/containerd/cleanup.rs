//! What containerd leaves behind on purpose (shims, mounts), removed when a node is dropped.
use std::path::Path;

/// SIGKILLs every process whose command line mentions `dir`.
pub(super) fn kill_processes_mentioning(dir: &Path) {
    let needle = dir.display().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Lazily unmounts every mount under `dir` (containerd's rootfs, shm and netns mounts),
/// deepest first.
pub(super) fn unmount_under(dir: &Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
    }
}
