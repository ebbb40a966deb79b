//! Registering pods: writing their configuration, addresses and subnets into the maps, and
//! reading their counters back.
//!
//! Every change to a pod is made before break: the entries the new state needs are written
//! first, then the pod's configuration (one map update: the switch), then the entries only the
//! old state needed are removed. A change that fails before the switch leaves the maps exactly as
//! they were, so a refused change never leaves a pod less intercepted than before.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuValues};
use interceptor_common::{
    ConnectSlot, ListenerKey, MAX_LOCAL_ADDRS_PER_POD, MAX_PODS, MAX_SUBNET_RULES, NetnsCookie,
    OrigDst, PendingKey, PendingOrigDst, PendingSlot, PodConfig, PodCounters, PodSlot,
    SocketCookie, names, pending_phase,
};

use super::{
    EbpfError, LoadOptions, PodSpec,
    encode::{SubnetEntry, listener_key, own_addresses, pod_config, subnet_keys, write_addresses},
    inbound::{Inbound, inbound_link_path, load_inbound},
    links::PinnedLink,
    listener::{Listening, find_listeners},
    maps::{PodMaps, map_error},
    pod_lookup::PodLookupLoader,
};
use crate::{config::InterceptionConfig, crash_points::crash_point, netns::PodNetns};

mod entries;
mod inspect;

use entries::ignore_absent;
pub use inspect::read_counters;

const BPF_NOEXIST: u64 = 1;

/// The subnet entries the maps hold, by netns cookie (see [`PodRegistry::in_maps`]); a pod's
/// addresses are in its configuration entry.
#[derive(Default)]
pub struct InMaps {
    subnets: BTreeMap<NetnsCookie, BTreeSet<SubnetEntry>>,
}

impl InMaps {
    /// The pods these entries belong to.
    pub fn cookies(&self) -> impl Iterator<Item = NetnsCookie> + '_ {
        self.subnets.keys().copied()
    }
}

/// Entries in each map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillLevels {
    /// Original destinations of connections whose proxy side has not closed: in their slots and
    /// in the LRU map behind them ...
    pub pending: usize,
    /// ... of which in the LRU map (`--orig-dst-capacity` bounds it).
    pub pending_in_lru: usize,
    pub connecting: usize,
    pub listeners: usize,
    pub subnets: usize,
    pub pods: usize,
}

/// What the maps hold for a pod: its configuration entry, with its addresses (none for a pod
/// not yet registered), and its subnet entries.
#[derive(Default)]
struct InForce {
    config: Option<PodConfig>,
    subnets: BTreeSet<SubnetEntry>,
}

/// Entries written during a change, removed again if the change cannot be completed.
#[derive(Default)]
struct Written {
    subnets: Vec<SubnetEntry>,
}

/// What was written for one pod, so it can be changed or removed exactly.
struct Registered {
    slot: PodSlot,
    /// The configuration asked for (the pod's record).
    config: InterceptionConfig,
    /// The pod map's entry when it is not `config`'s encoding (a restore that could not apply
    /// the record's configuration kept the one in force; `problem` says so). Boxed and usually
    /// absent: an entry is 24 KiB (three port bitmaps), and a node holds thousands of pods.
    kept_in_force: Option<Box<PodConfig>>,
    /// The addresses its configuration entry holds as the pod's own.
    addresses: BTreeSet<IpAddr>,
    /// Every subnet entry the maps hold for the pod.
    subnets: BTreeSet<SubnetEntry>,
    /// The pod's own sk_lookup program; dropping it detaches it from the pod's namespace (unless its
    /// link is persistent).
    inbound: Option<Inbound>,
    /// Why the maps do not hold exactly `config` (a restore that could not apply the record's
    /// configuration and kept the one in force, or old entries that could not be removed).
    problem: Option<String>,
}

/// `config` with no addresses, to compare what else two entries hold.
fn without_addresses(mut config: PodConfig) -> PodConfig {
    write_addresses(&mut config, &BTreeSet::new());
    config
}

impl Registered {
    /// The pod map's entry for the pod, as this registry wrote or kept it.
    fn in_force(&self) -> PodConfig {
        match &self.kept_in_force {
            Some(kept) => **kept,
            None => pod_config(self.slot, &self.config, &self.addresses),
        }
    }
}

/// The pods one node attachment serves.
pub struct PodRegistry {
    maps: PodMaps,
    pods: BTreeMap<NetnsCookie, Registered>,
    pin_dir: PathBuf,
    links_dir: PathBuf,
    /// The agent's: links and maps stay pinned when the registry goes.
    persistent: bool,
    max_pods: u32,
    pod_lookup: PodLookupLoader,
    /// Entries in the subnet trie, kept up to date by every insert and delete (counting them
    /// means a system call per entry): what lets a change that cannot fit be refused up front.
    subnet_entries: usize,
}

