//! Registering pods: writing their configuration, addresses and subnets into the maps, and
//! reading their counters back.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    os::fd::AsFd as _,
    path::PathBuf,
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
    PendingKey, PendingOrigDst, PodConfig, PodCounters, SUBNET_KEY_FIXED_BITS, SubnetKey,
    addr::family,
    names,
    pod::{direction, flags},
};
use ipnet::IpNet;

use super::{
    Counters, EbpfError, PodSpec,
    listener::{Listening, find_listeners},
    loader::{Inbound, load_inbound},
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
            listeners: take(ebpf, names::MAP_LISTENERS)?
                .try_into()
                .map_err(map_error(names::MAP_LISTENERS))?,
        })
    }
}

/// What was written for one pod, so it can be removed exactly.
struct Registered {
    slot: u32,
    addresses: BTreeSet<IpAddr>,
    subnets: Vec<Key<SubnetKey>>,
    /// The pod's sk_lookup instance; dropping it detaches it from the pod's namespace.
    inbound: Option<Inbound>,
}

/// The pods one node attachment serves.
pub struct PodRegistry {
    maps: PodMaps,
    pods: BTreeMap<u64, Registered>,
    pin_dir: PathBuf,
    pin_links: bool,
}

impl PodRegistry {
    pub(super) fn new(maps: PodMaps, pin_dir: PathBuf, pin_links: bool) -> Self {
        Self {
            maps,
            pods: BTreeMap::new(),
            pin_dir,
            pin_links,
        }
    }

    /// Registers a pod. Its configuration is written last, so the programs never see a pod whose
    /// addresses or subnets are missing. Returns the pod's counter slot.
    pub fn add(&mut self, spec: &PodSpec) -> Result<u32, EbpfError> {
        let cookie = spec.netns_cookie;
        if self.pods.contains_key(&cookie) {
            return Err(EbpfError::AlreadyRegistered(cookie));
        }
        let slot = (0..MAX_PODS)
            .find(|slot| self.pods.values().all(|p| p.slot != *slot))
            .ok_or(EbpfError::NoFreeSlot(MAX_PODS))?;
        if spec.addresses.len() > MAX_LOCAL_ADDRS_PER_POD as usize {
            return Err(EbpfError::TooManyAddresses {
                netns: spec.netns_path.clone(),
                count: spec.addresses.len(),
                max: MAX_LOCAL_ADDRS_PER_POD,
            });
        }
        let netns = PodNetns::open(&spec.netns_path)?;
        self.zero_counters(slot)?;
        let mut registered = Registered {
            slot,
            addresses: BTreeSet::new(),
            subnets: Vec::new(),
            inbound: None,
        };
        let result = self
            .write_addresses(cookie, &mut registered, &spec.addresses)
            .and_then(|()| self.write_subnets(cookie, &mut registered, &spec.config))
            .and_then(|()| {
                self.maps
                    .pods
                    .insert(cookie, pod_config(slot, &spec.config), 0)
                    .map_err(map_error(names::MAP_PODS))
            })
            .and_then(|()| {
                // From here on inbound connections are steered, or dropped until the proxy
                // listens: the pod fails closed from its first registered moment.
                registered.inbound =
                    Some(load_inbound(&self.pin_dir, self.pin_links, cookie, &netns)?);
                self.adopt_existing_listener(cookie, &netns, spec.config.incoming_proxy_port)
            });
        self.pods.insert(cookie, registered);
        if let Err(e) = result {
            let _ = self.remove(cookie);
            return Err(e);
        }
        Ok(slot)
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
        for Listening { socket, ipv6 } in find_listeners(netns.path(), port) {
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
        let inbound = self.pods.get(&cookie)?.inbound.as_ref()?;
        let info = inbound.ebpf.program(names::PROG_SK_LOOKUP)?.info().ok()?;
        Some(super::ProgramState {
            name: names::PROG_SK_LOOKUP.into(),
            id: info.id(),
            attach_type: "sk_lookup".into(),
        })
    }

    /// Whether the pod's proxy is listening, in either family (as far as steering knows).
    pub fn has_listener(&self, cookie: u64) -> bool {
        // Walk the keys: a sock hash lookup from userspace needs 8-byte values (socket cookies),
        // and aya-ebpf declares 4-byte ones.
        self.maps
            .listeners
            .keys()
            .any(|k| k.is_ok_and(|k| k.netns_cookie == cookie))
    }

    /// Unregisters a pod: its connections are no longer intercepted from this call on.
    pub fn remove(&mut self, cookie: u64) -> Result<(), EbpfError> {
        let Some(registered) = self.pods.remove(&cookie) else {
            return Ok(());
        };
        let ignore_absent = |r: Result<(), MapError>| match r {
            Err(e) if is_absent(&e) => Ok(()),
            r => r,
        };
        ignore_absent(self.maps.pods.remove(&cookie)).map_err(map_error(names::MAP_PODS))?;
        drop(registered.inbound);
        for ipv6 in [false, true] {
            ignore_absent(self.maps.listeners.remove(&listener_key(cookie, ipv6)))
                .map_err(map_error(names::MAP_LISTENERS))?;
        }
        for ip in &registered.addresses {
            ignore_absent(self.maps.local_addrs.remove(&local_key(cookie, *ip)))
                .map_err(map_error(names::MAP_LOCAL_ADDRS))?;
        }
        for key in &registered.subnets {
            ignore_absent(self.maps.subnets.remove(key)).map_err(map_error(names::MAP_SUBNETS))?;
        }
        self.zero_counters(registered.slot)
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
            match self.maps.local_addrs.remove(&local_key(cookie, *ip)) {
                Err(e) if !is_absent(&e) => return Err(map_error(names::MAP_LOCAL_ADDRS)(e)),
                _ => {}
            }
        }
        registered.addresses = wanted;
        Ok(())
    }

    fn write_subnets(
        &mut self,
        cookie: u64,
        registered: &mut Registered,
        config: &InterceptionConfig,
    ) -> Result<(), EbpfError> {
        let rules = config
            .outbound_subnets_to_ignore
            .iter()
            .map(|net| (direction::OUTBOUND, net))
            .chain(
                config
                    .subnets_to_ignore
                    .iter()
                    .map(|net| (direction::INBOUND, net)),
            );
        for (direction, net) in rules {
            let (family, prefix_len) = match net {
                IpNet::V4(v4) => (
                    family::IPV4,
                    IP4_MAPPED_PREFIX_BITS + u32::from(v4.prefix_len()),
                ),
                IpNet::V6(v6) => (family::IPV6, u32::from(v6.prefix_len())),
            };
            let key = Key::new(
                SUBNET_KEY_FIXED_BITS + prefix_len,
                SubnetKey {
                    netns_cookie: cookie,
                    direction,
                    family,
                    addr: Ip6Addr::from(net.network()),
                },
            );
            self.maps
                .subnets
                .insert(&key, 1, 0)
                .map_err(map_error(names::MAP_SUBNETS))?;
            registered.subnets.push(key);
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

/// A delete of a key that is not there (hash maps say KeyNotFound, sock hashes ENOENT).
fn is_absent(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
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
        // Detach every pod's sk_lookup instance, then drop the pins: the maps themselves go away
        // once no program or process uses them.
        for (_, registered) in std::mem::take(&mut self.pods) {
            drop(registered.inbound);
        }
        for name in names::SHARED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
    }
}
