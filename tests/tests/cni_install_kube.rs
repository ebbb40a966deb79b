//! `interceptor cni install --watch --daemonset NAMESPACE/NAME` on SIGTERM, as the DaemonSet's
//! `install-cni` container gets it: the real binary, against a node's CNI directories of each
//! test's own (a primary network placed there before) and the kit's stand-in API server
//! (`interceptor_tests::fake_api`, through `--kubeconfig`).
//!
//! The plugin is removed only when the API says the DaemonSet is gone, being deleted or taken
//! over by another chart (no longer labelled ours), or no longer lets the installer read it after
//! it did (its account or role deleted with it). While
//! the DaemonSet remains (a rolling update replacing this pod) or the API cannot tell, the
//! plugin stays chained: a pod created meanwhile waits (CNI error 11) rather than start
//! unmeshed.
use std::{path::PathBuf, time::Duration};

use interceptor_tests::{
    cni_installer::Installer,
    cni_network::CniNetwork,
    fake_api::{FakeApi, Mode, daemonset},
};
use serde_json::json;

const NAMESPACE: &str = "interceptor";
const NAME: &str = "interceptor";

/// Where no agent listens: nothing is ever sent to the node's.
fn no_agent(network: &CniNetwork) -> PathBuf {
    network.root.join("agent.sock")
}

/// The installer as the DaemonSet runs it, watching, against `api`, naming its DaemonSet.
fn with_daemonset(network: &CniNetwork, api: &FakeApi) -> Installer {
    let kubeconfig = api.kubeconfig(&network.root.join("kube"));
    Installer::start(
        network,
        &no_agent(network),
        &[
            "--watch",
            "--daemonset",
            &format!("{NAMESPACE}/{NAME}"),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
        ],
    )
}

/// A node with the primary network only, an API with the DaemonSet, and the installer started
/// against both, which has chained the plugin and read the DaemonSet once.
fn installed(tag: &str) -> (CniNetwork, FakeApi, Installer) {
    let network = CniNetwork::new(tag);
    let api = FakeApi::start(vec![daemonset(NAMESPACE, NAME)]);
    let installer = with_daemonset(&network, &api);
    installer.wait_for("DaemonSet found");
    assert_eq!(network.chained(), 1);
    assert!(network.bin_dir.join("interceptor-cni").is_file());
    (network, api, installer)
}

fn daemonset_gets(api: &FakeApi) -> usize {
    api.requests_with(&format!(
        "/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{NAME}"
    ))
}

fn assert_still_chained(network: &CniNetwork) {
    assert_eq!(network.chained(), 1);
    assert!(network.bin_dir.join("interceptor-cni").is_file());
}

fn assert_unchained(network: &CniNetwork) {
    assert_eq!(network.conflist(), CniNetwork::primary());
    assert!(!network.bin_dir.join("interceptor-cni").exists());
}

#[test]
fn while_its_daemonset_remains_the_installer_leaves_the_plugin_chained_on_sigterm() {
    let (network, api, installer) = installed("dsremains");
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
    assert_still_chained(&network);
    assert!(log.contains("this pod is being replaced"), "{log}");
    assert!(log.contains("CNI error 11"), "{log}");
    assert!(!log.contains("uninstalled"), "{log}");
    // Once at start, once on SIGTERM.
    assert_eq!(daemonset_gets(&api), 2, "{:?}", api.state().requests);
}

#[test]
fn when_its_daemonset_is_gone_the_installer_unchains_the_plugin_on_sigterm() {
    let (network, api, installer) = installed("dsgone");
    api.state().remove("DaemonSet", NAMESPACE, NAME);
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
    assert_unchained(&network);
    assert!(
        log.contains("CNI plugin uninstalled on termination"),
        "{log}"
    );
    assert!(log.contains("the DaemonSet is gone"), "{log}");
}

