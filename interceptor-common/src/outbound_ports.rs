//! The node's set of proxy outbound ports ([`crate::names::MAP_OUTBOUND_PORTS`]): a bit per
//! port, indexed by the port in network order (as sock_addr programs read it, no byte swap).
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

/// The word holding `port_be`'s bit.
#[inline(always)]
pub const fn word(port_be: u16) -> u32 {
    (port_be >> 6) as u32
}

/// `port_be`'s bit in its word.
#[inline(always)]
pub const fn bit(port_be: u16) -> u64 {
    1 << (port_be & 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_port_has_its_own_bit_in_a_word_of_the_map() {
        let mut set = [0u64; WORDS as usize];
        for port in 0..=u16::MAX {
            let port_be = port.to_be();
            assert_eq!(bit(port_be).count_ones(), 1);
            let word = &mut set[word(port_be) as usize];
            assert_eq!(*word & bit(port_be), 0, "port {port} shares a bit");
            *word |= bit(port_be);
        }
        assert!(set.iter().all(|word| *word == u64::MAX));
    }
}
