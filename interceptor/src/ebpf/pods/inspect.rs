//! What the maps say about the pods: for restore, health, `pod list`, metrics.
use std::{collections::BTreeSet, os::fd::AsFd as _, path::Path};

use aya::maps::{MapData, PerCpuArray};
use interceptor_common::{
    ListenerKey, NetnsCookie, PENDING_SLOTS, PendingSlot, PodCounters, PodSlot, addr::family,
    names, pending_phase,
};

use super::{EbpfWritten, FillLevels, InMaps, PodWriter};
use crate::{
    ebpf::{
        Counters, EbpfError, ProgramState, inbound::inbound_link_path, links::PinnedLink,
        maps::map_error,
    },
    node::Pod,
};

impl PodWriter {
    /// What the subnet map holds, by pod: read once to restore many pods (a walk per pod would
    /// cost pods × entries system calls).
    pub fn in_maps(&self) -> InMaps {
        let mut in_maps = InMaps::default();
        for key in self.maps.subnets.keys().filter_map(Result::ok) {
            let data = key.data();
            in_maps
                .subnets
                .entry(NetnsCookie(data.netns_cookie))
                .or_default()
                .insert((key.prefix_len(), data));
        }
        in_maps
    }

    /// Why a pod's entries are not exactly what its configuration asks for, if they are not:
    /// what the kernel holds is checked (its configuration entry, its pinned sk_lookup link),
    /// and what an earlier change could not complete is reported.
    pub(in crate::ebpf) fn problem(
        &self,
        cookie: NetnsCookie,
        pod: &Pod<EbpfWritten>,
    ) -> Option<String> {
        let written = &pod.written;
        if let Some(problem) = &written.problem {
            return Some(problem.clone());
        }
        match self.maps.pods.get(&cookie, 0) {
            Ok(in_maps)
                if bytemuck::bytes_of(&in_maps)
                    == bytemuck::bytes_of(&written.in_force(
                        &pod.config,
                        pod.host_ids,
                        &pod.local,
                    )) => {}
            Ok(_) => return Some("its configuration entry differs from the one written".into()),
            Err(_) => return Some("its configuration entry is missing from the pod map".into()),
        }
        let Some(inbound) = &written.inbound else {
            return Some("its sk_lookup program is not attached by this agent".into());
        };
        if self.persistent
            && let Some(problem) = inbound.pin_problem(&inbound_link_path(&self.links_dir, cookie))
        {
            return Some(format!("its sk_lookup link: {problem}"));
        }
        None
    }

    /// How the subnet entries the maps hold for a registered pod (`in_maps`, read once for all
    /// pods) differ from what was written for it, if they do. (Its addresses are in its
    /// configuration entry, which [`Self::problem`] checks.)
    pub(in crate::ebpf) fn entries_differ(
        &self,
        cookie: NetnsCookie,
        registered: &EbpfWritten,
        in_maps: &InMaps,
    ) -> Option<String> {
        let empty_subnets = BTreeSet::new();
        let subnets = in_maps.subnets.get(&cookie).unwrap_or(&empty_subnets);
        if *subnets != registered.subnets {
            return Some(format!(
                "the subnet map holds {} entries for it, not the {} written",
                subnets.len(),
                registered.subnets.len()
            ));
        }
        None
    }

