//! The `/proc` files the agent reads: a namespace's TCP table (`net/tcp`, `net/tcp6`), for a
//! proxy's listener that existed before the programs; a process's file descriptor links
//! (`fd/N`), for the one that is that socket; and the mount table (`mountinfo`), for the
//! cgroup2 hierarchy. Lines that do not parse are skipped: these files are the kernel's, but
//! the agent must not fail on a field it does not expect.
use std::{
    collections::HashSet,
    ffi::OsString,
    os::unix::ffi::OsStringExt as _,
    path::{Path, PathBuf},
};

/// `TCP_LISTEN` in `/proc/net/tcp`'s `st` column.
const TCP_LISTEN: &str = "0A";

/// The inodes of the sockets listening on `port` in a `/proc/PID/net/tcp` or `tcp6` table.
pub fn listening_inodes(table: &str, port: u16) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9))
        else {
            continue;
        };
        let local_port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        if *state == TCP_LISTEN
            && local_port == Some(port)
            && let Ok(inode) = inode.parse()
        {
            inodes.insert(inode);
        }
    }
    inodes
}

/// The socket inode a `/proc/PID/fd/N` link names (`socket:[12345]`), if it names one: in the
/// kernel's form only (decimal, no sign, no leading zero), so one link names one inode.
pub fn socket_inode(link: &Path) -> Option<u64> {
    let digits = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// The mount point of the first cgroup2 filesystem in a `/proc/PID/mountinfo` table. Lines:
/// `id parent major:minor root mount-point options [optional...] - fstype source super`, each
/// field after one space: the kernel escapes only space, tab, newline and backslash in a path,
/// so any other whitespace is the path's own. The separator is the first field `-` after the
/// options, not the first ` - ` of the line, which a path of its own could hold.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.split('\n').find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let separator = 6 + fields.get(6..)?.iter().position(|f| *f == "-")?;
        if *fields.get(separator + 1)? != "cgroup2" {
            return None;
        }
        Some(unescape_mountinfo(fields[4]))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` (octal); every other byte of
/// the path is as it is, whatever its encoding. A backslash not followed by three octal digits
/// that fit a byte is kept as it is.
pub fn unescape_mountinfo(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .and_then(|digits| {
                let value = digits.iter().fold(0u16, |n, d| n * 8 + u16::from(d - b'0'));
                u8::try_from(value).ok()
            });
        match code {
            Some(code) => {
                out.push(code);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// How the kernel writes a path into mountinfo (`mangle` in fs/proc_namespace.c): space, tab,
/// newline and backslash as `\ooo`. The inverse of [`unescape_mountinfo`], for the tests and
/// the fuzz target.
pub fn escape_mountinfo(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut out = Vec::new();
    for &b in path.as_os_str().as_bytes() {
        if matches!(b, b' ' | b'\t' | b'\n' | b'\\') {
            out.extend(format!("\\{b:03o}").bytes());
        } else {
            out.push(b);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/PID/net/tcp6` of a pod whose proxy listens on 4143 (dual-stack) and 4191, with one
    /// connection established to 4143.
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:102F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  2102        0 31337 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:105F 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  2102        0 31338 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:102F 0000000000000000FFFF00000100007F:A3D2 01 00000000:00000000 00:00000000 00000000  2102        0 31339 1 0000000000000000 20 4 30 10 -1
";

    #[test]
    fn a_listening_socket_is_found_by_its_port_and_state() {
        assert_eq!(listening_inodes(TCP6, 4143), HashSet::from([31337]));
        assert_eq!(listening_inodes(TCP6, 4191), HashSet::from([31338]));
        assert!(listening_inodes(TCP6, 41250).is_empty(), "established only");
    }

    #[test]
    fn lines_that_do_not_parse_are_skipped() {
        let table = "header\n0: 0100007F:102F 00000000:0000 0A\n\
                 1: 0100007F:ZZZZ 00000000:0000 0A 0 0 0 0 0 7\n\
                 2: 0100007F:102F 00000000:0000 0A 0 0 0 0 0 -1\n\
                 3: 0100007F:102F 00000000:0000 0A 0 0 0 0 0 8\n";
        assert_eq!(listening_inodes(table, 4143), HashSet::from([8]));
    }

    #[test]
    fn a_socket_link_names_its_inode() {
        assert_eq!(socket_inode(Path::new("socket:[31337]")), Some(31337));
        assert_eq!(socket_inode(Path::new("pipe:[31337]")), None);
        assert_eq!(socket_inode(Path::new("socket:[-1]")), None);
        assert_eq!(socket_inode(Path::new("/dev/null")), None);
    }

    /// `socket:[032]` and `socket:[+32]` were read as inode 32: the kernel writes neither. Found by
    /// the `proc` fuzz target.
    #[test]
    fn a_socket_link_is_read_only_in_the_kernels_form() {
        assert_eq!(socket_inode(Path::new("socket:[0]")), Some(0));
        assert_eq!(socket_inode(Path::new("socket:[032]")), None);
        assert_eq!(socket_inode(Path::new("socket:[+32]")), None);
        assert_eq!(socket_inode(Path::new("socket:[]")), None);
    }

    #[test]
    fn finds_the_cgroup2_mount_in_a_hybrid_layout() {
        let mountinfo = "\
25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn unescapes_mount_points() {
        let mountinfo = "26 25 0:24 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(PathBuf::from("/mnt/my cgroups"))
        );
        assert_eq!(cgroup2_mount("1 2 0:1 / / rw - ext4 /dev/vda rw\n"), None);
    }

    /// A mount point outside ASCII came back with each byte of its UTF-8 taken for a character of
    /// its own (`/mnt/é` as `/mnt/Ã©`), a directory that does not exist. The `proc` fuzz target
    /// checks every path comes back.
    #[test]
    fn a_mount_point_outside_ascii_comes_back_as_it_is() {
        let path = Path::new("/mnt/cgroup é\\x");
        let field = escape_mountinfo(path);
        assert_eq!(field, "/mnt/cgroup\\040é\\134x");
        assert_eq!(unescape_mountinfo(&field), path);
        let mountinfo = format!("26 25 0:24 / {field} rw - cgroup2 none rw\n");
        assert_eq!(cgroup2_mount(&mountinfo).as_deref(), Some(path));
    }

    /// What is not an escape the kernel writes stays as it is: a backslash before digits that are
    /// not octal, or before an octal number over a byte.
    #[test]
    fn a_backslash_that_is_no_escape_is_kept() {
        assert_eq!(unescape_mountinfo("/a\\089"), Path::new("/a\\089"));
        assert_eq!(unescape_mountinfo("/a\\777"), Path::new("/a\\777"));
        assert_eq!(unescape_mountinfo("/a\\04"), Path::new("/a\\04"));
    }

    /// Fields are split at spaces only: other whitespace (a carriage return, a no-break space) in a
    /// path is not escaped by the kernel, and split there the mount point came back cut short.
    #[test]
    fn whitespace_the_kernel_does_not_escape_is_the_paths_own() {
        for path in ["/mnt/a\rb", "/mnt/a\u{a0}b", "/mnt/a\u{b}b\u{c}"] {
            let mountinfo = format!("26 25 0:24 / {path} rw shared:9 - cgroup2 none rw\n");
            assert_eq!(
                cgroup2_mount(&mountinfo),
                Some(PathBuf::from(path)),
                "{path:?}"
            );
        }
    }

    /// A mount point `-` made the line's first ` - ` the separator, and the cgroup2 mount was not
    /// found. Found by the `proc` fuzz target.
    #[test]
    fn the_separator_is_the_field_after_the_options() {
        let mountinfo = "26 25 0:24 / - rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(mountinfo), Some(PathBuf::from("-")));
        let mountinfo = "26 25 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount("26 25 0:24 / /x rw - cgroup2"),
            Some(PathBuf::from("/x"))
        );
        assert_eq!(cgroup2_mount("26 25 0:24 / /x rw cgroup2 -"), None);
        assert_eq!(cgroup2_mount("- cgroup2"), None);
    }
}
