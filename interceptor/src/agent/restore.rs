//! Taking the pods back at start-up, from the pod records and the pinned maps.
//!
//! The state after any crash is one the API could have produced: a pod whose record exists and
//! whose namespace is still there is restored in full (its record's configuration, or, if that
//! cannot be applied, the one in force); everything the maps and pins hold for a pod without a
//! record (a registration or removal cut short) is removed. A namespace that is there but whose
//! addresses or routes cannot be read keeps its pod, with the local destinations in force.

use std::collections::BTreeSet;

use anyhow::bail;
use interceptor_common::NetnsCookie;
use tracing::{info, warn};

use super::{
    Agent, Refusal,
    api::{
        Backend as Kind,
        records::{Found, NotRestored, Then, take_back},
    },
    records::PodRecord,
    registration::{namespace_id, proxy_ids_on_host, take_over_from_iptables},
    watch::Registering,
};
use crate::{
    crash_points::crash_point,
    netns::{PodNetns, listener::find_listeners},
};

impl Agent {
    /// Takes back the pods of the previous agent: every record whose namespace still exists
    /// with the same key. eBPF pods keep their slot and counters; with `migrating`, the maps are
    /// new ones the links do not use yet, and a pod they cannot take stops the start-up before
    /// anything is switched: the previous programs and maps keep every pod intercepted.
    ///
    /// A record of the other backend is brought over: an eBPF agent registers a pod the
    /// iptables backend meshed (its chains are removed by [`Self::take_over_iptables_pods`],
    /// once the programs are attached); an iptables agent writes chains for a pod eBPF meshed,
    /// and leaves the pinned eBPF state alone.
    pub(super) fn restore(&mut self, migrating: bool) -> anyhow::Result<()> {
        let restored = self.restore_records(migrating);
        self.pods.end_restore();
        restored?;
        self.remove_leftovers();
        info!(pods = self.pods.len(), backend = %self.pods.kind(), "pods restored");
        Ok(())
    }

    fn restore_records(&mut self, migrating: bool) -> anyhow::Result<()> {
        for record in self.records.load_all() {
            let cookie = record.netns_cookie;
            let netns = record.netns.clone();
            match self.restore_one(&record, migrating) {
                Ok(registering) => {
                    self.netns_watch.watch(cookie, &netns, registering);
                    crash_point!("restore-pod");
                }
                Err(Then::Abort(why)) => bail!(
                    "building the new maps: pod {} cannot be registered in them: {why}. Nothing was switched: every pod stays intercepted by the previous programs and maps. Remove the pod or fix the cause, then start the agent again",
                    netns.display()
                ),
                Err(Then::Keep(why)) => {
                    warn!(netns = %netns.display(), netns_cookie = %cookie, "pod left as it was, not restored: {why}");
                }
                Err(Then::Forget(why)) => {
                    warn!(netns = %netns.display(), netns_cookie = %cookie, "not restoring pod: {why}");
                    if let Some(leftovers) = self.pods.leftovers_mut() {
                        let _ = leftovers.purge(cookie);
                    }
                    let _ = self.records.remove(cookie);
                }
            }
        }
        Ok(())
    }

    /// Restores one pod into the pod table; `migrating`: into new maps, where no pod is yet
    /// (nothing to repair). Returns its registration with the address listener, to watch it;
    /// what becomes of a pod not restored is `interceptor_api::records::take_back`'s decision
    /// (the code the `pod_record` fuzz target drives).
    fn restore_one(
        &mut self,
        record: &PodRecord,
        migrating: bool,
    ) -> Result<Option<Registering>, Then> {
        let gone = |e: crate::netns::NetnsError| NotRestored::Gone(e.to_string()).then(migrating);
        let netns = PodNetns::open(&record.netns).map_err(gone)?;
        // Before the read, as a registration does (`registration::add`).
        let registering = namespace_id(&netns).map(|id| self.netns_watch.registering(id));
        // Leniently, as the sweep: a dump that fails in a namespace that is there must not pass
        // for a gone pod (whose entries and record would go).
        let (cookie, local) = (self.pods.lenient_identifier())(&netns).map_err(gone)?;
        let (found, local) = match local {
            Ok(local) => (Found::Key(cookie), Some(local)),
            Err(e) => (
                Found::Unread {
                    key: cookie,
                    why: e.to_string(),
                },
                None,
            ),
        };
        let path = record.netns.display().to_string();
        if let Found::Unread { why, .. } = &found {
            warn!(netns = %path, netns_cookie = %cookie, error = %why, "restoring the pod with the addresses and local routes in force before the restart: its network namespace is there but could not be read");
        }
        let kind = self.pods.kind();
        take_back(record, kind, found, migrating, |how| {
            // As recorded: a namespace's id maps never change once written. An older agent's
            // record has none; a pod whose maps cannot be read now is left as it was.
            let host_ids = match record.host_ids {
                Some(ids) => ids,
                None => proxy_ids_on_host(&netns, &record.config)
                    .map_err(|refusal| NotRestored::Kept(refusal.message))?,
            };
            let repaired = self
                .pods
                .restore(record, how, &netns, host_ids, local.as_ref())
                .map_err(|not| match not {
                    // The new maps would not have the pod the backend left as it was: at the
                    // switch it would lose its interception, so the migration stops.
                    NotRestored::Kept(why) if migrating => NotRestored::Refused(why),
                    not => not,
                })?;
            if let Some(what) = repaired.filter(|_| !migrating) {
                warn!(netns = %path, netns_cookie = %cookie, "pod restored, repaired: {what}");
            }
            Ok(())
        })?;
        // What the backend wrote anew (iptables: its chains) goes into the record.
        if let Some(now) = self.pods.record(cookie)
            && now != *record
            && let Err(e) = self.records.save(&now)
        {
            warn!(netns = %path, error = %e, "saving the pod record");
        }
        Ok(registering)
    }

