//! The watching installer's loop: the plugin chained again whenever the primary CNI drops it,
//! each restore reported to the agent.
use std::{
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        mpsc::{self, SyncSender, TrySendError},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use interceptor_cni::install::{self, Applied, Installer, Restores};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout, poll},
    sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor},
};
use tracing::{debug, error, info, warn};

use super::{chain_report::ChainReporter, lock};

pub(super) fn report(applied: &Applied) {
    match applied {
        Applied::Chained { conf, .. } => info!(conf = %conf.display(), "CNI plugin chained"),
        Applied::Updated(conf) => info!(conf = %conf.display(), "CNI plugin's entry updated"),
        Applied::Unchanged(conf) => info!(conf = %conf.display(), "CNI plugin already chained"),
    }
}

/// Installs (copies the binary, then chains), or once `installed` only chains again. Logs what
/// it did, but for a chain unchanged (unless it ends a failure, `last`) and a restore (the
/// watch's to report); an error only when it is not the same as `last` (a retry every check
/// says it once).
pub(super) fn attempt(
    installer: &Installer,
    installed: bool,
    last: Option<&str>,
    check: Duration,
) -> Result<Applied, String> {
    let result = if installed {
        installer.apply()
    } else {
        installer.install()
    };
    match &result {
        Ok(Applied::Unchanged(_)) if installed && last.is_none() => {}
        Ok(Applied::Chained { .. }) if installed => {}
        Ok(applied) => report(applied),
        Err(e) => {
            if last != Some(e.to_string().as_str()) {
                error!(error = %e, retry_ms = check.as_millis(), "the CNI plugin is not chained; trying again when the conf or bin directory changes");
            }
        }
    }
    result.map_err(|e| e.to_string())
}

/// How long the agent may take to count a restore: the count is best effort, and the report
/// waits on a thread of its own.
const REPORT_DEADLINE: Duration = Duration::from_secs(2);

/// Restores waiting to be reported, at most: beyond that (an agent that does not answer, a
/// primary CNI rewriting its file in a loop) they are logged as not counted.
const REPORTS_WAITING: usize = 16;

/// Tells the agent at `socket` of each restore sent to the returned channel, from a thread of
/// its own: an agent that is down or does not answer never holds up the watch. What the agent
/// was not told is logged.
pub(super) fn report_restores(socket: PathBuf) -> SyncSender<PathBuf> {
    let (sender, restores) = mpsc::sync_channel::<PathBuf>(REPORTS_WAITING);
    std::thread::spawn(move || {
        for conf in restores {
            let request = interceptor_api::Request::ChainRestored { conf: conf.clone() };
            match interceptor_api::call_within(&socket, &request, REPORT_DEADLINE) {
                Ok(_) => debug!(conf = %conf.display(), "the agent counted the restore"),
                Err(e) => warn!(
                    conf = %conf.display(), agent_socket = %socket.display(), error = %e,
                    "the agent was not told of this restore: interceptor_cni_chain_restored_total does not count it"
                ),
            }
        }
    });
    sender
}

/// The watching installer's loop and what it needs.
pub(super) struct Watch<'a> {
    pub installer: &'a Installer,
    /// Held while it chains; true once the installer is stopping (see the caller).
    pub stopped: &'a Mutex<bool>,
    /// How often it checks, events or not.
    pub check: Duration,
    /// Restores to report to the agent ([`report_restores`]).
    pub reports: SyncSender<PathBuf>,
    /// Whether the plugin is chained, for the agent's readiness.
    pub chain: &'a ChainReporter,
}

/// The conf directory as inotify watches it, by inode: a directory replaced (renamed away or
/// removed, another made in its place) is watched anew.
struct ConfWatch {
    descriptor: WatchDescriptor,
    inode: (u64, u64),
}

const CHANGES: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM);