impl PodRegistry {
    /// `loopback_by_ifindex`: whether pods' own sk_lookup programs may read `ingress_ifindex`
    /// (see `pod_lookup`).
    pub(super) fn new(
        maps: PodMaps,
        options: &LoadOptions,
        loopback_by_ifindex: bool,
    ) -> Result<Self, EbpfError> {
        let subnet_entries = maps.subnets.keys().filter(Result::is_ok).count();
        Ok(Self {
            maps,
            pods: BTreeMap::new(),
            pin_dir: options.pin_dir.clone(),
            links_dir: options.links_dir.clone(),
            persistent: options.persistent,
            max_pods: options.max_pods.min(MAX_PODS),
            pod_lookup: PodLookupLoader::new(&options.pin_dir, loopback_by_ifindex)
                .map_err(EbpfError::PodLookup)?,
            subnet_entries,
        })
    }

    /// Registers a pod and adopts its proxy's inbound listener if it already listens (see
    /// [`Self::register`] and [`Self::adopt_listeners`]): all of it, or nothing.
    pub fn add(&mut self, spec: &PodSpec) -> Result<PodSlot, EbpfError> {
        let is_new = !self.pods.contains_key(&spec.netns_cookie);
        let slot = self.register(spec)?;
        let netns = PodNetns::open(&spec.netns_path)?;
        let found = find_listeners(&netns, spec.config.incoming_proxy_port);
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
    /// so is better done without holding whatever guards the registry.
    pub fn register(&mut self, spec: &PodSpec) -> Result<PodSlot, EbpfError> {
        let cookie = spec.netns_cookie;
        if let Some(registered) = self.pods.get(&cookie) {
            if registered.config == spec.config && registered.problem.is_none() {
                return Ok(registered.slot);
            }
            return Err(EbpfError::AlreadyRegistered(cookie));
        }
        let slot = self.free_slot()?;
        let netns = PodNetns::open(&spec.netns_path)?;
        self.zero_counters(slot)?;
        let registered = self
            .write(spec, &netns, slot, &InForce::default(), None)
            .map_err(|(e, _)| e)?;
        self.pods.insert(cookie, registered);
        Ok(slot)
    }

    fn free_slot(&self) -> Result<PodSlot, EbpfError> {
        let used: BTreeSet<PodSlot> = self.pods.values().map(|p| p.slot).collect();
        (0..self.max_pods)
            .map(PodSlot)
            .find(|slot| !used.contains(slot))
            .ok_or(EbpfError::NoFreeSlot(self.max_pods))
    }

    /// Applies a new configuration to a registered pod in place (registers it if it is not),
    /// make before break: at every moment the programs apply the old or the new configuration,
    /// and if the new one cannot be applied the old one stays in force.
    pub fn update(&mut self, spec: &PodSpec) -> Result<PodSlot, EbpfError> {
        let cookie = spec.netns_cookie;
        let Some(mut registered) = self.pods.remove(&cookie) else {
            return self.register(spec);
        };
        let before = InForce {
            config: Some(registered.in_force()),
            subnets: std::mem::take(&mut registered.subnets),
        };
        let inbound = registered.inbound.take();
        let result = match PodNetns::open(&spec.netns_path) {
            Ok(netns) => self.write(spec, &netns, registered.slot, &before, inbound),
            Err(e) => Err((e.into(), inbound)),
        };
        match result {
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
    /// agent did not complete.
    pub fn restore(
        &mut self,
        spec: &PodSpec,
        in_maps: &mut InMaps,
    ) -> Result<Option<String>, EbpfError> {
        let cookie = spec.netns_cookie;
        // Entries of a registration or removal cut short may be there without a configuration:
        // the pod is registered afresh over them, and they go with the old state.
        let before = InForce {
            config: self.maps.pods.get(&cookie, 0).ok(),
            subnets: in_maps.subnets.remove(&cookie).unwrap_or_default(),
        };
        let netns = PodNetns::open(&spec.netns_path)?;
        let slot = match before.config {
            Some(in_force) => PodSlot(in_force.slot),
            None => {
                let slot = self.free_slot()?;
                self.zero_counters(slot)?;
                slot
            }
        };
        match self.write(spec, &netns, slot, &before, None) {
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
                    Some(_) if before.subnets != registered.subnets => Some(
                        "subnet entries of a change cut short were removed".to_owned(),
                    ),
                    Some(_) => None,
                };
                self.pods.insert(cookie, registered);
                let found = find_listeners(&netns, spec.config.incoming_proxy_port);
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
                        subnets: before.subnets,
                        inbound,
                        problem: Some(problem.clone()),
                    },
                );
                Ok(Some(problem))
            }
        }
    }

    /// Makes `spec` the pod's state, from `before`: its sk_lookup link (`inbound`, or attached
    /// now), the entries the new state needs, its configuration (the switch), then the entries
    /// only `before` needed are removed. Nothing is written unless everything fits; a failure
    /// before the switch removes what was written, so the maps are as they were (a new pod's
    /// link is detached too), and hands the link back.
    #[allow(
        clippy::result_large_err,
        reason = "the link handed back with the error makes it large; built once per change"
    )]
    fn write(
        &mut self,
        spec: &PodSpec,
        netns: &PodNetns,
        slot: PodSlot,
        before: &InForce,
        inbound: Option<Inbound>,
    ) -> Result<Registered, (EbpfError, Option<Inbound>)> {
        let cookie = spec.netns_cookie;
        let addresses: BTreeSet<IpAddr> = spec.addresses.iter().copied().collect();
        let subnets = subnet_keys(cookie, &spec.config);
        if let Err(e) = self.check_room(spec, &addresses, &before.subnets, &subnets) {
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
        let config = pod_config(slot, &spec.config, &addresses);
        let mut written = Written::default();
        let switched = self
            .write_new_entries(before, &subnets, &mut written)
            .and_then(|()| {
                crash_point!("pod-entries-written");
                self.maps
                    .pods
                    .insert(cookie, config, 0)
                    .map_err(map_error(names::MAP_PODS))
            });
        if let Err(e) = switched {
            self.remove_written(cookie, written);
            if before.config.is_none() {
                self.detach_inbound(cookie, Some(inbound));
                return Err((e, None));
            }
            return Err((e, Some(inbound)));
        }
        crash_point!("pod-switched");
        let (subnets, problem) =
            self.remove_old_entries(cookie, before, subnets, config.inbound_port);
        Ok(Registered {
            slot,
            config: spec.config.clone(),
            kept_in_force: None,
            addresses,
            subnets,
            inbound: Some(inbound),
            problem,
        })
    }

    /// Refuses a change the maps cannot hold, before anything is written. The old and the new
    /// entries are both in the maps for a moment, so a change needs room for what it adds.
    fn check_room(
        &self,
        spec: &PodSpec,
        addresses: &BTreeSet<IpAddr>,
        subnets_before: &BTreeSet<SubnetEntry>,
        subnets: &BTreeSet<SubnetEntry>,
    ) -> Result<(), EbpfError> {
        if addresses.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: spec.netns_path.clone(),
                count: addresses.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        let needed = subnets.difference(subnets_before).count();
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

    /// Puts the listeners of the pod's proxy that existed before registration (found with
    /// [`find_listeners`]) into the listener map, one per family (new ones are caught by
    /// sock_ops; see `listener.rs`). A listener already in the map is newer: keep it. A pod
    /// that is no longer registered is left alone.
    pub fn adopt_listeners(
        &mut self,
        cookie: NetnsCookie,
        found: Vec<Listening>,
    ) -> Result<(), EbpfError> {
        if !self.pods.contains_key(&cookie) {
            return Ok(());
        }
        for Listening { socket, ipv6 } in found {
            tracing::info!(
                netns_cookie = %cookie,
                ipv6,
                "adopting the proxy's existing inbound listener"
            );
            // Our duplicate is closed right after: the map holds the socket only while the proxy
            // keeps it open.
            self.insert_listener(listener_key(cookie, ipv6), &socket)?;
        }
        Ok(())
    }

    fn insert_listener(
        &mut self,
        key: ListenerKey,
        socket: &std::os::fd::OwnedFd,
    ) -> Result<(), EbpfError> {
        self.maps
            .listeners
            .insert(key, socket.as_fd(), BPF_NOEXIST)
            .or_else(|e| match e {
                // A listen() in between got there first, and it is the newer socket.
                MapError::SyscallError(ref s)
                    if s.io_error.raw_os_error() == Some(libc::EEXIST) =>
                {
                    Ok(())
                }
                e => Err(e),
            })
            .map_err(map_error(names::MAP_LISTENERS))
    }

    /// Unregisters a pod: its connections are no longer intercepted from this call on.
    pub fn remove(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.remove(&cookie) else {
            return Ok(());
        };
        self.remove_config(cookie)?;
        crash_point!("pod-config-removed");
        self.detach_inbound(cookie, registered.inbound);
        crash_point!("pod-inbound-detached");
        self.remove_entries(cookie, Some(registered.slot), &registered.subnets)
    }

    fn remove_config(&mut self, cookie: NetnsCookie) -> Result<(), EbpfError> {
        ignore_absent(self.maps.pods.remove(&cookie)).map_err(map_error(names::MAP_PODS))
    }

    /// Detaches a pod's sk_lookup program: drops this process's link and, for the agent, the
    /// pin that keeps it attached.
    fn detach_inbound(&mut self, cookie: NetnsCookie, inbound: Option<Inbound>) {
        drop(inbound);
        if self.persistent {
            let path = inbound_link_path(&self.links_dir, cookie);
            if let Err(e) = PinnedLink::remove_pinned(&path) {
                tracing::warn!(path = %path.display(), error = %e, "unpinning a pod's sk_lookup link");
            }
        }
    }

    /// Replaces the pod's set of own addresses (after an address change in its namespace): its
    /// configuration entry is written again with the new set, one update that switches the
    /// programs from the old set to the new; if it cannot be written, the old set stays.
    pub fn set_addresses(
        &mut self,
        cookie: NetnsCookie,
        addresses: &[IpAddr],
    ) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.get_mut(&cookie) else {
            return Ok(());
        };
        let wanted: BTreeSet<IpAddr> = addresses.iter().copied().collect();
        if wanted.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: PathBuf::from(format!("with netns cookie {cookie}")),
                count: wanted.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        // What is in force keeps everything but the addresses (a configuration kept by a
        // restore too).
        let mut config = registered.in_force();
        write_addresses(&mut config, &wanted);
        self.maps
            .pods
            .insert(cookie, config, 0)
            .map_err(map_error(names::MAP_PODS))?;
        crash_point!("addresses-written");
        registered.addresses = wanted;
        if let Some(kept) = &mut registered.kept_in_force {
            **kept = config;
        }
        Ok(())
    }

    /// Copies the original destinations that an older set of maps (pinned in `dir`, of the same
    /// key and value layout) holds for connections in flight: the programs being replaced
    /// recorded them there. Returns how many were copied; maps of another layout are skipped
    /// (aya refuses to open them as these types).
    pub fn import_in_flight(&mut self, dir: &Path) -> usize {
        let open = |name: &str| {
            MapData::from_pin(dir.join(name))
                .ok()
                .and_then(|data| Map::from_map_data(data).ok())
        };
        let mut copied = 0;
        if let Some(old) = open(names::MAP_CONNECTING)
            .and_then(|m| HashMap::<MapData, SocketCookie, OrigDst>::try_from(m).ok())
        {
            for (key, value) in old.iter().filter_map(Result::ok) {
                copied += usize::from(self.maps.connecting.insert(key, value, 0).is_ok());
            }
        }
        // A connect in flight in an old slot goes to the LRU map, where the new programs look
        // when their slot does not hold the socket (a slot is given back by its own socket only).
        if let Some(old) = open(names::MAP_CONNECT_SLOTS)
            .and_then(|m| Array::<MapData, ConnectSlot>::try_from(m).ok())
        {
            for slot in old.iter().filter_map(Result::ok) {
                if slot.socket_cookie != 0 {
                    let key = SocketCookie(slot.socket_cookie);
                    copied += usize::from(self.maps.connecting.insert(key, slot.orig, 0).is_ok());
                }
            }
        }
        // Likewise a connection in an old pending slot: the new programs look in the LRU map
        // when their slot does not hold it, and remove it from there when the proxy's socket
        // closes.
        if let Some(old) = open(names::MAP_PENDING_SLOTS)
            .and_then(|m| Array::<MapData, PendingSlot>::try_from(m).ok())
        {
            for slot in old.iter().filter_map(Result::ok) {
                if pending_phase::holds_a_connection(slot.state) {
                    copied += usize::from(self.maps.pending.insert(slot.key, slot.orig, 0).is_ok());
                }
            }
        }
        if let Some(old) = open(names::MAP_PENDING)
            .and_then(|m| HashMap::<MapData, PendingKey, PendingOrigDst>::try_from(m).ok())
        {
            for (key, value) in old.iter().filter_map(Result::ok) {
                copied += usize::from(self.maps.pending.insert(key, value, 0).is_ok());
            }
        }
        copied
    }

    fn zero_counters(&mut self, slot: PodSlot) -> Result<(), EbpfError> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        let zero = PerCpuValues::try_from(vec![PodCounters::ZERO; cpus])
            .map_err(|e| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        self.maps
            .counters
            .set(slot.0, zero, 0)
            .map_err(map_error(names::MAP_COUNTERS))
    }
}

impl Drop for PodRegistry {
    fn drop(&mut self) {
        // Detach every pod's sk_lookup program, then drop the pins: the maps themselves go away
        // once no program or process uses them. The agent's (persistent) pins stay.
        for (_, registered) in std::mem::take(&mut self.pods) {
            drop(registered.inbound);
        }
        if self.persistent {
            return;
        }
        for name in names::SHARED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
    }
}