    /// Moves the pods the iptables backend meshed, registered by another backend in
    /// [`Self::restore`] (their records still say iptables), to that backend alone: their
    /// proxy's existing listener is adopted where the backend holds listeners, then their
    /// chains are removed (the backend already intercepts them, so there is no moment without
    /// interception) and their records say the backend's. Called once the backend intercepts
    /// (the programs attached). An iptables agent's records all say iptables: nothing to do.
    pub(super) fn take_over_iptables_pods(&mut self) {
        if !self.pods.takes_over_iptables() {
            return;
        }
        let meshed_by_iptables: Vec<PodRecord> = self
            .pods
            .keys()
            .into_iter()
            .filter_map(|cookie| self.pods.record(cookie))
            .filter(|r| r.meshed_by.kind == Kind::Iptables)
            .collect();
        for record in meshed_by_iptables {
            let cookie = record.netns_cookie;
            if let Some(listeners) = self.pods.listeners_mut() {
                let found = PodNetns::open(&record.netns)
                    .map(|netns| find_listeners(&netns, record.config.incoming_proxy_port))
                    .unwrap_or_default();
                if let Err(e) = listeners.adopt(cookie, found, false) {
                    warn!(netns = %record.netns.display(), error = %e, "not taking over a pod from iptables (its proxy's listener could not be adopted): its chains stay in force");
                    continue;
                }
            }
            if let Err(Refusal { message: e, .. }) = take_over_from_iptables(&record.netns) {
                warn!(netns = %record.netns.display(), "{e}");
                continue;
            }
            let Some(record) = self.pods.claim(cookie) else {
                continue;
            };
            if let Err(e) = self.records.save(&record) {
                warn!(netns = %record.netns.display(), error = %e, "saving the pod record");
            }
            info!(netns = %record.netns.display(), netns_cookie = %cookie, "took over a pod from iptables: the backend intercepts it, its chains are removed");
        }
    }

    /// Removes what the maps and pins hold for pods without a record: a configuration, address
    /// or subnet entries, or an sk_lookup link written by a registration that never answered.
    /// A pod left as it was ([`Then::Keep`]) has a record but is not registered: what the maps
    /// and pins hold of it is what keeps it intercepted, and stays.
    fn remove_leftovers(&mut self) {
        let recorded: BTreeSet<NetnsCookie> = self
            .records
            .load_all()
            .iter()
            .map(|record| record.netns_cookie)
            .collect();
        let Some(leftovers) = self.pods.leftovers_mut() else {
            return;
        };
        for cookie in leftovers.without_record(&recorded) {
            warn!(
                netns_cookie = %cookie,
                "removing what the maps and pins hold for a pod without a record"
            );
            if let Err(e) = leftovers.purge(cookie) {
                warn!(netns_cookie = %cookie, error = %e, "removing a pod's leftovers");
            }
        }
    }

    /// The pods the maps or the pins hold something of, and that are not registered
    /// (`interceptor_api::records` decides).
    pub(super) fn unregistered(&self) -> BTreeSet<NetnsCookie> {
        self.pods
            .leftovers()
            .map(|leftovers| leftovers.unregistered())
            .unwrap_or_default()
    }
}
