//! The eBPF backend's writes of pods: their configuration, addresses and subnets into the maps,
//! their sk_lookup programs into their namespaces, and their counters read back. What was
//! written for a pod ([`EbpfWritten`]) is kept in its entry of the node's pod table
//! (`crate::node`), which hands it back for each change.
//!
//! Every change to a pod is made before break: the entries the new state needs are written
//! first, then the pod's configuration (one map update: the switch), then the entries only the
//! old state needed are removed. A change that fails before the switch leaves the maps exactly as
//! they were, so a refused change never leaves a pod less intercepted than before.
//!
//! By job: `lifecycle` (register, update, new addresses, remove), `write` (the make-before-break
//! write and its room check), `entries` (subnet entries), `restore` (a pod taken back after a
//! restart), `listeners` (a proxy's listener opened before registration), `migration` (what an
//! older map layout holds for connections in flight), `inspect` (what the maps say, read only).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use crate::netns::LocalDestinations;

use aya::maps::{MapError, PerCpuValues};
use interceptor_common::{MAX_PODS, NetnsCookie, PodConfig, PodCounters, PodSlot, names};

use super::{
    EbpfError, LoadOptions,
    encode::{SubnetEntry, pod_config, write_local},
    inbound::Inbound,
    maps::{PodMaps, map_error},
    pod_lookup::PodLookupLoader,
};
use crate::config::{InterceptionConfig, user_ids::HostIds};

mod entries;
mod inspect;
mod lifecycle;
mod listeners;
mod migration;
mod restore;
mod write;

pub use inspect::read_counters;

/// The subnet entries the maps hold, by netns cookie (see [`PodWriter::in_maps`]); a pod's
/// addresses are in its configuration entry.
#[derive(Default)]
pub struct InMaps {
    subnets: BTreeMap<NetnsCookie, BTreeSet<SubnetEntry>>,
}

impl InMaps {
    /// The pods these entries belong to.
    pub fn cookies(&self) -> impl Iterator<Item = NetnsCookie> + '_ {
        self.subnets.keys().copied()
    }
}

/// Entries in each map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillLevels {
    /// Original destinations of connections not over (one of their sockets open): in their
    /// slots and in the LRU map behind them ...
    pub pending: usize,
    /// ... of which in the LRU map (`--orig-dst-capacity` bounds it).
    pub pending_in_lru: usize,
    pub connecting: usize,
    pub listeners: usize,
    pub subnets: usize,
    pub pods: usize,
}

/// What the maps hold for a pod: its configuration entry, with its addresses (none for a pod
/// not yet registered), and its subnet entries.
#[derive(Default)]
struct InForce {
    config: Option<PodConfig>,
    subnets: BTreeSet<SubnetEntry>,
}

/// Entries written during a change, removed again if the change cannot be completed.
#[derive(Default)]
struct Written {
    subnets: Vec<SubnetEntry>,
}

/// What the eBPF backend wrote for one pod, kept in the pod's table entry, so it can be changed
/// or removed exactly.
pub struct EbpfWritten {
    slot: PodSlot,
    /// The pod map's entry when it is not the encoding of the entry's configuration (a restore
    /// that could not apply the record's configuration kept the one in force; `problem` says
    /// so). Boxed and usually absent: an entry is 24 KiB (three port bitmaps), and a node holds
    /// thousands of pods.
    kept_in_force: Option<Box<PodConfig>>,
    /// Every subnet entry the maps hold for the pod (its `local` routes' too).
    subnets: BTreeSet<SubnetEntry>,
    /// The pod's own sk_lookup program; dropping it detaches it from the pod's namespace
    /// (unless its link is persistent).
    inbound: Option<Inbound>,
    /// Why the maps do not hold exactly the configuration (a restore that could not apply the
    /// record's configuration and kept the one in force, or old entries that could not be
    /// removed).
    problem: Option<String>,
}

