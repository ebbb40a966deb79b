//! The raw system calls of the interceptor, its tests and xtask (bpf(2), pidfd for the listener
//! adoption, and the namespace and rtnetlink calls of [`netns`]), in one place that owns the
//! `unsafe`: one private [`sys_bpf`] on the
//! kernel's own `union bpf_attr` (aya-obj's generated bindings, never hand-counted offsets), and
//! a safe, typed function per command. aya 0.14 lacks
//! some of these (link info, link update of cgroup sockopt links, loading hand-assembled programs),
//! and the tests and xtask must not need aya at all.
//!
//! Each public item names the oldest kernel it works on.
pub mod asm;
pub mod netns;
pub mod userns;
use std::{
    ffi::{CStr, CString},
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

pub use aya_obj::generated::{
    BPF_CMPXCHG, BPF_F_ALLOW_MULTI, BPF_PSEUDO_MAP_FD, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB,
    BPF_SOCK_OPS_STATE_CB_FLAG, bpf_attach_type, bpf_func_id, bpf_insn, bpf_link_type,
    bpf_map_type, bpf_prog_type,
};
use aya_obj::generated::{
    BPF_OBJ_NAME_LEN, bpf_attr, bpf_cmd, bpf_link_info, bpf_map_info, bpf_prog_info, bpf_stats_type,
};

/// bpf(2) with `attr`, zero beyond what the command uses (the kernel refuses non-zero bytes it
/// does not know).
///
/// # Safety
/// Every pointer stored in `attr` must be valid for what `cmd` does with it (read or written,
/// for the length stored next to it) for the duration of the call.
unsafe fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<libc::c_long> {
    // SAFETY: attr is a whole bpf_attr; the pointers in it are the caller's to vouch for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// [`sys_bpf`] for the commands that return a new file descriptor.
///
/// # Safety
/// As [`sys_bpf`]; `cmd` must be one that returns a new fd on success.
unsafe fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    // SAFETY: forwarded from the caller.
    let fd = unsafe { sys_bpf(cmd, attr) }?;
    // SAFETY: the command returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is a union of plain integer fields: all zeroes is valid, and is what the
    // kernel expects of every field a command does not use.
    unsafe { std::mem::zeroed() }
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A kernel object name (`char[BPF_OBJ_NAME_LEN]`): at most 15 bytes and a NUL.
fn object_name(name: &str) -> [libc::c_char; BPF_OBJ_NAME_LEN as usize] {
    let mut out = [0; BPF_OBJ_NAME_LEN as usize];
    let bytes = name.as_bytes().iter().take(out.len() - 1);
    for (to, from) in out.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    out
}

fn name_string(name: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The object pinned at `path` (BPF_OBJ_GET), or `None` when nothing is pinned there. Kernel >= 4.4.
pub fn obj_get(path: &Path) -> io::Result<Option<OwnedFd>> {
    let pathname = c_path(path)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = pathname.as_ptr() as u64;
    // SAFETY: pathname is a NUL-terminated string that outlives the call; OBJ_GET returns an fd.
    match unsafe { sys_bpf_fd(bpf_cmd::BPF_OBJ_GET, &mut attr) } {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Pins `fd` (a map, program or link) at `path` on a bpffs (BPF_OBJ_PIN). Kernel >= 4.4.
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let pathname = c_path(path)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = pathname.as_ptr() as u64;
    attr.__bindgen_anon_4.bpf_fd = fd_u32(fd);
    // SAFETY: pathname is a NUL-terminated string that outlives the call.
    unsafe { sys_bpf(bpf_cmd::BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// Attaches `prog` to `target` (a cgroup or network namespace fd) with a new link
/// (BPF_LINK_CREATE). Kernel >= 5.7 (cgroup links), 5.9 (sk_lookup links).
pub fn link_create(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: bpf_attach_type,
) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.link_create.__bindgen_anon_1.prog_fd = fd_u32(prog);
    attr.link_create.__bindgen_anon_2.target_fd = fd_u32(target);
    attr.link_create.attach_type = attach_type as u32;
    // SAFETY: no pointers; LINK_CREATE returns an fd.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr) }
}

/// Makes `link` run `new_prog` instead of its program, atomically: no moment without a program on
/// the hook (BPF_LINK_UPDATE). `ENOLINK` when the link's cgroup or namespace is gone.
/// Kernel >= 5.7 (cgroup links), 5.9 (sk_lookup links).
pub fn link_update(link: BorrowedFd<'_>, new_prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = zeroed_attr();
    attr.link_update.link_fd = fd_u32(link);
    attr.link_update.__bindgen_anon_1.new_prog_fd = fd_u32(new_prog);
    // SAFETY: no pointers.
    unsafe { sys_bpf(bpf_cmd::BPF_LINK_UPDATE, &mut attr) }.map(drop)
}

/// Attaches `prog` to `target` without a link (BPF_PROG_ATTACH), as older tools do; `flags` e.g.
/// [`BPF_F_ALLOW_MULTI`]. Kernel >= 4.10 (BPF_F_ALLOW_MULTI: 4.15).
pub fn prog_attach(
    prog: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    attach_type: bpf_attach_type,
    flags: u32,
) -> io::Result<()> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_5.__bindgen_anon_1.target_fd = fd_u32(target);
    attr.__bindgen_anon_5.attach_bpf_fd = fd_u32(prog);
    attr.__bindgen_anon_5.attach_type = attach_type as u32;
    attr.__bindgen_anon_5.attach_flags = flags;
    // SAFETY: no pointers.
    unsafe { sys_bpf(bpf_cmd::BPF_PROG_ATTACH, &mut attr) }.map(drop)
}

/// The ids of the programs attached to `target` at `attach_type`, at most 64 (BPF_PROG_QUERY).
/// Kernel >= 4.15.
pub fn prog_query(target: BorrowedFd<'_>, attach_type: bpf_attach_type) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    let mut attr = zeroed_attr();
    attr.query.__bindgen_anon_1.target_fd = fd_u32(target);
    attr.query.attach_type = attach_type as u32;
    attr.query.prog_ids = ids.as_mut_ptr() as u64;
    attr.query.__bindgen_anon_2.prog_cnt = ids.len() as u32;
    // SAFETY: prog_ids points at prog_cnt writable u32s that outlive the call.
    unsafe { sys_bpf(bpf_cmd::BPF_PROG_QUERY, &mut attr) }?;
    // SAFETY: reading an integer the kernel wrote back.
    let count = unsafe { attr.query.__bindgen_anon_2.prog_cnt } as usize;
    Ok(ids[..count.min(ids.len())].to_vec())
}

/// A new fd for the program with kernel id `id` (BPF_PROG_GET_FD_BY_ID). Kernel >= 4.13.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_6.__bindgen_anon_1.prog_id = id;
    // SAFETY: no pointers; PROG_GET_FD_BY_ID returns an fd.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_PROG_GET_FD_BY_ID, &mut attr) }
}

/// Turns on the kernel's per-program run time and run count (`kernel.bpf_stats_enabled`) for as
/// long as the returned fd is open: closing it, even by the process dying, puts the setting back
/// as it was (BPF_ENABLE_STATS). Kernel >= 5.8.
pub fn enable_stats() -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.enable_stats.type_ = bpf_stats_type::BPF_STATS_RUN_TIME as u32;
    // SAFETY: no pointers; ENABLE_STATS returns an fd.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_ENABLE_STATS, &mut attr) }
}

/// One of the `bpf_*_info` structs BPF_OBJ_GET_INFO_BY_FD fills in.
trait InfoStruct: Copy {}
impl InfoStruct for bpf_link_info {}
impl InfoStruct for bpf_prog_info {}
impl InfoStruct for bpf_map_info {}

/// BPF_OBJ_GET_INFO_BY_FD into a zeroed `T`. The kernel writes at most `size_of::<T>()` bytes and
/// leaves the fields it does not know (an older kernel) zero. Kernel >= 4.13.
fn obj_info<T: InfoStruct>(fd: BorrowedFd<'_>) -> io::Result<T> {
    // SAFETY: the info structs are plain integers (and arrays of them): all zeroes is valid.
    let mut info: T = unsafe { std::mem::zeroed() };
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = fd_u32(fd);
    attr.info.info_len = size_of::<T>() as u32;
    attr.info.info = std::ptr::from_mut(&mut info) as u64;
    // SAFETY: info points at info_len writable bytes that outlive the call.
    unsafe { sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

/// What a link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkTarget {
    /// A cgroup v2, by id (on cgroup2 the directory's inode number); 0 once the cgroup is gone
    /// and the link defunct.
    Cgroup { id: u64 },
    /// A network namespace, by inode number; 0 once the namespace is gone and the link defunct.
    Netns { inode: u32 },
    /// Another kind of link (its `bpf_link_type`).
    Other { link_type: u32 },
}

impl LinkTarget {
    /// Whether what the link was attached to is gone: it runs nowhere and can never run again.
    pub fn is_defunct(&self) -> bool {
        matches!(self, Self::Cgroup { id: 0 } | Self::Netns { inode: 0 })
    }
}

/// A link, as the kernel describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub id: u32,
    /// The program it runs.
    pub prog_id: u32,
    /// The hook (`bpf_attach_type`) of a cgroup or netns link; 0 for other links.
    pub attach_type: u32,
    pub target: LinkTarget,
}

/// What the link `fd` is attached to and runs (BPF_OBJ_GET_INFO_BY_FD). Kernel >= 5.8.
pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    let info: bpf_link_info = obj_info(fd)?;
    // SAFETY: reading plain integers; the union member read is the one `type_` says is there.
    let (attach_type, target) = unsafe {
        match info.type_ {
            t if t == bpf_link_type::BPF_LINK_TYPE_CGROUP as u32 => {
                let cgroup = info.__bindgen_anon_1.cgroup;
                (
                    cgroup.attach_type,
                    LinkTarget::Cgroup {
                        id: cgroup.cgroup_id,
                    },
                )
            }
            t if t == bpf_link_type::BPF_LINK_TYPE_NETNS as u32 => {
                let netns = info.__bindgen_anon_1.netns;
                (
                    netns.attach_type,
                    LinkTarget::Netns {
                        inode: netns.netns_ino,
                    },
                )
            }
            link_type => (0, LinkTarget::Other { link_type }),
        }
    };
    Ok(LinkInfo {
        id: info.id,
        prog_id: info.prog_id,
        attach_type,
        target,
    })
}

/// A loaded program, as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    /// Its `bpf_prog_type`.
    pub prog_type: u32,
    /// Its name, cut to 15 bytes by the kernel.
    pub name: String,
    /// Time spent in it and times run while stats were enabled ([`enable_stats`]; kernel >= 5.1).
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

/// The program `fd` (BPF_OBJ_GET_INFO_BY_FD). Kernel >= 4.13 (names: 4.15).
pub fn prog_info(fd: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let info: bpf_prog_info = obj_info(fd)?;
    Ok(ProgInfo {
        id: info.id,
        prog_type: info.type_,
        name: name_string(&info.name),
        run_time_ns: info.run_time_ns,
        run_cnt: info.run_cnt,
    })
}

/// A map, as the kernel describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub id: u32,
    /// Its `bpf_map_type`.
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub name: String,
}

/// The map `fd` (BPF_OBJ_GET_INFO_BY_FD). Kernel >= 4.13 (names: 4.15).
pub fn map_info(fd: BorrowedFd<'_>) -> io::Result<MapInfo> {
    let info: bpf_map_info = obj_info(fd)?;
    Ok(MapInfo {
        id: info.id,
        map_type: info.type_,
        key_size: info.key_size,
        value_size: info.value_size,
        max_entries: info.max_entries,
        name: name_string(&info.name),
    })
}

/// Creates a map with no BTF (BPF_MAP_CREATE). Kernel >= 3.18 (names: 4.15).
pub fn map_create(
    map_type: bpf_map_type,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_1.map_type = map_type as u32;
    attr.__bindgen_anon_1.key_size = key_size;
    attr.__bindgen_anon_1.value_size = value_size;
    attr.__bindgen_anon_1.max_entries = max_entries;
    attr.__bindgen_anon_1.map_name = object_name(name);
    // SAFETY: no pointers; MAP_CREATE returns an fd.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_MAP_CREATE, &mut attr) }
}

/// Deletes the element of the map `fd` at `key` (BPF_MAP_DELETE_ELEM); a key that is not the
/// map's key size is refused. Kernel >= 4.13.
pub fn map_delete_elem(fd: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    map_key_size(fd, &[key])?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_2.map_fd = fd.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = key.as_ptr() as u64;
    // SAFETY: `key` is readable for its length, which is the map's key size (checked above),
    // all the kernel reads.
    unsafe { sys_bpf(bpf_cmd::BPF_MAP_DELETE_ELEM, &mut attr) }.map(drop)
}

/// The key size of the map `fd`, which every one of `keys` must have: a key of another size is
/// refused before the kernel reads past it or short of it.
fn map_key_size(fd: BorrowedFd<'_>, keys: &[&[u8]]) -> io::Result<usize> {
    let key_size = map_info(fd)?.key_size as usize;
    match keys.iter().find(|k| k.len() != key_size) {
        Some(key) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a {}-byte key for a map of {key_size}-byte keys", key.len()),
        )),
        None => Ok(key_size),
    }
}

