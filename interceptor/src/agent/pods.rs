//! The agent's pods: the node's one pod table (`crate::node::PodTable`), with the agent's
//! [`PodFacts`] in each entry, behind the backend chosen once per node (`daemon --mode`).
//!
//! The agent holds it as a `Box<dyn AgentPods>` ([`pods_over`]): its start-up picks the backend,
//! and nothing else asks which one it is. What differs between backends for the agent (how a refusal is
//! worded, what a record says was written) is [`AgentBackend`], one impl per backend; what only
//! some backends can do (listeners, counters, leftovers, node programs) is a capability
//! (`capabilities`), asked for by what it is.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use interceptor_common::{NetnsCookie, PodSlot};
use tracing::info;

use super::{
    Refusal,
    api::{
        Backend as Kind, ErrorKind,
        records::{NotRestored, Restore},
    },
    capabilities::{Counters, Leftovers, Listeners, NodePrograms},
    records::{MeshedBy, PodFacts, PodRecord},
};
use crate::{
    config::user_ids::HostIds,
    ebpf::{EbpfError, EbpfNode, EbpfWritten, InMaps},
    iptables::{ChainsInForce, IptablesBackend, IptablesError, IptablesSettings},
    netns::{LocalDestinations, NetnsError, PodNetns},
    node::{Interception, PodTable, Wanted},
};

/// Which backend an agent is to use, once `--mode auto` is resolved.
#[derive(Clone, Copy, Debug)]
pub enum BackendChoice {
    Ebpf,
    Iptables(IptablesSettings),
}

/// The agent's pod table over `backend`: the eBPF node it loaded, or proxy-init's chains.
pub fn pods_over<B: AgentBackend>(backend: B) -> Box<dyn AgentPods> {
    Box::new(AgentTable::new(backend))
}

/// A backend's [`Interception::identify_lenient`].
pub type IdentifyLenient =
    fn(&PodNetns) -> Result<(NetnsCookie, Result<LocalDestinations, NetnsError>), NetnsError>;

/// What the backend knows of a pod beyond its record; `None` where the backend has no such
/// thing (the iptables backend has no counter slot, counters or listener map).
pub struct PodDetails {
    pub slot: Option<PodSlot>,
    pub counters: Option<BTreeMap<String, u64>>,
    pub inbound_listener: Option<bool>,
    pub addresses: Vec<IpAddr>,
    pub problem: Option<String>,
}