/// `config` with no addresses (and no `local` routes), to compare what else two entries hold.
fn without_addresses(mut config: PodConfig) -> PodConfig {
    write_local(&mut config, &BTreeSet::new(), false);
    config
}

impl EbpfWritten {
    /// The pod's counter slot.
    pub fn slot(&self) -> PodSlot {
        self.slot
    }

    /// The pod map's entry for the pod, as it was written for `config` and `local` or kept.
    pub(super) fn in_force(
        &self,
        config: &InterceptionConfig,
        host_ids: HostIds,
        local: &LocalDestinations,
    ) -> PodConfig {
        match &self.kept_in_force {
            Some(kept) => **kept,
            None => pod_config(
                self.slot,
                config,
                host_ids,
                &local.addresses.iter().copied().collect(),
                !local.routes.is_empty(),
            ),
        }
    }
}

/// What writes the pods of one node attachment into its maps and their namespaces. The pods
/// themselves are the node's pod table's; this keeps which counter slots they hold.
pub struct PodWriter {
    maps: PodMaps,
    /// A bit per counter slot in use (a set cost an allocation per node of it, a tenth of a
    /// registration's time at 1,000 pods).
    slots: [u64; MAX_PODS.div_ceil(64) as usize],
    pin_dir: PathBuf,
    links_dir: PathBuf,
    /// The agent's: links and maps stay pinned when the writer goes.
    persistent: bool,
    max_pods: u32,
    pod_lookup: PodLookupLoader,
    /// Entries in the subnet trie, kept up to date by every insert and delete (counting them
    /// means a system call per entry): what lets a change that cannot fit be refused up front.
    subnet_entries: usize,
}

impl PodWriter {
    /// `loopback_by_ifindex`: whether pods' own sk_lookup programs may read `ingress_ifindex`
    /// (see `pod_lookup`).
    pub(super) fn new(
        maps: PodMaps,
        options: &LoadOptions,
        loopback_by_ifindex: bool,
    ) -> Result<Self, EbpfError> {
        let subnet_entries = maps.subnets.keys().filter(Result::is_ok).count();
        Ok(Self {
            maps,
            slots: [0; MAX_PODS.div_ceil(64) as usize],
            pin_dir: options.pin_dir.clone(),
            links_dir: options.links_dir.clone(),
            persistent: options.persistent,
            max_pods: options.max_pods.min(MAX_PODS),
            pod_lookup: PodLookupLoader::new(&options.pin_dir, loopback_by_ifindex)
                .map_err(EbpfError::PodLookup)?,
            subnet_entries,
        })
    }

    pub(super) fn free_slot(&self) -> Result<PodSlot, EbpfError> {
        (0..self.max_pods)
            .find(|&slot| self.slots[slot as usize / 64] & (1 << (slot % 64)) == 0)
            .map(PodSlot)
            .ok_or(EbpfError::NoFreeSlot(self.max_pods))
    }

    /// Marks a pod's counter slot as in use (`true`) or free.
    pub(super) fn mark_slot(&mut self, slot: PodSlot, used: bool) {
        let Some(word) = self.slots.get_mut(slot.0 as usize / 64) else {
            return;
        };
        let bit = 1 << (slot.0 % 64);
        if used {
            *word |= bit;
        } else {
            *word &= !bit;
        }
    }

    pub(super) fn zero_counters(&mut self, slot: PodSlot) -> Result<(), EbpfError> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        let zero = PerCpuValues::try_from(vec![PodCounters::ZERO; cpus])
            .map_err(|e| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        self.maps
            .counters
            .set(slot.0, zero, 0)
            .map_err(map_error(names::MAP_COUNTERS))
    }
}

impl Drop for PodWriter {
    fn drop(&mut self) {
        // The pods' sk_lookup programs went with the table's entries, before the backend: drop
        // the pins, and the maps themselves go away once no program or process uses them. The
        // agent's (persistent) pins stay.
        if self.persistent {
            return;
        }
        for name in names::SHARED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
    }
}
