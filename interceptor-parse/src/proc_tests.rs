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
