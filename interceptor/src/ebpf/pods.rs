//! Registering pods: writing their configuration, addresses and subnets into the maps, and
//! reading their counters back.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    maps::{
        HashMap, Map, MapData, MapError, PerCpuArray, PerCpuValues, SockHash,
        lpm_trie::{Key, LpmTrie},
    },
};
use interceptor_common::{
    IP4_MAPPED_PREFIX_BITS, Ip6Addr, ListenerKey, LocalAddrKey, MAX_LOCAL_ADDRS_PER_POD, MAX_PODS,
    OrigDst, PendingKey, PendingOrigDst, PodConfig, PodCounters, SUBNET_KEY_FIXED_BITS, SubnetKey,
    addr::family,
    names,
    pod::{direction, flags},
};
use ipnet::IpNet;

use super::{
    Counters, EbpfError, LoadOptions, PodSpec,
    links::PinnedLink,
    listener::{Listening, find_listeners},
    loader::{Inbound, inbound_link_path, load_inbound},
    pod_lookup::PodLookupLoader,
};
use crate::{config::InterceptionConfig, netns::PodNetns};

const BPF_NOEXIST: u64 = 1;

/// The maps userspace writes, taken out of the loaded object.
pub(super) struct PodMaps {
    pods: HashMap<MapData, u64, PodConfig>,
    local_addrs: HashMap<MapData, LocalAddrKey, u8>,
    subnets: LpmTrie<MapData, SubnetKey, u8>,
    counters: PerCpuArray<MapData, PodCounters>,
    pending: HashMap<MapData, PendingKey, PendingOrigDst>,
    connecting: HashMap<MapData, u64, OrigDst>,
    listeners: SockHash<MapData, ListenerKey>,
}

fn map_error(map: &'static str) -> impl Fn(MapError) -> EbpfError {
    move |source| EbpfError::Map { map, source }
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, EbpfError> {
    ebpf.take_map(name)
        .ok_or(EbpfError::Missing { kind: "map", name })
}

impl PodMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, EbpfError> {
        Ok(Self {
            pods: take(ebpf, names::MAP_PODS)?
                .try_into()
                .map_err(map_error(names::MAP_PODS))?,
            local_addrs: take(ebpf, names::MAP_LOCAL_ADDRS)?
                .try_into()
                .map_err(map_error(names::MAP_LOCAL_ADDRS))?,
            subnets: take(ebpf, names::MAP_SUBNETS)?
                .try_into()
                .map_err(map_error(names::MAP_SUBNETS))?,
            counters: take(ebpf, names::MAP_COUNTERS)?
                .try_into()
                .map_err(map_error(names::MAP_COUNTERS))?,
            pending: take(ebpf, names::MAP_PENDING)?
                .try_into()
                .map_err(map_error(names::MAP_PENDING))?,
            connecting: take(ebpf, names::MAP_CONNECTING)?
                .try_into()
                .map_err(map_error(names::MAP_CONNECTING))?,
            listeners: take(ebpf, names::MAP_LISTENERS)?
                .try_into()
                .map_err(map_error(names::MAP_LISTENERS))?,
        })
    }
}

/// The address and subnet entries the maps hold, by netns cookie (see [`PodRegistry::in_maps`]).
#[derive(Default)]
pub struct InMaps {
    addresses: BTreeMap<u64, BTreeSet<IpAddr>>,
    subnets: BTreeMap<u64, BTreeSet<(u32, SubnetKey)>>,
}

/// Entries in each map.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillLevels {
    pub pending: usize,
    pub connecting: usize,
    pub listeners: usize,
    pub local_addrs: usize,
    pub subnets: usize,
    pub pods: usize,
}

/// What was written for one pod, so it can be changed or removed exactly.
struct Registered {
    slot: u32,
    config: InterceptionConfig,
    addresses: BTreeSet<IpAddr>,
    /// (prefix length, key) of each entry in the subnet trie.
    subnets: BTreeSet<(u32, SubnetKey)>,
    /// The pod's own sk_lookup program; dropping it detaches it from the pod's namespace (unless its
    /// link is persistent).
    inbound: Option<Inbound>,
}

