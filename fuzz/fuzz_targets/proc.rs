//! The `/proc` files the agent reads (`interceptor_parse::proc`): a namespace's TCP table
//! (`net/tcp`, `net/tcp6`) for the sockets listening on the proxy's inbound port, a file
//! descriptor's link (`socket:[inode]`), and the mount table (`mountinfo`) for the cgroup2
//! hierarchy, its mount point unescaped as the kernel escapes it.
//!
//! Input: two bytes, the port (big-endian), then the text (UTF-8), read as each of the files;
//! each of its lines is also taken for a link and for a mount point's path.
#![no_main]

use std::path::Path;

use interceptor_parse::proc::{
    cgroup2_mount, escape_mountinfo, listening_inodes, socket_inode, unescape_mountinfo,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [high, low, text @ ..] = data else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let port = u16::from_be_bytes([*high, *low]);

    let inodes = listening_inodes(text, port);
    for inode in &inodes {
        assert!(
            text.contains(&inode.to_string()),
            "an inode found is in the table"
        );
    }
    // A listener appended to the table is found, whatever came before it.
    let inode = u64::MAX - 7;
    let table = format!(
        "sl local_address rem_address st\n{text}\n   9: 00000000:{port:04X} 00000000:0000 0A \
         00000000:00000000 00:00000000 00000000  2102        0 {inode} 1 0 100 0 0 10 0\n"
    );
    let found = listening_inodes(&table, port);
    assert!(found.contains(&inode), "the listener appended is found");
    assert!(found.is_superset(&inodes), "appending takes nothing away");

    for line in text.lines() {
        if let Some(inode) = socket_inode(Path::new(line)) {
            assert_eq!(line, format!("socket:[{inode}]"), "only a socket's link");
        }
        // A mount point, as the kernel writes it into mountinfo, comes back as it is.
        if line.contains('\0') {
            continue;
        }
        let path = Path::new(line);
        let field = escape_mountinfo(path);
        assert_eq!(
            unescape_mountinfo(&field),
            path,
            "{field:?} unescapes to its path"
        );
        let mountinfo = format!(
            "25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs ro\n\
             26 25 0:24 / {field} rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
        );
        assert_eq!(
            cgroup2_mount(&mountinfo).as_deref(),
            Some(path),
            "{mountinfo:?}"
        );
    }
    if let Some(mount) = cgroup2_mount(text) {
        assert!(
            text.contains(" - cgroup2"),
            "only a cgroup2 mount: {mount:?}"
        );
    }
});
