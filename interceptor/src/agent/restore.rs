//! Taking the pods back at start-up, from the pod records and the pinned maps.
//!
//! The state after any crash is one the API could have produced: a pod whose record exists and
//! whose namespace is still there is restored in full (its record's configuration, or, if that
//! cannot be applied, the one in force); everything the maps and pins hold for a pod without a
//! record (a registration or removal cut short) is removed.
use interceptor_common::NetnsCookie;
use std::{collections::BTreeSet, sync::Arc};

use anyhow::bail;
use tracing::{info, warn};

use super::{
    Agent,
    api::records::{Found, NotRestored, Restore, Then, leftovers, restore_step},
    backend::{Backend, identify},
    records::{PodBackend, PodRecord},
    registration::{namespace_id, take_over_from_iptables},
};
use crate::{
    crash_points::crash_point,
    ebpf::{InMaps, PodSpec},
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
        let mut in_maps = self.backend.in_maps();
        for record in self.records.load_all() {
            let cookie = record.netns_cookie;
            let netns = record.netns.clone();
            // What becomes of a pod not restored: `interceptor_api::records` decides.
            match self
                .restore_one(record, in_maps.as_mut(), migrating)
                .map_err(|not| not.then(migrating))
            {
                Ok(nsid) => {
                    self.netns_watch.watch(cookie, &netns, nsid);
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
                    if let Some(node) = self.backend.ebpf_mut() {
                        let _ = node.pods().purge(cookie);
                    }
                    let _ = self.records.remove(cookie);
                }
            }
        }
        if let Some(in_maps) = &in_maps {
            self.remove_leftovers(in_maps);
        }
        info!(pods = self.backend.len(), backend = %self.backend.kind(), "pods restored");
        Ok(())
    }

    /// Restores one pod into the pod table; `migrating`: into new maps, where no pod is yet
    /// (nothing to repair). Returns its namespace's id, for its address notifications.
    fn restore_one(
        &mut self,
        record: PodRecord,
        in_maps: Option<&mut InMaps>,
        migrating: bool,
    ) -> Result<Option<i32>, NotRestored> {
        let gone = |e: crate::netns::NetnsError| NotRestored::Gone(e.to_string());
        let netns = Arc::new(PodNetns::open(&record.netns).map_err(gone)?);
        let (cookie, local) = identify(self.backend.kind(), &netns).map_err(gone)?;
        // How the pod is taken back, if its namespace is still the recorded one:
        // `interceptor_api::records` decides.
        let how = restore_step(&record, self.backend.kind(), Found::Key(cookie))?;
        let path = record.netns.display().to_string();
        match (&mut self.backend, in_maps, how) {
            (Backend::Ebpf(node), Some(in_maps), Restore::Ebpf { .. }) => {
                let spec = PodSpec {
                    netns: Arc::clone(&netns),
                    netns_cookie: cookie,
                    addresses: local.addresses.clone(),
                    local_routes: local.routes.clone(),
                    config: record.config.clone(),
                };
                let repaired = node
                    .pods()
                    .restore(&spec, in_maps, record.facts())
                    .map_err(|e| NotRestored::Refused(e.to_string()))?;
                if let Some(what) = repaired.filter(|_| !migrating) {
                    warn!(netns = %path, netns_cookie = %cookie, "pod restored, repaired: {what}");
                }
            }
            (Backend::Iptables(pods), _, Restore::Iptables { recorded }) => {
                let (chains, written) = pods
                    .restore_chains(&record.netns, &record.config, recorded)
                    .map_err(|e| NotRestored::Kept(format!("writing its iptables chains: {e}")))?;
                match &record.backend {
                    PodBackend::Ebpf => {
                        info!(netns = %path, netns_cookie = %cookie, "pod meshed by eBPF: its iptables chains are written; its pinned eBPF state is left alone");
                    }
                    PodBackend::Iptables(_) if written => {
                        warn!(netns = %path, netns_cookie = %cookie, "pod restored, repaired: its iptables chains were missing or not those recorded, and are written again");
                    }
                    PodBackend::Iptables(_) => {}
                }
                let mut facts = record.facts();
                if written {
                    facts.meshed_by = PodBackend::Iptables(chains);
                }
                pods.insert(cookie, &record.config, &local.addresses, facts);
                if written
                    && let Some(record) = self.backend.record(cookie)
                    && let Err(e) = self.records.save(&record)
                {
                    warn!(netns = %path, error = %e, "saving the pod record");
                }
            }
            (Backend::Ebpf(_), None, _) => unreachable!("the eBPF backend has maps"),
            (_, _, how) => unreachable!("{how:?} is another backend's"),
        }
        Ok(namespace_id(&netns))
    }

    /// Moves the pods the iptables backend meshed, registered in the maps by
    /// [`Self::restore`], to the programs alone: their proxy's existing listener is adopted,
    /// then their chains are removed (the programs already intercept them, so there is no
    /// moment without interception) and their records say eBPF. Called once the programs are
    /// attached.
    pub(super) fn take_over_iptables_pods(&mut self) {
        let meshed_by_iptables: Vec<PodRecord> = self
            .backend
            .records()
            .into_iter()
            .filter(|r| matches!(r.backend, PodBackend::Iptables(_)))
            .collect();
        for mut record in meshed_by_iptables {
            let cookie = record.netns_cookie;
            let Some(node) = self.backend.ebpf_mut() else {
                return;
            };
            let found = PodNetns::open(&record.netns)
                .map(|netns| find_listeners(&netns, record.config.incoming_proxy_port))
                .unwrap_or_default();
            if let Err(e) = node.pods().adopt_listeners(cookie, found) {
                warn!(netns = %record.netns.display(), error = %e, "not taking over a pod from iptables (its proxy's listener could not be adopted): its chains stay in force");
                continue;
            }
            if let Err((_, e)) = take_over_from_iptables(&record.netns) {
                warn!(netns = %record.netns.display(), "{e}");
                continue;
            }
            record.backend = PodBackend::Ebpf;
            self.backend.set_facts(cookie, record.facts());
            if let Err(e) = self.records.save(&record) {
                warn!(netns = %record.netns.display(), error = %e, "saving the pod record");
            }
            info!(netns = %record.netns.display(), netns_cookie = %cookie, "took over a pod from iptables: the programs intercept it, its chains are removed");
        }
    }

    /// Removes what the maps and pins hold for pods without a record: a configuration, address
    /// or subnet entries, or an sk_lookup link written by a registration that never answered.
    fn remove_leftovers(&mut self, in_maps: &InMaps) {
        for cookie in self.unregistered(in_maps) {
            warn!(
                netns_cookie = %cookie,
                "removing what the maps and pins hold for a pod without a record"
            );
            let Some(node) = self.backend.ebpf_mut() else {
                return;
            };
            if let Err(e) = node.pods().purge(cookie) {
                warn!(netns_cookie = %cookie, error = %e, "removing a pod's leftovers");
            }
        }
    }

    /// The pods the maps (`in_maps`: the address and subnet entries, read once) or the pins hold
    /// something of, and that are not registered.
    pub(super) fn unregistered(&self, in_maps: &InMaps) -> BTreeSet<NetnsCookie> {
        let Some(node) = self.backend.ebpf() else {
            return BTreeSet::new();
        };
        let pods = node.pods_ref();
        leftovers(
            pods.cookies_in_maps()
                .into_iter()
                .chain(in_maps.cookies())
                .chain(pods.pinned_inbound_cookies()),
            |cookie| self.backend.facts(cookie).is_some(),
        )
    }
}