/// Whether the map `fd` has an element at any of `keys`, for maps whose values userspace cannot
/// read (a sock hash of listening sockets answers every lookup with ENOSPC). BPF_MAP_GET_NEXT_KEY
/// from an absent key starts over at the map's first key, from a present one it goes on past it
/// (or finds none past the last): a key is there exactly when that answer is not the first key.
/// One system call per key and two more, where walking every key costs one per element. As
/// racy as any read of a map others change. Kernel >= 4.12.
pub fn map_has_any_key(fd: BorrowedFd<'_>, keys: &[&[u8]]) -> io::Result<bool> {
    let key_size = map_key_size(fd, keys)?;
    let mut first = vec![0u8; key_size];
    if !map_next_key(fd, None, &mut first)? {
        return Ok(false);
    }
    let mut after = vec![0u8; key_size];
    for key in keys {
        if !map_next_key(fd, Some(key), &mut after)? || after != first {
            return Ok(true);
        }
    }
    Ok(false)
}

/// BPF_MAP_GET_NEXT_KEY: the key after `key` (the first with `None`) into `next`, which is the
/// map's key size; false when there is none.
fn map_next_key(fd: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<bool> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_2.map_fd = fd.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = key.map_or(0, |k| k.as_ptr() as u64);
    attr.__bindgen_anon_2.__bindgen_anon_1.next_key = next.as_mut_ptr() as u64;
    // SAFETY: `key` (when given) is readable and `next` writable for the map's key size, all
    // the kernel reads and writes (the caller checked the size).
    match unsafe { sys_bpf(bpf_cmd::BPF_MAP_GET_NEXT_KEY, &mut attr) } {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// A read-only view of the values of a `BPF_F_MMAPABLE` array map (mmap(2) of its fd), unmapped
/// when dropped: reading a large array costs memory reads, not a system call per element.
/// Kernel >= 5.5.
pub struct MappedArray {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl MappedArray {
    /// Maps the first `len` bytes of the map's values (elements are `value_size` rounded up to
    /// 8 bytes apart).
    pub fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Self> {
        // SAFETY: a new shared read-only mapping of the map's pages; no existing memory is
        // touched, and the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast()).ok_or_else(io::Error::last_os_error)?;
        Ok(Self { ptr, len })
    }

    /// The `u64` at `offset`, read once (the programs change the memory meanwhile); `None` past
    /// the end or unaligned.
    pub fn read_u64(&self, offset: usize) -> Option<u64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: in bounds and aligned (checked above; the mapping is page-aligned), within a
        // live mapping; a volatile read, since the kernel's programs write it concurrently.
        Some(unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset).cast::<u64>()) })
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One instruction: `dst_reg` and `src_reg` are 4-bit register numbers.
pub fn insn(code: u8, dst_reg: u8, src_reg: u8, off: i16, imm: i32) -> bpf_insn {
    bpf_insn {
        code,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(dst_reg, src_reg),
        off,
        imm,
    }
}

/// A program to load with [`prog_load`].
#[derive(Clone, Copy, Debug)]
pub struct ProgLoad<'a> {
    pub prog_type: bpf_prog_type,
    /// Required by some program types (cgroup sock_addr, sk_lookup); kernel >= 4.17.
    pub expected_attach_type: Option<bpf_attach_type>,
    /// At most 15 bytes are kept.
    pub name: &'a str,
    pub insns: &'a [bpf_insn],
    pub license: &'a CStr,
}

