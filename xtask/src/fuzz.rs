//! `cargo xtask fuzz`: the cargo-fuzz targets of `fuzz/` (libFuzzer, on the nightly the eBPF
//! programs build with), each for a while from its committed seed corpus. New inputs go to a
//! scratch corpus under `target/fuzz/`, so the committed one stays small; a crash fails the run
//! and leaves its input under `target/fuzz/artifacts/<target>/`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

use crate::{cmd, setup, workspace_root};

/// Builds with this machine's stable Rust (1.95) with `--locked`.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Every target of fuzz/Cargo.toml, and what it drives (docs/testing.md, "Fuzzing").
pub const TARGETS: &[&str] = &[
    "cni",
    "conflist",
    "api_request",
    "proxy_init_flags",
    "annotations",
    "pod_record",
    "kube_pod",
    "id_map",
    "cni_commands",
    "netlink",
    "proc",
    "iptables_save",
];

/// Each target's time in `cargo xtask test`. With the twelve targets built, the step took 79 s
/// (load 5 to 6.5). For eight, measured on two cores shared with other builds
/// (load 2.8 to 4.6): a cold install of cargo-fuzz took 46 to 109 s, a cold build of the seven
/// targets 129 to 167 s, and the step from a cold build with cargo-fuzz installed 175 s (the
/// targets two at a time: 46 s; one at a time the step took 229 s), so 221 to 284 s with a cold
/// install. The install and the build dominate; once done, the step is its fuzzing (46 s for
/// eight targets, 79 s for twelve) and an incremental build.
pub const TEST_TIME: Duration = Duration::from_secs(10);

/// One input running longer than this is a hang, reported as a crash.
const INPUT_TIMEOUT_SECS: u32 = 10;

/// What libFuzzer reported for one target.
struct Stats {
    target: &'static str,
    executions: u64,
    /// libFuzzer's `cov:` (edges reached) and `ft:` (features) on its last status line.
    cov: u64,
    ft: u64,
    /// Inputs saved as crashes, hangs, leaks or out-of-memory.
    crashes: Vec<PathBuf>,
}

/// `cargo xtask fuzz`: `targets` (all when empty), each for `time`.
pub fn run(time: Duration, targets: &[String]) -> anyhow::Result<()> {
    let targets: Vec<&'static str> = if targets.is_empty() {
        TARGETS.to_vec()
    } else {
        targets
            .iter()
            .map(|t| {
                TARGETS
                    .iter()
                    .copied()
                    .find(|known| known == t)
                    .with_context(|| format!("no fuzz target {t:?}: {}", TARGETS.join(", ")))
            })
            .collect::<anyhow::Result<_>>()?
    };
    campaign(time, &targets)
}

