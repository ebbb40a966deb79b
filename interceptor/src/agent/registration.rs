//! Registering, changing and removing pods through the API.
//!
//! A change is applied to the maps first (make before break: the old state stays in force
//! unless the new one is complete, see `crate::node`), and only then to the pod's record,
//! so a restarted agent never restores a configuration the maps did not take. Work that can be
//! slow (opening the pod's namespace, looking through `/proc` for its proxy's listener, running
//! iptables) is done without holding the agent's lock.
use interceptor_common::NetnsCookie;
use std::{collections::BTreeSet, path::Path, time::Instant};

use tracing::{info, warn};

use super::{
    Agent, Refusal, Shared,
    api::{ErrorKind, Health, PodAdd, PodInfo},
    events::Occurrence,
    kube_pods::PodRef,
    lock,
    records::{MeshedBy, PodFacts},
};
use crate::{
    config::{InterceptionConfig, user_ids::HostIds},
    crash_points::{crash_point, fault},
    netns::{LocalDestinations, PodNetns, listener::find_listeners},
    node::Wanted,
};

/// What a request changed in the maps.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Applied {
    Nothing,
    NewPod,
    Changed,
}

/// `add`: registers a pod, or applies a new configuration with `update`. Answers once the
/// pod's interception is in force.
pub(super) fn add(agent: &Shared, add: PodAdd) -> Result<Vec<PodInfo>, Refusal> {
    let started = Instant::now();
    let config = add.config.clone();
    let unknown =
        |e: crate::netns::NetnsError| Refusal::new(ErrorKind::UnknownNetns, e.to_string());
    let netns = PodNetns::open(&add.netns).map_err(unknown)?;
    // The id first, and the registration noted with the listener, then the read: a change made
    // after the read began is heard, one made before is in it.
    let nsid = namespace_id(&netns);
    let (backend, identify, holds_listeners, takes_over_chains, registering) = {
        let agent = lock(agent);
        let pods = &agent.pods;
        (
            pods.kind(),
            pods.lenient_identifier(),
            pods.listeners().is_some(),
            pods.takes_over_iptables(),
            nsid.map(|id| agent.netns_watch.registering(id)),
        )
    };
    let (cookie, local) = identify(&netns).map_err(unknown)?;
    let _ = fault!("registration-after-read");
    // The namespace is there but its addresses or routes cannot be read now: nothing is
    // written, and the plugin tries again within its deadline, then has the runtime retry.
    let local = local.map_err(|e| {
        Refusal::new(
            ErrorKind::Unavailable,
            format!(
                "reading what the pod delivers over lo failed: {e}; nothing of the pod was written: try again"
            ),
        )
    })?;
    let host_ids = proxy_ids_on_host(&netns, &config)?;
    let pod = PodAsked {
        netns: &netns,
        path: &add.netns,
        config: &config,
        host_ids,
        local: &local,
    };
    let facts = PodFacts {
        meta: add.meta.clone(),
        meshed_by: MeshedBy::default(),
    };
    // The answer's problem is the one `apply` left: none, as its writes (or its check of a pod
    // already in force) succeeded, unless a check since found one. Reading back what was just
    // written (the pod's 24 KiB configuration entry, its link and program) would cost a tenth of
    // a registration and find nothing more. Its listener is looked up alone, not every pod's.
    let answer = |state: &Agent| state.info_checked(cookie, None, Checked::Just);
    // Answered under the same lock as the change, unless listeners are still to be adopted.
    let (applied, answered) = {
        let mut state = lock(agent);
        let applied = state.apply(cookie, &pod, facts, registering, add.update)?;
        let done = applied == Applied::Nothing || !holds_listeners;
        (applied, done.then(|| answer(&state)))
    };
    let info = match answered {
        Some(info) => info,
        None => {
            // Its configuration is in force, so a listen() from here on is caught by sock_ops;
            // one made before is looked for now, in /proc, without the lock.
            let found = find_listeners(&netns, config.incoming_proxy_port);
            let mut state = lock(agent);
            state.adopt_listeners(cookie, found, applied == Applied::NewPod)?;
            answer(&state)
        }
    };
    if applied != Applied::Nothing {
        agent
            .metrics
            .registration_seconds
            .observe(started.elapsed().as_secs_f64());
        info!(
            netns = %add.netns.display(),
            netns_cookie = %cookie,
            name = add.meta.name.as_deref().unwrap_or("-"),
            namespace = add.meta.namespace.as_deref().unwrap_or("-"),
            uid = add.meta.uid.as_deref().unwrap_or("-"),
            %config,
            %backend,
            micros = started.elapsed().as_micros() as u64,
            "pod registered"
        );
    }
    if add.takeover_iptables && takes_over_chains {
        take_over_from_iptables(&add.netns)?;
    }
    Ok(info.into_iter().collect())
}