/// Loads (and so verifies) a program (BPF_PROG_LOAD). A refusal carries the verifier's log in
/// its message. Kernel >= 3.18; the program type sets its own minimum (sk_lookup: 5.9).
pub fn prog_load(prog: &ProgLoad<'_>) -> io::Result<OwnedFd> {
    match load(prog, None) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            // Again with the verifier's log, which only a failed load needs.
            let mut log = vec![0u8; 1 << 16];
            if let Ok(fd) = load(prog, Some(&mut log)) {
                return Ok(fd);
            }
            let log = String::from_utf8_lossy(&log);
            let log = log.trim_end_matches('\0').trim();
            Err(io::Error::new(
                e.kind(),
                format!("loading {}: {e}: {log}", prog.name),
            ))
        }
    }
}

fn load(prog: &ProgLoad<'_>, log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_3.prog_type = prog.prog_type as u32;
    attr.__bindgen_anon_3.insn_cnt = prog.insns.len() as u32;
    attr.__bindgen_anon_3.insns = prog.insns.as_ptr() as u64;
    attr.__bindgen_anon_3.license = prog.license.as_ptr() as u64;
    attr.__bindgen_anon_3.prog_name = object_name(prog.name);
    attr.__bindgen_anon_3.expected_attach_type = prog.expected_attach_type.map_or(0, |t| t as u32);
    if let Some(log) = log {
        attr.__bindgen_anon_3.log_level = 1;
        attr.__bindgen_anon_3.log_size = log.len() as u32;
        attr.__bindgen_anon_3.log_buf = log.as_mut_ptr() as u64;
    }
    // SAFETY: insns (insn_cnt of them), license and log_buf (log_size bytes, writable) outlive
    // the call; PROG_LOAD returns an fd.
    unsafe { sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr) }
}

