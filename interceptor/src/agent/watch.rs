//! What the agent hears instead of polling its pods:
//!
//! - a pod's namespace removed: inotify on the directories the paths live in (`/run/netns`, a
//!   runtime's), or, for a `/proc/PID/ns/net` path (which inotify cannot watch), a pidfd that
//!   becomes readable when the process exits;
//! - a pod's address added or removed: one rtnetlink socket hearing every namespace that has an
//!   id in the agent's (`netns::nsid`), each pod's namespace given one when it is watched;
//! - a pin of the agent's links removed: inotify on its bpffs directory.
//!
//! Events can be missed (an overflow, a path nothing can watch): the slow safety sweep
//! (`reconcile`) stays the backstop.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use interceptor_common::NetnsCookie;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::netns::nsid::{AddressChanges, Heard};

/// Something changed that may concern the pods.
#[derive(Debug)]
pub enum Event {
    /// The namespace at this path is gone: its directory entry was removed, or its process
    /// exited.
    NetnsRemoved(PathBuf),
    /// An address of the pod's namespace was added or removed.
    Addresses(NetnsCookie),
    /// A pin in the agent's bpffs directory was removed.
    PinRemoved,
    /// Notifications were lost: every pod is to be checked.
    Lost,
}

/// What the address listener knows of namespace ids.
#[derive(Default)]
struct Listened {
    /// The pod each namespace id stands for.
    pods: HashMap<i32, NetnsCookie>,
    /// The ids of namespaces being registered (given their id, not yet in `pods`): how many
    /// registrations of each are under way, and whether a change was heard since the first began.
    registering: HashMap<i32, (u32, bool)>,
}

/// A namespace's registration under way, from before its addresses and routes are read until
/// it is watched ([`Watch::registering`]): a change the read may have missed is not lost.
pub struct Registering {
    nsid: i32,
    nsids: Arc<Mutex<Listened>>,
}

impl Drop for Registering {
    fn drop(&mut self) {
        let mut listened = lock(&self.nsids);
        if let Some((count, _)) = listened.registering.get_mut(&self.nsid) {
            *count -= 1;
            if *count == 0 {
                listened.registering.remove(&self.nsid);
            }
        }
    }
}

/// What an inotify watch descriptor stands for.
enum Watched {
    NetnsDir(PathBuf),
    Pins,
}

pub struct Watch {
    inotify: Arc<Inotify>,
    watched: Arc<Mutex<HashMap<WatchDescriptor, Watched>>>,
    netns_dirs: BTreeSet<PathBuf>,
    /// What the address listener knows of each namespace id.
    nsids: Arc<Mutex<Listened>>,
    /// Each pod's namespace id and its process watch, to be dropped with the pod.
    pods: BTreeMap<NetnsCookie, (Option<i32>, Option<u64>)>,
    processes: Processes,
    events: mpsc::UnboundedSender<Event>,
    /// Whether the kernel delivers the pods' address and route notifications to the listener
    /// (it is open, and the agent has `CAP_NET_BROADCAST`).
    hears_pods: bool,
}

/// The processes whose namespaces are pods' (`/proc/PID/ns/net` paths): their pidfds in one
/// epoll set, which a thread of its own waits on.
#[derive(Clone)]
struct Processes {
    epoll: Arc<Epoll>,
    /// By the key their epoll event carries.
    watched: Arc<Mutex<HashMap<u64, (OwnedFd, PathBuf)>>>,
    next_key: Arc<AtomicU64>,
}

impl Watch {
    /// Starts the watches: inotify (and on `pins`, the eBPF agent's bpffs directory) and the
    /// address listener. Events arrive on the receiver.
    pub fn start(pins: Option<&Path>) -> nix::Result<(Self, mpsc::UnboundedReceiver<Event>)> {
        let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
        let watched = Arc::new(Mutex::new(HashMap::new()));
        let nsids = Arc::new(Mutex::new(Listened::default()));
        let (events, receiver) = mpsc::unbounded_channel();
        spawn_inotify_reader(inotify.clone(), watched.clone(), events.clone());
        let hears_pods = spawn_address_listener(nsids.clone(), events.clone());
        let processes = Processes {
            epoll: Arc::new(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?),
            watched: Arc::default(),
            next_key: Arc::default(),
        };
        spawn_process_waiter(processes.clone(), events.clone());
        let watch = Self {
            inotify,
            watched,
            netns_dirs: BTreeSet::new(),
            nsids,
            pods: BTreeMap::new(),
            processes,
            events,
            hears_pods,
        };
        if let Some(pins) = pins {
            watch.add(pins, Watched::Pins);
        }
        Ok((watch, receiver))
    }

