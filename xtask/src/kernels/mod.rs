//! The kernel matrix: the kernel tests in guests of Debian's kernels (5.10, 6.1, 6.12 and the
//! newest in trixie-backports), booted under QEMU by virtme-ng.
//!
//! - [`fetch`]: the kernels, through a private apt configuration under `target/kernels`;
//! - [`plan`]: which test binaries run, and what each kernel is expected to do with them;
//! - [`guest`]: booting a kernel and running the binaries in it;
//! - [`report`]: the table at the end and `target/kernels/results.json`.

mod fetch;
mod guest;
mod plan;
mod report;

use std::{
    collections::HashMap,
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{cmd, setup, workspace_root};

pub use plan::Scope;

/// virtme-ng, verified to boot Debian's kernels with the host's root over 9p.
const VIRTME_NG_VERSION: &str = "1.42";

/// What the guests need on the host.
const HOST_PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    // depmod builds the index of the kernels' modules; the guest's modprobe reads it.
    ("depmod", "kmod"),
    ("dpkg-deb", "dpkg"),
];

/// Variables passed from the host into every guest run, to replay a random table's seed.
const REPLAYED_FROM_THE_HOST: [&str; 3] = [
    "INTERCEPTOR_RANDOM_SEED",
    "INTERCEPTOR_RANDOM_BASE_SEED",
    "INTERCEPTOR_RANDOM_CONFIGS",
];

pub struct Options {
    pub scope: Scope,
    /// Only these series (`5.10`, `6.1`, `6.12`, `newest`); empty: all.
    pub series: Vec<String>,
    /// Only the runs of these test binaries; empty: all.
    pub binaries: Vec<String>,
    /// libtest's `--test-threads` in the guests.
    pub test_threads: u32,
    /// The upgrade test's previous release (the guests see the host's files).
    pub previous_release: Option<crate::upgrade::PreviousBuild>,
}

/// Runs the matrix; fails if any test expected to pass on a kernel failed there.
pub fn run(path: &OsString, options: &Options) -> anyhow::Result<()> {
    let path = setup::path_with_dir(Path::new("/usr/sbin"), path)?;
    setup::debian_packages(HOST_PACKAGES, &path)?;
    let vng_bin = setup::python_tool("virtme-ng", "vng", VIRTME_NG_VERSION)?;
    let binaries = build_test_binaries(&path)?;

    let kernels_dir = workspace_root().join("target").join("kernels");
    let apt = fetch::Apt::new(&kernels_dir)?;
    apt.update()?;
    let mut kernels = Vec::new();
    for series in fetch::SERIES {
        if !options.series.is_empty() && !options.series.iter().any(|s| s == series.name) {
            continue;
        }
        let resolved = apt.resolve(series)?;
        kernels.push(apt.install(series, &resolved, &kernels_dir)?);
    }
    if kernels.is_empty() {
        bail!(
            "no kernel series matches {:?}; the series are 5.10, 6.1, 6.12 and newest",
            options.series
        );
    }

    let mut reports = Vec::new();
    for kernel in &kernels {
        println!(
            "kernels: {} ({} {} from {}): booting...",
            kernel.release, kernel.package, kernel.version, kernel.suite
        );
        let report = run_kernel(kernel, &binaries, &vng_bin, &path, options, &kernels_dir)?;
        println!(
            "kernels: {} done in {} s",
            kernel.release, report.guest_secs
        );
        reports.push(report);
    }

    print!("{}", report::table(&reports));
    let json = kernels_dir.join("results.json");
    report::write_json(&reports, &json)?;
    let table = kernels_dir.join("supported-kernels.md");
    std::fs::write(&table, report::supported_kernels(&reports))
        .with_context(|| format!("could not write {}", table.display()))?;
    println!(
        "kernels: the supported-kernels table (docs/kernels.md) is in {}",
        table.display()
    );
    println!("kernel matrix results: {}", json.display());
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|k| {
            k.runs
                .iter()
                .filter(|r| r.is_failure())
                .map(move |r| format!("{} on {}", r.run, k.release))
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "tests expected to pass failed in the kernel matrix: {}; their logs are in {}/runs",
            failed.join(", "),
            kernels_dir.display()
        );
    }
    Ok(())
}

