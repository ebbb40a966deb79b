//! Where the eBPF time goes: the kernel's per-program run-time statistics
//! (`kernel.bpf_stats_enabled`, turned on only for the measuring run: they slow every program run)
//! of the programs a process holds, read before and after a run.
use std::{
    collections::BTreeSet,
    fs,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::ensure;

/// One program's share of a connection.
pub struct ProgramCost {
    pub name: String,
    pub ns_per_run: f64,
    pub runs_per_conn: f64,
}

impl ProgramCost {
    pub fn us_per_conn(&self) -> f64 {
        self.ns_per_run * self.runs_per_conn / 1e3
    }
}

/// Per program held by process `pid`: average run time and runs per connection over `run`,
/// which returns how many connections it made. The programs are found through the process's
/// program and link fds, so the programs of pods' links count too.
pub fn program_costs(
    pid: u32,
    run: impl FnOnce() -> anyhow::Result<f64>,
) -> anyhow::Result<Vec<ProgramCost>> {
    let _stats = enable_bpf_stats()?;
    let progs: Vec<OwnedFd> = program_ids(pid)?
        .into_iter()
        .map(prog_fd)
        .collect::<anyhow::Result<_>>()?;
    let before: Vec<ProgInfo> = progs.iter().map(prog_info).collect::<anyhow::Result<_>>()?;
    let conns = run()?;
    let after: Vec<ProgInfo> = progs.iter().map(prog_info).collect::<anyhow::Result<_>>()?;
    Ok(before
        .iter()
        .zip(&after)
        .map(|(before, after)| {
            let runs = (after.run_cnt - before.run_cnt) as f64;
            ProgramCost {
                name: after.name.clone(),
                ns_per_run: (after.run_time_ns - before.run_time_ns) as f64 / runs.max(1.0),
                runs_per_conn: runs / conns.max(1.0),
            }
        })
        .filter(|cost| cost.runs_per_conn > 0.0)
        .collect())
}

/// bpf(2) commands from <linux/bpf.h>; the libc crate does not define them.
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_ENABLE_STATS: libc::c_long = 32;

/// bpf(2); `attr` is the command's part of union bpf_attr (the kernel zero-extends it and may
/// write back into it).
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> anyhow::Result<libc::c_long> {
    // SAFETY: attr is valid for size_of::<T>() bytes, read and written by the kernel only.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    ensure!(
        rc >= 0,
        "bpf command {cmd}: {}",
        std::io::Error::last_os_error()
    );
    Ok(rc)
}

fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> anyhow::Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: these commands return a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Turns on run_time_ns/run_cnt accounting (kernel.bpf_stats_enabled) for as long as the fd is
/// open: closing it, even by the process dying, puts the setting back as it was.
fn enable_bpf_stats() -> anyhow::Result<OwnedFd> {
    bpf_fd(BPF_ENABLE_STATS, &mut [0u32 /* BPF_STATS_RUN_TIME */])
}

fn prog_fd(id: u32) -> anyhow::Result<OwnedFd> {
    bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut [id, 0, 0])
}

/// The ids of the programs a process holds: its program and link fds name them in fdinfo.
fn program_ids(pid: u32) -> anyhow::Result<BTreeSet<u32>> {
    let mut ids = BTreeSet::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        // An fd closed since the directory was listed has no fdinfo any more.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        ids.extend(
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:")?.trim().parse::<u32>().ok()),
        );
    }
    Ok(ids)
}

struct ProgInfo {
    name: String,
    run_time_ns: u64,
    run_cnt: u64,
}

fn prog_info(fd: &OwnedFd) -> anyhow::Result<ProgInfo> {
    // struct bpf_prog_info up to run_cnt; offsets from <linux/bpf.h> (the struct only grows).
    const NAME: usize = 64;
    const RUN_TIME_NS: usize = 192;
    const RUN_CNT: usize = 200;
    let mut info = [0u8; RUN_CNT + 8];
    #[repr(C)]
    struct InfoByFd {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr = InfoByFd {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let u64_at = |at: usize| u64::from_ne_bytes(info[at..at + 8].try_into().expect("8 bytes"));
    let name = info[NAME..NAME + 16]
        .split(|&b| b == 0)
        .next()
        .unwrap_or_default();
    Ok(ProgInfo {
        name: String::from_utf8_lossy(name).into_owned(),
        run_time_ns: u64_at(RUN_TIME_NS),
        run_cnt: u64_at(RUN_CNT),
    })
}
