//! The maps userspace reads and writes, taken out of the loaded object once.
use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, SockHash, lpm_trie::LpmTrie},
};
use interceptor_common::{
    ListenerKey, OrigDst, PendingKey, PendingSlot, PodConfig, PodCounters, SubnetKey, names,
};
use interceptor_common::{NetnsCookie, SocketCookie};

use super::EbpfError;

/// The maps userspace writes, taken out of the loaded object.
pub(super) struct PodMaps {
    pub(super) pods: HashMap<MapData, NetnsCookie, PodConfig>,
    pub(super) subnets: LpmTrie<MapData, SubnetKey, u8>,
    pub(super) counters: PerCpuArray<MapData, PodCounters>,
    /// `ICPT_PEND_SLOTS`, read through a mapping of its memory (see `pending_slots_in_use`).
    pub(super) pending_slots: MapData,
    pub(super) pending: HashMap<MapData, PendingKey, PendingSlot>,
    pub(super) connecting: HashMap<MapData, SocketCookie, OrigDst>,
    pub(super) listeners: SockHash<MapData, ListenerKey>,
    /// `ICPT_OUT_PORTS`: see `interceptor_common::outbound_ports`.
    pub(super) outbound_ports: Array<MapData, u64>,
}

pub(super) fn map_error(map: &'static str) -> impl Fn(MapError) -> EbpfError {
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
            subnets: take(ebpf, names::MAP_SUBNETS)?
                .try_into()
                .map_err(map_error(names::MAP_SUBNETS))?,
            counters: take(ebpf, names::MAP_COUNTERS)?
                .try_into()
                .map_err(map_error(names::MAP_COUNTERS))?,
            pending_slots: match take(ebpf, names::MAP_PENDING_SLOTS)? {
                Map::Array(data) => data,
                _ => {
                    return Err(EbpfError::Missing {
                        kind: "array map",
                        name: names::MAP_PENDING_SLOTS,
                    });
                }
            },
            pending: take(ebpf, names::MAP_PENDING)?
                .try_into()
                .map_err(map_error(names::MAP_PENDING))?,
            connecting: take(ebpf, names::MAP_CONNECTING)?
                .try_into()
                .map_err(map_error(names::MAP_CONNECTING))?,
            listeners: take(ebpf, names::MAP_LISTENERS)?
                .try_into()
                .map_err(map_error(names::MAP_LISTENERS))?,
            outbound_ports: take(ebpf, names::MAP_OUTBOUND_PORTS)?
                .try_into()
                .map_err(map_error(names::MAP_OUTBOUND_PORTS))?,
        })
    }
}
