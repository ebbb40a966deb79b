//! Where the eBPF time goes: the kernel's per-program run-time statistics
//! (`kernel.bpf_stats_enabled`, turned on only for the measuring run: they slow every program run)
//! of the programs a process holds, read before and after a run.
use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    os::fd::{AsFd as _, OwnedFd},
};

use anyhow::Context as _;
use interceptor_sys::ProgInfo;

use super::{
    base_case,
    lab::{Interception, Lab},
    load::{Case, Family, HEADLINE_MODES, Mode},
    matrix::DIRECTIONS,
};

/// One program's share of a connection.
#[derive(Clone, Debug, PartialEq)]
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

/// One eBPF mode's programs in one case.
pub struct Costs {
    pub mode: Mode,
    pub case: Case,
    pub programs: Vec<ProgramCost>,
}

/// Runs per mode and direction; each program's figure is its lowest. A run's average is moved
/// by a single stall of the vCPU inside a program run (one of 1 ms among 20,000 runs adds 50 ns),
/// and this host's VMs are stalled often: the same program read 50 ns apart in one run of two
/// modes.
const RUNS: usize = 5;

/// Each program's run with its lowest time per run (runs in the order of the first).
fn lowest_of(runs: Vec<Vec<ProgramCost>>) -> Vec<ProgramCost> {
    let mut runs = runs.into_iter();
    let mut lowest = runs.next().unwrap_or_default();
    for run in runs {
        for cost in run {
            if let Some(kept) = lowest.iter_mut().find(|kept| kept.name == cost.name)
                && cost.ns_per_run < kept.ns_per_run
            {
                *kept = cost;
            }
        }
    }
    lowest
}

/// The programs' costs in each headline case with each eBPF mode of [`HEADLINE_MODES`] (the
/// programs of this kernel and of older ones), the lowest of [`RUNS`] runs of `seconds` (at
/// least 1) each with that mode's `interceptor run`.
pub fn measure(lab: &mut Lab, family: Family, seconds: f64) -> anyhow::Result<Vec<Costs>> {
    let mut measured = Vec::new();
    for mode in HEADLINE_MODES.into_iter().filter(|m| m.is_ebpf()) {
        for direction in DIRECTIONS {
            let case = base_case(direction, family);
            let Interception::Ebpf(meshed) = &lab.pod(mode, 0)?.interception else {
                unreachable!("an eBPF pod is meshed by interceptor run");
            };
            let pid = meshed.child.id();
            let mut runs = Vec::with_capacity(RUNS);
            for _ in 0..RUNS {
                runs.push(program_costs(pid, || {
                    Ok(lab.measure(&case, mode, seconds.max(1.0))?.conns)
                })?);
            }
            let programs = lowest_of(runs);
            measured.push(Costs {
                mode,
                case,
                programs,
            });
        }
    }
    Ok(measured)
}

/// The report's section.
pub fn section(measured: &[Costs]) -> String {
    let mut md = String::from(
        "\n## Where the eBPF time goes\n\nSeparate runs with the kernel's per-program statistics on (`kernel.bpf_stats_enabled`; they slow every program run, so these runs are not in the tables): each program's lowest average of five 1 s runs (a single stall of the VM inside a program run moves an average), for the programs of this kernel and those the loader chooses when `INTERCEPTOR_KERNEL_FEATURES` takes features away.\n\n| case | mode | program | ns/run | runs/conn | µs/conn |\n|---|---|---|---:|---:|---:|\n",
    );
    for Costs {
        mode,
        case,
        programs,
    } in measured
    {
        let mode = mode.name();
        let total: f64 = programs.iter().map(ProgramCost::us_per_conn).sum();
        for cost in programs {
            let _ = writeln!(
                md,
                "| {case} | {mode} | {} | {:.0} | {:.2} | {:.2} |",
                cost.name,
                cost.ns_per_run,
                cost.runs_per_conn,
                cost.us_per_conn()
            );
        }
        let _ = writeln!(md, "| {case} | {mode} | **total** | | | **{total:.2}** |");
    }
    md
}

/// Per program held by process `pid`: average run time and runs per connection over `run`,
/// which returns how many connections it made. The programs are found through the process's
/// program and link fds, so the programs of pods' links count too.
fn program_costs(
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

/// Turns on run_time_ns/run_cnt accounting (kernel.bpf_stats_enabled) for as long as the fd is
/// open: closing it, even by the process dying, puts the setting back as it was.
fn enable_bpf_stats() -> anyhow::Result<OwnedFd> {
    interceptor_sys::enable_stats().context("BPF_ENABLE_STATS")
}

fn prog_fd(id: u32) -> anyhow::Result<OwnedFd> {
    interceptor_sys::prog_fd_by_id(id).with_context(|| format!("the fd of program {id}"))
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

fn prog_info(fd: &OwnedFd) -> anyhow::Result<ProgInfo> {
    interceptor_sys::prog_info(fd.as_fd()).context("a program's info")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(name: &str, ns_per_run: f64, runs_per_conn: f64) -> ProgramCost {
        ProgramCost {
            name: name.to_owned(),
            ns_per_run,
            runs_per_conn,
        }
    }

    #[test]
    fn each_program_keeps_its_own_lowest_run() {
        let runs = vec![
            vec![cost("a", 150.0, 1.0), cost("b", 90.0, 11.0)],
            vec![cost("b", 80.0, 11.5), cost("a", 160.0, 1.0)],
            vec![cost("a", 140.0, 2.0), cost("b", 85.0, 11.0)],
        ];
        assert_eq!(
            lowest_of(runs),
            vec![cost("a", 140.0, 2.0), cost("b", 80.0, 11.5)]
        );
        assert_eq!(lowest_of(Vec::new()), Vec::new());
    }
}
