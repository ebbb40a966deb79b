//! Room for a descriptor per pod, made before the agent starts.
//!
//! The agent keeps each eBPF pod's sk_lookup link open, one descriptor per pod, beside about
//! fifty of its own. Two limits stood in the way of a node with many pods:
//!
//! - **The open-files limit.** A container's soft `RLIMIT_NOFILE` is often 1,024 (containerd
//!   2.0 leaves it there), and a registration past it fails with "Too many open files". The
//!   agent raises its soft limit at start (as Go programs do), as far as `--max-pods` needs
//!   and the hard limit allows.
//! - **The descriptor table's growth.** The kernel grows a process's table by doubling, and in a
//!   process of several threads each growth waits for an RCU grace period (`synchronize_rcu`
//!   in `expand_fdtable`). The registrations that crossed 256, 512 and 1,024 descriptors took
//!   10 to 40 ms where the others take under 1 ms. The table is grown once here instead, while
//!   the process has a single thread, so that no grace period is waited for at all.
use std::os::fd::AsFd as _;

use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};
use tracing::{info, warn};

/// Descriptors the agent needs besides one per pod: its own (about fifty: maps, programs,
/// links of the node, sockets, the log) and those a registration or a check opens for a while
/// (the namespace, a netlink socket, an API connection, a listener taken from a process).
pub const BESIDES_PODS: u32 = 256;

/// Raises the soft open-files limit to what `max_pods` pods need (at most the hard limit) and
/// grows the descriptor table to hold their descriptors and [`BESIDES_PODS`]. Never fails: a
/// limit that cannot be raised, or a table that cannot be grown, is logged, and the agent runs
/// with what it has (a registration beyond the limit is refused with the kernel's error).
pub fn make_room(max_pods: u32) {
    let wanted = max_pods.saturating_add(BESIDES_PODS);
    let (soft_before, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((0, 0));
    let mut soft = soft_before;
    // Only as far as needed: the processes the agent runs (iptables) inherit it.
    let raised = rlim_t::from(wanted).min(hard);
    if soft < raised {
        match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
            Ok(()) => soft = raised,
            Err(e) => warn!(soft, hard, error = %e, "raising the open-files limit"),
        }
    }
    let table = u32::try_from(soft).unwrap_or(u32::MAX).min(wanted);
    let grown =
        std::fs::File::open("/").and_then(|any| interceptor_sys::grow_fd_table(any.as_fd(), table));
    if let Err(e) = grown {
        warn!(descriptors = table, error = %e, "growing the descriptor table ahead of the pods: a registration that grows it waits for an RCU grace period (tens of ms)");
    }
    if table < wanted {
        let pods = table.saturating_sub(BESIDES_PODS);
        warn!(
            limit = soft,
            max_pods,
            pods,
            "the open-files limit leaves room for about {pods} pods, fewer than --max-pods: registrations beyond fail with 'Too many open files'; raise the container's nofile limit (hard) to {wanted} or more, or lower --max-pods"
        );
    } else {
        info!(
            limit = soft,
            was = soft_before,
            descriptors = table,
            "room for a descriptor per pod"
        );
    }
}