/// The agent's pods, whichever backend intercepts them: registration, restore,
/// reconciliation, health and metrics ask this, and branch on the backend nowhere.
pub trait AgentPods: Send {
    fn kind(&self) -> Kind;
    fn len(&self) -> usize;
    /// The registered pods' keys.
    fn keys(&self) -> Vec<NetnsCookie>;
    /// The registered pods, with their namespace paths and the agent's facts about each.
    fn registered(&self) -> Box<dyn Iterator<Item = (NetnsCookie, &Path, &PodFacts)> + '_>;
    fn facts(&self, key: NetnsCookie) -> Option<&PodFacts>;
    /// The namespace path a pod was registered with.
    fn netns(&self, key: NetnsCookie) -> Option<&Path>;
    /// A registered pod's record, as it is saved: built from its entry.
    fn record(&self, key: NetnsCookie) -> Option<PodRecord>;
    /// The pod registered for the namespace at `netns`.
    fn find(&self, netns: &Path) -> Option<NetnsCookie>;
    /// Replaces the agent's facts about a registered pod, writing nothing else; returns the
    /// previous ones (`None`: the pod is not registered).
    fn set_facts(&mut self, key: NetnsCookie, facts: PodFacts) -> Option<PodFacts>;
    /// How the backend tells a pod's key and local destinations, or why the latter could not
    /// be read (a failed dump alone must not pass for a gone namespace): called without the
    /// agent's lock, as it switches into the namespace.
    fn lenient_identifier(&self) -> IdentifyLenient;
    /// Puts `wanted` in force for the pod `key` registered at `path`, new or changed; the pod
    /// is registered with `facts` from then on (their `meshed_by` says what this backend
    /// wrote). If it fails, what was in force stays, with the pod's previous facts.
    fn apply(
        &mut self,
        key: NetnsCookie,
        path: &Path,
        wanted: &Wanted<'_>,
        facts: PodFacts,
    ) -> Result<(), Refusal>;
    /// Takes a registered pod out of interception, and out of the table; on failure it stays.
    fn remove(&mut self, key: NetnsCookie) -> Result<(), String>;
    /// Lets go of a pod whose namespace is gone or was replaced; if that fails, it stays
    /// registered (to be tried again).
    fn forget(&mut self, key: NetnsCookie) -> Result<(), String>;
    /// Why a pod's state is not what was written, as far as can be told cheaply.
    fn problem(&self, key: NetnsCookie) -> Option<String>;
    /// The thorough check of one pod, without reading what all pods share (iptables: its
    /// chains; eBPF: nothing more than [`Self::problem`]).
    fn differs(&self, key: NetnsCookie) -> Option<String>;
    /// The thorough check of every pod, what they share read once.
    fn differences(&self) -> Vec<(NetnsCookie, String)>;
    /// What the backend knows of a registered pod. `listening`: the pods whose proxy listens,
    /// read once for a report of many pods (`None`: looked up alone). `check`: whether to
    /// check the pod for its problem now.
    fn details(
        &self,
        key: NetnsCookie,
        listening: Option<&BTreeSet<NetnsCookie>>,
        check: bool,
    ) -> Option<PodDetails>;
    /// The pods whose proxy's inbound listener the backend holds (read once for many pods).
    fn listening(&self) -> BTreeSet<NetnsCookie>;
    /// What a pod is known to deliver over lo: its addresses and `local` routes.
    fn local_destinations(&self, key: NetnsCookie) -> Option<&LocalDestinations>;
    /// Applies a pod's new addresses and `local` routes.
    fn set_local(&mut self, key: NetnsCookie, local: &LocalDestinations) -> Result<(), String>;
    /// Takes back a pod an earlier agent meshed, from its record, as `how` (the API's restore
    /// decision) says; says what was repaired. What all pods share is read at the first one,
    /// and kept until [`Self::end_restore`].
    fn restore(
        &mut self,
        record: &PodRecord,
        how: Restore<'_>,
        netns: &PodNetns,
        host_ids: HostIds,
        local: Option<&LocalDestinations>,
    ) -> Result<Option<String>, NotRestored>;
    /// Drops what [`Self::restore`] read once for all pods.
    fn end_restore(&mut self);
    /// Whether this backend takes a pod over from proxy-init's chains (and removes them) rather
    /// than writing them itself.
    fn takes_over_iptables(&self) -> bool;
    /// Says that this backend alone meshes a registered pod from now on (its chains, written by
    /// the iptables backend, are removed); returns its record, to be saved.
    fn claim(&mut self, key: NetnsCookie) -> Option<PodRecord>;
    /// The backend's listeners, if it holds the proxies' listeners.
    fn listeners(&self) -> Option<&dyn Listeners>;
    fn listeners_mut(&mut self) -> Option<&mut dyn Listeners>;
    /// The backend's state outside the table, if it keeps any that outlives the agent.
    fn leftovers(&self) -> Option<&dyn Leftovers>;
    fn leftovers_mut(&mut self) -> Option<&mut dyn Leftovers>;
    /// The backend's programs attached for the whole node, if it has any.
    fn programs(&self) -> Option<&dyn NodePrograms>;
    fn programs_mut(&mut self) -> Option<&mut dyn NodePrograms>;
}