fn run_kernel(
    kernel: &fetch::Kernel,
    binaries: &HashMap<String, PathBuf>,
    vng_bin: &Path,
    path: &OsString,
    options: &Options,
    kernels_dir: &Path,
) -> anyhow::Result<report::KernelReport> {
    let version = plan::major_minor(&kernel.release)
        .with_context(|| format!("cannot read a version from release {}", kernel.release))?;
    let mut planned = Vec::new();
    let mut reports = Vec::new();
    for (index, run) in plan::RUNS.iter().enumerate() {
        if run.scope == Scope::Full && options.scope == Scope::Core {
            continue;
        }
        if !options.binaries.is_empty() && !options.binaries.iter().any(|b| b == run.binary) {
            continue;
        }
        let expectation = plan::expectation(run, version);
        let report =
            report::RunReport::not_run(run.id(), run.binary, run.features.label(), &expectation);
        let Some(binary) = binaries.get(run.binary) else {
            bail!(
                "no test binary {} was built: is tests/tests/{0}.rs gone? Update kernels::plan::RUNS",
                run.binary
            );
        };
        if matches!(
            expectation,
            plan::Expectation::Impossible(_) | plan::Expectation::Covered(_)
        ) {
            reports.push((report, None));
            continue;
        }
        let mut args: Vec<String> = run.filters.iter().map(|f| f.to_string()).collect();
        for skip in run.skip {
            args.extend(["--skip".to_owned(), skip.to_string()]);
        }
        let listed = list_tests(binary, &args)?;
        args.extend([
            "--test-threads".to_owned(),
            options.test_threads.to_string(),
            // What passing tests print too: kernel_support's record of the kernel.
            "--show-output".to_owned(),
        ]);
        let mut env = vec![("INTERCEPTOR_REQUIRE_PRIVILEGED", "1".to_owned())];
        if let Some(value) = run.features.env_value() {
            env.push(("INTERCEPTOR_KERNEL_FEATURES", value.to_owned()));
        }
        env.extend(run.env.iter().map(|(k, v)| (*k, (*v).to_owned())));
        // A seed replayed from the host's environment wins over the plan's count.
        for name in REPLAYED_FROM_THE_HOST {
            if let Ok(value) = std::env::var(name) {
                env.retain(|(k, _)| *k != name);
                env.push((name, value));
            }
        }
        if let Some(previous) = &options.previous_release {
            env.extend(previous.env());
        }
        let slug = format!("{index:02}-{}", run.binary);
        planned.push(guest::GuestCommand {
            slug: slug.clone(),
            binary: binary.clone(),
            args,
            env,
            timeout: Duration::from_secs(run.timeout_secs),
        });
        reports.push((report, Some((slug, listed))));
    }

    let dir = kernels_dir.join("runs").join(&kernel.release);
    let result = guest::run_booted(vng_bin, path, kernel, &planned, &dir)?;
    let runs = reports
        .into_iter()
        .map(|(report, ran)| match ran {
            None => report,
            Some((slug, listed)) => {
                let log =
                    std::fs::read_to_string(dir.join(format!("{slug}.log"))).unwrap_or_default();
                let (status, secs) = result
                    .statuses
                    .iter()
                    .find(|(s, _, _)| *s == slug)
                    .map_or((None, 0), |(_, status, secs)| (*status, *secs));
                report.with_log(&log, &listed, status, secs)
            }
        })
        .collect();
    Ok(report::KernelReport {
        series: kernel.series,
        package: kernel.package.clone(),
        version: kernel.version.clone(),
        suite: kernel.suite.clone(),
        release: kernel.release.clone(),
        guest_secs: result.elapsed.as_secs(),
        earlier_attempts: result.earlier_attempts,
        runs,
    })
}

/// The tests `binary` runs with these filters, from its `--list` (run on the host: listing
/// loads nothing), so a run killed midway names the tests it never finished.
fn list_tests(binary: &Path, filters: &[String]) -> anyhow::Result<Vec<String>> {
    let out = cmd::output(
        std::process::Command::new(binary)
            .args(filters)
            .args(["--list", "--format", "terse"]),
    )?;
    Ok(out
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Builds the kernel tests and the binaries they run beside themselves, as `cargo xtask test`
/// builds them (the same command: nothing is rebuilt after the host tests); returns the tests'
/// executables by target name, from cargo's JSON messages.
fn build_test_binaries(path: &OsString) -> anyhow::Result<HashMap<String, PathBuf>> {
    let messages = cmd::output(
        cmd::cargo()
            .current_dir(workspace_root())
            .args([
                "test",
                "--workspace",
                "--exclude",
                "interceptor-ebpf",
                "--no-run",
            ])
            .args(["--message-format", "json-render-diagnostics"])
            .env("PATH", path),
    )
    .context("building the kernel tests failed; the output above says why")?;
    let mut binaries = HashMap::new();
    for line in messages.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let target = &message["target"];
        let is_kernel_test = message["package_id"]
            .as_str()
            .is_some_and(|id| id.contains("#interceptor-tests@"))
            && target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if message["reason"] == "compiler-artifact"
            && is_kernel_test
            && let (Some(name), Some(executable)) =
                (target["name"].as_str(), message["executable"].as_str())
        {
            binaries.insert(name.to_owned(), PathBuf::from(executable));
        }
    }
    Ok(binaries)
}
