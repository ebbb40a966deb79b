//! Taking the pods back at start-up, from the pod records and the pinned maps.
//!
//! The state after any crash is one the API could have produced: a pod whose record exists and
//! whose namespace is still there is restored in full (its record's configuration, or, if that
//! cannot be applied, the one in force); everything the maps and pins hold for a pod without a
//! record (a registration or removal cut short) is removed.
use interceptor_common::NetnsCookie;
use std::collections::BTreeSet;

use anyhow::bail;
use tracing::{info, warn};

use super::{Agent, records::PodRecord};
use crate::{
    crash_points::crash_point,
    ebpf::{InMaps, PodSpec},
    netns::PodNetns,
};

/// Why a record's pod was not restored.
enum NotRestored {
    /// Its namespace is gone or was replaced, or its record is unusable: the pod is gone.
    Gone(String),
    /// The maps refused it; nothing of it is in force.
    Refused(String),
}

impl Agent {
    /// Takes back the pods of the previous agent: every record whose namespace still exists
    /// with the same cookie keeps its slot and counters. With `migrating`, the maps are new
    /// ones the links do not use yet, and a pod they cannot take stops the start-up before
    /// anything is switched: the previous programs and maps keep every pod intercepted.
    pub(super) fn restore(&mut self, migrating: bool) -> anyhow::Result<()> {
        let mut in_maps = self.node.pods_ref().in_maps();
        for record in self.records.load_all() {
            let cookie = record.netns_cookie;
            match self.restore_one(&record, &mut in_maps, migrating) {
                Ok(()) => {
                    self.netns_watch.watch(&record.netns);
                    self.pods.insert(cookie, record);
                    crash_point!("restore-pod");
                }
                Err(NotRestored::Refused(why)) if migrating => bail!(
                    "building the new maps: pod {} cannot be registered in them: {why}. Nothing was switched: every pod stays intercepted by the previous programs and maps. Remove the pod or fix the cause, then start the agent again",
                    record.netns.display()
                ),
                Err(NotRestored::Gone(why) | NotRestored::Refused(why)) => {
                    warn!(netns = %record.netns.display(), netns_cookie = %cookie, "not restoring pod: {why}");
                    let _ = self.node.pods().purge(cookie);
                    let _ = self.records.remove(cookie);
                }
            }
        }
        self.remove_leftovers(&in_maps);
        info!(pods = self.pods.len(), "pods restored from the pinned maps");
        Ok(())
    }

    /// Restores one pod; `migrating`: into new maps, where no pod is yet (nothing to repair).
    fn restore_one(
        &mut self,
        record: &PodRecord,
        in_maps: &mut InMaps,
        migrating: bool,
    ) -> Result<(), NotRestored> {
        let gone = |e: crate::netns::NetnsError| NotRestored::Gone(e.to_string());
        let netns = PodNetns::open(&record.netns).map_err(gone)?;
        let (cookie, addresses) = netns.cookie_and_addresses().map_err(gone)?;
        if cookie != record.netns_cookie {
            return Err(NotRestored::Gone(
                "its network namespace was replaced".into(),
            ));
        }
        let spec = PodSpec {
            netns_path: record.netns.clone(),
            netns_cookie: cookie,
            addresses,
            config: record.config.clone(),
        };
        let repaired = self
            .node
            .pods()
            .restore(&spec, in_maps)
            .map_err(|e| NotRestored::Refused(e.to_string()))?;
        if let Some(what) = repaired.filter(|_| !migrating) {
            warn!(netns = %record.netns.display(), netns_cookie = %cookie, "pod restored, repaired: {what}");
        }
        Ok(())
    }

    /// Removes what the maps and pins hold for pods without a record: a configuration, address
    /// or subnet entries, or an sk_lookup link written by a registration that never answered.
    fn remove_leftovers(&mut self, in_maps: &InMaps) {
        for cookie in self.unregistered(in_maps) {
            warn!(
                netns_cookie = %cookie,
                "removing what the maps and pins hold for a pod without a record"
            );
            if let Err(e) = self.node.pods().purge(cookie) {
                warn!(netns_cookie = %cookie, error = %e, "removing a pod's leftovers");
            }
        }
    }

    /// The pods the maps (`in_maps`: the address and subnet entries, read once) or the pins hold
    /// something of, and that are not registered.
    pub(super) fn unregistered(&self, in_maps: &InMaps) -> BTreeSet<NetnsCookie> {
        let pods = self.node.pods_ref();
        pods.cookies_in_maps()
            .into_iter()
            .chain(in_maps.cookies())
            .chain(pods.pinned_inbound_cookies())
            .filter(|cookie| !self.pods.contains_key(cookie))
            .collect()
    }
}
