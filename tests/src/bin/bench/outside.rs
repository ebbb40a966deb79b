//! What the programs cost a socket outside every meshed pod. On a node they are attached to the
//! kubelet's pod cgroup, or to the cgroup2 root where the agent finds none, so they also run for
//! sockets of pods that are not meshed and of host processes; there they find no pod for the
//! socket's network namespace (one map lookup) and leave it alone. Measured as a connect from a
//! process in the attached cgroup whose namespace is not registered, against the same process in
//! a cgroup with nothing attached, the two taking turns in 20 ms slices.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use interceptor_tests::{Netns, agent_home::free_loopback_addr};

use super::{
    load::{self, Sample},
    report::Spread,
};

/// One kind of socket, measured with no program attached and with the programs attached.
pub struct OutsideResult {
    pub what: &'static str,
    pub none: Vec<Sample>,
    pub attached: Vec<Sample>,
}

/// connload in `netns`, from `cgroup`, connecting to its own listener at `addr` on loopback and
/// accepting: `SO_ORIGINAL_DST` must have no answer (nothing was redirected). One worker pinned
/// to CPU 0, RST close, as the headline cases.
fn command(connload: &Path, netns: &Path, cgroup: &Path, addr: &str) -> Command {
    let mut cmd = Command::new(connload);
    cmd.arg("--listen-netns")
        .arg(netns)
        .args(["--listen", addr])
        .arg("--connect-netns")
        .arg(netns)
        .args(["--connect", addr, "--expect", "none"])
        .arg("--cgroup")
        .arg(cgroup)
        .args(["--workers", "1", "--cpu", "0", "--close", "rst"]);
    cmd
}

/// Measures a host process (the node's network namespace, this process's) and an unmeshed pod
/// (a namespace of its own), each in `attached` (a cgroup the programs are attached to) against
/// `free` (one with nothing attached).
pub fn run(
    connload: &Path,
    attached: &Path,
    free: &Path,
    repetitions: usize,
    seconds: f64,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Vec<OutsideResult>> {
    let pod = Netns::new("bench-unmeshed");
    // The host's loopback is shared with whatever runs here: ports free a moment ago.
    let host = (
        "host process",
        PathBuf::from("/proc/self/ns/net"),
        [free_loopback_addr(), free_loopback_addr()],
    );
    let unmeshed = (
        "unmeshed pod",
        pod.path(),
        ["127.0.0.1:4140".to_owned(), "127.0.0.1:4141".to_owned()],
    );
    let mut results = Vec::new();
    for (what, netns, [none_addr, attached_addr]) in [host, unmeshed] {
        let mut samples = load::interleave(
            vec![
                (
                    format!("{what}, no program"),
                    command(connload, &netns, free, &none_addr),
                ),
                (
                    format!("{what}, programs attached"),
                    command(connload, &netns, attached, &attached_addr),
                ),
            ],
            repetitions as f64 * seconds * 2.0,
            repetitions,
        )?;
        let (attached, none) = (samples.pop().expect("two"), samples.pop().expect("two"));
        let result = OutsideResult {
            what,
            none,
            attached,
        };
        let ratio = result.ratio();
        progress(&format!(
            "{what}: {:.3} of its rate with no program attached ({:.3}-{:.3})",
            ratio.median, ratio.min, ratio.max
        ));
        results.push(result);
    }
    Ok(results)
}

impl OutsideResult {
    /// The rate with the programs attached over the rate without, repetition by repetition.
    pub fn ratio(&self) -> Spread {
        Spread::of(
            &self
                .attached
                .iter()
                .zip(&self.none)
                .map(|(a, n)| a.rate / n.rate)
                .collect::<Vec<_>>(),
        )
    }
}

/// The report's section.
pub fn section(results: &[OutsideResult]) -> String {
    let mut md = String::from(
        "\n## Sockets outside meshed pods\n\nThe programs run for every socket of the cgroup they are attached to (the kubelet's pod cgroup, or the cgroup2 root where the agent finds none). A process in that cgroup whose network namespace is not registered (a host process, in the node's namespace; an unmeshed pod's, in its own) connects to its own listener on loopback, accepts and asks SO_ORIGINAL_DST (no answer), taking turns in 20 ms slices with the same process in a cgroup with nothing attached; one worker pinned to CPU 0, RST close.\n\n| socket | no program conn/s | programs attached conn/s | vs no program (min-max) | +µs/conn | CPU µs/conn (none / attached) |\n|---|---:|---:|---|---:|---|\n",
    );
    let median = |samples: &[Sample], f: fn(&Sample) -> f64| {
        Spread::of(&samples.iter().map(f).collect::<Vec<_>>()).median
    };
    for result in results {
        let ratio = result.ratio();
        let extra_us = Spread::of(
            &result
                .attached
                .iter()
                .zip(&result.none)
                .map(|(a, n)| 1e6 / a.rate - 1e6 / n.rate)
                .collect::<Vec<_>>(),
        )
        .median;
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.0} | **{:.3}** ({:.3}-{:.3}) | {extra_us:+.2} | {:.2} / {:.2} |",
            result.what,
            median(&result.none, |s| s.rate),
            median(&result.attached, |s| s.rate),
            ratio.median,
            ratio.min,
            ratio.max,
            median(&result.none, |s| s.cpu_us_per_conn),
            median(&result.attached, |s| s.cpu_us_per_conn),
        );
    }
    md
}