/// A pod as a request asks for it.
struct PodAsked<'a> {
    netns: &'a PodNetns,
    /// The path it names the namespace with.
    path: &'a Path,
    config: &'a InterceptionConfig,
    host_ids: HostIds,
    local: &'a LocalDestinations,
}

impl PodAsked<'_> {
    fn wanted(&self) -> Wanted<'_> {
        Wanted {
            netns: self.netns,
            config: self.config,
            host_ids: self.host_ids,
            local: self.local,
        }
    }
}

/// `config`'s proxy ids as the host knows them: translated through the pod's user namespace
/// when it has one of its own (`hostUsers: false`), which costs a fork; an id it does not map
/// is refused, as iptables' owner match refuses it.
pub(super) fn proxy_ids_on_host(
    netns: &PodNetns,
    config: &InterceptionConfig,
) -> Result<HostIds, Refusal> {
    let users = netns
        .users()
        .map_err(|e| Refusal::new(ErrorKind::Internal, e.to_string()))?;
    users
        .host_ids(config)
        .map_err(|e| Refusal::new(ErrorKind::InvalidConfig, e.to_string()))
}

/// Where a pod's report takes its problem from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Checked {
    /// Checked afresh for the report.
    Now,
    /// The last check or change of the pod ([`Agent::recheck`], [`Agent::apply`]), kept in
    /// `pod_problems`.
    Just,
}

