//! `cargo xtask demo`: builds the binaries the demo runs.

use std::{env, path::PathBuf};

use crate::{cmd, setup, workspace_root};

pub fn run() -> anyhow::Result<()> {
    let path = setup::run()?;
    cmd::run(
        cmd::cargo()
            .current_dir(workspace_root())
            .args([
                "build",
                "--release",
                "-p",
                "interceptor",
                "-p",
                "interceptor-tests",
                "--bins",
            ])
            .env("PATH", path),
    )?;
    let release = target_dir().join("release");
    println!("interceptor: {}", release.join("interceptor").display());
    println!("netprobe: {}", release.join("netprobe").display());
    Ok(())
}

/// cargo's target directory; a relative CARGO_TARGET_DIR is relative to the workspace root,
/// where the build above runs.
fn target_dir() -> PathBuf {
    let dir = env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
    workspace_root().join(dir)
}