/// Installs cargo-fuzz if missing, builds the targets, runs each for `time`, prints what each
/// reached, and fails if any crashed.
pub fn campaign(time: Duration, targets: &[&'static str]) -> anyhow::Result<()> {
    let started = Instant::now();
    cargo_fuzz()?;
    let fuzz_dir = workspace_root().join("fuzz");
    let target_dir = workspace_root().join("target").join("fuzz");
    cmd::run(
        nightly_cargo()
            .current_dir(&fuzz_dir)
            .args(["fuzz", "build", "--target-dir"])
            .arg(&target_dir),
    )
    .context("building the fuzz targets failed; the cargo output above says why")?;
    println!(
        "fuzz: cargo-fuzz and the targets ready in {:.0} s; {} s per target",
        started.elapsed().as_secs_f64(),
        time.as_secs()
    );
    // libFuzzer runs a target on one core: as many run at once as there are cores, so the
    // twelve targets of `cargo xtask test` take 6 × 10 s on two cores rather than 12 × 10 s.
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut all = Vec::new();
    for group in targets.chunks(jobs) {
        let results: Vec<anyhow::Result<Stats>> = std::thread::scope(|scope| {
            let runs: Vec<_> = group
                .iter()
                .map(|&target| scope.spawn(|| fuzz(target, time, &fuzz_dir, &target_dir)))
                .collect();
            runs.into_iter()
                .map(|run| run.join().expect("a fuzz run's thread panicked"))
                .collect()
        });
        for stats in results {
            let stats = stats?;
            println!(
                "fuzz {}: {} executions, cov {} ft {}, {} crashes",
                stats.target,
                stats.executions,
                stats.cov,
                stats.ft,
                stats.crashes.len()
            );
            all.push(stats);
        }
    }
    println!("\n| target | executions | cov | ft | crashes |\n|---|---:|---:|---:|---:|");
    for s in &all {
        println!(
            "| {} | {} | {} | {} | {} |",
            s.target,
            s.executions,
            s.cov,
            s.ft,
            s.crashes.len()
        );
    }
    println!("fuzz: done in {:.0} s", started.elapsed().as_secs_f64());
    let crashed: Vec<String> = all
        .iter()
        .flat_map(|s| {
            s.crashes.iter().map(|c| {
                format!(
                    "{} (reproduce: cd fuzz && cargo +{} fuzz run --target-dir ../target/fuzz {} {})",
                    c.display(),
                    setup::ebpf_toolchain(),
                    s.target,
                    c.display()
                )
            })
        })
        .collect();
    ensure!(
        crashed.is_empty(),
        "fuzzing found crashes: {}; fix each with a regression test in the owning crate",
        crashed.join("; ")
    );
    Ok(())
}

/// One target for `time` from its committed corpus, new inputs into a scratch corpus.
fn fuzz(
    target: &'static str,
    time: Duration,
    fuzz_dir: &Path,
    target_dir: &Path,
) -> anyhow::Result<Stats> {
    let scratch = target_dir.join("corpus").join(target);
    let artifacts = target_dir.join("artifacts").join(target);
    let log = target_dir.join("logs").join(format!("{target}.log"));
    for dir in [
        &scratch,
        &artifacts,
        &log.parent().expect("a log directory").to_owned(),
    ] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let before = saved(&artifacts)?;
    let log_file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    println!(
        "fuzz {target}: {} s (log: {})",
        time.as_secs(),
        log.display()
    );
    let status = nightly_cargo()
        .current_dir(fuzz_dir)
        .args(["fuzz", "run", "--target-dir"])
        .arg(target_dir)
        .arg(target)
        .arg(&scratch)
        .arg(fuzz_dir.join("corpus").join(target))
        .arg("--")
        .arg(format!("-max_total_time={}", time.as_secs()))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg("-print_final_stats=1")
        // libFuzzer joins the prefix and the file name as they are.
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .stdout(Stdio::null())
        .stderr(log_file)
        .status()
        .with_context(|| format!("could not start cargo fuzz run {target}"))?;
    remove_scratch_dirs();
    let text = fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let crashes: Vec<PathBuf> = saved(&artifacts)?
        .into_iter()
        .filter(|a| !before.contains(a))
        .collect();
    if !status.success() && crashes.is_empty() {
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "cargo fuzz run {target} failed ({status}) without saving an input:\n{}",
            tail.join("\n")
        );
    }
    if !crashes.is_empty() {
        // The panic message and backtrace, before libFuzzer's summary.
        let from = text
            .find("panicked at")
            .or_else(|| text.find("==ERROR"))
            .unwrap_or(0);
        let report: String = text[from..].lines().take(25).collect::<Vec<_>>().join("\n");
        eprintln!("fuzz {target}: crashed:\n{report}");
    }
    let stat = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("stat::{name}: ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    let (cov, ft) = coverage(&text);
    Ok(Stats {
        target,
        executions: stat("number_of_executed_units"),
        cov,
        ft,
        crashes,
    })
}

/// `cov:` and `ft:` of libFuzzer's last status line (`#1234 NEW cov: 812 ft: 2210 ...`).
fn coverage(log: &str) -> (u64, u64) {
    let field = |line: &str, name: &str| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
    log.lines()
        .rev()
        .find_map(|line| Some((field(line, "cov:")?, field(line, "ft:")?)))
        .unwrap_or((0, 0))
}

/// The `conflist` target works in `/dev/shm/interceptor-fuzz-conflist-<pid>` and cannot remove
/// it at exit (libFuzzer ends the process): remove those of processes that are gone.
fn remove_scratch_dirs() {
    let Ok(entries) = fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("interceptor-fuzz-conflist-"))
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// The inputs libFuzzer saved in `dir`.
fn saved(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    files.sort();
    Ok(files)
}

/// cargo-fuzz at [`CARGO_FUZZ_VERSION`], installed with the stable toolchain if missing.
fn cargo_fuzz() -> anyhow::Result<()> {
    let version = nightly_cargo()
        .args(["fuzz", "--version"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    if version.as_deref() == Some(&format!("cargo-fuzz {CARGO_FUZZ_VERSION}")) {
        println!("cargo-fuzz {CARGO_FUZZ_VERSION}: present");
        return Ok(());
    }
    println!("cargo-fuzz {CARGO_FUZZ_VERSION}: installing (about a minute)...");
    cmd::run(cmd::cargo().args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--force",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))
    .context("installing cargo-fuzz failed; the cargo output above says why")
}

/// `cargo +<nightly>`: libFuzzer's instrumentation needs the nightly (the eBPF programs' one).
fn nightly_cargo() -> Command {
    let mut cargo = Command::new("cargo");
    cargo
        .arg(format!("+{}", setup::ebpf_toolchain()))
        // rustup picks the toolchain from `+nightly` only when cargo is its proxy, not the
        // stable cargo that runs xtask.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC");
    cargo
}
