//! Taking a pod back under management after the agent restarted.
use std::collections::BTreeSet;

use interceptor_common::{NetnsCookie, PodConfig, PodSlot};

use super::{EbpfWritten, InForce, InMaps, PodWriter, without_addresses};
use crate::{
    ebpf::{
        EbpfError,
        encode::{SubnetEntry, configured_subnets, local_routes_of, own_addresses},
    },
    netns::{LocalDestinations, listener::find_listeners},
    node::{Adopted, Wanted},
};

impl PodWriter {
    /// What the maps say a pod delivers over lo (its configuration entry's addresses, its
    /// `local` route entries): what a restore keeps when the pod's namespace cannot be read.
    /// `in_maps`: as [`Self::restore`] takes it, before it takes this pod's out.
    pub fn local_in_force(&self, cookie: NetnsCookie, in_maps: &InMaps) -> LocalDestinations {
        let config = self.maps.pods.get(&cookie, 0).ok();
        let subnets = in_maps.subnets.get(&cookie).cloned().unwrap_or_default();
        local_of(config.as_ref(), &subnets)
    }

    /// Takes a pod back under management after a restart: its map entries and pinned sk_lookup
    /// link are still in force (they outlive the agent process), so it keeps its counter slot
    /// and counters, `wanted` is applied (make before break, as an update), stale entries are
    /// removed, and its sk_lookup link gets this process's program. Writes it afresh if its
    /// configuration never reached the maps. `in_maps`: the subnet entries of every pod, read
    /// once for all of them; this pod's are taken out.
    ///
    /// When `wanted` cannot be applied, what was in force stays in force and the pod is taken
    /// back with a problem: a restart never unmeshes a pod.
    ///
    /// Says what the restart repaired, if anything: the remains of a change the previous agent
    /// did not complete.
    pub(in crate::ebpf) fn restore(
        &mut self,
        cookie: NetnsCookie,
        wanted: &Wanted<'_>,
        in_maps: &mut InMaps,
    ) -> Result<Adopted<EbpfWritten>, EbpfError> {
        // Entries of a registration or removal cut short may be there without a configuration:
        // the pod is written afresh over them, and they go with the old state.
        let before = InForce {
            config: self.maps.pods.get(&cookie, 0).ok(),
            subnets: in_maps.subnets.remove(&cookie).unwrap_or_default(),
        };
        let slot = match before.config {
            Some(in_force) => PodSlot(in_force.slot),
            None => {
                let slot = self.free_slot()?;
                self.zero_counters(slot)?;
                slot
            }
        };
        match self.write(cookie, wanted, slot, &before, None) {
            Ok(written) => {
                self.mark_slot(slot, true);
                let repaired = match before.config {
                    None => Some(
                        "its configuration was not in the maps (a registration or removal cut short): registered afresh"
                            .to_owned(),
                    ),
                    // The pod's addresses may have changed while no agent ran: that is no repair.
                    Some(in_force)
                        if bytemuck::bytes_of(&without_addresses(in_force))
                            != bytemuck::bytes_of(&without_addresses(
                                written.in_force(wanted.config, wanted.host_ids, wanted.local),
                            )) =>
                    {
                        Some("the maps held another configuration than its record's (a change cut short): the record's is applied".to_owned())
                    }
                    // Nor may its `local` routes.
                    Some(_)
                        if configured_subnets(&before.subnets)
                            != configured_subnets(&written.subnets) =>
                    {
                        Some("subnet entries of a change cut short were removed".to_owned())
                    }
                    Some(_) => None,
                };
                let found = find_listeners(wanted.netns, wanted.config.incoming_proxy_port);
                if let Err(e) = self.adopt_listeners(cookie, found) {
                    let mut written = written;
                    let _ = self.remove(cookie, &mut written);
                    return Err(e);
                }
                Ok(Adopted {
                    written,
                    local: wanted.local.clone(),
                    repaired,
                })
            }
            Err((e, _)) if before.config.is_none() => Err(e),
            Err((e, inbound)) => {
                self.mark_slot(slot, true);
                let problem = format!(
                    "the configuration in force before the agent restarted is kept: its record's cannot be applied: {e}"
                );
                let local = local_of(before.config.as_ref(), &before.subnets);
                Ok(Adopted {
                    written: EbpfWritten {
                        slot,
                        kept_in_force: Some(Box::new(
                            before.config.unwrap_or_else(bytemuck::Zeroable::zeroed),
                        )),
                        subnets: before.subnets,
                        inbound,
                        problem: Some(problem.clone()),
                    },
                    local,
                    repaired: Some(problem),
                })
            }
        }
    }
}

/// The local destinations a configuration entry and subnet entries put in force.
fn local_of(config: Option<&PodConfig>, subnets: &BTreeSet<SubnetEntry>) -> LocalDestinations {
    LocalDestinations {
        addresses: config
            .map(|c| own_addresses(c).into_iter().collect())
            .unwrap_or_default(),
        routes: local_routes_of(subnets).into_iter().collect(),
    }
}
