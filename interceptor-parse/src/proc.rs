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
#[path = "proc_tests.rs"]
mod tests;