impl Agent {
    /// Applies a pod's configuration to the maps (and the pod table), then saves its record;
    /// on failure nothing changed.
    /// `registering`: begun with the namespace's id in the agent's, before its addresses and
    /// routes were read, for its notifications (`watch`).
    fn apply(
        &mut self,
        cookie: NetnsCookie,
        pod: &PodAsked<'_>,
        facts: PodFacts,
        registering: Option<super::watch::Registering>,
        update: bool,
    ) -> Result<Applied, Refusal> {
        let existing = self.pods.record(cookie);
        // Whether only the pod's names change: what is in force stays, nothing is written again.
        let mut names_only = false;
        if let Some(existing) = &existing {
            let same = existing.config == *pod.config;
            // A pod whose entries (or chains) are not what its record says is written again.
            let settled =
                same && self.pods.problem(cookie).is_none() && self.pods.differs(cookie).is_none();
            if settled && existing.meta == facts.meta {
                // In force as asked. A record that is missing (a panic between a registration's
                // maps and its record) is written now, so a restart restores the pod.
                if !self.records.exists(cookie) {
                    self.records.save(existing).map_err(|e| {
                        Refusal::new(ErrorKind::Internal, format!("saving the pod record: {e}"))
                    })?;
                }
                if self.pod_problems.remove(&cookie).is_some() {
                    self.status_changed.notify();
                }
                return Ok(Applied::Nothing);
            }
            names_only = settled;
            if !same && !update {
                return Err(Refusal::new(
                    ErrorKind::Conflict,
                    format!(
                        "pod {} is already registered with another configuration ({}); pass --update to apply the new one in place",
                        pod.path.display(),
                        existing.config.to_args().join(" ")
                    ),
                ));
            }
        }
        // The same path with another cookie: the namespace was replaced, the old pod is gone.
        let stale = self
            .pods
            .registered()
            .find(|(c, netns, _)| netns.as_os_str() == pod.path.as_os_str() && *c != cookie)
            .map(|(c, _, _)| c);
        if let Some(stale) = stale {
            self.forget(stale, "its network namespace was replaced");
        }
        if names_only && let Some(existing) = &existing {
            let facts = PodFacts {
                meshed_by: existing.meshed_by.clone(),
                ..facts
            };
            self.pods.set_facts(cookie, facts);
        } else {
            self.pods.apply(cookie, pod.path, &pod.wanted(), facts)?;
        }
        crash_point!("agent-before-record");
        let record = self
            .pods
            .record(cookie)
            .expect("a pod just applied is registered");
        if let Err(e) = self.records.save(&record) {
            // Back to what was in force, so the table, the maps and the records agree.
            let undone = match &existing {
                Some(existing) if names_only => {
                    self.pods.set_facts(cookie, existing.facts());
                    Ok(())
                }
                Some(existing) => {
                    let before = PodAsked {
                        config: &existing.config,
                        // A record built from the table always has them.
                        host_ids: existing.host_ids.unwrap_or(pod.host_ids),
                        ..*pod
                    };
                    self.pods
                        .apply(cookie, &existing.netns, &before.wanted(), existing.facts())
                        .map_err(|refusal| refusal.message)
                }
                None => self.pods.remove(cookie),
            };
            if let Err(undo) = undone {
                warn!(netns = %record.netns.display(), error = %undo, "undoing a change whose record could not be saved");
            }
            return Err(Refusal::new(
                ErrorKind::Internal,
                format!("saving the pod record: {e}; the pod's interception is as it was"),
            ));
        }
        self.netns_watch.watch(cookie, &record.netns, registering);
        // Written as configured: whatever an earlier check found is mended.
        self.pod_problems.remove(&cookie);
        self.status_changed.notify();
        Ok(if existing.is_none() {
            Applied::NewPod
        } else {
            Applied::Changed
        })
    }

    /// Puts the proxy's listeners that existed before the pod was registered into the listener
    /// map, where the backend holds listeners. A new pod that cannot have them is taken out of
    /// the table again by the backend (`Listeners::adopt`), and untracked here.
    fn adopt_listeners(
        &mut self,
        cookie: NetnsCookie,
        found: Vec<crate::netns::listener::Listening>,
        is_new: bool,
    ) -> Result<(), Refusal> {
        let Some(listeners) = self.pods.listeners_mut() else {
            return Ok(());
        };
        let Err(e) = listeners.adopt(cookie, found, is_new) else {
            return Ok(());
        };
        if self.pods.facts(cookie).is_none() {
            self.untrack(cookie);
            warn!(netns_cookie = %cookie, "pod removed: its proxy's listener could not be adopted");
        }
        Err(Refusal::new(
            ErrorKind::Internal,
            format!("adopting the proxy's inbound listener: {e}"),
        ))
    }

    pub(super) fn find(&self, netns: &Path) -> Result<NetnsCookie, Refusal> {
        self.pods.find(netns).ok_or_else(|| {
            Refusal::new(
                ErrorKind::UnknownNetns,
                format!("no pod is registered for {}", netns.display()),
            )
        })
    }

    pub(super) fn remove_by_path(&mut self, netns: &Path) -> Result<Vec<PodInfo>, Refusal> {
        let Ok(cookie) = self.find(netns) else {
            return Ok(Vec::new());
        };
        let info = self.info(cookie);
        self.pods
            .remove(cookie)
            .map_err(|e| Refusal::new(ErrorKind::Internal, e))?;
        crash_point!("agent-before-record-removal");
        self.untrack(cookie);
        info!(netns = %netns.display(), netns_cookie = %cookie, "pod removed");
        Ok(info.into_iter().collect())
    }