#[test]
fn when_its_daemonset_is_being_deleted_the_installer_unchains_the_plugin_on_sigterm() {
    let (network, api, installer) = installed("dsdeleting");
    // A foreground deletion: the DaemonSet stays, marked, until its pods are gone.
    let mut state = api.state();
    let found = state.object_mut("DaemonSet", NAMESPACE, NAME).unwrap();
    found["metadata"]["deletionTimestamp"] = json!("2025-01-01T01:00:00Z");
    found["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    found["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
    drop(state);
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
    assert_unchained(&network);
    assert!(log.contains("the DaemonSet is being deleted"), "{log}");
}

/// `helm upgrade linkerd2-cni linkerd/linkerd2-cni` on the way back: the DaemonSet keeps its name
/// and selector, but its labels and template are linkerd-cni's. The pod stopped is replaced by
/// linkerd-cni's installer, which chains its own plugin: ours must go, or pods would wait on an
/// agent that never comes back.
#[test]
fn when_another_chart_takes_its_daemonset_over_the_installer_unchains_the_plugin_on_sigterm() {
    let (network, api, installer) = installed("dsreplaced");
    let mut state = api.state();
    let found = state.object_mut("DaemonSet", NAMESPACE, NAME).unwrap();
    found["metadata"]["labels"] = json!({ "k8s-app": NAME, "linkerd.io/cni-resource": "true" });
    drop(state);
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
    assert_unchained(&network);
    assert!(log.contains("the DaemonSet is no longer ours"), "{log}");
}

/// The API unreachable at SIGTERM, whether it never answers (the installer gives up in time for
/// the pod's 10 s grace period) or drops the connection: the plugin stays chained, and the log
/// says what to do if the DaemonSet was in fact deleted.
#[test]
fn when_the_api_cannot_tell_the_installer_leaves_the_plugin_chained_on_sigterm() {
    for mode in [Mode::Silent, Mode::Down] {
        let (network, api, installer) = installed("dsunknown");
        api.state().mode = mode;
        let (status, took, log) = installer.terminate();
        assert!(status.success(), "{mode:?}: {status}: {log}");
        assert!(took < Duration::from_secs(8), "{mode:?}: {took:?}");
        assert_still_chained(&network);
        assert!(
            log.contains("cannot tell whether the DaemonSet is being deleted"),
            "{mode:?}: {log}"
        );
        assert!(
            log.contains("`interceptor cni uninstall`"),
            "{mode:?}: {log}"
        );
    }
}

/// `kubectl delete -k` deletes the DaemonSet's Role, RoleBinding and ServiceAccount with it, so
/// at SIGTERM the API may refuse what it allowed at start (403, or 401 for a deleted account):
/// that is the DaemonSet being removed. An installer that was never allowed (its RBAC missing)
/// cannot tell, and leaves the plugin chained.
#[test]
fn access_withdrawn_since_start_unchains_the_plugin_but_access_never_granted_does_not() {
    for code in [403, 401] {
        let (network, api, installer) = installed("dswithdrawn");
        api.state().mode = Mode::Refuse(code);
        let (status, _, log) = installer.terminate();
        assert!(status.success(), "{code}: {status}: {log}");
        assert_unchained(&network);
        assert!(
            log.contains("the access to the DaemonSet was withdrawn"),
            "{code}: {log}"
        );
    }

    let network = CniNetwork::new("dsnever");
    let api = FakeApi::start(vec![daemonset(NAMESPACE, NAME)]);
    api.state().mode = Mode::Refuse(403);
    let installer = with_daemonset(&network, &api);
    installer.wait_for("refuses this pod its DaemonSet");
    assert_eq!(network.chained(), 1);
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
    assert_still_chained(&network);
    assert!(log.contains("`interceptor cni uninstall`"), "{log}");
}

/// A kubeconfig that cannot be read is refused before anything is installed; `--daemonset`
/// takes NAMESPACE/NAME, and only with `--watch`.
#[test]
fn the_daemonset_option_is_checked_before_anything_is_installed() {
    let network = CniNetwork::new("dsbad");
    let missing = network.root.join("no-kubeconfig");
    let (status, log) = Installer::start(
        &network,
        &no_agent(&network),
        &[
            "--watch",
            "--daemonset",
            "interceptor/interceptor",
            "--kubeconfig",
            &missing.display().to_string(),
        ],
    )
    .exited();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("--daemonset interceptor/interceptor"), "{log}");
    assert!(log.contains(&missing.display().to_string()), "{log}");
    assert_eq!(network.chained(), 0);
    assert!(!network.bin_dir.join("interceptor-cni").exists());

    for args in [
        &["--watch", "--daemonset", "interceptor"][..],
        &["--watch", "--daemonset", "/interceptor"],
        &["--daemonset", "interceptor/interceptor"],
        &["--watch", "--kubeconfig", "/k"],
    ] {
        let (status, log) = Installer::start(&network, &no_agent(&network), args).exited();
        assert_eq!(status.code(), Some(2), "{args:?}: {log}");
    }
    assert_eq!(network.chained(), 0);
}