/// What kind of object an fd is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Link,
    Map,
    Prog,
    /// Anything else, as `/proc/self/fd` names it (`anon_inode:bpf_iter`, a path).
    Other(String),
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Link => f.write_str("a bpf link"),
            Self::Map => f.write_str("a bpf map"),
            Self::Prog => f.write_str("a bpf program"),
            Self::Other(what) => write!(f, "{what}"),
        }
    }
}

/// What kind of bpf object `fd` is, from the name of its anonymous inode in `/proc/self/fd`
/// (`anon_inode:bpf-link`, `-map`, `-prog`). Kernel >= 5.7 (links; maps and programs: 4.4).
pub fn object_kind(fd: BorrowedFd<'_>) -> io::Result<ObjectKind> {
    let target = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    Ok(match target.to_string_lossy().as_ref() {
        // Links made by BPF_LINK_CREATE are `bpf_link`, those opened from a pin `bpf-link`.
        "anon_inode:bpf-link" | "anon_inode:bpf_link" => ObjectKind::Link,
        "anon_inode:bpf-map" => ObjectKind::Map,
        "anon_inode:bpf-prog" => ObjectKind::Prog,
        other => ObjectKind::Other(other.to_owned()),
    })
}

/// A pidfd of process `pid`: readable once the process has exited (poll/epoll). Kernel >= 5.3.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain integer arguments; the fd returned on success is new and owned at once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(pidfd as i32) })
}