/// The pods one node attachment serves.
pub struct PodRegistry {
    maps: PodMaps,
    pods: BTreeMap<u64, Registered>,
    pin_dir: PathBuf,
    links_dir: PathBuf,
    /// The agent's: links and maps stay pinned when the registry goes.
    persistent: bool,
    max_pods: u32,
    pod_lookup: PodLookupLoader,
}

impl PodRegistry {
    pub(super) fn new(maps: PodMaps, options: &LoadOptions) -> Result<Self, EbpfError> {
        Ok(Self {
            maps,
            pods: BTreeMap::new(),
            pin_dir: options.pin_dir.clone(),
            links_dir: options.links_dir.clone(),
            persistent: options.persistent,
            max_pods: options.max_pods.min(MAX_PODS),
            pod_lookup: PodLookupLoader::new(&options.pin_dir).map_err(EbpfError::PodLookup)?,
        })
    }

    /// Registers a pod. Its configuration is written last, so the programs never see a pod whose
    /// addresses or subnets are missing. Returns the pod's counter slot. Adding a pod that is
    /// registered with the same configuration changes nothing; with another configuration it is
    /// an error (see [`Self::update`]).
    pub fn add(&mut self, spec: &PodSpec) -> Result<u32, EbpfError> {
        let cookie = spec.netns_cookie;
        if let Some(registered) = self.pods.get(&cookie) {
            if registered.config == spec.config {
                return Ok(registered.slot);
            }
            return Err(EbpfError::AlreadyRegistered(cookie));
        }
        let used: BTreeSet<u32> = self.pods.values().map(|p| p.slot).collect();
        let slot = (0..self.max_pods)
            .find(|slot| !used.contains(slot))
            .ok_or(EbpfError::NoFreeSlot(self.max_pods))?;
        self.zero_counters(slot)?;
        let registered = Registered {
            slot,
            config: spec.config.clone(),
            addresses: BTreeSet::new(),
            subnets: BTreeSet::new(),
            inbound: None,
        };
        self.write(spec, registered)
    }

    /// Applies a new configuration to a registered pod in place (registers it if it is not):
    /// new subnets are added before the configuration that uses them is written, old ones are
    /// removed after, so at every moment the programs apply the old or the new configuration.
    pub fn update(&mut self, spec: &PodSpec) -> Result<u32, EbpfError> {
        let Some(mut registered) = self.pods.remove(&spec.netns_cookie) else {
            return self.add(spec);
        };
        registered.config = spec.config.clone();
        self.write(spec, registered)
    }

    /// Takes a pod back under management after a restart: its map entries and pinned sk_lookup
    /// link are still in force (they outlive the agent process), so it keeps its counter slot
    /// and counters, stale entries are removed, and its sk_lookup link gets this process's
    /// program. Registers it afresh if its configuration never reached the maps.
    pub fn restore(&mut self, spec: &PodSpec, in_maps: &mut InMaps) -> Result<u32, EbpfError> {
        let cookie = spec.netns_cookie;
        let Ok(in_force) = self.maps.pods.get(&cookie, 0) else {
            return self.add(spec);
        };
        let registered = Registered {
            slot: in_force.slot,
            config: spec.config.clone(),
            addresses: in_maps.addresses.remove(&cookie).unwrap_or_default(),
            subnets: in_maps.subnets.remove(&cookie).unwrap_or_default(),
            inbound: None,
        };
        self.write(spec, registered)
    }

