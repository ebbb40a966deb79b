//! `interceptor cni install --watch` keeps the plugin chained while the primary CNI rewrites its
//! configuration without it: the real binaries, a node's CNI directories of each test's own
//! (the kit's `CniNetwork`), rewritten as primaries rewrite them (a new file renamed over, as
//! Cilium with `cni.exclusive=true` does; a plain truncate and write; the whole directory
//! replaced, which inotify does not see). Each restore is a warning, counted by the agent in
//! `interceptor_cni_chain_restored_total`, and the third within ten minutes an error naming the
//! likely cause and its fix, once. An agent that is down or never answers costs the installer
//! nothing but the count, which it says was not delivered.
use std::{
    os::unix::net::UnixListener,
    path::Path,
    time::{Duration, Instant},
};

use interceptor_tests::{
    Cgroup,
    agent_home::{AgentHome, free_loopback_addr, http_get},
    cni_installer::Installer,
    cni_network::CniNetwork,
    eventually_eq, privileged,
};
use serde_json::{Value, json};

/// The installers' `--check-ms` here: long enough that a rewrite inotify reports is seen to be
/// put back well before the next check.
const CHECK: Duration = Duration::from_millis(2000);
/// How long a rewrite inotify reports may take to be put back on a busy machine: well under
/// [`CHECK`], so that only inotify can do it.
const ON_INOTIFY: Duration = Duration::from_millis(1000);
/// The restore's warning, and the error once restores keep happening.
const RESTORED: &str = "chained again";
const KEEPS_REWRITING: &str = "keeps rewriting its configuration without the CNI plugin";
const NOT_COUNTED: &str = "the agent was not told of this restore";

/// Cilium's configuration as its agent writes it, as a list of one.
fn cilium() -> Value {
    json!({"cniVersion": "0.3.1", "name": "cilium", "plugins": [
        {"type": "cilium-cni", "enable-debug": false, "log-file": "/var/run/cilium/cilium-cni.log"}]})
}

/// A watching installer (`--check-ms` [`CHECK`]), returned once it watches: rewrites made
/// before inotify watches would wait for the first check.
fn watching(network: &CniNetwork, agent_socket: &Path, extra: &[&str]) -> Installer {
    let check = CHECK.as_millis().to_string();
    let args = [&["--watch", "--check-ms", &check][..], extra].concat();
    let installer = Installer::start(network, agent_socket, &args);
    installer.logged(&["watching the CNI configuration"], 1);
    installer
}

/// SIGTERM: without --daemonset it removes what it added, then exits 0.
fn stop(installer: Installer) {
    let (status, _, log) = installer.terminate();
    assert!(status.success(), "{status}: {log}");
}

/// How the primary CNI rewrites its configuration, without our entry.
#[derive(Clone, Copy, Debug)]
enum Rewrite {
    /// A new file written beside it and renamed over it, as Cilium writes its own (and, with
    /// `cni.exclusive=true`, renames every other configuration to `*.cilium_bak`).
    RenameOver,
    /// Truncated and written in place.
    InPlace,
    /// The whole conf directory replaced by another holding the new file: the directory inotify
    /// watched is gone from the path, so only the periodic check sees it.
    DirectoryReplaced,
}

impl Rewrite {
    fn apply(self, network: &CniNetwork, primary: &Value, round: usize) {
        let path = &network.primary_path;
        let text = primary.to_string();
        match self {
            Rewrite::RenameOver => {
                let tmp = path.with_extension("conflist.tmp");
                std::fs::write(&tmp, &text).unwrap();
                std::fs::rename(&tmp, path).unwrap();
                for entry in std::fs::read_dir(&network.conf_dir).unwrap().flatten() {
                    let other = entry.path();
                    let conf = other
                        .extension()
                        .is_some_and(|e| e == "conf" || e == "conflist");
                    if conf && other != *path {
                        let name = other.file_name().unwrap().to_string_lossy().into_owned();
                        std::fs::rename(&other, other.with_file_name(name + ".cilium_bak"))
                            .unwrap();
                    }
                }
            }
            Rewrite::InPlace => std::fs::write(path, &text).unwrap(),
            Rewrite::DirectoryReplaced => {
                let conf_dir = &network.conf_dir;
                let old = conf_dir.with_extension(format!("replaced-{round}"));
                let new = conf_dir.with_extension("new");
                std::fs::rename(conf_dir, &old).unwrap();
                std::fs::create_dir(&new).unwrap();
                std::fs::write(new.join(path.file_name().unwrap()), &text).unwrap();
                std::fs::rename(&new, conf_dir).unwrap();
            }
        }
    }