    /// The pods whose sk_lookup link is pinned (the agent's), registered or not.
    pub fn pinned_inbound_cookies(&self) -> Vec<NetnsCookie> {
        let prefix = inbound_link_path(Path::new(""), NetnsCookie(0))
            .to_string_lossy()
            .trim_end_matches('0')
            .to_owned();
        std::fs::read_dir(&self.links_dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                name.strip_prefix(&prefix)?.parse().ok()
            })
            .collect()
    }

    /// The pods in the kernel's pod map, registered by this process or an earlier one.
    pub fn cookies_in_maps(&self) -> Vec<NetnsCookie> {
        self.maps.pods.keys().filter_map(Result::ok).collect()
    }

    /// The pods whose proxy is listening, in either family (one walk of the listener map: a
    /// sock hash lookup from userspace needs 8-byte values, socket cookies, and aya-ebpf
    /// declares 4-byte ones).
    pub fn listening_cookies(&self) -> BTreeSet<NetnsCookie> {
        self.maps
            .listeners
            .keys()
            .filter_map(Result::ok)
            .map(|k| NetnsCookie(k.netns_cookie))
            .collect()
    }

    /// Whether the pod's proxy is listening, in either family (as far as steering knows): its
    /// two keys looked up, not every pod's listeners read.
    pub fn has_listener(&self, cookie: NetnsCookie) -> bool {
        let key = |family| ListenerKey {
            netns_cookie: cookie.0,
            family,
            _pad: 0,
        };
        let keys = [key(family::IPV4), key(family::IPV6)];
        let keys = keys.each_ref().map(bytemuck::bytes_of);
        interceptor_sys::map_has_any_key(self.maps.listeners.fd().as_fd(), &keys).unwrap_or(false)
    }

    /// The counters of a pod's slot, summed over CPUs.
    pub fn counters(&self, slot: PodSlot) -> Result<Counters, EbpfError> {
        read_counters(&self.maps.counters, slot)
    }

    /// Number of original destinations recorded for connections not over yet (one of their
    /// sockets open): in their slots and in the LRU fallback.
    pub fn pending_orig_dst_entries(&self) -> usize {
        self.pending_slots_in_use() + self.pending_in_lru()
    }

    fn pending_in_lru(&self) -> usize {
        self.maps.pending.keys().filter(Result::is_ok).count()
    }

    /// The slots of `ICPT_PEND_SLOTS` that hold a connection, counted by reading the array's
    /// memory (4 MiB, mapped only for the count: the agent's resident memory does not keep it).
    fn pending_slots_in_use(&self) -> usize {
        let stride = size_of::<PendingSlot>();
        let len = stride * PENDING_SLOTS as usize;
        let state_at = std::mem::offset_of!(PendingSlot, state);
        let Ok(mapped) =
            interceptor_sys::MappedArray::map(self.maps.pending_slots.fd().as_fd(), len)
        else {
            tracing::warn!("mapping the pending slots to count them failed; counting none");
            return 0;
        };
        (0..PENDING_SLOTS as usize)
            .filter_map(|i| mapped.read_u64(i * stride + state_at))
            .filter(|state| pending_phase::holds_a_connection(*state))
            .count()
    }

    /// How full the maps are (walks their keys: for metrics and tests, not a hot path).
    pub fn fill_levels(&self) -> FillLevels {
        let pending_in_lru = self.pending_in_lru();
        FillLevels {
            pending: self.pending_slots_in_use() + pending_in_lru,
            pending_in_lru,
            connecting: self.maps.connecting.keys().filter(Result::is_ok).count(),
            listeners: self.maps.listeners.keys().filter(Result::is_ok).count(),
            subnets: self.maps.subnets.keys().filter(Result::is_ok).count(),
            pods: self.maps.pods.keys().filter(Result::is_ok).count(),
        }
    }
}

impl EbpfWritten {
    /// The pod's own sk_lookup program instance, as `status` reports it.
    pub fn inbound_program(&self) -> Option<ProgramState> {
        Some(self.inbound.as_ref()?.program.clone())
    }

    /// The sk_lookup link held for the pod.
    pub(in crate::ebpf) fn inbound_link(&self) -> Option<&PinnedLink> {
        Some(self.inbound.as_ref()?.link())
    }
}

/// Sums one slot of the per-CPU counter array.
pub fn read_counters<T: std::borrow::Borrow<MapData>>(
    counters: &PerCpuArray<T, PodCounters>,
    slot: PodSlot,
) -> Result<Counters, EbpfError> {
    let per_cpu = counters
        .get(&slot.0, 0)
        .map_err(map_error(names::MAP_COUNTERS))?;
    let mut sum = [0u64; interceptor_common::counters::COUNTERS_PER_POD];
    for cpu in per_cpu.iter() {
        for (total, value) in sum.iter_mut().zip(cpu.values) {
            *total += value;
        }
    }
    Ok(Counters(sum))
}
