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
        // Likewise a connection in an old pending slot, in the LRU map, where the new programs
        // look when their slot does not hold it and which they free as a slot. Its phase is
        // kept; its date and tag are not of this layout before 8: it ages at once, and, untagged,
        // answers the app's `getpeername()` by its 4-tuple, as the old programs did.
        if let Some(old) = open(names::MAP_PENDING_SLOTS)
            .and_then(|m| Array::<MapData, PendingSlot>::try_from(m).ok())
        {
            for slot in old.iter().filter_map(Result::ok) {
                if pending_phase::holds_a_connection(slot.state) {
                    let entry = PendingSlot {
                        state: phase_only(slot.state),
                        ..slot
                    };
                    copied += usize::from(self.maps.pending.insert(slot.key, entry, 0).is_ok());
                }
            }
        }
        let pending = open(names::MAP_PENDING);
        match pending.map(HashMap::<MapData, PendingKey, PendingSlot>::try_from) {
            Some(Ok(old)) => {
                for (key, entry) in old.iter().filter_map(Result::ok) {
                    let entry = PendingSlot {
                        state: phase_only(entry.state),
                        ..entry
                    };
                    copied += usize::from(self.maps.pending.insert(key, entry, 0).is_ok());
                }
            }
            // Layouts before 8 kept a bare original destination there, removed at the proxy's
            // close: recorded, it is freed by the proxy's close as it was, and by the app's
            // after it.
            Some(Err(_)) => {
                if let Some(old) = open(names::MAP_PENDING)
                    .and_then(|m| HashMap::<MapData, PendingKey, PendingOrigDst>::try_from(m).ok())
                {
                    for (key, orig) in old.iter().filter_map(Result::ok) {
                        let entry = PendingSlot {
                            state: pending_phase::state(
                                pending_phase::RECORDED,
                                0,
                                pending_phase::UNTAGGED,
                            ),
                            key,
                            orig,
                        };
                        copied += usize::from(self.maps.pending.insert(key, entry, 0).is_ok());
                    }
                }
            }
            None => {}
        }
        copied
    }
}

/// The state of an entry copied from an older layout, whose dates and tags may have had
/// another form: its phase alone, undated and untagged (`pending_phase::UNTAGGED`).
fn phase_only(state: u64) -> u64 {
    pending_phase::state(state & pending_phase::MASK, 0, pending_phase::UNTAGGED)
}