    /// Removes a pod whose namespace is gone, whatever state it is in. If its entries cannot be
    /// removed it stays registered, and the next reconciliation tries again.
    pub(super) fn forget(&mut self, cookie: NetnsCookie, why: &str) {
        let netns = self.pods.netns(cookie).map(Path::to_owned);
        if let Err(e) = self.pods.forget(cookie) {
            warn!(netns_cookie = %cookie, error = %e, "removing a pod's map entries");
            return;
        }
        self.untrack(cookie);
        if let Some(netns) = netns {
            warn!(netns = %netns.display(), netns_cookie = %cookie, "pod removed: {why}");
        }
    }

    /// Drops what is kept beside the table for a pod no longer in it: its watches, its last
    /// problem and its record.
    fn untrack(&mut self, cookie: NetnsCookie) {
        self.netns_watch.unwatch(cookie);
        self.pod_problems.remove(&cookie);
        let _ = self.records.remove(cookie);
        self.status_changed.notify();
    }

    /// Every pod's information; the listener map is walked once, not once per pod.
    pub(super) fn all_info(&self) -> Vec<PodInfo> {
        let listening = self.pods.listening();
        self.pods
            .keys()
            .into_iter()
            .filter_map(|c| self.info_checked(c, Some(&listening), Checked::Now))
            .collect()
    }

    pub(super) fn info(&self, cookie: NetnsCookie) -> Option<PodInfo> {
        self.info_checked(cookie, None, Checked::Now)
    }

    /// `listening`: as [`super::pods::AgentPods::details`] takes it.
    fn info_checked(
        &self,
        cookie: NetnsCookie,
        listening: Option<&BTreeSet<NetnsCookie>>,
        checked: Checked,
    ) -> Option<PodInfo> {
        let record = self.pods.record(cookie)?;
        let mut details = self
            .pods
            .details(cookie, listening, checked == Checked::Now)?;
        // Not checked for the report: the last check or change left its problem in `pod_problems`.
        if checked == Checked::Just {
            details.problem = self.pod_problems.get(&cookie).cloned();
        }
        Some(PodInfo {
            netns: record.netns,
            netns_cookie: cookie,
            meta: record.meta,
            backend: record.meshed_by.kind,
            slot: details.slot,
            args: record.config.to_args(),
            config: record.config,
            addresses: details.addresses.iter().map(ToString::to_string).collect(),
            inbound_listener: details.inbound_listener,
            counters: details.counters,
            problem: details.problem,
        })
    }

    /// Checks a pod's entries (or chains: its configuration entry and sk_lookup link) against
    /// what was written, and keeps what is wrong for the metrics and the node's status. Done
    /// after each change to the pod, each check of it (events, the sweep) and after pins were
    /// restored (what can be put right, a removed pin, is by then). A drift found is an Event
    /// on the pod; found or cleared, it changes the node's status.
    pub(super) fn recheck(&mut self, cookie: NetnsCookie) {
        let found = self
            .pods
            .facts(cookie)
            .and_then(|_| self.pods.problem(cookie));
        let before = match &found {
            Some(problem) => self.pod_problems.insert(cookie, problem.clone()),
            None => self.pod_problems.remove(&cookie),
        };
        if before.is_some() == found.is_some() {
            return;
        }
        self.status_changed.notify();
        let Some(problem) = found else {
            info!(netns_cookie = %cookie, "the pod's interception is in force as configured again");
            return;
        };
        let (Some(facts), Some(netns)) = (self.pods.facts(cookie), self.pods.netns(cookie)) else {
            return;
        };
        warn!(netns = %netns.display(), netns_cookie = %cookie, %problem, "the pod's interception is not in force as configured");
        if let (Some(events), Some(namespace), Some(name)) =
            (&self.events, &facts.meta.namespace, &facts.meta.name)
        {
            let pod = PodRef {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: facts.meta.uid.clone().unwrap_or_default(),
            };
            events.post(&pod, Occurrence::InterceptionDrifted { problem });
        }
    }

