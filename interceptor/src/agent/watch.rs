//! Noticing at once that a pod's network namespace was deleted: inotify on the directories its
//! path lives in (`/run/netns`, `/var/run/netns`, a CNI runtime's). The periodic reconciliation
//! stays the backstop (paths under `/proc` cannot be watched, and events can be missed).
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::sync::mpsc;
use tracing::warn;

pub struct NetnsWatch {
    inotify: Arc<Inotify>,
    watched: BTreeSet<PathBuf>,
}

impl NetnsWatch {
    /// Starts the watch; the receiver gets a message whenever an entry of a watched directory is
    /// removed or renamed away.
    pub fn start() -> nix::Result<(Self, mpsc::UnboundedReceiver<()>)> {
        let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = inotify.clone();
        std::thread::spawn(move || {
            while let Ok(events) = reader.read_events() {
                if !events.is_empty() && tx.send(()).is_err() {
                    return;
                }
            }
        });
        Ok((
            Self {
                inotify,
                watched: BTreeSet::new(),
            },
            rx,
        ))
    }

    /// Watches the directory `netns` lives in, once.
    pub fn watch(&mut self, netns: &Path) {
        let Some(dir) = netns.parent() else { return };
        if dir.starts_with("/proc") || self.watched.contains(dir) {
            return;
        }
        match self
            .inotify
            .add_watch(dir, AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
        {
            Ok(_) => {
                self.watched.insert(dir.to_owned());
            }
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot watch for deleted namespaces; the periodic check still removes their pods")
            }
        }
    }
}
