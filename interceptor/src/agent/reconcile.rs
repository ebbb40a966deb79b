//! Keeping the pods in step with their namespaces: a pod whose namespace disappeared (or was
//! replaced: another cookie at the same path) is removed, and address changes are applied.
//! Runs periodically, and at once when a watched namespace directory loses an entry. Each run
//! also pins again any of the agent's links whose pin went missing.
//!
//! Each namespace is visited without the agent's lock (a switch into it per pod, which adds up
//! on a node with many pods); the lock is taken only to apply what changed.
use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use interceptor_common::NetnsCookie;
use tracing::warn;

use super::{Agent, backend::identify_lenient, lock};
use crate::netns::PodNetns;

/// Starts a reconciliation on a blocking thread unless one is still running.
pub(super) fn start(agent: &Arc<Mutex<Agent>>, running: &Arc<AtomicBool>) {
    if running.swap(true, Ordering::AcqRel) {
        return;
    }
    let (agent, running) = (agent.clone(), running.clone());
    tokio::task::spawn_blocking(move || {
        reconcile(&agent);
        running.store(false, Ordering::Release);
    });
}

fn reconcile(agent: &Mutex<Agent>) {
    restore_missing_pins(&lock(agent));
    let (kind, pods): (_, Vec<(NetnsCookie, PathBuf)>) = {
        let agent = lock(agent);
        let pods = agent
            .backend
            .registered()
            .map(|(cookie, facts)| (cookie, facts.netns.clone()))
            .collect();
        (agent.backend.kind(), pods)
    };
    for (cookie, path) in pods {
        // One switch into the namespace for both.
        let current = PodNetns::open(&path).and_then(|n| identify_lenient(kind, &n));
        let mut agent = lock(agent);
        // Removed or replaced through the API meanwhile.
        if agent.backend.facts(cookie).map(|f| &f.netns) != Some(&path) {
            continue;
        }
        match current {
            Ok((c, addresses)) if c == cookie => {
                if let Some(addresses) = addresses
                    && agent.backend.addresses(cookie) != addresses
                    && let Err(e) = agent.backend.set_addresses(cookie, &addresses)
                {
                    warn!(netns = %path.display(), error = %e, "updating pod addresses: the previous ones stay in force");
                }
            }
            Ok(_) => agent.forget(cookie, "its network namespace was replaced"),
            Err(_) => agent.forget(cookie, "its network namespace is gone"),
        }
    }
}

/// A pin removed by hand (or by a cleanup script) while the agent runs leaves the attachment
/// held by this process only: pinned again here, the next restart or crash does not end it.
fn restore_missing_pins(agent: &Agent) {
    let Some(node) = agent.backend.ebpf() else {
        return;
    };
    let (pinned, failed) = node.restore_missing_pins();
    for path in pinned {
        warn!(path = %path.display(), "a link's pin was removed while the agent held the link; pinned it again");
    }
    for (path, error) in failed {
        warn!(path = %path.display(), %error, "a link's pin was removed and pinning it again failed: its interception ends with this process");
    }
}