    pub(super) fn recheck_all(&mut self) {
        let cookies = self.pods.keys();
        self.pod_problems.retain(|c, _| cookies.contains(c));
        for cookie in cookies {
            self.recheck(cookie);
        }
    }

    /// What is not in force as configured (the API's answer, for `status` and tests): the
    /// node's problems ([`Self::node_problems`], `/ready`'s), then each pod's entries, read from
    /// the kernel, and anything the address and subnet maps, the pins and the records hold that
    /// belongs to no registered pod, and every iptables pod's chains.
    pub(super) fn health(&self) -> Health {
        let backend = self.pods.kind();
        let node_problems = self.node_problems();
        let mut problems = node_problems.clone();
        for (cookie, netns, _) in self.pods.registered() {
            if let Some(problem) = self.pods.problem(cookie) {
                problems.push(format!("pod {}: {problem}", netns.display()));
            }
        }
        for (cookie, difference) in self.pods.differences() {
            if let Some(netns) = self.pods.netns(cookie) {
                problems.push(format!("pod {}: {difference}", netns.display()));
            }
        }
        for cookie in self.unregistered() {
            problems.push(format!(
                "the maps or pins hold entries for netns cookie {cookie}, which is not a registered pod"
            ));
        }
        let recorded: BTreeSet<NetnsCookie> = self
            .records
            .load_all()
            .iter()
            .map(|r| r.netns_cookie)
            .collect();
        let registered: BTreeSet<NetnsCookie> = self.pods.keys().into_iter().collect();
        for cookie in recorded.symmetric_difference(&registered) {
            problems.push(format!(
                "netns cookie {cookie} has a pod record but is not registered, or the other way round"
            ));
        }
        Health {
            problems,
            backend,
            node_problems: Some(node_problems),
            notes: self
                .netns_watch
                .deafness()
                .map(String::from)
                .into_iter()
                .collect(),
        }
    }
}

/// The id of the pod's namespace in the agent's, given one if it has none, for its address
/// notifications; without one, its address changes wait for the safety sweep.
pub(super) fn namespace_id(netns: &PodNetns) -> Option<i32> {
    crate::netns::nsid::nsid_of(netns)
        .inspect_err(|e| {
            warn!(netns = %netns.path().display(), error = %e, "no namespace id for the pod: its address changes are applied by the safety sweep only");
        })
        .ok()
}

/// Called once the pod is intercepted by the programs: its iptables chains can go.
pub(super) fn take_over_from_iptables(netns: &Path) -> Result<(), Refusal> {
    remove_iptables_chains(netns).map_err(|e| {
        Refusal::new(
            ErrorKind::Internal,
            format!("the pod is registered and intercepted, but removing its iptables chains failed: {e}"),
        )
    })
}

/// Removes proxy-init's chains from a pod, whichever binaries wrote them; modes whose binaries
/// are not installed cannot have written any.
fn remove_iptables_chains(netns: &Path) -> Result<(), crate::iptables::IptablesError> {
    use crate::iptables::{IptablesError, IptablesMode, IptablesOptions, cleanup};
    for mode in [IptablesMode::Legacy, IptablesMode::Nft] {
        let options = IptablesOptions {
            mode,
            wait: true,
            ipv6: true,
            netns: Some(netns.to_owned()),
        };
        match cleanup(&options) {
            Ok(ran) if !ran.is_empty() => {
                info!(netns = %netns.display(), ?mode, commands = ran.len(), "took over from iptables: chains removed");
            }
            Ok(_) | Err(IptablesError::MissingBinary { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
