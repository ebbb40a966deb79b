//! The make-before-break write of a pod's state, and the room check that refuses a change the
//! maps cannot hold before anything is written.
use std::{collections::BTreeSet, net::IpAddr};

use ipnet::IpNet;

use interceptor_common::{
    MAX_LOCAL_ADDRS_PER_POD, MAX_SUBNET_RULES, NetnsCookie, PodConfig, PodSlot, names,
    outbound_ports,
};

use super::{EbpfWritten, InForce, PodWriter, Written};
use crate::{
    crash_points::{crash_point, fault_error},
    ebpf::{
        EbpfError,
        encode::{SubnetEntry, pod_config, subnet_keys},
        inbound::{Inbound, inbound_link_path, load_inbound},
        maps::map_error,
    },
    node::Wanted,
};

impl PodWriter {
    /// Makes `wanted` the pod's state, from `before`: its sk_lookup link (`inbound`, or attached
    /// now), the entries the new state needs, its configuration (the switch), then the entries
    /// only `before` needed are removed. Nothing is written unless everything fits; a failure
    /// before the switch removes what was written, so the maps are as they were (a new pod's
    /// link is detached too), and hands the link back.
    #[allow(
        clippy::result_large_err,
        reason = "the link handed back with the error makes it large; built once per change"
    )]
    pub(super) fn write(
        &mut self,
        cookie: NetnsCookie,
        wanted: &Wanted<'_>,
        slot: PodSlot,
        before: &InForce,
        inbound: Option<Inbound>,
    ) -> Result<EbpfWritten, (EbpfError, Option<Inbound>)> {
        let netns = wanted.netns;
        let addresses: BTreeSet<IpAddr> = wanted.local.addresses.iter().copied().collect();
        let local_routes: BTreeSet<IpNet> = wanted.local.routes.iter().copied().collect();
        let subnets = subnet_keys(cookie, wanted.config, &local_routes);
        if let Err(e) = self.check_room(wanted, &addresses, &before.subnets, &subnets) {
            return Err((e, inbound));
        }
        // Attached again when its pin went missing: the new link is attached before the old
        // one is dropped, so inbound steering never stops.
        let pinned = !self.persistent || inbound_link_path(&self.links_dir, cookie).exists();
        let inbound = match inbound {
            Some(inbound) if pinned => inbound,
            old => match load_inbound(
                &self.pod_lookup,
                &self.links_dir,
                self.persistent,
                cookie,
                slot,
                netns,
            ) {
                Ok(new) => {
                    drop(old);
                    new
                }
                Err(e) => return Err((e, old)),
            },
        };
        crash_point!("pod-inbound-attached");
        let config = pod_config(
            slot,
            wanted.config,
            wanted.host_ids,
            &addresses,
            !local_routes.is_empty(),
        );
        let switched = self
            .mark_outbound_port(config.outbound_port)
            .and_then(|()| self.switch(cookie, before, &subnets, config));
        if let Err(e) = switched {
            if before.config.is_none() {
                self.detach_inbound(cookie, Some(inbound));
                return Err((e, None));
            }
            return Err((e, Some(inbound)));
        }
        crash_point!("pod-switched");
        let (subnets, problem) =
            self.remove_old_entries(cookie, before, subnets, config.inbound_port);
        Ok(EbpfWritten {
            slot,
            kept_in_force: None,
            subnets,
            inbound: Some(inbound),
            problem,
        })
    }

    /// The make-before-break switch of one pod: the entries of `subnets` that `before` lacks
    /// are written, then the pod's entry becomes `config`. If either fails, what was written is
    /// removed and the maps are as they were. The entries only `before` needed are the
    /// caller's to remove once it has switched ([`Self::remove_old_entries`]).
    pub(super) fn switch(
        &mut self,
        cookie: NetnsCookie,
        before: &InForce,
        subnets: &BTreeSet<SubnetEntry>,
        config: PodConfig,
    ) -> Result<(), EbpfError> {
        let mut written = Written::default();
        let switched = self
            .write_new_entries(before, subnets, &mut written)
            .and_then(|()| {
                crash_point!("pod-entries-written");
                if let Some(io_error) = fault_error!("pod-map-update-fails") {
                    return Err(EbpfError::Map {
                        map: names::MAP_PODS,
                        source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                            call: "bpf_map_update_elem",
                            io_error,
                        }),
                    });
                }
                self.maps
                    .pods
                    .insert(cookie, config, 0)
                    .map_err(map_error(names::MAP_PODS))
            });
        if switched.is_err() {
            self.remove_written(cookie, written);
        }
        switched
    }

    /// Puts `port` in the node's set of outbound ports before a pod's entry names it (see
    /// `interceptor_common::outbound_ports`); never taken out.
    fn mark_outbound_port(&mut self, port: u16) -> Result<(), EbpfError> {
        let index = outbound_ports::word(port);
        let error = map_error(names::MAP_OUTBOUND_PORTS);
        let word = self.maps.outbound_ports.get(&index, 0).map_err(&error)?;
        if word & outbound_ports::bit(port) != 0 {
            return Ok(());
        }
        let word = word | outbound_ports::bit(port);
        self.maps.outbound_ports.set(index, word, 0).map_err(error)
    }

    /// Refuses a change the maps cannot hold, before anything is written. The old and the new
    /// entries are both in the maps for a moment, so a change needs room for what it adds.
    fn check_room(
        &self,
        wanted: &Wanted<'_>,
        addresses: &BTreeSet<IpAddr>,
        subnets_before: &BTreeSet<SubnetEntry>,
        subnets: &BTreeSet<SubnetEntry>,
    ) -> Result<(), EbpfError> {
        if addresses.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: wanted.netns.path().to_owned(),
                count: addresses.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        self.check_subnet_room(subnets_before, subnets)
    }

    /// Refuses a change of a pod's subnet entries from `before` to `subnets` that the trie
    /// cannot hold (both sets are in it for a moment).
    pub(super) fn check_subnet_room(
        &self,
        before: &BTreeSet<SubnetEntry>,
        subnets: &BTreeSet<SubnetEntry>,
    ) -> Result<(), EbpfError> {
        let needed = subnets.difference(before).count();
        let free = (MAX_SUBNET_RULES as usize).saturating_sub(self.subnet_entries);
        if needed > free {
            return Err(EbpfError::TableFull {
                table: "subnet",
                unit: "rules",
                capacity: MAX_SUBNET_RULES as usize,
                free,
                needed,
            });
        }
        Ok(())
    }
}
