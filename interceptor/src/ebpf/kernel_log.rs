//! The eBPF programs' own log lines (aya-log), for the rare failures they cannot report any
//! other way: an original destination or the proxy's inbound listener that a map could not
//! take, an inbound connection refused because the proxy is not listening. Never a connection's
//! decision: those are counted.
//!
//! Off unless asked for, and then free: unless the log filter enables this module at debug level
//! (e.g. `--log-level info,interceptor::ebpf=debug`), the programs are loaded with their log
//! level off, which the verifier knows (it is a read-only global) and so removes their logging
//! code, and nothing reads their log. When on, a thread reads the programs' ring buffer and
//! writes each record as an event of this module, with the program's name in `program`.
use std::{io::PipeReader, os::fd::AsFd as _, thread::JoinHandle};

use aya::{Ebpf, EbpfLoader};
use aya_log::{EbpfLogger, Level};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
};
use tracing::warn;

/// The target of the programs' log lines: a log filter that enables it at debug level turns them
/// on.
const TARGET: &str = module_path!();

/// The programs' log level when nobody reads their log: nothing is written.
const OFF: u8 = 0;
/// Their level when their log is read: all they write (failures, and `debug` for the least
/// important).
const ON: u8 = Level::Debug as u8;

/// Whether the log filter asks for the programs' log lines. Call it after logging is set up.
pub(super) fn wanted() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Sets the programs' log level, before they are loaded.
pub(super) fn set_level(loader: &mut EbpfLoader<'_>, wanted: bool) {
    loader.override_global(aya_log::LEVEL, if wanted { &ON } else { &OFF }, true);
}

/// Reads the programs' log until dropped.
pub(super) struct KernelLog {
    /// Closing it wakes the reader, which then stops.
    stop: Option<std::io::PipeWriter>,
    reader: Option<JoinHandle<()>>,
}

impl KernelLog {
    /// Starts reading the log of `ebpf`'s programs. A log that cannot be read is reported and
    /// done without: it must not keep the programs from running.
    pub(super) fn start(ebpf: &mut Ebpf) -> Option<Self> {
        let started = EbpfLogger::init_with_logger(ebpf, Forward)
            .map_err(|e| e.to_string())
            .and_then(|logger| {
                let (woken, stop) = std::io::pipe().map_err(|e| e.to_string())?;
                let reader = std::thread::Builder::new()
                    .name("ebpf-log".into())
                    .spawn(move || read(logger, &woken))
                    .map_err(|e| e.to_string())?;
                Ok(Self {
                    stop: Some(stop),
                    reader: Some(reader),
                })
            });
        match started {
            Ok(log) => Some(log),
            Err(error) => {
                warn!(%error, "the eBPF programs' log cannot be read; running without it");
                None
            }
        }
    }
}

impl Drop for KernelLog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Writes the log's records as they come, until `woken` reports the other end closed.
fn read(mut logger: EbpfLogger<Forward>, woken: &PipeReader) {
    loop {
        let stopping = {
            let mut fds = [
                PollFd::new(logger.as_fd(), PollFlags::POLLIN),
                PollFd::new(woken.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(error) => {
                    warn!(%error, "waiting for the eBPF programs' log; no longer reading it");
                    return;
                }
            }
            fds[1].revents().is_some_and(|r| !r.is_empty())
        };
        logger.flush();
        if stopping {
            return;
        }
    }
}

/// Hands aya-log's records to `tracing`, under [`TARGET`].
struct Forward;

impl log::Log for Forward {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        // The programs log with their own name as the target.
        let program = record.target();
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: TARGET, program, "{message}"),
            log::Level::Warn => tracing::warn!(target: TARGET, program, "{message}"),
            log::Level::Info => tracing::info!(target: TARGET, program, "{message}"),
            log::Level::Debug => tracing::debug!(target: TARGET, program, "{message}"),
            log::Level::Trace => tracing::trace!(target: TARGET, program, "{message}"),
        }
    }

    fn flush(&self) {}
}
