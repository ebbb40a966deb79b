//! Adopting the listeners a pod's proxy opened before the pod was registered.
use std::os::fd::AsFd as _;

use aya::maps::MapError;
use interceptor_common::{ListenerKey, NetnsCookie, names};

use super::PodWriter;
use crate::{
    ebpf::{EbpfError, encode::listener_key, maps::map_error},
    netns::listener::Listening,
};

/// `bpf_map_update_elem`'s flag: only if the key is not there yet.
const BPF_NOEXIST: u64 = 1;

impl PodWriter {
    /// Puts the listeners of the pod's proxy that existed before registration (found with
    /// [`find_listeners`](crate::netns::listener::find_listeners)) into the listener map, one per family (new ones are caught by
    /// sock_ops; see `listener.rs`). A listener already in the map is newer: keep it.
    pub(in crate::ebpf) fn adopt_listeners(
        &mut self,
        cookie: NetnsCookie,
        found: Vec<Listening>,
    ) -> Result<(), EbpfError> {
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

    pub(super) fn insert_listener(
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
}