    fn add(&self, dir: &Path, what: Watched) -> bool {
        match self
            .inotify
            .add_watch(dir, AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
        {
            Ok(wd) => {
                lock(&self.watched).insert(wd, what);
                true
            }
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, "cannot watch for removed entries; the safety sweep still notices");
                false
            }
        }
    }

    /// Starts a registration of the namespace with id `nsid`, before its addresses and routes
    /// are read: a change heard from then on is applied once the pod is watched
    /// ([`Self::watch`]), so one made between the read and the watch does not wait for the
    /// sweep. The id must be given before: the kernel sends nothing of a namespace without one.
    pub fn registering(&self, nsid: i32) -> Registering {
        lock(&self.nsids)
            .registering
            .entry(nsid)
            .or_insert((0, false))
            .0 += 1;
        Registering {
            nsid,
            nsids: self.nsids.clone(),
        }
    }

    /// Watches a registered pod: its namespace's removal (its directory, or its process for a
    /// `/proc` path) and, with its registration's namespace id (see `netns::nsid` and
    /// [`Self::registering`]), its addresses and local routes; a change heard since the
    /// registration began is checked now. Watching a pod again replaces its watches.
    pub fn watch(&mut self, cookie: NetnsCookie, netns: &Path, registering: Option<Registering>) {
        self.unwatch(cookie);
        let process = match proc_pid(netns) {
            Some(pid) => self.watch_process(pid, netns),
            None => {
                if let Some(dir) = netns.parent()
                    && !self.netns_dirs.contains(dir)
                    && self.add(dir, Watched::NetnsDir(dir.to_owned()))
                {
                    self.netns_dirs.insert(dir.to_owned());
                }
                None
            }
        };
        let nsid = registering.as_ref().map(|r| r.nsid);
        if let Some(nsid) = nsid {
            let mut listened = lock(&self.nsids);
            listened.pods.insert(nsid, cookie);
            if let Some((_, heard)) = listened.registering.get_mut(&nsid)
                && std::mem::take(heard)
            {
                let _ = self.events.send(Event::Addresses(cookie));
            }
        }
        self.pods.insert(cookie, (nsid, process));
    }

    /// Why the pods' address and route changes are not heard, if they are not (no
    /// `CAP_NET_BROADCAST`, or no listener): the node's note.
    pub fn deafness(&self) -> Option<&'static str> {
        (!self.hears_pods).then_some(NOT_HEARD)
    }

    /// The pods whose address and route changes are not heard: every pod when the listener
    /// hears none, else those whose namespace has no id.
    pub fn unheard(&self) -> Vec<NetnsCookie> {
        self.pods
            .iter()
            .filter(|(_, (nsid, _))| !self.hears_pods || nsid.is_none())
            .map(|(cookie, _)| *cookie)
            .collect()
    }

    /// Stops watching a pod that is no longer registered.
    pub fn unwatch(&mut self, cookie: NetnsCookie) {
        let Some((nsid, process)) = self.pods.remove(&cookie) else {
            return;
        };
        if let Some(nsid) = nsid {
            let mut listened = lock(&self.nsids);
            // An id is reused once its namespace is gone: only ours is removed.
            if listened.pods.get(&nsid) == Some(&cookie) {
                listened.pods.remove(&nsid);
            }
        }
        if let Some(key) = process
            && let Some((pidfd, _)) = lock(&self.processes.watched).remove(&key)
        {
            let _ = self.processes.epoll.delete(&pidfd);
        }
    }

    /// Sends [`Event::NetnsRemoved`] when process `pid` exits (its pidfd becomes readable).
    /// Returns the watch's key.
    fn watch_process(&self, pid: i32, netns: &Path) -> Option<u64> {
        let pidfd = match interceptor_sys::pidfd_open(pid) {
            Ok(fd) => fd,
            // Gone already: the check this triggers removes the pod.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                let _ = self.events.send(Event::NetnsRemoved(netns.to_owned()));
                return None;
            }
            Err(e) => {
                warn!(netns = %netns.display(), error = %e, "cannot watch the process whose namespace the pod is; the safety sweep still notices its exit");
                return None;
            }
        };
        let key = self.processes.next_key.fetch_add(1, Ordering::Relaxed);
        let mut watched = lock(&self.processes.watched);
        if let Err(e) = self
            .processes
            .epoll
            .add(&pidfd, EpollEvent::new(EpollFlags::EPOLLIN, key))
        {
            warn!(netns = %netns.display(), error = %e, "cannot watch the process whose namespace the pod is; the safety sweep still notices its exit");
            return None;
        }
        watched.insert(key, (pidfd, netns.to_owned()));
        Some(key)
    }
}

