//! The CNI installer's runtime (`interceptor cni install`): the plugin's binary and its entry in
//! the node's CNI configuration (see `interceptor_cni::install`), installed once or kept there
//! by a watch that reports each time it had to put it back (`watch`), with the report of the
//! chain the agent's readiness goes by (`chain_report`), and the removal on termination when
//! the DaemonSet goes (`crate::kubernetes::Owner`, the agent's decision too).
mod chain_report;
mod watch;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use interceptor_cni::install::Installer;
use nix::sys::signal::{SigSet, Signal};
use tracing::info;

use crate::kubernetes::{DaemonSetRef, Installed, Owner};
use chain_report::ChainReporter;
use watch::{Watch, applied_conf, attempt, report, report_restores};

/// What the installer removes or keeps on termination, in the log's words.
const INSTALLED: Installed = Installed {
    what: "the CNI plugin",
    kept: "the CNI plugin stays chained, and pods Linkerd injected wait (CNI error 11) until the next agent answers",
    unknown: "the CNI plugin stays chained, and pods Linkerd injected wait (CNI error 11) until an agent answers; if the DaemonSet was deleted, run `interceptor cni uninstall` on this node",
};

/// How the installer runs.
pub struct InstallOptions {
    pub installer: Installer,
    /// Where to write the report of the chain (`--chain-report`).
    pub chain_report: Option<PathBuf>,
    /// Keep the plugin chained until SIGTERM or SIGINT, checking at least this often; `None`:
    /// install once and return.
    pub watch: Option<Duration>,
    /// The agent's API socket, told of each restore.
    pub agent_socket: PathBuf,
    /// The DaemonSet the installer runs in: on termination the plugin is removed only when it
    /// goes. Without one, it is removed on every termination.
    pub daemonset: Option<DaemonSetRef>,
    pub kubeconfig: Option<PathBuf>,
}

/// Installs the plugin; with a watch, keeps it chained until SIGTERM or SIGINT, then removes it
/// unless the DaemonSet remains.
pub fn install(options: InstallOptions) -> anyhow::Result<()> {
    let InstallOptions {
        installer,
        chain_report,
        watch,
        agent_socket,
        daemonset,
        kubeconfig,
    } = options;
    let chain = Arc::new(ChainReporter::new(chain_report));
    let Some(check) = watch else {
        let applied = installer.install()?;
        report(&applied);
        chain.note(Ok(applied_conf(&applied)));
        return Ok(());
    };
    // Blocked before the watch thread and the runtime's threads start, so they inherit
    // the mask and the signals wait for `sigwait`.
    let signals = termination_signals();
    signals
        .thread_block()
        .context("blocking SIGTERM and SIGINT")?;
    // Before any change: a kubeconfig that cannot be read is refused at once.
    let owner = daemonset
        .map(|daemonset| OwnerRuntime::start(daemonset, kubeconfig.as_deref()))
        .transpose()?;
    // Not fatal while watching: the watch tries again (the primary CNI not installed
    // yet, its plugins not yet in the bin directory) rather than the container
    // restarting in a loop.
    let first = attempt(&installer, false, None, check);
    chain.note(first.as_ref().map(applied_conf).map_err(String::as_str));
    let failing = first.err();
    // Held by the watch while it chains, and after the signal, which marks it stopped:
    // an uninstall's own write must not be chained again, nor a kept plugin rewritten.
    let stopped = Arc::new(Mutex::new(false));
    let (watcher, watch_stopped, watch_chain) = (installer.clone(), stopped.clone(), chain.clone());
    let failed = Arc::new(Mutex::new(None));
    let watch_failed = failed.clone();
    let reports = report_restores(agent_socket);
    std::thread::spawn(move || {
        let watch = Watch {
            installer: &watcher,
            stopped: &watch_stopped,
            check,
            reports,
            chain: &watch_chain,
        };
        if let Err(e) = watch.keep_chained(failing) {
            *lock(&watch_failed) = Some(e);
            // Ends the wait below, which returns the error without uninstalling.
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM);
        }
    });
    let watch_error = || {
        lock(&failed)
            .take()
            .map(|e| e.context("watching the CNI configuration stopped"))
    };
    let Some(owner) = owner else {
        let signal = signals.wait().context("waiting for SIGTERM or SIGINT")?;
        if let Some(e) = watch_error() {
            return Err(e);
        }
        let _stopped = stop(&stopped);
        installer.uninstall()?;
        chain.remove();
        info!(%signal, "CNI plugin uninstalled on termination");
        return Ok(());
    };
    let signal = owner.wait(signals)?;
    if let Some(e) = watch_error() {
        return Err(e);
    }
    let _stopped = stop(&stopped);
    if let Some(reason) = owner.removal_reason() {
        installer.uninstall()?;
        chain.remove();
        info!(%signal, daemonset = %owner.owner.daemonset(), reason, "CNI plugin uninstalled on termination");
    }
    Ok(())
}

/// The installer's [`Owner`], on a runtime of its own: the installer's threads are plain ones.
struct OwnerRuntime {
    runtime: tokio::runtime::Runtime,
    owner: Owner,
}

impl OwnerRuntime {
    fn start(daemonset: DaemonSetRef, kubeconfig: Option<&Path>) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("a runtime for the Kubernetes API")?;
        let owner = runtime
            .block_on(Owner::start(daemonset, kubeconfig, &INSTALLED))
            .map_err(anyhow::Error::msg)?;
        Ok(Self { runtime, owner })
    }

    /// Waits for SIGTERM or SIGINT; meanwhile the runtime runs the owner's confirmation of
    /// access.
    fn wait(&self, signals: SigSet) -> anyhow::Result<Signal> {
        let signal = self.runtime.block_on(async {
            // Spawned inside the runtime: the wait runs on its blocking pool.
            tokio::task::spawn_blocking(move || signals.wait()).await
        })??;
        Ok(signal)
    }

    fn removal_reason(&self) -> Option<&'static str> {
        self.runtime.block_on(self.owner.removal_reason(&INSTALLED))
    }
}

/// Marks the watch stopped; it waits on the guard until what follows the signal is done.
fn stop(stopped: &Mutex<bool>) -> std::sync::MutexGuard<'_, bool> {
    let mut guard = lock(stopped);
    *guard = true;
    guard
}

/// The guarded value, also after a thread panicked holding it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn termination_signals() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}