    /// How long the installer may take to put the entry back.
    fn limit(self) -> Duration {
        match self {
            Rewrite::RenameOver | Rewrite::InPlace => ON_INOTIFY,
            Rewrite::DirectoryReplaced => CHECK + Duration::from_secs(1),
        }
    }
}

/// Rewrites the primary configuration, and asserts the installer put our entry back (once) within
/// the rewrite's limit. That it was gone in between, the caller checks by the restores counted.
fn rewrite_and_wait(
    installer: &Installer,
    network: &CniNetwork,
    primary: &Value,
    round: usize,
    how: Rewrite,
) {
    let rewritten = Instant::now();
    how.apply(network, primary, round);
    while network.chained() != 1 {
        assert!(
            rewritten.elapsed() < how.limit(),
            "rewrite {round} ({how:?}) not put back within {:?}:\n{}",
            how.limit(),
            installer.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let plugins = network.conflist()["plugins"].clone();
    assert_eq!(
        plugins[0], primary["plugins"][0],
        "the primary's own plugin kept"
    );
    assert_eq!(plugins.as_array().unwrap().len(), 2, "{plugins}");
}

/// The agent's `interceptor_cni_chain_restored_total`.
fn restored_total(metrics_addr: &str) -> u64 {
    let (status, body) = http_get(metrics_addr, "/metrics");
    assert!(status.contains("200"), "{status}");
    body.lines()
        .find_map(|l| l.strip_prefix("interceptor_cni_chain_restored_total "))
        .unwrap_or_else(|| panic!("no interceptor_cni_chain_restored_total in:\n{body}"))
        .trim()
        .parse()
        .expect("a count")
}

/// Cilium's configuration rewritten five ways while the installer watches, with an agent: each
/// time the entry is back (on inotify, or within the check for a replaced directory, whose
/// replacement is then watched), the agent counts it, the third brings the error naming
/// Cilium's `cni.exclusive` once, and with the agent killed the fifth is put back all the same
/// and logged as not counted.
#[test]
fn the_installer_puts_back_what_cilium_rewrites_and_the_agent_counts_it() {
    if !privileged() {
        return;
    }
    let cgroup = Cgroup::new("chainkept");
    let home = AgentHome::new(&cgroup.path);
    let metrics = free_loopback_addr();
    let agent = home.agent().args(&["--metrics-addr", &metrics]).start();
    let network = CniNetwork::with_stand_ins("chainkept", "05-cilium.conflist", &cilium());
    std::fs::write(
        network.conf_dir.join("10-calico.conflist"),
        json!({"cniVersion": "0.3.1", "name": "k8s-pod-network", "plugins": [{"type": "calico"}]})
            .to_string(),
    )
    .unwrap();
    let installer = watching(&network, &home.socket(), &[]);
    eventually_eq("chained at start", 1, || network.chained());
    installer.logged(&["CNI plugin chained"], 1);
    assert_eq!(
        restored_total(&metrics),
        0,
        "the first install is no restore"
    );
    let conf = network.primary_path.display().to_string();

    let rounds = [
        Rewrite::RenameOver,
        Rewrite::InPlace,
        Rewrite::DirectoryReplaced,
        Rewrite::RenameOver,
    ];
    for (round, how) in rounds.into_iter().enumerate() {
        let restores = round + 1;
        rewrite_and_wait(&installer, &network, &cilium(), restores, how);
        eventually_eq(
            "interceptor_cni_chain_restored_total",
            restores as u64,
            || restored_total(&metrics),
        );
        installer.logged(&[RESTORED, &conf], restores);
        let error = [
            KEEPS_REWRITING,
            &conf,
            "Cilium rewrites its CNI configuration (cni.exclusive=true): install Cilium with --set cni.exclusive=false",
        ];
        installer.logged(&error, usize::from(restores >= 3));
        if restores == 1 {
            assert!(
                !network.conf_dir.join("10-calico.conflist").exists()
                    && network
                        .conf_dir
                        .join("10-calico.conflist.cilium_bak")
                        .exists(),
                "renamed as Cilium renames it"
            );
        }
    }
    assert_eq!(
        installer.lines_with(&[NOT_COUNTED]),
        0,
        "{}",
        installer.log()
    );

    // The agent down: the entry is put back all the same, and the count said not delivered.
    agent.kill();
    rewrite_and_wait(&installer, &network, &cilium(), 5, Rewrite::InPlace);
    installer.logged(&[RESTORED, &conf], 5);
    installer.logged(
        &[NOT_COUNTED, &conf, &home.socket().display().to_string()],
        1,
    );
    installer.logged(&[KEEPS_REWRITING], 1);

    stop(installer);
    assert_eq!(network.conflist(), cilium(), "uninstalled on SIGTERM");
}

/// A primary of reference plugins (loopback), with an agent that takes connections and never
/// answers: three rewrites in a row are each put back on inotify, none waiting for the agent;
/// each count is logged as not delivered once its deadline passes; the error names the
/// primary's plugins, not Cilium.
#[test]
fn an_agent_that_never_answers_holds_up_no_restore_and_the_error_names_the_primarys_plugins() {
    let network = CniNetwork::new("chainsilent");
    let socket = network.root.join("agent.sock");
    // Never accepted: connections wait in the backlog, their requests unread.
    let _silent = UnixListener::bind(&socket).unwrap();
    let installer = watching(&network, &socket, &[]);
    eventually_eq("chained at start", 1, || network.chained());
    let conf = network.primary_path.display().to_string();
    let primary = CniNetwork::primary();
    for (round, how) in [Rewrite::InPlace, Rewrite::RenameOver, Rewrite::InPlace]
        .into_iter()
        .enumerate()
    {
        rewrite_and_wait(&installer, &network, &primary, round + 1, how);
    }
    installer.logged(&[RESTORED, &conf], 3);
    installer.logged(&[NOT_COUNTED, &conf, "did not answer within 2000 ms"], 3);
    installer.logged(
        &[
            KEEPS_REWRITING,
            "the installer of the primary CNI (plugins: loopback) keeps rewriting",
        ],
        1,
    );
    assert_eq!(installer.lines_with(&["Cilium"]), 0, "{}", installer.log());
    stop(installer);
    assert_eq!(network.conflist(), primary, "uninstalled on SIGTERM");
}

/// The installer's report of the chain (`--chain-report`), which the agent's readiness goes by:
/// not chained, with the installer's reason, while the primary's plugin is missing from the bin
/// directory; chained into the primary's configuration once it is there (and still after a
/// restore); gone once the installer removes the plugin.
#[test]
fn the_installer_reports_whether_the_plugin_is_chained() {
    use interceptor::agent::api::node_status::ChainReport;
    let network = CniNetwork::new("chainreport");
    let loopback = network.bin_dir.join("loopback");
    let kept = network.root.join("loopback");
    std::fs::rename(&loopback, &kept).unwrap();
    // In a directory not there yet, as the agent's state directory before the agent runs.
    let report = network.root.join("state").join("cni-chain.json");
    let installer = watching(
        &network,
        &network.root.join("agent.sock"),
        &["--chain-report", &report.display().to_string()],
    );
    let read = || ChainReport::read(&report).ok();
    eventually_eq("reported not chained", Some(false), || {
        read().map(|r| r.chained)
    });
    let reason = read().unwrap().reason.unwrap_or_default();
    assert!(reason.contains("loopback"), "{reason}");
    assert_eq!(network.chained(), 0);

    // The primary's plugin appears: chained, and reported so.
    std::fs::rename(&kept, &loopback).unwrap();
    let chained = Some(ChainReport::chained(&network.primary_path));
    eventually_eq("reported chained", chained.clone(), read);
    assert_eq!(network.chained(), 1);
    rewrite_and_wait(
        &installer,
        &network,
        &CniNetwork::primary(),
        1,
        Rewrite::InPlace,
    );
    assert_eq!(read(), chained, "still chained after a restore");

    stop(installer);
    assert_eq!(
        network.conflist(),
        CniNetwork::primary(),
        "uninstalled on SIGTERM"
    );
    assert!(!report.exists(), "the report goes with the plugin");
}