/// A duplicate of file descriptor `fd` of process `pid` (pidfd_open, then pidfd_getfd): how the
/// agent takes a proxy's listening socket that predates registration. Needs ptrace access to
/// the process (root has it). Kernel >= 5.6.
pub fn duplicate_fd_of(pid: i32, fd: i32) -> io::Result<OwnedFd> {
    let pidfd = pidfd_open(pid)?;
    // SAFETY: plain integer arguments; the fd returned on success is new and owned at once.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as i32) })
}

/// Caps glibc's malloc arenas at `arenas` (mallopt M_ARENA_MAX). glibc gives threads arenas of
/// their own, up to eight per CPU, each keeping the memory it once held: a daemon that hands
/// short requests to a few threads in turn would otherwise hold several idle arenas' worth.
/// Returns whether the allocator took the setting.
pub fn limit_malloc_arenas(arenas: i32) -> bool {
    // SAFETY: mallopt takes plain integers and only changes the allocator's tuning.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
}

/// Grows this process's table of file descriptors to hold at least `fds` of them, so that
/// opening descriptor number `fds - 1` later does not grow it. The kernel grows the table by
/// doubling when a descriptor does not fit, and in a process of more than one thread each
/// growth waits for an RCU grace period (`expand_fdtable` -> `synchronize_rcu`): 10 to 40 ms
/// here, paid by whichever call opened the descriptor. The table never shrinks. `any` is a
/// descriptor to duplicate (the duplicate is closed at once); `fds` must not exceed the soft
/// `RLIMIT_NOFILE`, else `EINVAL`.
pub fn grow_fd_table(any: BorrowedFd<'_>, fds: u32) -> io::Result<()> {
    let Some(highest) = fds.checked_sub(1) else {
        return Ok(());
    };
    // SAFETY: F_DUPFD_CLOEXEC duplicates `any` onto the lowest free descriptor >= `highest`,
    // growing the table to hold it, and returns it (or -1).
    let fd = unsafe {
        libc::fcntl(
            any.as_raw_fd(),
            libc::F_DUPFD_CLOEXEC,
            highest as libc::c_int,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned to this function, and nothing else knows it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_pack_dst_low_src_high() {
        let i = insn(asm::MOV64_REG, 6, 1, -4, 7);
        assert_eq!((i.dst_reg(), i.src_reg(), i.off, i.imm), (6, 1, -4, 7));
        assert_eq!(size_of::<bpf_insn>(), 8);
    }

    #[test]
    fn the_descriptor_table_is_grown_and_the_duplicate_closed() {
        let fd_table = || {
            std::fs::read_to_string("/proc/self/status")
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("FDSize:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap()
        };
        use std::os::fd::AsFd as _;
        let root = std::fs::File::open("/").unwrap();
        // 1,024 is the smallest soft limit a process is given.
        grow_fd_table(root.as_fd(), 1000).unwrap();
        assert!(fd_table() >= 1000, "{}", fd_table());
        assert!(
            !Path::new("/proc/self/fd/999").exists(),
            "the duplicate is closed"
        );
        grow_fd_table(root.as_fd(), 0).unwrap();
    }

    #[test]
    fn names_are_cut_to_fifteen_bytes() {
        let name = object_name("a_name_longer_than_fifteen");
        assert_eq!(name_string(&name), "a_name_longer_t");
    }
}