    /// What the address and subnet maps hold, by pod: read once to restore many pods (a walk
    /// per pod would cost pods × entries system calls).
    pub fn in_maps(&self) -> InMaps {
        let mut in_maps = InMaps::default();
        for key in self.maps.local_addrs.keys().filter_map(Result::ok) {
            in_maps
                .addresses
                .entry(key.netns_cookie)
                .or_default()
                .insert(IpAddr::from(key.addr));
        }
        for key in self.maps.subnets.keys().filter_map(Result::ok) {
            let data = key.data();
            in_maps
                .subnets
                .entry(data.netns_cookie)
                .or_default()
                .insert((key.prefix_len(), data));
        }
        in_maps
    }

    /// Writes (or rewrites) a pod's entries, its configuration, and attaches its sk_lookup
    /// instance. On failure the pod is removed: a half-registered pod is never left behind.
    fn write(&mut self, spec: &PodSpec, mut registered: Registered) -> Result<u32, EbpfError> {
        let cookie = spec.netns_cookie;
        let slot = registered.slot;
        if spec.addresses.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            self.pods.insert(cookie, registered);
            let _ = self.remove(cookie);
            return Err(EbpfError::TooManyAddresses {
                netns: spec.netns_path.clone(),
                count: spec.addresses.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        let wanted_subnets = subnet_keys(cookie, &spec.config);
        let result = PodNetns::open(&spec.netns_path)
            .map_err(EbpfError::from)
            .and_then(|netns| {
                self.write_addresses(cookie, &mut registered, &spec.addresses)?;
                self.add_subnets(&mut registered, &wanted_subnets)?;
                self.maps
                    .pods
                    .insert(cookie, pod_config(slot, &spec.config), 0)
                    .map_err(map_error(names::MAP_PODS))?;
                self.prune_subnets(&mut registered, &wanted_subnets)?;
                if registered.inbound.is_none() {
                    // From here on inbound connections are steered, or dropped until the proxy
                    // listens: the pod fails closed from its first registered moment.
                    registered.inbound = Some(load_inbound(
                        &self.pod_lookup,
                        &self.links_dir,
                        self.persistent,
                        cookie,
                        &netns,
                    )?);
                }
                self.adopt_existing_listener(cookie, &netns, spec.config.incoming_proxy_port)
            });
        self.pods.insert(cookie, registered);
        if let Err(e) = result {
            let _ = self.remove(cookie);
            return Err(e);
        }
        Ok(slot)
    }

    /// The registered pods' netns cookies.
    pub fn cookies(&self) -> Vec<u64> {
        self.pods.keys().copied().collect()
    }

    /// A registered pod's counter slot.
    pub fn slot(&self, cookie: u64) -> Option<u32> {
        self.pods.get(&cookie).map(|p| p.slot)
    }

    /// The pods in the kernel's pod map, registered by this process or an earlier one.
    pub fn cookies_in_maps(&self) -> Vec<u64> {
        self.maps.pods.keys().filter_map(Result::ok).collect()
    }

    /// A registered pod's own addresses, sorted.
    pub fn addresses(&self, cookie: u64) -> Vec<IpAddr> {
        self.pods
            .get(&cookie)
            .map(|p| p.addresses.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Removes everything the maps and pins hold for a pod this registry does not manage (left
    /// by an earlier agent whose pod is gone): its configuration first, so it stops being
    /// intercepted at once, then its addresses, subnets, listeners, counters and sk_lookup link.
    pub fn purge(&mut self, cookie: u64) -> Result<(), EbpfError> {
        if self.pods.contains_key(&cookie) {
            return self.remove(cookie);
        }
        let slot = self.maps.pods.get(&cookie, 0).ok().map(|c| c.slot);
        self.remove_config(cookie)?;
        let mut in_maps = self.in_maps();
        let addresses = in_maps.addresses.remove(&cookie).unwrap_or_default();
        let subnets = in_maps.subnets.remove(&cookie).unwrap_or_default();
        self.remove_entries(cookie, slot, &addresses, &subnets)
    }

    /// Puts the listeners that existed before registration into the listener map, one per family
    /// (new ones are caught by sock_ops; see `listener.rs`). A listener already in the map is
    /// newer: keep it.
    fn adopt_existing_listener(
        &mut self,
        cookie: u64,
        netns: &PodNetns,
        port: u16,
    ) -> Result<(), EbpfError> {
        for Listening { socket, ipv6 } in find_listeners(netns, port) {
            let key = listener_key(cookie, ipv6);
            tracing::info!(netns = %netns.path().display(), port, ipv6, "adopting the proxy's existing inbound listener");
            // Our duplicate is closed right after: the map holds the socket only while the proxy
            // keeps it open.
            self.insert_listener(key, &socket)?;
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

    /// The pod's own sk_lookup program instance, as `status` reports it.
    pub fn inbound_program(&self, cookie: u64) -> Option<super::ProgramState> {
        Some(self.pods.get(&cookie)?.inbound.as_ref()?.program.clone())
    }

    /// The pods whose proxy is listening, in either family (one walk of the listener map: a
    /// sock hash lookup from userspace needs 8-byte values, socket cookies, and aya-ebpf
    /// declares 4-byte ones).
    pub fn listening_cookies(&self) -> BTreeSet<u64> {
        self.maps
            .listeners
            .keys()
            .filter_map(Result::ok)
            .map(|k| k.netns_cookie)
            .collect()
    }

    /// Whether the pod's proxy is listening, in either family (as far as steering knows).
    pub fn has_listener(&self, cookie: u64) -> bool {
        self.listening_cookies().contains(&cookie)
    }

    /// Unregisters a pod: its connections are no longer intercepted from this call on.
    pub fn remove(&mut self, cookie: u64) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.remove(&cookie) else {
            return Ok(());
        };
        self.remove_config(cookie)?;
        drop(registered.inbound);
        self.remove_entries(
            cookie,
            Some(registered.slot),
            &registered.addresses,
            &registered.subnets,
        )
    }

    fn remove_config(&mut self, cookie: u64) -> Result<(), EbpfError> {
        ignore_absent(self.maps.pods.remove(&cookie)).map_err(map_error(names::MAP_PODS))
    }

    /// What remains of a pod once its configuration is gone: its pinned sk_lookup link, its
    /// listeners, addresses, subnets and counters.
    fn remove_entries(
        &mut self,
        cookie: u64,
        slot: Option<u32>,
        addresses: &BTreeSet<IpAddr>,
        subnets: &BTreeSet<(u32, SubnetKey)>,
    ) -> Result<(), EbpfError> {
        if self.persistent {
            let path = inbound_link_path(&self.links_dir, cookie);
            PinnedLink::remove_pinned(&path)
                .map_err(|source| EbpfError::PinDir { path, source })?;
        }
        for ipv6 in [false, true] {
            ignore_absent(self.maps.listeners.remove(&listener_key(cookie, ipv6)))
                .map_err(map_error(names::MAP_LISTENERS))?;
        }
        for ip in addresses {
            ignore_absent(self.maps.local_addrs.remove(&local_key(cookie, *ip)))
                .map_err(map_error(names::MAP_LOCAL_ADDRS))?;
        }
        for (prefix_len, key) in subnets {
            ignore_absent(self.maps.subnets.remove(&Key::new(*prefix_len, *key)))
                .map_err(map_error(names::MAP_SUBNETS))?;
        }
        match slot {
            Some(slot) => self.zero_counters(slot),
            None => Ok(()),
        }
    }

    /// Replaces the pod's set of own addresses (after an address change in its namespace).
    pub fn set_addresses(&mut self, cookie: u64, addresses: &[IpAddr]) -> Result<(), EbpfError> {
        let Some(mut registered) = self.pods.remove(&cookie) else {
            return Ok(());
        };
        let result = self.write_addresses(cookie, &mut registered, addresses);
        self.pods.insert(cookie, registered);
        result
    }

    pub fn counters(&self, cookie: u64) -> Result<Option<Counters>, EbpfError> {
        let Some(registered) = self.pods.get(&cookie) else {
            return Ok(None);
        };
        read_counters(&self.maps.counters, registered.slot).map(Some)
    }

    /// Number of original destinations recorded and not yet read by a proxy.
    pub fn pending_orig_dst_entries(&self) -> usize {
        self.maps.pending.keys().filter(Result::is_ok).count()
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
            .and_then(|m| HashMap::<MapData, u64, OrigDst>::try_from(m).ok())
        {
            for (key, value) in old.iter().filter_map(Result::ok) {
                copied += usize::from(self.maps.connecting.insert(key, value, 0).is_ok());
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

    /// How full the maps are (walks their keys: for metrics and tests, not a hot path).
    pub fn fill_levels(&self) -> FillLevels {
        FillLevels {
            pending: self.pending_orig_dst_entries(),
            connecting: self.maps.connecting.keys().filter(Result::is_ok).count(),
            listeners: self.maps.listeners.keys().filter(Result::is_ok).count(),
            local_addrs: self.maps.local_addrs.keys().filter(Result::is_ok).count(),
            subnets: self.maps.subnets.keys().filter(Result::is_ok).count(),
            pods: self.maps.pods.keys().filter(Result::is_ok).count(),
        }
    }

    fn write_addresses(
        &mut self,
        cookie: u64,
        registered: &mut Registered,
        addresses: &[IpAddr],
    ) -> Result<(), EbpfError> {
        let wanted: BTreeSet<IpAddr> = addresses.iter().copied().collect();
        for ip in wanted.difference(&registered.addresses) {
            self.maps
                .local_addrs
                .insert(local_key(cookie, *ip), 1, 0)
                .map_err(map_error(names::MAP_LOCAL_ADDRS))?;
        }
        for ip in registered.addresses.difference(&wanted) {
            ignore_absent(self.maps.local_addrs.remove(&local_key(cookie, *ip)))
                .map_err(map_error(names::MAP_LOCAL_ADDRS))?;
        }
        registered.addresses = wanted;
        Ok(())
    }

    fn add_subnets(
        &mut self,
        registered: &mut Registered,
        wanted: &BTreeSet<(u32, SubnetKey)>,
    ) -> Result<(), EbpfError> {
        for (prefix_len, key) in wanted.difference(&registered.subnets.clone()) {
            self.maps
                .subnets
                .insert(&Key::new(*prefix_len, *key), 1, 0)
                .map_err(map_error(names::MAP_SUBNETS))?;
            registered.subnets.insert((*prefix_len, *key));
        }
        Ok(())
    }

    fn prune_subnets(
        &mut self,
        registered: &mut Registered,
        wanted: &BTreeSet<(u32, SubnetKey)>,
    ) -> Result<(), EbpfError> {
        for (prefix_len, key) in registered.subnets.clone().difference(wanted) {
            ignore_absent(self.maps.subnets.remove(&Key::new(*prefix_len, *key)))
                .map_err(map_error(names::MAP_SUBNETS))?;
            registered.subnets.remove(&(*prefix_len, *key));
        }
        Ok(())
    }

    fn zero_counters(&mut self, slot: u32) -> Result<(), EbpfError> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(_, e)| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        let zero = PerCpuValues::try_from(vec![PodCounters::ZERO; cpus])
            .map_err(|e| map_error(names::MAP_COUNTERS)(MapError::IoError(e)))?;
        self.maps
            .counters
            .set(slot, zero, 0)
            .map_err(map_error(names::MAP_COUNTERS))
    }
}

/// A delete that found nothing to delete is not an error.
fn ignore_absent(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(e) if is_absent(&e) => Ok(()),
        r => r,
    }
}

/// A delete of a key that is not there (hash maps say KeyNotFound, sock hashes ENOENT).
fn is_absent(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// The subnet trie entries of a pod's configuration: (prefix length, key).
fn subnet_keys(cookie: u64, config: &InterceptionConfig) -> BTreeSet<(u32, SubnetKey)> {
    let outbound = config
        .outbound_subnets_to_ignore
        .iter()
        .map(|net| (direction::OUTBOUND, net));
    let inbound = config
        .subnets_to_ignore
        .iter()
        .map(|net| (direction::INBOUND, net));
    outbound
        .chain(inbound)
        .map(|(direction, net)| {
            let (family, prefix_len) = match net {
                IpNet::V4(v4) => (
                    family::IPV4,
                    IP4_MAPPED_PREFIX_BITS + u32::from(v4.prefix_len()),
                ),
                IpNet::V6(v6) => (family::IPV6, u32::from(v6.prefix_len())),
            };
            let key = SubnetKey {
                netns_cookie: cookie,
                direction,
                family,
                addr: Ip6Addr::from(net.network()),
            };
            (SUBNET_KEY_FIXED_BITS + prefix_len, key)
        })
        .collect()
}

fn local_key(netns_cookie: u64, ip: IpAddr) -> LocalAddrKey {
    LocalAddrKey {
        netns_cookie,
        addr: Ip6Addr::from(ip),
    }
}

fn listener_key(netns_cookie: u64, ipv6: bool) -> ListenerKey {
    ListenerKey {
        netns_cookie,
        family: if ipv6 { family::IPV6 } else { family::IPV4 },
        _pad: 0,
    }
}

fn pod_config(slot: u32, config: &InterceptionConfig) -> PodConfig {
    let mut pod_flags = 0;
    if config.proxy_uid.is_some() {
        pod_flags |= flags::HAS_PROXY_UID;
    }
    if config.proxy_gid.is_some() {
        pod_flags |= flags::HAS_PROXY_GID;
    }
    if config.ipv6 {
        pod_flags |= flags::INTERCEPT_IPV6;
    }
    for (nets, v4_flag, v6_flag) in [
        (
            &config.outbound_subnets_to_ignore,
            flags::HAS_OUTBOUND_SUBNETS_V4,
            flags::HAS_OUTBOUND_SUBNETS_V6,
        ),
        (
            &config.subnets_to_ignore,
            flags::HAS_INBOUND_SUBNETS_V4,
            flags::HAS_INBOUND_SUBNETS_V6,
        ),
    ] {
        for net in nets {
            pod_flags |= match net {
                IpNet::V4(_) => v4_flag,
                IpNet::V6(_) => v6_flag,
            };
        }
    }
    let mut redirect_ports = interceptor_common::PortBitmap::EMPTY;
    for port in &config.ports_to_redirect {
        redirect_ports.insert(*port);
    }
    if !config.ports_to_redirect.is_empty() {
        pod_flags |= flags::HAS_PORTS_TO_REDIRECT;
    }
    PodConfig {
        slot,
        flags: pod_flags,
        proxy_uid: config.proxy_uid.unwrap_or(0),
        proxy_gid: config.proxy_gid.unwrap_or(0),
        outbound_port: config.outgoing_proxy_port,
        inbound_port: config.incoming_proxy_port,
        _pad: 0,
        outbound_ignore_ports: config.outbound_ports_to_ignore.bitmap(),
        inbound_ignore_ports: config.inbound_ports_to_ignore.bitmap(),
        redirect_ports,
    }
}

/// Sums one slot of the per-CPU counter array.
pub fn read_counters<T: std::borrow::Borrow<MapData>>(
    counters: &PerCpuArray<T, PodCounters>,
    slot: u32,
) -> Result<Counters, EbpfError> {
    let per_cpu = counters
        .get(&slot, 0)
        .map_err(map_error(names::MAP_COUNTERS))?;
    let mut sum = [0u64; interceptor_common::counters::COUNTERS_PER_POD];
    for cpu in per_cpu.iter() {
        for (total, value) in sum.iter_mut().zip(cpu.values) {
            *total += value;
        }
    }
    Ok(Counters(sum))
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
