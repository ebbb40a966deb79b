//! `cargo xtask test`: every test in the workspace, with privileged tests required to run.

use std::ffi::OsString;

use anyhow::{Context as _, ensure};

use crate::{cmd, kernels, setup, workspace_root};

pub fn run(
    upgrade_only: bool,
    random_configs: Option<u32>,
    cargo_args: &[OsString],
    test_args: &[OsString],
) -> anyhow::Result<()> {
    // Cheap and offline: a version out of step fails before anything builds.
    crate::release::check()?;
    ensure_root()?;
    crate::disk::warn_if_short(
        &workspace_root().join("target"),
        crate::disk::TEST_RUN_NEEDS,
    );
    let path = setup::run()?;
    // The upgrade test's previous release, from this repository's history.
    let previous = crate::upgrade::build_previous(&path)?;
    if upgrade_only {
        return cmd::run(
            cmd::cargo()
                .current_dir(workspace_root())
                .args(["test", "-p", "interceptor-tests", "--test", "upgrade"])
                .args(cargo_args)
                .arg("--")
                .args(test_args)
                .env("PATH", &path)
                .envs(previous.env())
                .env("INTERCEPTOR_REQUIRE_PRIVILEGED", "1"),
        )
        .context("the upgrade test failed; the output above says where");
    }
    clippy(&path)?;
    // The tests load and run the image the DaemonSet runs.
    let image = crate::image::build()?;
    crate::crash_points::check_user_builds(&path)?;
    let mut cargo_test = cmd::cargo();
    cargo_test
        .current_dir(workspace_root())
        // interceptor-ebpf only builds for the BPF target, through interceptor's build.rs.
        .args(["test", "--workspace", "--exclude", "interceptor-ebpf"])
        .args(cargo_args)
        .env("PATH", &path)
        .env("INTERCEPTOR_IMAGE", image)
        .envs(previous.env())
        // Turns every "skipped: not privileged" into a failure, so a green run means the
        // kernel tests really ran.
        .env("INTERCEPTOR_REQUIRE_PRIVILEGED", "1");
    if let Some(count) = random_configs {
        cargo_test.env("INTERCEPTOR_RANDOM_CONFIGS", count.to_string());
    }
    let filtered = !cargo_args.is_empty() || !test_args.is_empty();
    if !test_args.is_empty() {
        cargo_test.arg("--").args(test_args);
    }
    cmd::run(&mut cargo_test).context("tests failed; the output above names them")?;
    if filtered {
        println!(
            "fuzzing and the kernel matrix: skipped for a filtered run (`cargo xtask fuzz` and \
             `cargo xtask kernels` run them)"
        );
        return Ok(());
    }
    // Every parser of outside input, briefly: a crash fails the run (`cargo xtask fuzz` for
    // a longer campaign).
    crate::fuzz::campaign(crate::fuzz::TEST_TIME, crate::fuzz::TARGETS)?;
    kernels::run(
        &path,
        &kernels::Options {
            scope: kernels::Scope::Core,
            series: Vec::new(),
            binaries: Vec::new(),
            test_threads: DEFAULT_GUEST_TEST_THREADS,
            previous_release: Some(previous),
        },
    )
}

/// `cargo xtask kernels`: the kernel matrix alone.
pub fn kernels(mut options: kernels::Options) -> anyhow::Result<()> {
    ensure_root()?;
    let path = setup::run()?;
    // The upgrade runs of `--full` start from it.
    options.previous_release = Some(crate::upgrade::build_previous(&path)?);
    kernels::run(&path, &options)
}

/// libtest threads in a guest of two vCPUs: the kernel tests spend much of their time waiting
/// for connections, and four halved outbound_ebpf's time on 6.1 (102 -> 52 s) where the
/// CPU-bound behaviour table took 10 % longer.
pub const DEFAULT_GUEST_TEST_THREADS: u32 = 4;

fn ensure_root() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    ensure!(
        euid == 0,
        "the kernel tests need root: run as root, e.g. sudo -E cargo xtask test"
    );
    Ok(())
}

/// Clippy with warnings as errors: the host crates, then the eBPF crate for its own target
/// (nightly, `build-std`, as `interceptor`'s build script builds it; its own target directory so
/// the two builds do not invalidate each other).
fn clippy(path: &OsString) -> anyhow::Result<()> {
    cmd::run(
        cmd::cargo()
            .current_dir(workspace_root())
            .args([
                "clippy",
                "--workspace",
                "--exclude",
                "interceptor-ebpf",
                "--all-targets",
            ])
            .args(["--", "-D", "warnings"])
            .env("PATH", path),
    )
    .context("clippy found something in the host crates: fix what it names")?;
    let target_dir = workspace_root().join("target").join("ebpf-clippy");
    cmd::run(
        std::process::Command::new("cargo")
            .current_dir(workspace_root())
            .arg(format!("+{}", setup::ebpf_toolchain()))
            .args(["clippy", "-p", "interceptor-ebpf"])
            .args([
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--release",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "-D", "warnings"])
            .env("PATH", path)
            // rustup picks the toolchain from `+nightly` only when cargo is its proxy, not the
            // stable cargo that runs xtask.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("CARGO")
            .env_remove("RUSTC"),
    )
    .context("clippy found something in the eBPF programs: fix what it names")
}
