//! Keeping the pods in step with their namespaces: a pod whose namespace disappeared (or was
//! replaced: another cookie at the same path) is removed, and address changes are applied; a
//! link whose pin went missing is pinned again.
//!
//! Driven by events (`watch`): only the pods an event names are checked, so an agent at rest
//! does no work per pod. The safety sweep catches what no event reported (a path nothing can
//! watch, a lost notification): one pod at a time, spread evenly over `--reconcile-ms` but never
//! more than two a second, and the pins once per round. Its cost does not grow with the pods:
//! a round of more than `2 × --reconcile-ms` seconds' worth of pods takes longer instead.
//!
//! Checks run on one thread of their own, in order, without the agent's lock while they visit a
//! namespace (a switch into it per pod); the lock is taken only to apply what changed.
use std::{
    path::PathBuf,
    sync::{Arc, mpsc},
    time::Duration,
};

use interceptor_common::NetnsCookie;
use tokio::time::Instant;
use tracing::warn;

use super::{Agent, Shared, lock, watch::Event};
use crate::netns::PodNetns;

/// Work for the reconciler's thread.
enum Work {
    /// Check these pods; the trigger is counted (`PodChecks`).
    Pods(Vec<NetnsCookie>, &'static str),
    /// Check the pods whose namespace is at this path.
    At(PathBuf),
    /// Pin again the links whose pins are missing.
    Pins,
    /// Notifications were lost: the pins and every pod.
    All,
}

/// Hands checks to the reconciler's thread.
pub(super) struct Reconciler {
    work: mpsc::Sender<Work>,
}

impl Reconciler {
    pub fn start(agent: Arc<Shared>) -> Self {
        let (work, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("reconcile".into())
            .spawn(move || {
                for work in receiver {
                    run(&agent, work);
                }
            })
            .expect("spawning the reconciliation thread");
        Self { work }
    }

    /// Checks the pods whose changes are not heard (`watch`): every [`UNHEARD_EVERY`].
    pub fn check_unheard(&self, pods: Vec<NetnsCookie>) {
        if !pods.is_empty() {
            let _ = self.work.send(Work::Pods(pods, "unheard"));
        }
    }

    pub fn on(&self, event: Event) {
        let work = match event {
            Event::NetnsRemoved(path) => Work::At(path),
            Event::Addresses(cookie) => Work::Pods(vec![cookie], "event"),
            Event::PinRemoved => Work::Pins,
            Event::Lost => Work::All,
        };
        let _ = self.work.send(work);
    }
}

fn run(agent: &Shared, work: Work) {
    let (pods, trigger) = match work {
        Work::Pods(pods, trigger) => (pods, trigger),
        Work::At(path) => {
            let pods = lock(agent)
                .pods
                .registered()
                .filter(|(_, netns, _)| *netns == path)
                .map(|(cookie, _, _)| cookie)
                .collect();
            (pods, "event")
        }
        Work::Pins => return repin(agent),
        Work::All => {
            repin(agent);
            let pods = lock(agent).pods.keys();
            (pods, "lost")
        }
    };
    for cookie in pods {
        check(agent, cookie, trigger);
    }
}

/// Checks one pod against its namespace: removed if the namespace is gone or was replaced, its
/// addresses applied if they changed.
fn check(agent: &Shared, cookie: NetnsCookie, trigger: &'static str) {
    let (identify, path) = {
        let state = lock(agent);
        let Some(netns) = state.pods.netns(cookie) else {
            return;
        };
        (state.pods.lenient_identifier(), netns.to_owned())
    };
    agent.metrics.pod_checks.count(trigger);
    // One switch into the namespace for both.
    let current = PodNetns::open(&path).and_then(|n| identify(&n));
    let mut agent = lock(agent);
    // Removed or replaced through the API meanwhile.
    if agent.pods.netns(cookie) != Some(path.as_path()) {
        return;
    }
    match current {
        Ok((c, Ok(local))) if c == cookie => {
            if agent.pods.local_destinations(cookie) != Some(&local)
                && let Err(e) = agent.pods.set_local(cookie, &local)
            {
                warn!(netns = %path.display(), error = %e, "updating pod addresses and local routes: the previous ones stay in force");
            }
        }
        Ok((c, Err(e))) if c == cookie => {
            warn!(netns = %path.display(), error = %e, "reading the pod's addresses and local routes failed: the ones in force stay");
        }
        Ok(_) => return agent.forget(cookie, "its network namespace was replaced"),
        Err(_) => return agent.forget(cookie, "its network namespace is gone"),
    }
    agent.recheck(cookie);
}

/// Pins again what went missing, then takes every pod's problem afresh (a pod's link may be
/// among the pins).
fn repin(agent: &Shared) {
    let mut agent = lock(agent);
    restore_missing_pins(&agent);
    agent.recheck_all();
}

/// A pin removed by hand (or by a cleanup script) while the agent runs leaves the attachment
/// held by this process only: pinned again here, the next restart or crash does not end it.
fn restore_missing_pins(agent: &Agent) {
    let Some(programs) = agent.pods.programs() else {
        return;
    };
    let (pinned, failed) = programs.restore_missing_pins();
    for path in pinned {
        warn!(path = %path.display(), "a link's pin was removed while the agent held the link; pinned it again");
    }
    for (path, error) in failed {
        warn!(path = %path.display(), %error, "a link's pin was removed and pinning it again failed: its interception ends with this process");
    }
}

/// How often the pods whose address and route changes are not heard (an agent without
/// `CAP_NET_BROADCAST`, a namespace without an id) are checked: the window in which such a
/// change is not in force. A check costs a few hundred microseconds of CPU, so 2 s is about
/// 0.015 % of a CPU a pod, 1.7 % for a node's 110 (the kubelet's default maximum); the
/// node's note says how to do without it.
pub(super) const UNHEARD_EVERY: Duration = Duration::from_secs(2);

/// The longest a sweep step waits for the next: a round of many pods takes longer than the
/// period rather than cost more. A check (a switch into the pod's namespace, its cookie and
/// addresses, its entries and pin read back) takes a few hundred microseconds of CPU, so the
/// sweep costs at most about 0.1 % of one CPU, whatever the pods.
const MIN_STEP: Duration = Duration::from_millis(500);

/// The safety sweep: one pod per step, in cookie order, each step `period / pods` after the
/// last but at most two a second; the pins at the start of each round.
pub(super) struct Sweep {
    period: Duration,
    next_at: Instant,
    /// The last pod checked; the round starts again after the highest cookie.
    last: Option<NetnsCookie>,
}

impl Sweep {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            next_at: Instant::now() + period,
            last: None,
        }
    }

    pub fn next_at(&self) -> Instant {
        self.next_at
    }

    /// Hands the next pod (and at a round's start, the pins) to the reconciler, and schedules
    /// the next step.
    pub fn step(&mut self, agent: &Shared, reconciler: &Reconciler) {
        let (next, pods) = {
            let agent = lock(agent);
            let pods = agent.pods.len();
            let mut registered = agent.pods.registered().map(|(c, _, _)| c);
            let next = match self.last {
                Some(last) => registered.find(|c| *c > last),
                None => registered.next(),
            };
            (next, pods)
        };
        if self.last.is_none() {
            let _ = reconciler.work.send(Work::Pins);
        }
        if let Some(cookie) = next {
            let _ = reconciler.work.send(Work::Pods(vec![cookie], "sweep"));
        }
        self.last = next;
        let steps = u32::try_from(pods.max(1)).unwrap_or(u32::MAX);
        self.next_at = Instant::now() + (self.period / steps).max(MIN_STEP);
    }
}
