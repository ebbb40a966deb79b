//! The node's set of proxy outbound ports ([`crate::names::MAP_OUTBOUND_PORTS`]): a bit per
//! port, indexed by the port in host order. The ports looked up are mostly the app's ephemeral
//! ports, which go up by two from one connection to the next: in host order they read the same
//! word for 32 connections and the same cache line for 256, where in network order each
//! connection read a word of another line (measured: 50 ns more a run than an early return,
//! the line's miss). The byte swap this costs is bounded by the array lookup's own check, not by
//! the verifier (see `PortBitmap::contains` for why that matters).
//!
//! getpeername4/6 run for every `accept()` that asks for the peer's address (tokio's, and so
//! linkerd2-proxy's, do), so for the proxy's side of every redirected connection. Only a socket
//! whose peer is a proxy's outbound port can be an app's redirected socket; one array read tells
//! the proxy's accepted socket (whose peer is the app's ephemeral port) from it, where the
//! pod's entry cost the netns cookie and a hash.
//!
//! Userspace sets a pod's port before it writes the pod's entry and never clears one: every pod
//! in `ICPT_PODS` has its port in the set. A bit left for a port no pod uses any more only sends
//! sockets with that peer port to the pod's lookup, as before the set.

/// Words of the map (`u64` each): 65,536 bits, 8 KiB.
pub const WORDS: u32 = 1024;

/// The word holding `port`'s bit.
#[inline(always)]
pub const fn word(port: u16) -> u32 {
    (port >> 6) as u32
}

/// `port`'s bit in its word.
#[inline(always)]
pub const fn bit(port: u16) -> u64 {
    1 << (port & 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_port_has_its_own_bit_in_a_word_of_the_map() {
        let mut set = [0u64; WORDS as usize];
        for port in 0..=u16::MAX {
            assert_eq!(bit(port).count_ones(), 1);
            let word = &mut set[word(port) as usize];
            assert_eq!(*word & bit(port), 0, "port {port} shares a bit");
            *word |= bit(port);
        }
        assert!(set.iter().all(|word| *word == u64::MAX));
    }
}
