//! Copying what an older map layout holds for connections in flight into this one.
use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData};
use interceptor_common::{
    ConnectSlot, OrigDst, PendingKey, PendingOrigDst, PendingSlot, SocketCookie, names,
    pending_phase,
};

use super::PodWriter;

impl PodWriter {
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
}
