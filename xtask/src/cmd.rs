//! Running child commands with errors that name the command and how it ended.

use std::{
    env,
    process::{Command, Stdio},
};

use anyhow::{Context as _, ensure};

/// Runs `cmd` with the terminal as its stdio; fails if it cannot start or exits unsuccessfully.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    ensure!(status.success(), "`{}` failed ({status})", show(cmd));
    Ok(())
}

/// Runs `cmd` and returns its stdout; its stderr goes to the terminal, so failures explain themselves.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    ensure!(
        out.status.success(),
        "`{}` failed ({})",
        show(cmd),
        out.status
    );
    String::from_utf8(out.stdout).with_context(|| format!("`{}` printed non-UTF-8", show(cmd)))
}

/// `cargo` of the toolchain running xtask (cargo sets `CARGO` for `cargo run`).
pub fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
