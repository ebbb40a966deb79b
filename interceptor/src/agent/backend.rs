//! The agent's backend, chosen once per node (`daemon --mode`): the eBPF node (programs attached
//! once to the cgroup, pods as map entries keyed by their netns cookie) or the iptables pod set
//! (proxy-init's chains in each pod's namespace). Registration, restore, reconciliation, health
//! and metrics ask this for what differs between the two, and branch nowhere else.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use interceptor_common::{NetnsCookie, PodSlot};

use super::{
    Refusal,
    api::{Backend as Kind, ErrorKind},
    records::{PodBackend, PodFacts, PodRecord},
};
use crate::{
    config::InterceptionConfig,
    ebpf::{EbpfError, EbpfNode, InMaps, PodSpec},
    iptables::{IptablesError, IptablesPods, IptablesSettings},
    netns::{LocalDestinations, NetnsError, PodNetns},
};

/// Which backend an agent is to use, once `--mode auto` is resolved.
#[derive(Clone, Copy, Debug)]
pub enum BackendChoice {
    Ebpf,
    Iptables(IptablesSettings),
}

/// The backend, and with it the one table of the agent's pods: the eBPF registry or the
/// iptables pod set keeps each pod's configuration and what it wrote, with the agent's
/// [`PodFacts`]; a pod's record is built from them ([`Backend::record`]) and saved after every
/// change, never kept beside them.
pub enum Backend {
    /// Boxed: the node is large, and there is one per agent.
    Ebpf(Box<EbpfNode<PodFacts>>),
    Iptables(IptablesPods<PodFacts>),
}

/// What the backend knows of a pod beyond its record; `None` where the backend has no such
/// thing (the iptables backend has no counter slot, counters or listener map).
pub struct PodDetails {
    pub slot: Option<PodSlot>,
    pub counters: Option<BTreeMap<String, u64>>,
    pub inbound_listener: Option<bool>,
    pub addresses: Vec<IpAddr>,
    pub problem: Option<String>,
}