impl Watch<'_> {
    /// Re-applies whenever a file of the conf directory is written, created, moved or removed
    /// (the primary CNI rewriting its configuration drops our entry), and of the bin directory
    /// (where the primary's plugins appear), and every [`Self::check`] regardless: inotify
    /// misses a conf directory replaced, and the last attempt may have failed (`failing`, the
    /// first one's error). Applying is idempotent, so our own write (one event) ends in
    /// "already chained", and a check that finds the entry changes nothing.
    pub fn keep_chained(&self, mut failing: Option<String>) -> anyhow::Result<()> {
        let installer = self.installer;
        let mut installed = failing.is_none();
        let mut restores = Restores::default();
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).context("inotify")?;
        let mut conf_watch = watch_conf(&inotify, &installer.conf_dir)
            .with_context(|| format!("watching {}", installer.conf_dir.display()))?;
        info!(conf_dir = %installer.conf_dir.display(), check_ms = self.check.as_millis(), "watching the CNI configuration");
        let mut bin_watched = inotify.add_watch(&installer.bin_dir, CHANGES).is_ok();
        let timeout = PollTimeout::try_from(self.check).unwrap_or(PollTimeout::MAX);
        loop {
            let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(0) | Err(Errno::EINTR) => {}
                Ok(_) => {
                    inotify.read_events().context("reading inotify events")?;
                }
                Err(e) => return Err(e).context("waiting for inotify events"),
            }
            // Created after the watch started (by our own first copy, or the primary CNI's).
            if !bin_watched {
                bin_watched = inotify.add_watch(&installer.bin_dir, CHANGES).is_ok();
            }
            if dir_inode(&installer.conf_dir).is_some_and(|inode| inode != conf_watch.inode) {
                let _ = inotify.rm_watch(conf_watch.descriptor);
                match watch_conf(&inotify, &installer.conf_dir) {
                    Ok(replaced) => {
                        info!(conf_dir = %installer.conf_dir.display(), "the conf directory was replaced: watching the new one");
                        conf_watch = replaced;
                    }
                    Err(e) => {
                        debug!(error = %e, "the replaced conf directory is not watched yet")
                    }
                }
            }
            let stopped = lock(self.stopped);
            if *stopped {
                return Ok(());
            }
            let result = attempt(installer, installed, failing.as_deref(), self.check);
            // Still under the guard: nothing is reported once the installer is stopping.
            self.chain
                .note(result.as_ref().map(applied_conf).map_err(String::as_str));
            drop(stopped);
            if let Ok(Applied::Chained {
                conf,
                primary_plugins,
            }) = &result
                && installed
            {
                self.restored(conf, primary_plugins, &mut restores);
            }
            failing = result.err();
            installed |= failing.is_none();
        }
    }

    /// Our entry had to be chained again: a warning, the agent told, and an error naming the
    /// likely cause once restores keep happening.
    fn restored(&self, conf: &Path, primary_plugins: &[String], restores: &mut Restores) {
        warn!(
            conf = %conf.display(),
            "the primary CNI rewrote its configuration without the CNI plugin: chained again (pods created meanwhile started without it)"
        );
        match self.reports.try_send(conf.to_owned()) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => warn!(
                conf = %conf.display(), waiting = REPORTS_WAITING,
                "the agent was not told of this restore (earlier ones are still waiting for it): interceptor_cni_chain_restored_total does not count it"
            ),
        }
        if restores.record(Instant::now()) {
            error!(
                conf = %conf.display(),
                restores = Restores::PERSISTENT,
                within_minutes = Restores::WINDOW.as_secs() / 60,
                cause = %install::rewrite_cause(primary_plugins),
                "the primary CNI keeps rewriting its configuration without the CNI plugin"
            );
        }
    }
}

/// The configuration an install or apply left the plugin chained into.
pub(super) fn applied_conf(applied: &Applied) -> &Path {
    match applied {
        Applied::Unchanged(conf) | Applied::Updated(conf) | Applied::Chained { conf, .. } => conf,
    }
}

fn watch_conf(inotify: &Inotify, conf_dir: &Path) -> nix::Result<ConfWatch> {
    let inode = dir_inode(conf_dir).ok_or(Errno::ENOENT)?;
    let descriptor = inotify.add_watch(conf_dir, CHANGES)?;
    Ok(ConfWatch { descriptor, inode })
}

/// The directory's device and inode.
fn dir_inode(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}
