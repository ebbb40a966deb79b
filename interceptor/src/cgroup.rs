//! The cgroup v2 directory the programs attach to.
use std::{
    fs::File,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no cgroup2 filesystem in /proc/self/mountinfo: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or pass --cgroup"
    )]
    NoCgroup2Mount,
    #[error("reading /proc/self/mountinfo: {0}")]
    Mountinfo(std::io::Error),
    #[error("cannot open cgroup {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a cgroup v2 directory (pass a directory under the cgroup2 mount)")]
    NotCgroup2 { path: PathBuf },
}

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// The root of the cgroup2 hierarchy, from this process's mount table (never hard-coded: on
/// hybrid systems it is /sys/fs/cgroup/unified, on unified ones /sys/fs/cgroup).
pub fn cgroup2_root() -> Result<PathBuf, CgroupError> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::Mountinfo)?;
    find_cgroup2_mount(&mountinfo).ok_or(CgroupError::NoCgroup2Mount)
}

/// mountinfo lines: `id parent major:minor root mount-point options... - fstype source super`.
fn find_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4].iter().all(u8::is_ascii_digit)
        {
            let code = u8::from_str_radix(&s[i + 1..i + 4], 8).unwrap_or(b'?');
            out.push(code as char);
            i += 4;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

/// Opens `path` and checks it is a cgroup v2 directory.
pub fn open_cgroup2(path: &Path) -> Result<File, CgroupError> {
    let file = File::open(path).map_err(|source| CgroupError::Open {
        path: path.to_owned(),
        source,
    })?;
    let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| CgroupError::Open {
        path: path.to_owned(),
        source: e.into(),
    })?;
    if fs.filesystem_type().0 as i64 != CGROUP2_SUPER_MAGIC || !path.is_dir() {
        return Err(CgroupError::NotCgroup2 {
            path: path.to_owned(),
        });
    }
    Ok(file)
}

/// The directory of the cgroup with id `id` (on cgroup2, the directory's inode number), found by
/// walking the cgroup2 hierarchy; `None` when it is gone or cannot be read.
pub fn path_of_id(id: u64) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    let mut dirs = vec![cgroup2_root().ok()?];
    while let Some(dir) = dirs.pop() {
        if std::fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            return Some(dir);
        }
        let entries = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok);
        dirs.extend(
            entries
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_in_a_hybrid_layout() {
        let mountinfo = "\
25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
";
        assert_eq!(
            find_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn unescapes_mount_points() {
        let mountinfo = "26 25 0:24 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        assert_eq!(
            find_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/mnt/my cgroups"))
        );
        assert_eq!(
            find_cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
