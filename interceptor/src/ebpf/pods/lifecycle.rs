//! A pod's lifecycle in the maps: written new, changed in place, given new addresses, removed.
use std::{collections::BTreeSet, net::IpAddr, path::PathBuf};

use interceptor_common::{MAX_LOCAL_ADDRS_PER_POD, NetnsCookie, PodSlot, names};

use ipnet::IpNet;

use super::{EbpfWritten, InForce, PodWriter, entries::ignore_absent};
use crate::{
    crash_points::crash_point,
    ebpf::{
        EbpfError,
        encode::{configured_subnets, local_route_keys, write_local},
        inbound::{Inbound, inbound_link_path},
        links::PinnedLink,
        maps::map_error,
    },
    netns::LocalDestinations,
    node::{Pod, Wanted},
};

impl PodWriter {
    /// Writes a new pod: a free counter slot, zeroed, then its state (see [`Self::write`]).
    pub(in crate::ebpf) fn write_new(
        &mut self,
        cookie: NetnsCookie,
        wanted: &Wanted<'_>,
    ) -> Result<EbpfWritten, EbpfError> {
        let slot = self.free_slot()?;
        self.zero_counters(slot)?;
        let written = self
            .write(cookie, wanted, slot, &InForce::default(), None)
            .map_err(|(e, _)| e)?;
        self.mark_slot(slot, true);
        Ok(written)
    }

    /// Applies a new configuration to a registered pod in place, make before break: at every
    /// moment the programs apply the old or the new configuration, and if the new one cannot
    /// be applied the old one stays in force (and `before` as it was).
    pub(in crate::ebpf) fn update(
        &mut self,
        cookie: NetnsCookie,
        wanted: &Wanted<'_>,
        before: &mut Pod<EbpfWritten>,
    ) -> Result<EbpfWritten, EbpfError> {
        let written = &mut before.written;
        let in_force = InForce {
            config: Some(written.in_force(&before.config, before.host_ids, &before.local)),
            subnets: std::mem::take(&mut written.subnets),
        };
        let inbound = written.inbound.take();
        self.write(cookie, wanted, written.slot, &in_force, inbound)
            .map_err(|(e, inbound)| {
                written.subnets = in_force.subnets;
                written.inbound = inbound;
                e
            })
    }

    /// Removes everything the maps and pins hold for a pod the table does not have (left by an
    /// earlier agent whose pod is gone): its configuration first, so it stops being
    /// intercepted at once, then its addresses, subnets, listeners, counters and sk_lookup link.
    pub(in crate::ebpf) fn purge(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        let slot = self.maps.pods.get(&cookie, 0).ok().map(|c| PodSlot(c.slot));
        self.remove_config(cookie)?;
        let subnets = self.in_maps().subnets.remove(&cookie).unwrap_or_default();
        self.detach_inbound(cookie, None);
        self.remove_entries(cookie, slot, &subnets)
    }

    /// Takes a pod out of the maps: its connections are no longer intercepted from this call
    /// on. If its configuration cannot be removed, it stays as it was.
    pub(in crate::ebpf) fn remove(
        &mut self,
        cookie: NetnsCookie,
        written: &mut EbpfWritten,
    ) -> Result<(), EbpfError> {
        self.remove_config(cookie)?;
        crash_point!("pod-config-removed");
        self.detach_inbound(cookie, written.inbound.take());
        crash_point!("pod-inbound-detached");
        self.remove_entries(cookie, Some(written.slot), &written.subnets)?;
        self.mark_slot(written.slot, false);
        Ok(())
    }

    pub(super) fn remove_config(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        ignore_absent(self.maps.pods.remove(&cookie)).map_err(map_error(names::MAP_PODS))
    }

    /// Detaches a pod's sk_lookup program: drops this process's link and, for the agent, the
    /// pin that keeps it attached.
    pub(super) fn detach_inbound(&mut self, cookie: NetnsCookie, inbound: Option<Inbound>) {
        drop(inbound);
        if self.persistent {
            let path = inbound_link_path(&self.links_dir, cookie);
            if let Err(e) = PinnedLink::remove_pinned(&path) {
                tracing::warn!(path = %path.display(), error = %e, "unpinning a pod's sk_lookup link");
            }
        }
    }

    /// Makes `local` the pod's own addresses and `local` routes, everything else in force kept
    /// (a configuration kept by a restore too): the new route entries are written first, then
    /// the pod's entry (the switch), then the entries only the old routes needed are removed.
    pub(in crate::ebpf) fn set_local(
        &mut self,
        cookie: NetnsCookie,
        pod: &mut Pod<EbpfWritten>,
        local: &LocalDestinations,
    ) -> Result<(), EbpfError> {
        let wanted: BTreeSet<IpAddr> = local.addresses.iter().copied().collect();
        if wanted.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: PathBuf::from(format!("with netns cookie {cookie}")),
                count: wanted.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        let routes: BTreeSet<IpNet> = local.routes.iter().copied().collect();
        let written = &mut pod.written;
        let in_force = written.in_force(&pod.config, pod.host_ids, &pod.local);
        let mut config = in_force;
        write_local(&mut config, &wanted, !routes.is_empty());
        let before = InForce {
            config: Some(in_force),
            subnets: written.subnets.clone(),
        };
        let mut subnets = configured_subnets(&written.subnets);
        subnets.extend(local_route_keys(cookie, &routes));
        self.check_subnet_room(&before.subnets, &subnets)?;
        self.switch(cookie, &before, &subnets, config)?;
        crash_point!("addresses-written");
        let (subnets, problem) =
            self.remove_old_entries(cookie, &before, subnets, config.inbound_port);
        written.subnets = subnets;
        if problem.is_some() {
            written.problem = problem;
        }
        if let Some(kept) = &mut written.kept_in_force {
            **kept = config;
        }
        Ok(())
    }
}
