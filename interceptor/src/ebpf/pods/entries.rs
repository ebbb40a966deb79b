//! A pod's subnet entries: written before a change's switch, removed after it, and removed again
//! when a change cannot be completed; the subnet count kept up to date. (A pod's addresses are
//! in its configuration entry, written with it.)
use std::collections::BTreeSet;

use aya::maps::{MapError, lpm_trie::Key};
use interceptor_common::{MAX_SUBNET_RULES, NetnsCookie, PodSlot, names};

use super::{InForce, PodWriter, Written};
use crate::ebpf::{
    EbpfError,
    encode::{SubnetEntry, listener_key},
    maps::map_error,
};

impl PodWriter {
    pub(super) fn write_new_entries(
        &mut self,
        before: &InForce,
        subnets: &BTreeSet<SubnetEntry>,
        written: &mut Written,
    ) -> Result<(), EbpfError> {
        for entry in subnets.difference(&before.subnets) {
            self.insert_subnet(entry)?;
            written.subnets.push(*entry);
        }
        Ok(())
    }

    /// Undoes [`Self::write_new_entries`] for a change that could not be completed.
    pub(super) fn remove_written(&mut self, cookie: NetnsCookie, written: Written) {
        let subnets = written.subnets.into_iter().collect();
        if let Err(e) = self.remove_subnet_entries(&subnets) {
            tracing::warn!(netns_cookie = %cookie, error = %e, "removing the entries of a change that could not be completed");
        }
    }

    /// After the switch: removes the entries only the old state needed. Returns the entries the
    /// maps now hold, and a problem if an old one could not be removed (kept, to be removed
    /// with the pod).
    pub(super) fn remove_old_entries(
        &mut self,
        cookie: NetnsCookie,
        before: &InForce,
        mut subnets: BTreeSet<SubnetEntry>,
        inbound_port: u16,
    ) -> (BTreeSet<SubnetEntry>, Option<String>) {
        let mut problem = None;
        // The listeners are the sockets on the old inbound port: steering to them now would
        // hand connections to whatever listens there, which need not be the proxy any more.
        // Until the proxy's listener on the new port is adopted (or its listen() is seen),
        // inbound connections are refused, as a REDIRECT to a closed port would be.
        if before
            .config
            .is_some_and(|c| c.inbound_port != inbound_port)
        {
            for ipv6 in [false, true] {
                if let Err(e) =
                    ignore_absent(self.maps.listeners.remove(&listener_key(cookie, ipv6)))
                {
                    problem = Some(format!("the listener on the old inbound port is left: {e}"));
                }
            }
        }
        for entry in before.subnets.difference(&subnets.clone()) {
            if let Err(e) = self.remove_subnet(entry) {
                problem = Some(format!("an old subnet entry is left: {e}"));
                subnets.insert(*entry);
            }
        }
        (subnets, problem)
    }

    pub(super) fn insert_subnet(
        &mut self,
        (prefix_len, key): &SubnetEntry,
    ) -> Result<(), EbpfError> {
        self.maps
            .subnets
            .insert(&Key::new(*prefix_len, *key), 1, 0)
            .map_err(|e| match e {
                // Another writer of the trie (an older agent still running) filled it.
                MapError::SyscallError(ref s)
                    if s.io_error.raw_os_error() == Some(libc::ENOSPC) =>
                {
                    EbpfError::TableFull {
                        table: "subnet",
                        unit: "rules",
                        capacity: MAX_SUBNET_RULES as usize,
                        free: 0,
                        needed: 1,
                    }
                }
                e => map_error(names::MAP_SUBNETS)(e),
            })?;
        self.subnet_entries += 1;
        Ok(())
    }

    pub(super) fn remove_subnet(
        &mut self,
        (prefix_len, key): &SubnetEntry,
    ) -> Result<(), EbpfError> {
        match self.maps.subnets.remove(&Key::new(*prefix_len, *key)) {
            Ok(()) => {
                self.subnet_entries = self.subnet_entries.saturating_sub(1);
                Ok(())
            }
            Err(e) if is_absent(&e) => Ok(()),
            Err(e) => Err(map_error(names::MAP_SUBNETS)(e)),
        }
    }

    /// What remains of a pod once its configuration and sk_lookup link are gone: its listeners,
    /// subnets and counters.
    pub(super) fn remove_entries(
        &mut self,
        cookie: NetnsCookie,
        slot: Option<PodSlot>,
        subnets: &BTreeSet<SubnetEntry>,
    ) -> Result<(), EbpfError> {
        for ipv6 in [false, true] {
            ignore_absent(self.maps.listeners.remove(&listener_key(cookie, ipv6)))
                .map_err(map_error(names::MAP_LISTENERS))?;
        }
        self.remove_subnet_entries(subnets)?;
        match slot {
            Some(slot) => self.zero_counters(slot),
            None => Ok(()),
        }
    }

    pub(super) fn remove_subnet_entries(
        &mut self,
        subnets: &BTreeSet<SubnetEntry>,
    ) -> Result<(), EbpfError> {
        for entry in subnets {
            self.remove_subnet(entry)?;
        }
        Ok(())
    }
}

/// A delete that found nothing to delete is not an error.
pub(super) fn ignore_absent(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(e) if is_absent(&e) => Ok(()),
        r => r,
    }
}

/// A delete of a key that is not there (hash maps say KeyNotFound, sock hashes ENOENT).
pub(super) fn is_absent(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}
