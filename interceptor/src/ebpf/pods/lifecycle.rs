//! A pod's lifecycle in the maps: registered, changed in place, given new addresses, removed.
use std::{collections::BTreeSet, net::IpAddr, path::PathBuf};

use interceptor_common::{MAX_LOCAL_ADDRS_PER_POD, NetnsCookie, PodSlot, names};

use ipnet::IpNet;

use super::{InForce, PodRegistry, entries::ignore_absent};
use crate::{
    crash_points::crash_point,
    ebpf::{
        EbpfError, PodSpec,
        encode::{configured_subnets, local_route_keys, write_local},
        inbound::{Inbound, inbound_link_path},
        links::PinnedLink,
        maps::map_error,
    },
    netns::{LocalDestinations, listener::find_listeners},
};

impl<D> PodRegistry<D> {
    /// Registers a pod and adopts its proxy's inbound listener if it already listens (see
    /// [`Self::register`] and [`Self::adopt_listeners`]): all of it, or nothing.
    pub fn add(&mut self, spec: &PodSpec) -> Result<PodSlot, EbpfError>
    where
        D: Default,
    {
        let is_new = !self.pods.contains_key(&spec.netns_cookie);
        let slot = self.register(spec, D::default())?;
        let found = find_listeners(&spec.netns, spec.config.incoming_proxy_port);
        if let Err(e) = self.adopt_listeners(spec.netns_cookie, found) {
            if is_new {
                let _ = self.remove(spec.netns_cookie);
            }
            return Err(e);
        }
        Ok(slot)
    }

    /// Registers a pod. Returns its counter slot. A pod registered with the same configuration
    /// changes nothing; with another configuration it is an error (see [`Self::update`]). Its
    /// proxy's existing listener is left to [`Self::adopt_listeners`], which walks `/proc` and
    /// so is better done without holding whatever guards the registry. `data` is kept with it.
    pub fn register(&mut self, spec: &PodSpec, data: D) -> Result<PodSlot, EbpfError> {
        let cookie = spec.netns_cookie;
        if let Some(registered) = self.pods.get_mut(&cookie) {
            if registered.config == spec.config && registered.problem.is_none() {
                registered.data = data;
                return Ok(registered.slot);
            }
            return Err(EbpfError::AlreadyRegistered(cookie));
        }
        let slot = self.free_slot()?;
        self.zero_counters(slot)?;
        let registered = self
            .write(spec, slot, &InForce::default(), None, data)
            .map_err(|(e, _)| e)?;
        self.pods.insert(cookie, registered);
        Ok(slot)
    }

    /// Applies a new configuration to a registered pod in place (registers it if it is not),
    /// make before break: at every moment the programs apply the old or the new configuration,
    /// and if the new one cannot be applied the old one stays in force (and so does its data).
    pub fn update(&mut self, spec: &PodSpec, data: D) -> Result<PodSlot, EbpfError> {
        let cookie = spec.netns_cookie;
        let Some(mut registered) = self.pods.remove(&cookie) else {
            return self.register(spec, data);
        };
        let before = InForce {
            config: Some(registered.in_force()),
            subnets: std::mem::take(&mut registered.subnets),
        };
        let inbound = registered.inbound.take();
        match self.write(spec, registered.slot, &before, inbound, data) {
            Ok(updated) => {
                self.pods.insert(cookie, updated);
                Ok(registered.slot)
            }
            Err((e, inbound)) => {
                registered.subnets = before.subnets;
                registered.inbound = inbound;
                self.pods.insert(cookie, registered);
                Err(e)
            }
        }
    }

    /// Removes everything the maps and pins hold for a pod this registry does not manage (left
    /// by an earlier agent whose pod is gone): its configuration first, so it stops being
    /// intercepted at once, then its addresses, subnets, listeners, counters and sk_lookup link.
    pub fn purge(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        if self.pods.contains_key(&cookie) {
            return self.remove(cookie);
        }
        let slot = self.maps.pods.get(&cookie, 0).ok().map(|c| PodSlot(c.slot));
        self.remove_config(cookie)?;
        let subnets = self.in_maps().subnets.remove(&cookie).unwrap_or_default();
        self.detach_inbound(cookie, None);
        self.remove_entries(cookie, slot, &subnets)
    }

    /// Unregisters a pod: its connections are no longer intercepted from this call on. If its
    /// configuration cannot be removed, it stays registered as it was.
    pub fn remove(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.remove(&cookie) else {
            return Ok(());
        };
        if let Err(e) = self.remove_config(cookie) {
            self.pods.insert(cookie, registered);
            return Err(e);
        }
        crash_point!("pod-config-removed");
        self.detach_inbound(cookie, registered.inbound);
        crash_point!("pod-inbound-detached");
        self.remove_entries(cookie, Some(registered.slot), &registered.subnets)
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
    pub fn set_local_destinations(
        &mut self,
        cookie: NetnsCookie,
        local: &LocalDestinations,
    ) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.get(&cookie) else {
            return Ok(());
        };
        let wanted: BTreeSet<IpAddr> = local.addresses.iter().copied().collect();
        if wanted.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: PathBuf::from(format!("with netns cookie {cookie}")),
                count: wanted.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        let routes: BTreeSet<IpNet> = local.routes.iter().copied().collect();
        let mut config = registered.in_force();
        write_local(&mut config, &wanted, !routes.is_empty());
        let before = InForce {
            config: Some(registered.in_force()),
            subnets: registered.subnets.clone(),
        };
        let mut subnets = configured_subnets(&registered.subnets);
        subnets.extend(local_route_keys(cookie, &routes));
        self.check_subnet_room(&before.subnets, &subnets)?;
        self.switch(cookie, &before, &subnets, config)?;
        crash_point!("addresses-written");
        let (subnets, problem) =
            self.remove_old_entries(cookie, &before, subnets, config.inbound_port);
        let Some(registered) = self.pods.get_mut(&cookie) else {
            return Ok(());
        };
        registered.addresses = wanted;
        registered.local_routes = routes;
        registered.subnets = subnets;
        if problem.is_some() {
            registered.problem = problem;
        }
        if let Some(kept) = &mut registered.kept_in_force {
            **kept = config;
        }
        Ok(())
    }

    /// Replaces what is kept with a registered pod, without writing to the maps; returns what
    /// was kept, or gives `data` back if the pod is not registered.
    pub fn set_data(&mut self, cookie: NetnsCookie, data: D) -> Result<D, D> {
        match self.pods.get_mut(&cookie) {
            Some(registered) => Ok(std::mem::replace(&mut registered.data, data)),
            None => Err(data),
        }
    }
}
