//! `cargo xtask test`: every test in the workspace, with privileged tests required to run.

use std::ffi::OsString;

use anyhow::{Context as _, ensure};

use crate::{cmd, setup, workspace_root};

pub fn run(cargo_args: &[OsString], test_args: &[OsString]) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    ensure!(
        euid == 0,
        "the kernel tests need root: run as root, e.g. sudo -E cargo xtask test"
    );
    let path = setup::run()?;
    let mut cargo_test = cmd::cargo();
    cargo_test
        .current_dir(workspace_root())
        // interceptor-ebpf only builds for the BPF target, through interceptor's build.rs.
        .args(["test", "--workspace", "--exclude", "interceptor-ebpf"])
        .args(cargo_args)
        .env("PATH", path)
        // Turns every "skipped: not privileged" into a failure, so a green run means the
        // kernel tests really ran.
        .env("INTERCEPTOR_REQUIRE_PRIVILEGED", "1");
    if !test_args.is_empty() {
        cargo_test.arg("--").args(test_args);
    }
    cmd::run(&mut cargo_test).context("tests failed; the output above names them")
}
