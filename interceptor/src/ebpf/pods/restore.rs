//! Taking a pod back under management after the agent restarted.
use interceptor_common::PodSlot;

use super::{InForce, InMaps, PodRegistry, Registered, without_addresses};
use crate::{
    ebpf::{
        EbpfError, PodSpec,
        encode::{configured_subnets, local_routes_of, own_addresses},
    },
    netns::listener::find_listeners,
};

impl<D> PodRegistry<D> {
    /// Takes a pod back under management after a restart: its map entries and pinned sk_lookup
    /// link are still in force (they outlive the agent process), so it keeps its counter slot
    /// and counters, its record's configuration is applied (make before break, as an update),
    /// stale entries are removed, and its sk_lookup link gets this process's program. Registers
    /// it afresh if its configuration never reached the maps.
    ///
    /// When the record's configuration cannot be applied, what was in force stays in force and
    /// the pod stays registered with a [`Self::problem`]: a restart never unmeshes a pod.
    ///
    /// Returns what the restart repaired, if anything: the remains of a change the previous
    /// agent did not complete. `data` is kept with the pod.
    pub fn restore(
        &mut self,
        spec: &PodSpec,
        in_maps: &mut InMaps,
        data: D,
    ) -> Result<Option<String>, EbpfError>
    where
        D: Clone,
    {
        let cookie = spec.netns_cookie;
        // Entries of a registration or removal cut short may be there without a configuration:
        // the pod is registered afresh over them, and they go with the old state.
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
        match self.write(spec, slot, &before, None, data.clone()) {
            Ok(registered) => {
                let repaired = match before.config {
                    None => Some(
                        "its configuration was not in the maps (a registration or removal cut short): registered afresh"
                            .to_owned(),
                    ),
                    // The pod's addresses may have changed while no agent ran: that is no repair.
                    Some(in_force)
                        if bytemuck::bytes_of(&without_addresses(in_force))
                            != bytemuck::bytes_of(&without_addresses(registered.in_force())) =>
                    {
                        Some("the maps held another configuration than its record's (a change cut short): the record's is applied".to_owned())
                    }
                    // Nor may its `local` routes.
                    Some(_)
                        if configured_subnets(&before.subnets)
                            != configured_subnets(&registered.subnets) =>
                    {
                        Some(
                        "subnet entries of a change cut short were removed".to_owned(),
                        )
                    }
                    Some(_) => None,
                };
                self.pods.insert(cookie, registered);
                let found = find_listeners(&spec.netns, spec.config.incoming_proxy_port);
                self.adopt_listeners(cookie, found)?;
                Ok(repaired)
            }
            Err((e, _)) if before.config.is_none() => Err(e),
            Err((e, inbound)) => {
                let problem = format!(
                    "the configuration in force before the agent restarted is kept: its record's cannot be applied: {e}"
                );
                self.pods.insert(
                    cookie,
                    Registered {
                        slot,
                        config: spec.config.clone(),
                        kept_in_force: Some(Box::new(
                            before.config.unwrap_or_else(bytemuck::Zeroable::zeroed),
                        )),
                        addresses: before
                            .config
                            .as_ref()
                            .map(own_addresses)
                            .unwrap_or_default(),
                        local_routes: local_routes_of(&before.subnets),
                        subnets: before.subnets,
                        inbound,
                        problem: Some(problem.clone()),
                        data,
                    },
                );
                Ok(Some(problem))
            }
        }
    }
}
