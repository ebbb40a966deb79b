//! `cargo xtask demo` and `cargo xtask bench`: the test kit's programs (`tests/src/bin/`), run
//! after setup and a release build, in place of xtask, with the arguments passed through.

use std::{ffi::OsString, os::unix::process::CommandExt as _, process::Command};

use anyhow::{Context as _, ensure};

use crate::{cmd, setup, workspace_root};

/// The packages the demo's and the bench's release build takes (checked for crash points by
/// `crash_points::check_user_builds`).
pub const DEMO_AND_BENCH_PACKAGES: &[&str] = &[
    "-p",
    "interceptor",
    "-p",
    "interceptor-cni",
    "-p",
    "interceptor-tests",
];

/// Runs the release build of the kit's `program` with `args`; returns only if it cannot start.
pub fn run(program: &str, args: &[OsString]) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    ensure!(
        euid == 0,
        "the {program} attaches eBPF programs and creates namespaces: run it as root, e.g. sudo -E cargo xtask {program}"
    );
    let path = setup::run()?;
    // The programs run the release `interceptor`, the CNI plugin and the kit's netprobe and
    // connload, found beside themselves.
    cmd::run(
        cmd::cargo()
            .current_dir(workspace_root())
            .args(["build", "--release"])
            .args(DEMO_AND_BENCH_PACKAGES)
            .arg("--bins")
            .env("PATH", &path),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    let binary = workspace_root().join(target).join("release").join(program);
    let err = Command::new(&binary).args(args).env("PATH", path).exec();
    Err(err).with_context(|| format!("could not start {}", binary.display()))
}
