//! How the package's programs built on the kit (the demo, the bench) start and end.
//!
//! The kit panics with a message that says what failed, as the tests need. In a program such a
//! panic unwinds like an error returned from its own code, through the same drops that remove
//! its namespaces, cgroups and processes, and either one is printed as a single `error:` line
//! with exit code 1 (a panic's location and backtrace follow it only when `RUST_BACKTRACE` asks
//! for them).
use std::{
    backtrace::{Backtrace, BacktraceStatus},
    panic::{self, AssertUnwindSafe},
    process::ExitCode,
};

/// Runs `run` as the program's whole work: root is required, and a returned error or a panic
/// ends it with one `error:` line.
pub fn main(run: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "error: this attaches eBPF programs and creates namespaces and cgroups: run it as root"
        );
        return ExitCode::FAILURE;
    }
    panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        eprintln!("error: {message}");
        // Where it panicked only for those who asked (RUST_BACKTRACE), after the message.
        let backtrace = Backtrace::capture();
        if backtrace.status() == BacktraceStatus::Captured {
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            eprintln!("panicked{at}:\n{backtrace}");
        }
    }));
    match panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
        // The hook has printed it.
        Err(_) => ExitCode::FAILURE,
    }
}
