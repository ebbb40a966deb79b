//! Free space under target/. A build that fills the disk fails in the linker with a bus error
//! that does not say why (CI, 2026-11-29, 18 minutes into `cargo xtask test`), so the tasks say
//! it themselves: before a run that may not fit, and after one that failed on a full disk.

use std::{ffi::CString, io, mem::MaybeUninit, os::unix::ffi::OsStrExt as _, path::Path};

/// What `cargo xtask test` wrote under target/ from nothing, measured on 2026-11-29 (13 GB:
/// debug 5.7, the previous release 1.5, the kernel guests 1.4, the image build 1.3, fuzzing
/// 1.3, release 1.2, tools 0.4), with room for what the next crates add.
pub const TEST_RUN_NEEDS: u64 = 16 * GB;

/// Below this a failed step is taken to have failed for want of space.
const FULL_BELOW: u64 = GB;

const GB: u64 = 1 << 30;

/// Bytes an unprivileged process may still write on the filesystem holding `path` (its
/// nearest existing ancestor: target/ is not there before the first build).
fn free_bytes(path: &Path) -> io::Result<u64> {
    let existing = path
        .ancestors()
        .find(|dir| dir.exists())
        .unwrap_or(Path::new("/"));
    let path = CString::new(existing.as_os_str().as_bytes())?;
    let mut stat = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stat` is valid for writes of a statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Prints a warning when `target` has less free than `needs`; the run goes on, as a warm
/// target/ needs far less than a cold one.
pub fn warn_if_short(target: &Path, needs: u64) {
    if let Ok(free) = free_bytes(target)
        && let Some(warning) = shortage(free, needs)
    {
        eprintln!("warning: {warning}");
    }
}

/// The words for a failed run when the disk holding `target` is (nearly) full.
pub fn full_disk_hint(target: &Path) -> Option<String> {
    let free = free_bytes(target).ok()?;
    (free < FULL_BELOW).then(|| {
        format!(
            "the disk holding {} has only {} free, so a \"No space left on device\" or a \
             linker's bus error above is why: free space (`cargo clean` empties target/) \
             and run again",
            target.display(),
            size(free)
        )
    })
}

fn shortage(free: u64, needs: u64) -> Option<String> {
    (free < needs).then(|| {
        format!(
            "{} free on the disk holding target/, and a run from an empty target/ writes \
             about {} there: a build may stop with \"No space left on device\"",
            size(free),
            size(needs)
        )
    })
}

fn size(bytes: u64) -> String {
    if bytes >= GB {
        format!("{:.1} GB", bytes as f64 / GB as f64)
    } else {
        format!("{} MB", bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_names_what_is_free_and_what_a_run_writes() {
        assert_eq!(shortage(20 * GB, TEST_RUN_NEEDS), None);
        assert_eq!(
            shortage(287 << 20, TEST_RUN_NEEDS).as_deref(),
            Some(
                "287 MB free on the disk holding target/, and a run from an empty target/ \
                 writes about 16.0 GB there: a build may stop with \"No space left on device\""
            )
        );
    }

    #[test]
    fn free_space_is_read_from_the_nearest_existing_directory() {
        // statvfs of the path itself would fail with ENOENT.
        assert!(free_bytes(Path::new("/tmp/xtask-no-such-dir/target")).is_ok());
    }
}
