//! The previous release's `interceptor`, built from this repository's history for the upgrade
//! test (tests/tests/upgrade.rs, docs/releasing.md "The upgrade test").
//!
//! Its source is the commit CHANGELOG.md records for the release before HEAD's, unpacked with
//! `git archive` under target/upgrade/. It builds into a target directory of its own,
//! target/upgrade/target (kept from one run to the next): cargo names a workspace crate's
//! artifacts by its name, version and path relative to its workspace, so a previous release of
//! the same version as HEAD (every commit after a release until the next is cut) would share
//! ours, and one tree's build would pass for the other's.
use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, ensure};

use crate::{cmd, release, workspace_root};

/// The environment the upgrade test reads the previous release from.
pub const BINARY_ENV: &str = "INTERCEPTOR_PREVIOUS_RELEASE_BIN";
pub const NAME_ENV: &str = "INTERCEPTOR_PREVIOUS_RELEASE";

#[derive(Clone)]
pub struct PreviousBuild {
    /// `Baseline 0.1.0 - 2026-11-27 (07eb428a3e9e)`: what the test's messages call it.
    pub name: String,
    pub binary: PathBuf,
}

impl PreviousBuild {
    /// The upgrade test's environment: where the previous release's binary is, and its name.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            (BINARY_ENV, self.binary.display().to_string()),
            (NAME_ENV, self.name.clone()),
        ]
    }
}

/// Builds the previous release's `interceptor` (quick when it already is).
pub fn build_previous(path: &OsString) -> anyhow::Result<PreviousBuild> {
    let previous = release::previous()?;
    let short = &previous.commit[..12];
    let name = format!("{} ({short})", previous.heading);
    let root = workspace_root();
    let home = root.join("target").join("upgrade").join(short);
    let source = home.join("src");
    unpack(&previous.commit, &source)?;
    println!(
        "upgrade test: building {name}'s interceptor from {}",
        source.display()
    );

    let target_dir = root.join("target").join("upgrade").join("target");
    cmd::run(
        cmd::cargo()
            .current_dir(&source)
            .args([
                "build",
                "--locked",
                "-p",
                "interceptor",
                "--bin",
                "interceptor",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .env("PATH", path)
            // As this tree's Cargo.toml has it (0.2.0 and before built full debug info: 2.1 GB
            // in its target directory against 1.5 GB).
            .env("CARGO_PROFILE_DEV_DEBUG", "line-tables-only")
            // xtask's own cargo sets these for its build; the previous tree picks its own.
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC")
            .env_remove("CARGO_MANIFEST_DIR"),
    )
    .with_context(|| format!("building {name} failed: the output above says why"))?;
    let binary = home.join("interceptor");
    fs::copy(target_dir.join("debug").join("interceptor"), &binary)
        .context("copy the previous release's interceptor out of its target directory")?;
    let version = cmd::output(Command::new(&binary).arg("--version"))?;
    ensure!(
        version.trim() == format!("interceptor {}", previous.version),
        "{} says {:?}, but CHANGELOG.md's {} says {}",
        binary.display(),
        version.trim(),
        previous.heading,
        previous.version
    );
    Ok(PreviousBuild { name, binary })
}

/// `git archive COMMIT` unpacked at `source`, once: a stamp says it is complete.
fn unpack(commit: &str, source: &Path) -> anyhow::Result<()> {
    let stamp = source.join(".unpacked-from");
    if fs::read_to_string(&stamp).is_ok_and(|s| s.trim() == commit) {
        return Ok(());
    }
    if source.exists() {
        fs::remove_dir_all(source).with_context(|| format!("remove {}", source.display()))?;
    }
    fs::create_dir_all(source).with_context(|| format!("create {}", source.display()))?;
    let archive = source.with_extension("tar");
    cmd::run(
        Command::new("git")
            .current_dir(workspace_root())
            .args(["archive", "--format=tar", "-o"])
            .arg(&archive)
            .arg(commit),
    )?;
    cmd::run(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(source),
    )?;
    fs::remove_file(&archive).with_context(|| format!("remove {}", archive.display()))?;
    fs::write(&stamp, commit).with_context(|| format!("write {}", stamp.display()))
}