impl Backend {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Ebpf(_) => Kind::Ebpf,
            Self::Iptables(_) => Kind::Iptables,
        }
    }

    pub fn ebpf(&self) -> Option<&EbpfNode<PodFacts>> {
        match self {
            Self::Ebpf(node) => Some(node),
            Self::Iptables(_) => None,
        }
    }

    pub fn ebpf_mut(&mut self) -> Option<&mut EbpfNode<PodFacts>> {
        match self {
            Self::Ebpf(node) => Some(node),
            Self::Iptables(_) => None,
        }
    }

    /// How many pods are registered.
    pub fn len(&self) -> usize {
        match self {
            Self::Ebpf(node) => node.pods_ref().len(),
            Self::Iptables(pods) => pods.len(),
        }
    }

    /// The registered pods, with the agent's facts about each.
    pub fn registered(&self) -> Box<dyn Iterator<Item = (NetnsCookie, &PodFacts)> + '_> {
        match self {
            Self::Ebpf(node) => Box::new(node.pods_ref().registered()),
            Self::Iptables(pods) => Box::new(pods.registered()),
        }
    }

    pub fn facts(&self, cookie: NetnsCookie) -> Option<&PodFacts> {
        match self {
            Self::Ebpf(node) => node.pods_ref().data(cookie),
            Self::Iptables(pods) => pods.data(cookie),
        }
    }

    /// A registered pod's record, as it is saved.
    pub fn record(&self, cookie: NetnsCookie) -> Option<PodRecord> {
        let config = match self {
            Self::Ebpf(node) => node.pods_ref().config(cookie),
            Self::Iptables(pods) => pods.config(cookie),
        }?;
        let facts = self.facts(cookie)?;
        Some(PodRecord::new(cookie, config.clone(), facts.clone()))
    }

    /// Every registered pod's record, by netns cookie.
    pub fn records(&self) -> Vec<PodRecord> {
        self.registered()
            .filter_map(|(cookie, _)| self.record(cookie))
            .collect()
    }

    /// The pod registered for the namespace at `netns`.
    pub fn find(&self, netns: &Path) -> Option<NetnsCookie> {
        self.registered()
            .find(|(_, facts)| same_path(&facts.netns, netns))
            .map(|(cookie, _)| cookie)
    }

    /// Replaces the agent's facts about a registered pod, writing nothing else; returns the
    /// previous ones (`None`: the pod is not registered).
    pub fn set_facts(&mut self, cookie: NetnsCookie, facts: PodFacts) -> Option<PodFacts> {
        match self {
            Self::Ebpf(node) => node.pods().set_data(cookie, facts).ok(),
            Self::Iptables(pods) => pods.set_data(cookie, facts).ok(),
        }
    }

    /// Puts `spec`'s configuration in force: a new pod, or a change to a registered one whose
    /// configuration in force is `previous`; the pod is registered with `facts` from then on
    /// (their `meshed_by` says what this backend wrote). If it fails, what was in force stays,
    /// with the pod's previous facts: eBPF changes are made before break; iptables removes what
    /// a failed run added, so the previous configuration's chains are written again.
    pub fn apply(
        &mut self,
        spec: &PodSpec,
        mut facts: PodFacts,
        previous: Option<&InterceptionConfig>,
    ) -> Result<(), Refusal> {
        match self {
            Self::Ebpf(node) => {
                facts.meshed_by = PodBackend::Ebpf;
                match previous {
                    None => node.pods().register(spec, facts),
                    Some(_) => node.pods().update(spec, facts),
                }
                .map_err(ebpf_refusal)?;
                Ok(())
            }
            Self::Iptables(pods) => {
                if let (None, Some(max)) = (previous, pods.full()) {
                    return Err((
                        ErrorKind::PodTableFull,
                        format!(
                            "this agent serves at most {max} pods (--max-pods): remove a pod first"
                        ),
                    ));
                }
                match pods.write_chains(spec.netns_path(), &spec.config) {
                    Ok(chains) => {
                        facts.meshed_by = PodBackend::Iptables(chains);
                        pods.insert(spec.netns_cookie, &spec.config, &spec.addresses, facts);
                        Ok(())
                    }
                    Err(e) => {
                        if let Some(previous) = previous
                            && let Err(undo) = pods.write_chains(spec.netns_path(), previous)
                        {
                            tracing::error!(netns = %spec.netns_path().display(), error = %undo, "writing a pod's previous iptables chains again after a change failed: the pod is not intercepted");
                        }
                        Err(iptables_refusal(e))
                    }
                }
            }
        }
    }

    /// Takes a registered pod out of interception, and out of the table; on failure it stays.
    pub fn remove(&mut self, cookie: NetnsCookie) -> Result<(), String> {
        match self {
            Self::Ebpf(node) => node.pods().remove(cookie).map_err(|e| e.to_string()),
            Self::Iptables(pods) => {
                let (Some(config), Some(facts)) = (pods.config(cookie), pods.data(cookie)) else {
                    return Ok(());
                };
                let mode = match &facts.meshed_by {
                    PodBackend::Iptables(chains) => Some(chains.mode),
                    PodBackend::Ebpf => None,
                };
                let (netns, ipv6) = (facts.netns.clone(), config.ipv6);
                pods.remove(cookie, &netns, ipv6, mode)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Forgets a pod whose namespace is gone or was replaced; if its entries cannot be removed,
    /// it stays registered (to be tried again).
    pub fn forget(&mut self, cookie: NetnsCookie) -> Result<(), String> {
        match self {
            Self::Ebpf(node) => node.pods().remove(cookie).map_err(|e| e.to_string()),
            Self::Iptables(pods) => {
                pods.forget(cookie);
                Ok(())
            }
        }
    }

    /// Why a pod's state is not what was written, as far as can be told cheaply (the eBPF
    /// registry's own check; the iptables chains are read only by [`Self::differs`]).
    pub fn problem(&self, cookie: NetnsCookie) -> Option<String> {
        self.ebpf().and_then(|node| node.pods_ref().problem(cookie))
    }

    /// The pods whose proxy's inbound listener the eBPF maps hold (read once for many pods).
    pub fn listening(&self) -> BTreeSet<NetnsCookie> {
        self.ebpf()
            .map(|node| node.pods_ref().listening_cookies())
            .unwrap_or_default()
    }

    /// What the backend knows of a registered pod; `None` if the eBPF registry does not have it.
    /// `listening`: the pods whose proxy listens, read once for a report of many pods (`None`:
    /// this pod's listener is looked up alone). `check`: whether to check an eBPF pod's entries
    /// and link for its problem (a pod just checked has it in the agent's `pod_problems`).
    pub fn details(
        &self,
        cookie: NetnsCookie,
        listening: Option<&BTreeSet<NetnsCookie>>,
        check: bool,
    ) -> Option<PodDetails> {
        match self {
            Self::Ebpf(node) => {
                let pods = node.pods_ref();
                let counters = pods
                    .counters(cookie)
                    .ok()
                    .flatten()
                    .map(|c| c.named().map(|(k, v)| (k.to_owned(), v)).collect())
                    .unwrap_or_default();
                Some(PodDetails {
                    slot: Some(pods.slot(cookie)?),
                    counters: Some(counters),
                    inbound_listener: Some(match listening {
                        Some(listening) => listening.contains(&cookie),
                        None => pods.has_listener(cookie),
                    }),
                    addresses: pods.addresses(cookie),
                    problem: if check { pods.problem(cookie) } else { None },
                })
            }
            Self::Iptables(pods) => Some(PodDetails {
                slot: None,
                counters: None,
                inbound_listener: None,
                addresses: pods.addresses(cookie),
                problem: None,
            }),
        }
    }

    /// What a pod is known to deliver over lo: its addresses and `local` routes.
    pub fn local_destinations(&self, cookie: NetnsCookie) -> LocalDestinations {
        match self {
            Self::Ebpf(node) => node.pods_ref().local_destinations(cookie),
            Self::Iptables(pods) => LocalDestinations {
                addresses: pods.addresses(cookie),
                routes: Vec::new(),
            },
        }
    }

    /// Applies a pod's new addresses and `local` routes (the eBPF programs treat them as
    /// delivered over lo; the chains need nothing: `-o lo` covers them).
    pub fn set_local_destinations(
        &mut self,
        cookie: NetnsCookie,
        local: &LocalDestinations,
    ) -> Result<(), String> {
        match self {
            Self::Ebpf(node) => node
                .pods()
                .set_local_destinations(cookie, local)
                .map_err(|e| e.to_string()),
            Self::Iptables(pods) => {
                pods.set_addresses(cookie, &local.addresses);
                Ok(())
            }
        }
    }

    /// What is wrong with the node's own attachment (eBPF: its cgroup links).
    pub fn node_problems(&self, cgroup: &Path) -> Vec<String> {
        self.ebpf()
            .map(|node| {
                node.link_problems(cgroup)
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The eBPF maps' address and subnet entries, read once for a thorough check or a restore.
    pub fn in_maps(&self) -> Option<InMaps> {
        self.ebpf().map(|node| node.pods_ref().in_maps())
    }

    /// The thorough check of one pod: what differs between what was written for it and what is
    /// in force (eBPF: its entries in `in_maps`, when given; iptables: its chains, read with
    /// iptables-save).
    pub fn differs(&self, record: &PodRecord, in_maps: Option<&InMaps>) -> Option<String> {
        match (self, &record.backend, in_maps) {
            (Self::Ebpf(node), _, Some(in_maps)) => {
                node.pods_ref().entries_differ(record.netns_cookie, in_maps)
            }
            (Self::Iptables(pods), PodBackend::Iptables(chains), _) => {
                pods.differs(&record.netns, record.config.ipv6, chains)
            }
            _ => None,
        }
    }
}

/// A pod's key and local destinations, for a backend of `kind` (run without the agent's lock:
/// it switches into the namespace). eBPF keys pods by their netns cookie, which the programs
/// read in the kernel (Linux 5.14; before, [`NetnsError::NoCookie`]); the iptables backend uses
/// the cookie too, or where the kernel cannot tell it a key derived from the namespace's inode
/// ([`PodNetns::inode_key`]).
pub fn identify(
    kind: Kind,
    netns: &PodNetns,
) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
    match kind {
        Kind::Ebpf => netns.cookie_and_local(),
        Kind::Iptables => netns.key_and_local(),
    }
}

/// [`identify`], with the local destinations only when they can be read: a failed dump alone
/// must not pass for a gone namespace.
pub fn identify_lenient(
    kind: Kind,
    netns: &PodNetns,
) -> Result<(NetnsCookie, Option<LocalDestinations>), NetnsError> {
    if let Ok((key, local)) = identify(kind, netns) {
        return Ok((key, Some(local)));
    }
    match netns.cookie() {
        Err(NetnsError::NoCookie { .. }) if kind == Kind::Iptables => netns.inode_key(),
        other => other,
    }
    .map(|key| (key, None))
}

/// The API's error kind for a registration the maps refused (nothing was changed).
pub fn ebpf_refusal(e: EbpfError) -> Refusal {
    let kind = match &e {
        EbpfError::NoFreeSlot(_) => ErrorKind::PodTableFull,
        EbpfError::Netns(_) => ErrorKind::UnknownNetns,
        e if e.is_capacity() => ErrorKind::TableFull,
        _ => ErrorKind::Internal,
    };
    (kind, e.to_string())
}

/// The API's error kind for chains iptables refused (a failure removes what it added).
fn iptables_refusal(e: IptablesError) -> Refusal {
    let kind = match &e {
        IptablesError::Netns { .. } => ErrorKind::UnknownNetns,
        _ => ErrorKind::Internal,
    };
    (kind, format!("writing the pod's iptables chains: {e}"))
}

/// Whether two namespace paths are the same string. A runtime names a pod's namespace the same
/// way each time, and this compares bytes where `Path`'s `==` parses both into components: looking
/// through 1,000 pods that way was a tenth of a registration's time.
pub(super) fn same_path(a: &Path, b: &Path) -> bool {
    a.as_os_str() == b.as_os_str()
}
