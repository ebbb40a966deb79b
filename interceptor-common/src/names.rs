//! Program and map names, shared so the loader and the object cannot drift apart. Each fits in
//! the kernel's object name (`BPF_OBJ_NAME_LEN`, 16 bytes with the terminating NUL), which
//! silently cuts longer names: a pin's file name and its map's name then differ.

/// Every program of ours starts with it: a pinned link running a program without it is not ours.
pub const PREFIX: &str = "icpt_";

pub const PROG_CONNECT4: &str = "icpt_connect4";
pub const PROG_CONNECT6: &str = "icpt_connect6";
pub const PROG_SOCKOPS: &str = "icpt_sockops";
pub const PROG_GETSOCKOPT: &str = "icpt_getsockopt";
/// An app's redirected socket reports the address it dialled as its peer.
pub const PROG_PEERNAME4: &str = "icpt_peername4";
pub const PROG_PEERNAME6: &str = "icpt_peername6";
/// Loaded once, into [`MAP_SK_LOOKUP_PROG`]: each pod's [`PROG_POD_LOOKUP`] tail-calls it.
pub const PROG_SK_LOOKUP: &str = "icpt_sk_lookup";

/// Variants of the programs above for kernels that lack what those need (see
/// `interceptor::ebpf::variants`). Each attaches where its original does, under the same link.
/// Without `bpf_sk_lookup.ingress_ifindex` (Linux 5.17): loopback told by the source address.
pub const PROG_SK_LOOKUP_ADDR: &str = "icpt_sklkp_addr";
/// Without BTF access to a socket's creator from connect4/6 (`bpf_skc_to_tcp_sock` and the
/// kernel's BTF): the proxy's UID and GID are told by the connecting task's real IDs.
pub const PROG_CONNECT4_TASK: &str = "icpt_conn4_task";
pub const PROG_CONNECT6_TASK: &str = "icpt_conn6_task";

/// Read-only global of the connect programs: where a socket's creator credentials are, in this
/// kernel's structures ([`crate::CredOffsets`]), set by the loader from the kernel's BTF.
pub const GLOBAL_CRED_OFFSETS: &str = "ICPT_CRED_OFFSETS";

/// A pod's own sk_lookup program, attached to its network namespace (sk_lookup cannot ask which
/// namespace it runs in): it writes the pod's netns cookie to [`MAP_LOOKUP_POD`] and tail-calls
/// [`PROG_SK_LOOKUP`]. Assembled by userspace, not in the object.
pub const PROG_POD_LOOKUP: &str = "icpt_pod_lookup";

/// netns cookie -> [`crate::PodConfig`]: which pods are meshed, and how.
pub const MAP_PODS: &str = "ICPT_PODS";
/// LPM trie of [`crate::SubnetKey`] -> 1: subnets exempted per pod and direction.
pub const MAP_SUBNETS: &str = "ICPT_SUBNETS";
/// Per-CPU array indexed by pod slot -> [`crate::PodCounters`].
pub const MAP_COUNTERS: &str = "ICPT_COUNTERS";
/// LRU socket cookie -> [`crate::OrigDst`]: redirected app sockets still connecting.
pub const MAP_CONNECTING: &str = "ICPT_CONNECTING";
/// Array of [`crate::ConnectSlot`] by socket cookie: redirected app sockets still connecting
/// (those whose slot is taken go to [`MAP_CONNECTING`]).
pub const MAP_CONNECT_SLOTS: &str = "ICPT_CONN_SLOTS";
/// Array of [`crate::PendingSlot`] by [`crate::PendingKey::slot_index`]: connections waiting for
/// the proxy (those whose slot is held go to [`MAP_PENDING`]).
pub const MAP_PENDING_SLOTS: &str = "ICPT_PEND_SLOTS";
/// LRU [`crate::PendingKey`] -> [`crate::PendingOrigDst`]: connections waiting for the proxy.
pub const MAP_PENDING: &str = "ICPT_PENDING";
/// Sock hash [`crate::ListenerKey`] -> the proxy's inbound listening socket(s), per family.
pub const MAP_LISTENERS: &str = "ICPT_LISTENERS";
/// Array of 1,024 `u64` words, a bit per port (host order): every proxy outbound port of a pod
/// registered since the maps were made (see [`crate::outbound_ports`]).
pub const MAP_OUTBOUND_PORTS: &str = "ICPT_OUT_PORTS";

/// Program array, index 0: [`PROG_SK_LOOKUP`].
pub const MAP_SK_LOOKUP_PROG: &str = "ICPT_SK_LOOKUP";
/// Per-CPU array, index 0: the netns cookie of the pod whose sk_lookup is running.
pub const MAP_LOOKUP_POD: &str = "ICPT_LOOKUP_POD";

/// Maps shared by the node's programs and every pod's sk_lookup program (through pins), and
/// read by `interceptor status` from another process.
pub const SHARED_MAPS: [&str; 11] = [
    MAP_PODS,
    MAP_SUBNETS,
    MAP_COUNTERS,
    MAP_CONNECT_SLOTS,
    MAP_CONNECTING,
    MAP_PENDING_SLOTS,
    MAP_PENDING,
    MAP_LISTENERS,
    MAP_OUTBOUND_PORTS,
    MAP_SK_LOOKUP_PROG,
    MAP_LOOKUP_POD,
];

/// Maps that earlier map layouts pinned and this one no longer has: removed with an older
/// layout's maps once the links are switched over, and by `interceptor uninstall`.
pub const RETIRED_MAPS: [&str; 2] = [
    // Up to layout 2, as `MAP_LOCAL_ADDRS`; the kernel cut its name to "ICPT_LOCAL_ADDR".
    "ICPT_LOCAL_ADDRS",
    // Layout 3: (pod, address) -> 1. The pod's addresses are in its `PodConfig` since layout 4.
    "ICPT_LOCAL_IPS",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest name the kernel keeps whole (`BPF_OBJ_NAME_LEN` - 1).
    const OBJ_NAME_MAX: usize = 15;

    #[test]
    fn every_program_and_map_name_fits_the_kernel() {
        let programs = [
            PROG_CONNECT4,
            PROG_CONNECT6,
            PROG_SOCKOPS,
            PROG_GETSOCKOPT,
            PROG_PEERNAME4,
            PROG_PEERNAME6,
            PROG_SK_LOOKUP,
            PROG_POD_LOOKUP,
            PROG_SK_LOOKUP_ADDR,
            PROG_CONNECT4_TASK,
            PROG_CONNECT6_TASK,
        ];
        for name in programs.iter().chain(&SHARED_MAPS) {
            assert!(
                name.len() <= OBJ_NAME_MAX,
                "{name} is {} bytes; the kernel keeps {OBJ_NAME_MAX}",
                name.len()
            );
        }
        for name in programs {
            assert!(name.starts_with(PREFIX), "{name}");
        }
    }

    #[test]
    fn retired_map_names_are_not_reused() {
        for retired in RETIRED_MAPS {
            assert!(!SHARED_MAPS.contains(&retired), "{retired}");
        }
    }
}