/// The pid of a `/proc/PID/ns/net` (or `/proc/PID/task/TID/ns/net`) path.
fn proc_pid(netns: &Path) -> Option<i32> {
    let rest = netns.strip_prefix("/proc").ok()?;
    let pid = rest.components().next()?.as_os_str().to_str()?;
    pid.parse().ok()
}

fn spawn_inotify_reader(
    inotify: Arc<Inotify>,
    watched: Arc<Mutex<HashMap<WatchDescriptor, Watched>>>,
    events: mpsc::UnboundedSender<Event>,
) {
    std::thread::spawn(move || {
        while let Ok(read) = inotify.read_events() {
            for event in read {
                let heard = if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    Some(Event::Lost)
                } else {
                    match lock(&watched).get(&event.wd) {
                        Some(Watched::Pins) => Some(Event::PinRemoved),
                        Some(Watched::NetnsDir(dir)) => event
                            .name
                            .as_ref()
                            .map(|name| Event::NetnsRemoved(dir.join(name))),
                        None => None,
                    }
                };
                if let Some(heard) = heard
                    && events.send(heard).is_err()
                {
                    return;
                }
            }
        }
    });
}

fn spawn_process_waiter(processes: Processes, events: mpsc::UnboundedSender<Event>) {
    std::thread::spawn(move || {
        let mut ready = [EpollEvent::empty(); 16];
        loop {
            let n = match processes.epoll.wait(&mut ready, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    warn!(error = %e, "waiting for the pods' processes stopped; the safety sweep still notices their exits");
                    return;
                }
            };
            for event in &ready[..n] {
                // An exited process stays readable: its watch goes with this one event.
                let Some((pidfd, netns)) = lock(&processes.watched).remove(&event.data()) else {
                    continue;
                };
                let _ = processes.epoll.delete(&pidfd);
                if events.send(Event::NetnsRemoved(netns)).is_err() {
                    return;
                }
            }
        }
    });
}

/// What the node's note and the start-up log say when the pods' changes are not heard.
const NOT_HEARD: &str = "the kernel does not deliver the pods' address and route changes to the agent (it needs CAP_NET_BROADCAST): they are applied by a check of each pod every 2 s instead of at once; give the agent CAP_NET_BROADCAST to close that window";

/// Starts the address listener; whether it hears the pods.
fn spawn_address_listener(
    nsids: Arc<Mutex<Listened>>,
    events: mpsc::UnboundedSender<Event>,
) -> bool {
    let mut changes = match AddressChanges::open() {
        Ok(changes) => changes,
        Err(e) => {
            warn!(error = %e, "cannot listen for address changes in the pods; {NOT_HEARD}");
            return false;
        }
    };
    let hears = has_net_broadcast();
    if !hears {
        warn!("{NOT_HEARD}");
    }
    std::thread::spawn(move || {
        loop {
            let event = match changes.wait() {
                Ok(Heard::In(nsid)) => {
                    let mut listened = lock(&nsids);
                    if let Some((_, heard)) = listened.registering.get_mut(&nsid) {
                        *heard = true;
                    }
                    match listened.pods.get(&nsid) {
                        Some(cookie) => Event::Addresses(*cookie),
                        None => continue,
                    }
                }
                Ok(Heard::Elsewhere) => continue,
                Ok(Heard::Lost) => {
                    // The pods being registered are not in the table the check walks.
                    for (_, heard) in lock(&nsids).registering.values_mut() {
                        *heard = true;
                    }
                    Event::Lost
                }
                Err(e) => {
                    warn!(error = %e, "the pods' address notifications stopped; the safety sweep still applies changes");
                    return;
                }
            };
            if events.send(event).is_err() {
                return;
            }
        }
    });
    info!("listening for address changes in the pods' namespaces");
    hears
}

/// `CAP_NET_BROADCAST` (`<linux/capability.h>`; neither libc nor nix exports it).
const CAP_NET_BROADCAST: u32 = 11;

/// Whether this process has CAP_NET_BROADCAST, which the kernel wants before it delivers another
/// namespace's notifications.
fn has_net_broadcast() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_NET_BROADCAST) != 0)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_path_names_its_process() {
        assert_eq!(proc_pid(Path::new("/proc/42/ns/net")), Some(42));
        assert_eq!(proc_pid(Path::new("/proc/42/task/43/ns/net")), Some(42));
        assert_eq!(proc_pid(Path::new("/proc/self/ns/net")), None);
        assert_eq!(proc_pid(Path::new("/run/netns/pod")), None);
    }
}
