//! What only some backends can do, each a small trait the agent asks for by what it needs
//! (`AgentPods::listeners`, `leftovers`, `programs`), as linkerd2-proxy's stacks ask for one
//! parameter each. A backend says which it has once, in its `AgentBackend` impl (the eBPF
//! node has all of them, the iptables backend none); no call site asks which backend runs.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use interceptor_common::{NetnsCookie, PodSlot};

use super::{api::records, records::PodFacts};
use crate::{ebpf::EbpfPods, netns::listener::Listening};

/// Holds the pods' proxy listeners for inbound steering: those a proxy opened before its pod
/// was registered are found in `/proc` and adopted.
pub trait Listeners {
    /// Adopts the listeners `found` for a registered pod (best found without the agent's lock,
    /// after the pod's configuration is in force). A pod that cannot have them would drop
    /// inbound connections: if `is_new`, it is taken out of the table again (and must be
    /// untracked by the caller); if not, it stays as it was.
    fn adopt(
        &mut self,
        key: NetnsCookie,
        found: Vec<Listening>,
        is_new: bool,
    ) -> Result<(), String>;
    /// The pods whose proxy listens (read once for many pods).
    fn listening(&self) -> BTreeSet<NetnsCookie>;
    fn has_listener(&self, key: NetnsCookie) -> bool;
}

/// Counts each pod's connections in a slot of its own.
pub trait Counters {
    fn slot(&self, key: NetnsCookie) -> Option<PodSlot>;
    /// By name, summed over CPUs; empty when they cannot be read.
    fn counters(&self, key: NetnsCookie) -> BTreeMap<String, u64>;
}

/// Keeps pods' state outside the table that outlives the agent (maps, pins): what of it belongs
/// to no registered pod (a registration or removal cut short), and its removal.
pub trait Leftovers {
    /// The pods something is held for that are not registered.
    fn unregistered(&self) -> BTreeSet<NetnsCookie>;
    /// Those of them without a record either: once the records are restored, what to remove.
    fn without_record(&self, recorded: &BTreeSet<NetnsCookie>) -> BTreeSet<NetnsCookie>;
    /// Removes everything held for a pod, registered (through the table) or not.
    fn purge(&mut self, key: NetnsCookie) -> Result<(), String>;
}

/// Programs attached once for the whole node, with pinned links and maps of their own.
pub trait NodePrograms {
    /// Attaches (or swaps into the pinned links) every program on `cgroup`.
    fn attach(&mut self, cgroup: &Path) -> anyhow::Result<()>;
    /// Copies the original destinations of connections in flight from older maps (`dirs`, one
    /// per older layout); returns how many.
    fn import_in_flight(&mut self, dirs: &[PathBuf]) -> usize;
    /// What is wrong with the node's links on `cgroup`.
    fn link_problems(&self, cgroup: &Path) -> Vec<String>;
    /// Each hook's variant, `hook=variant`.
    fn variants(&self) -> Vec<String>;
    /// Entries in the maps that fill with connections and listeners, by the metric's label.
    fn map_entries(&self) -> Vec<(&'static str, usize)>;
    /// Pins again the links whose pins were removed while this process held them: the paths
    /// pinned, and those that could not be, with why.
    fn restore_missing_pins(&self) -> (Vec<PathBuf>, Vec<(PathBuf, String)>);
}

impl Listeners for EbpfPods<PodFacts> {
    fn adopt(
        &mut self,
        key: NetnsCookie,
        found: Vec<Listening>,
        is_new: bool,
    ) -> Result<(), String> {
        self.adopt_listeners_or_undo(key, found, is_new)
            .map_err(|e| e.to_string())
    }

    fn listening(&self) -> BTreeSet<NetnsCookie> {
        self.backend().pod_writer().listening_cookies()
    }

    fn has_listener(&self, key: NetnsCookie) -> bool {
        EbpfPods::has_listener(self, key)
    }
}

impl Counters for EbpfPods<PodFacts> {
    fn slot(&self, key: NetnsCookie) -> Option<PodSlot> {
        EbpfPods::slot(self, key)
    }

    fn counters(&self, key: NetnsCookie) -> BTreeMap<String, u64> {
        EbpfPods::counters(self, key)
            .ok()
            .flatten()
            .map(|c| c.named().map(|(k, v)| (k.to_owned(), v)).collect())
            .unwrap_or_default()
    }
}

impl Leftovers for EbpfPods<PodFacts> {
    fn unregistered(&self) -> BTreeSet<NetnsCookie> {
        records::leftovers(self.held(&self.census()), |cookie| self.contains(cookie))
    }

    fn without_record(&self, recorded: &BTreeSet<NetnsCookie>) -> BTreeSet<NetnsCookie> {
        records::leftovers_after_restore(
            self.held(&self.census()),
            |cookie| self.contains(cookie),
            recorded,
        )
    }

    fn purge(&mut self, key: NetnsCookie) -> Result<(), String> {
        EbpfPods::purge(self, key).map_err(|e| e.to_string())
    }
}

impl NodePrograms for EbpfPods<PodFacts> {
    fn attach(&mut self, cgroup: &Path) -> anyhow::Result<()> {
        EbpfPods::attach(self, cgroup).map_err(anyhow::Error::from)
    }

    fn import_in_flight(&mut self, dirs: &[PathBuf]) -> usize {
        let maps = self.backend_mut().pod_writer_mut();
        dirs.iter().map(|dir| maps.import_in_flight(dir)).sum()
    }

    fn link_problems(&self, cgroup: &Path) -> Vec<String> {
        self.backend()
            .link_problems(cgroup)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn variants(&self) -> Vec<String> {
        self.backend()
            .programs()
            .iter()
            .map(|p| {
                let hook = p.attach_type.split(',').next().unwrap_or_default();
                format!("{hook}={}", p.variant)
            })
            .collect()
    }

    fn map_entries(&self) -> Vec<(&'static str, usize)> {
        let levels = self.backend().pod_writer().fill_levels();
        vec![
            ("pending_orig_dst", levels.pending),
            ("connecting", levels.connecting),
            ("listeners", levels.listeners),
        ]
    }

    fn restore_missing_pins(&self) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
        let (pinned, failed) = EbpfPods::restore_missing_pins(self);
        let failed = failed
            .into_iter()
            .map(|(path, e)| (path, e.to_string()))
            .collect();
        (pinned, failed)
    }
}