/// What differs between backends for the agent.
pub trait AgentBackend: Interception<Written: Send, Census: Send> + Sized + Send + 'static {
    const KIND: Kind;
    /// Whether it takes a pod over from proxy-init's chains, removing them once it intercepts
    /// the pod, rather than writing them itself.
    const TAKES_OVER_IPTABLES: bool;
    /// The API's error kind and message for a change the backend refused.
    fn refusal(e: Self::Error) -> Refusal;
    /// What becomes of a pod whose restore the backend refused.
    fn not_restored(e: Self::Error) -> NotRestored;
    /// What this backend wrote for a pod, read back from its own part of the pod's record
    /// (what [`Self::meshed_by`] wrote), where it keeps that; `None`: written anew.
    fn recorded(part: &MeshedBy) -> Option<Self::Written>;
    /// The record's part of this backend once it wrote `written` for a pod; `before`: the
    /// record's part before a restore.
    fn meshed_by(written: &Self::Written, before: Option<&MeshedBy>) -> MeshedBy;
    /// What to say of a restored pod another backend meshed (`from`), if anything.
    fn taken_from(from: Kind) -> Option<String>;
    /// What the pod `key` delivers over lo as the backend has it in force, before a restore
    /// takes it back (`census`: as the restore reads it): kept when its namespace cannot be read.
    fn local_in_force(
        table: &PodTable<Self, PodFacts>,
        key: NetnsCookie,
        census: &Self::Census,
    ) -> LocalDestinations;
    // The capabilities the backend has (`capabilities`), said here once: none by default.
    fn counters(_table: &PodTable<Self, PodFacts>) -> Option<&dyn Counters> {
        None
    }
    fn listeners(_table: &PodTable<Self, PodFacts>) -> Option<&dyn Listeners> {
        None
    }
    fn listeners_mut(_table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn Listeners> {
        None
    }
    fn leftovers(_table: &PodTable<Self, PodFacts>) -> Option<&dyn Leftovers> {
        None
    }
    fn leftovers_mut(_table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn Leftovers> {
        None
    }
    fn programs(_table: &PodTable<Self, PodFacts>) -> Option<&dyn NodePrograms> {
        None
    }
    fn programs_mut(_table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn NodePrograms> {
        None
    }
}

impl AgentBackend for EbpfNode {
    const KIND: Kind = Kind::Ebpf;
    const TAKES_OVER_IPTABLES: bool = true;

    fn refusal(e: EbpfError) -> Refusal {
        ebpf_refusal(e)
    }

    /// A write the kernel refused for want of room or memory says nothing of the pod: it stays
    /// as the previous agent left it, with its record, and is tried again at the next start.
    fn not_restored(e: EbpfError) -> NotRestored {
        match e.map_out_of_room() {
            Some(_) => NotRestored::Kept(e.to_string()),
            None => NotRestored::Refused(e.to_string()),
        }
    }

    /// Nothing of what eBPF writes is recorded: the maps and pins are read back.
    fn recorded(_part: &MeshedBy) -> Option<EbpfWritten> {
        None
    }

    /// A pod taken back from iptables keeps saying so until its chains are removed
    /// (`take_over_iptables_pods`).
    fn meshed_by(_written: &EbpfWritten, before: Option<&MeshedBy>) -> MeshedBy {
        before.cloned().unwrap_or_else(|| MeshedBy::new(Kind::Ebpf))
    }

    /// Its chains are removed once the programs are attached (`take_over_iptables_pods`).
    fn taken_from(_from: Kind) -> Option<String> {
        None
    }

    /// Its configuration entry's addresses and its `local` route entries.
    fn local_in_force(
        table: &PodTable<Self, PodFacts>,
        key: NetnsCookie,
        census: &InMaps,
    ) -> LocalDestinations {
        table.backend().pod_writer().local_in_force(key, census)
    }

    // Every capability: listeners, counters, leftovers in the maps and pins, node programs.
    fn counters(table: &PodTable<Self, PodFacts>) -> Option<&dyn Counters> {
        Some(table)
    }

    fn listeners(table: &PodTable<Self, PodFacts>) -> Option<&dyn Listeners> {
        Some(table)
    }

    fn listeners_mut(table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn Listeners> {
        Some(table)
    }

    fn leftovers(table: &PodTable<Self, PodFacts>) -> Option<&dyn Leftovers> {
        Some(table)
    }

    fn leftovers_mut(table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn Leftovers> {
        Some(table)
    }

    fn programs(table: &PodTable<Self, PodFacts>) -> Option<&dyn NodePrograms> {
        Some(table)
    }

    fn programs_mut(table: &mut PodTable<Self, PodFacts>) -> Option<&mut dyn NodePrograms> {
        Some(table)
    }
}

impl AgentBackend for IptablesBackend {
    const KIND: Kind = Kind::Iptables;
    /// The chains are its own.
    const TAKES_OVER_IPTABLES: bool = false;

    fn refusal(e: IptablesError) -> Refusal {
        let kind = match &e {
            IptablesError::Netns { .. } => ErrorKind::UnknownNetns,
            IptablesError::Full(_) => return Refusal::new(ErrorKind::PodTableFull, e.to_string()),
            _ => ErrorKind::Internal,
        };
        Refusal::new(kind, format!("writing the pod's iptables chains: {e}"))
    }

    fn not_restored(e: IptablesError) -> NotRestored {
        NotRestored::Kept(format!("writing its iptables chains: {e}"))
    }

    /// The chains in force, as written: kept at a restore unless they changed. A part that
    /// does not read (written by another release, damaged) has them written anew.
    fn recorded(part: &MeshedBy) -> Option<ChainsInForce> {
        part.part().ok()
    }

    fn meshed_by(written: &ChainsInForce, _before: Option<&MeshedBy>) -> MeshedBy {
        // A struct of two fields, neither `kind`: always an object of its own.
        MeshedBy::with_part(Kind::Iptables, written)
            .unwrap_or_else(|_| MeshedBy::new(Kind::Iptables))
    }

    fn taken_from(from: Kind) -> Option<String> {
        Some(format!(
            "pod meshed by {from}: its iptables chains are written; what {from} left of it is left alone"
        ))
    }

    /// The chains need none: `-o lo` covers whatever the pod delivers over lo.
    fn local_in_force(
        _table: &PodTable<Self, PodFacts>,
        _key: NetnsCookie,
        _census: &(),
    ) -> LocalDestinations {
        LocalDestinations::default()
    }
}

/// Removes what the backend that meshed a record's pod wrote in its namespace, as `interceptor
/// uninstall` does for a pod that still exists (iptables: its chains; eBPF's maps and pins are
/// removed whole, not per pod).
pub fn remove_recorded(record: &PodRecord) -> anyhow::Result<()> {
    use anyhow::Context as _;
    match record.meshed_by.kind {
        Kind::Ebpf => Ok(()),
        Kind::Iptables => {
            let Some(chains) = IptablesBackend::recorded(&record.meshed_by) else {
                return Ok(());
            };
            let options = crate::iptables::IptablesOptions {
                mode: chains.mode,
                wait: true,
                ipv6: record.config.ipv6,
                netns: Some(record.netns.clone()),
            };
            crate::iptables::cleanup(&options)
                .map(drop)
                .with_context(|| {
                    format!("removing the iptables chains in {}", record.netns.display())
                })
        }
    }
}

/// The API's error kind for a registration the maps refused (nothing was changed).
/// A map the kernel found full is a full table; one short of memory may take the write later,
/// so the plugin tries again.
pub fn ebpf_refusal(e: EbpfError) -> Refusal {
    let kind = match &e {
        EbpfError::NoFreeSlot(_) => ErrorKind::PodTableFull,
        EbpfError::Netns(_) => ErrorKind::UnknownNetns,
        e if e.is_capacity() => ErrorKind::TableFull,
        e => match e.map_out_of_room() {
            Some(libc::ENOMEM) => ErrorKind::Unavailable,
            Some(_) => ErrorKind::TableFull,
            None => ErrorKind::Internal,
        },
    };
    let message = match e.map_out_of_room() {
        Some(_) => format!("{e}; nothing of the change was written: try again later"),
        None => e.to_string(),
    };
    Refusal::new(kind, message)
}

/// The node's pod table with the agent's facts, and what a restore reads once for all pods.
struct AgentTable<B: Interception> {
    table: PodTable<B, PodFacts>,
    census: Option<B::Census>,
}

impl<B: AgentBackend> AgentTable<B> {
    fn new(backend: B) -> Self {
        Self {
            table: PodTable::new(backend),
            census: None,
        }
    }

    /// Puts what was written for a pod into the agent's facts (`before`: what its record said).
    fn say_meshed_by(&mut self, key: NetnsCookie, before: Option<&MeshedBy>) {
        let Some(entry) = self.table.get(key) else {
            return;
        };
        let meshed_by = B::meshed_by(&entry.pod.written, before);
        if let Some(facts) = self.table.facts_mut(key) {
            facts.meshed_by = meshed_by;
        }
    }
}

impl<B: AgentBackend> AgentPods for AgentTable<B> {
    fn kind(&self) -> Kind {
        B::KIND
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    fn keys(&self) -> Vec<NetnsCookie> {
        self.table.keys()
    }

    fn registered(&self) -> Box<dyn Iterator<Item = (NetnsCookie, &Path, &PodFacts)> + '_> {
        Box::new(
            self.table
                .iter()
                .map(|(key, entry)| (key, entry.pod.netns.as_path(), &entry.facts)),
        )
    }

    fn facts(&self, key: NetnsCookie) -> Option<&PodFacts> {
        Some(&self.table.get(key)?.facts)
    }

    fn netns(&self, key: NetnsCookie) -> Option<&Path> {
        Some(&self.table.get(key)?.pod.netns)
    }

    fn record(&self, key: NetnsCookie) -> Option<PodRecord> {
        let entry = self.table.get(key)?;
        Some(PodRecord::new(
            key,
            entry.pod.netns.clone(),
            entry.pod.config.clone(),
            entry.pod.host_ids,
            entry.facts.clone(),
        ))
    }

    fn find(&self, netns: &Path) -> Option<NetnsCookie> {
        self.table.find(netns)
    }

    fn set_facts(&mut self, key: NetnsCookie, facts: PodFacts) -> Option<PodFacts> {
        self.table.set_facts(key, facts)
    }

    fn lenient_identifier(&self) -> IdentifyLenient {
        B::identify_lenient
    }

    fn apply(
        &mut self,
        key: NetnsCookie,
        path: &Path,
        wanted: &Wanted<'_>,
        facts: PodFacts,
    ) -> Result<(), Refusal> {
        self.table
            .write(key, path, wanted, facts)
            .map_err(B::refusal)?;
        self.say_meshed_by(key, None);
        Ok(())
    }

    fn remove(&mut self, key: NetnsCookie) -> Result<(), String> {
        self.table.remove(key).map(drop).map_err(|e| e.to_string())
    }

    fn forget(&mut self, key: NetnsCookie) -> Result<(), String> {
        self.table.forget(key).map(drop).map_err(|e| e.to_string())
    }

    fn problem(&self, key: NetnsCookie) -> Option<String> {
        self.table.problem(key)
    }

    fn differs(&self, key: NetnsCookie) -> Option<String> {
        self.table.differs(key, None)
    }

    fn differences(&self) -> Vec<(NetnsCookie, String)> {
        let census = self.table.census();
        self.table
            .keys()
            .into_iter()
            .filter_map(|key| Some((key, self.table.differs(key, Some(&census))?)))
            .collect()
    }

    fn details(
        &self,
        key: NetnsCookie,
        listening: Option<&BTreeSet<NetnsCookie>>,
        check: bool,
    ) -> Option<PodDetails> {
        let entry = self.table.get(key)?;
        let mut details = PodDetails {
            slot: None,
            counters: None,
            inbound_listener: None,
            addresses: entry.pod.local.addresses.clone(),
            problem: if check { self.table.problem(key) } else { None },
        };
        if let Some(counters) = B::counters(&self.table) {
            details.slot = counters.slot(key);
            details.counters = Some(counters.counters(key));
        }
        if let Some(listeners) = self.listeners() {
            details.inbound_listener = Some(match listening {
                Some(listening) => listening.contains(&key),
                None => listeners.has_listener(key),
            });
        }
        Some(details)
    }

    fn listening(&self) -> BTreeSet<NetnsCookie> {
        self.listeners()
            .map(|listeners| listeners.listening())
            .unwrap_or_default()
    }

    fn local_destinations(&self, key: NetnsCookie) -> Option<&LocalDestinations> {
        Some(&self.table.get(key)?.pod.local)
    }

    fn set_local(&mut self, key: NetnsCookie, local: &LocalDestinations) -> Result<(), String> {
        self.table.set_local(key, local).map_err(|e| e.to_string())
    }

    fn restore(
        &mut self,
        record: &PodRecord,
        how: Restore<'_>,
        netns: &PodNetns,
        host_ids: HostIds,
        local: Option<&LocalDestinations>,
    ) -> Result<Option<String>, NotRestored> {
        let census = self.census.get_or_insert_with(|| self.table.census());
        let in_force;
        let local = match local {
            Some(local) => local,
            None => {
                in_force = B::local_in_force(&self.table, record.netns_cookie, census);
                &in_force
            }
        };
        let wanted = Wanted {
            netns,
            config: &record.config,
            host_ids,
            local,
        };
        let key = record.netns_cookie;
        let recorded = match how {
            Restore::Own(part) => B::recorded(part),
            Restore::From(_) => None,
        };
        let repaired = self
            .table
            .adopt(
                key,
                &record.netns,
                &wanted,
                recorded.as_ref(),
                census,
                record.facts(),
            )
            .map_err(B::not_restored)?;
        if let Restore::From(from) = how
            && let Some(note) = B::taken_from(from)
        {
            info!(netns = %record.netns.display(), netns_cookie = %key, "{note}");
        }
        self.say_meshed_by(key, Some(&record.meshed_by));
        Ok(repaired)
    }

    fn end_restore(&mut self) {
        self.census = None;
    }

    fn takes_over_iptables(&self) -> bool {
        B::TAKES_OVER_IPTABLES
    }

    fn claim(&mut self, key: NetnsCookie) -> Option<PodRecord> {
        self.say_meshed_by(key, None);
        self.record(key)
    }

    fn listeners(&self) -> Option<&dyn Listeners> {
        B::listeners(&self.table)
    }

    fn listeners_mut(&mut self) -> Option<&mut dyn Listeners> {
        B::listeners_mut(&mut self.table)
    }

    fn leftovers(&self) -> Option<&dyn Leftovers> {
        B::leftovers(&self.table)
    }

    fn leftovers_mut(&mut self) -> Option<&mut dyn Leftovers> {
        B::leftovers_mut(&mut self.table)
    }

    fn programs(&self) -> Option<&dyn NodePrograms> {
        B::programs(&self.table)
    }

    fn programs_mut(&mut self) -> Option<&mut dyn NodePrograms> {
        B::programs_mut(&mut self.table)
    }
}
