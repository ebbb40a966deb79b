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
mod tests {
    use serde_json::json;

    use super::{
        Outcome, Severity,
        checks::{CHECKS, MAX_NAMED, validator_failure},
        cluster::Cluster,
    };

    fn pod(init_status: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "app" },
            "status": { "initContainerStatuses": [init_status] },
        }))
        .unwrap()
    }

    #[test]
    fn the_validator_failed_only_when_its_last_run_ended_non_zero_and_it_is_not_running() {
        let status = |state: serde_json::Value, last: serde_json::Value| {
            json!({
                "name": "linkerd-network-validator", "image": "proxy", "imageID": "", "ready": false,
                "restartCount": 1, "state": state, "lastState": last,
            })
        };
        let exited = |code: i32| json!({ "terminated": { "exitCode": code } });
        let waiting = json!({ "waiting": { "reason": "CrashLoopBackOff" } });
        let running = json!({ "running": {} });
        assert_eq!(
            validator_failure(&pod(status(waiting.clone(), exited(95)))),
            Some(95)
        );
        assert_eq!(
            validator_failure(&pod(status(exited(1), json!({})))),
            Some(1)
        );
        // Passed after failing once.
        assert_eq!(validator_failure(&pod(status(exited(0), exited(95)))), None);
        // Trying again now.
        assert_eq!(validator_failure(&pod(status(running, exited(95)))), None);
        assert_eq!(validator_failure(&pod(status(waiting, json!({})))), None);
    }

    /// A cluster of `nodes` ready nodes, each with a ready agent whose status names `drifted`
    /// pods.
    fn cluster(nodes: usize, drifted: usize) -> Cluster {
        let status = json!({
            "version": "0.1.0", "backend": "iptables", "can_mesh": true, "chained": true,
            "meshed": 1, "updated": "2026-11-28T10:00:00Z",
            "drifted": (0..drifted)
                .map(|i| json!({ "namespace": "app", "name": format!("web-{i}"), "reason": "x" }))
                .collect::<Vec<_>>(),
            "drifted_total": drifted,
        })
        .to_string();
        let nodes = (0..nodes)
            .map(|i| {
                serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("node-{i}"),
                        "annotations": { "interceptor.linkerd.io/status": status },
                    },
                    "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
                }))
                .unwrap()
            })
            .collect::<Vec<_>>();
        let agents = (0..nodes.len())
            .map(|i| {
                serde_json::from_value(json!({
                    "metadata": { "name": format!("agent-{i}"), "namespace": "linkerd-cni" },
                    "spec": { "nodeName": format!("node-{i}"), "containers": [] },
                    "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
                }))
                .unwrap()
            })
            .collect();
        let daemonset = serde_json::from_value(json!({
            "metadata": {
                "name": "linkerd-cni",
                "labels": { "app.kubernetes.io/name": "interceptor" },
            },
            "spec": {
                "selector": { "matchLabels": { "k8s-app": "linkerd-cni" } },
                "template": { "spec": { "containers": [] } },
            },
        }))
        .unwrap();
        Cluster {
            namespace: "linkerd-cni".to_owned(),
            labelled_namespaces: vec![],
            namespace_object: Ok(None),
            daemonset: Ok(Some(daemonset)),
            nodes: Ok(nodes),
            agents: Ok(agents),
            injected: Ok(vec![]),
            pods_namespace: None,
        }
    }

    fn evaluate(description: &str, cluster: &Cluster) -> Outcome {
        CHECKS
            .iter()
            .find(|c| c.description == description)
            .unwrap()
            .evaluate(cluster)
            .outcome
    }

    #[test]
    fn at_most_ten_problems_are_named_and_the_rest_counted() {
        let Outcome::Failure { severity, message } =
            evaluate("no meshed pod's interception has drifted", &cluster(3, 5))
        else {
            panic!("15 drifted pods pass");
        };
        assert_eq!(severity, Severity::Error);
        assert!(
            message.starts_with("15 pods whose interception"),
            "{message}"
        );
        assert_eq!(message.matches("\n\t* app/web-").count(), MAX_NAMED);
        assert!(message.ends_with("\n\t* and 5 more"), "{message}");
    }

    #[test]
    fn many_nodes_of_one_kind_are_one_line() {
        let result = CHECKS
            .iter()
            .find(|c| c.description == "every node's agent can mesh pods")
            .unwrap()
            .evaluate(&cluster(12, 0));
        assert_eq!(result.outcome, Outcome::Success);
        assert_eq!(
            result.description,
            "every node's agent can mesh pods\n\t* node-0, node-1, node-2, node-3, node-4, node-5, \
         node-6, node-7, node-8, node-9 and 2 more: iptables, interceptor 0.1.0"
        );
    }

    #[test]
    fn every_check_has_a_hint_that_stands_alone_and_fatal_ones_come_first() {
        let cluster = cluster(1, 0);
        for check in CHECKS {
            // Someone holding only the binary has no docs beside it: the hint says what to do.
            let hint = check.evaluate(&cluster).hint;
            assert!(hint.split_whitespace().count() >= 8, "{hint}");
            assert!(
                !hint.contains(".md") && !hint.contains("docs/") && !hint.contains("{namespace}"),
                "{hint}"
            );
        }
        assert!(CHECKS[0].fatal && CHECKS[1..].iter().all(|c| !c.fatal));
    }
}
