//! Our health in Linkerd's terms: the checks `interceptor check` runs, and `linkerd check` too
//! (through `linkerd-interceptor check --output=json`, for the namespace labelled
//! `linkerd.io/extension: interceptor`).
//!
//! - [`cluster`]: what is read from the Kubernetes API;
//! - [`scheduling`]: which nodes the DaemonSet should run on;
//! - [`checks`]: what each check concludes;
//! - [`output`]: Linkerd's JSON and tables.
//!
//! Like Linkerd's checks (`pkg/healthcheck/healthcheck.go:289-315`), each is fatal or not (a
//! fatal failure ends the run), and may be retried until `--wait` runs out. Unlike them, a
//! check's severity is decided per run: a check that finds only what cannot be verified says
//! `warning`, one that finds something broken says `error`.
pub mod checks;
pub mod cluster;
pub mod output;
pub mod scheduling;

use std::time::{Duration, Instant};

use kube::Client;

use self::cluster::{Cluster, Scope};

/// The category of every check, and the name Linkerd shows.
pub const CATEGORY: &str = "linkerd-interceptor";
/// The extension's name: `linkerd-<name>` is the binary `linkerd check` runs, `<name>` the
/// value of the namespace's [`EXTENSION_LABEL`].
pub const EXTENSION: &str = "interceptor";
/// Linkerd's `LinkerdExtensionLabel` (`pkg/k8s/labels.go:25-27`).
pub const EXTENSION_LABEL: &str = "linkerd.io/extension";
/// The label Linkerd's injector puts on every pod it injects (`ControllerNSLabel`).
pub const INJECTED_LABEL: &str = "linkerd.io/control-plane-ns";
/// The DaemonSet, named as linkerd-cni's so that `linkerd check`'s own CNI checks find it.
pub const DAEMONSET: &str = "linkerd-cni";
/// Where the chart installs it unless told otherwise (Linkerd's `defaultCNINamespace`).
pub const DEFAULT_NAMESPACE: &str = "linkerd-cni";

/// The metadata `interceptor namespace-metadata` gives the namespace, and the check expects,
/// each with why. The [`EXTENSION_LABEL`] is not among them: it is given only when asked
/// (`--linkerd-extension`, the chart's `linkerdExtension`), since `linkerd check` warns for a
/// labelled namespace whose `linkerd-interceptor` is not on its PATH.
pub const NAMESPACE_LABELS: &[(&str, &str, &str)] = &[
    (
        "linkerd.io/cni-resource",
        "true",
        "as linkerd-cni's namespace: Linkerd's selectors leave CNI objects out",
    ),
    (
        "config.linkerd.io/admission-webhooks",
        "disabled",
        "Linkerd's admission webhooks skip the namespace",
    ),
    (
        "pod-security.kubernetes.io/enforce",
        "privileged",
        "the DaemonSet's bpffs init container is privileged",
    ),
];
pub const NAMESPACE_ANNOTATIONS: &[(&str, &str, &str)] = &[(
    "linkerd.io/inject",
    "disabled",
    "Linkerd's injector leaves the namespace's pods alone",
)];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Error,
}

/// How a check ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure { severity: Severity, message: String },
}

/// One check's result, as Linkerd's `CheckResult`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    pub category: &'static str,
    /// The check's description; on success, followed by what it found, a line each
    /// (Linkerd's `VerboseSuccess`).
    pub description: String,
    pub hint: String,
    pub outcome: Outcome,
}

/// Whether no check failed with an error (warnings pass, as in Linkerd).
pub fn success(results: &[CheckResult]) -> bool {
    !results.iter().any(|r| {
        matches!(
            r.outcome,
            Outcome::Failure {
                severity: Severity::Error,
                ..
            }
        )
    })
}

/// What the checks are doing, for the output.
pub enum Event<'a> {
    /// A check failed and is tried again after a pause.
    Retrying(&'a CheckResult),
    /// A check's final result.
    Done(&'a CheckResult),
}

/// The pause between two tries of a check, as Linkerd's `retryWindow`
/// (`pkg/healthcheck/healthcheck.go:208`).
pub const RETRY_WINDOW: Duration = Duration::from_secs(5);

/// Runs every check in order against the API, retrying those that may converge until `wait`
/// has passed, and stopping at a fatal one's failure.
pub async fn run(
    client: &Client,
    scope: &Scope,
    wait: Duration,
    mut observe: impl FnMut(Event<'_>),
) -> Vec<CheckResult> {
    let deadline = Instant::now() + wait;
    let mut cluster = Cluster::read(client, scope).await;
    let mut results = Vec::new();
    for check in checks::CHECKS {
        let result = loop {
            let result = check.evaluate(&cluster);
            let failed = matches!(
                result.outcome,
                Outcome::Failure {
                    severity: Severity::Error,
                    ..
                }
            );
            let left = deadline.saturating_duration_since(Instant::now());
            if !(failed && check.retry && !left.is_zero()) {
                break result;
            }
            observe(Event::Retrying(&result));
            tokio::time::sleep(RETRY_WINDOW.min(left)).await;
            cluster = Cluster::read(client, scope).await;
        };
        observe(Event::Done(&result));
        let stop = check.fatal && result.outcome != Outcome::Success;
        results.push(result);
        if stop {
            break;
        }
    }
    results
}

#[cfg(test)]
mod tests;
