//! The upgrade from the previous release, built from this repository's history by `cargo xtask
//! test` (xtask/src/upgrade.rs: the commit CHANGELOG.md records for the release before HEAD's),
//! and the rollback to it, as a DaemonSet's rolling update and `helm rollback` do them on a
//! node: the running agent gets SIGTERM, the other release's agent starts on the same bpffs and
//! state directory, while the pod's app connects without pause. Each backend in its own test.
use std::path::PathBuf;

use interceptor_tests::{
    PodFixture,
    agent_home::{Agent, AgentHome, UNREACHABLE, connections_while, interceptor_bin},
    privileged,
    probe::Landing,
    scenario::{APP_UID, Servers, assert_meshed},
};

/// The previous release's `interceptor` and what to call it, from `cargo xtask test`.
fn previous_release() -> Option<(PathBuf, String)> {
    let binary = std::env::var_os("INTERCEPTOR_PREVIOUS_RELEASE_BIN");
    let name = std::env::var("INTERCEPTOR_PREVIOUS_RELEASE").unwrap_or_default();
    match binary {
        Some(binary) => Some((binary.into(), name)),
        None if std::env::var("INTERCEPTOR_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") => {
            panic!(
                "the upgrade test needs the previous release: run it through `cargo xtask test \
                 --upgrade`, which builds it from this repository's history"
            )
        }
        None => {
            eprintln!(
                "SKIPPED: the upgrade test needs the previous release (`cargo xtask test --upgrade` \
                 builds it)"
            );
            None
        }
    }
}

/// The app's connections (both families) while `switch` replaces one agent with another.
fn connections_across(
    fixture: &PodFixture,
    switch: impl FnOnce() -> Agent,
) -> (Vec<String>, Agent) {
    let app = fixture.in_pod().uid(APP_UID);
    connections_while(&app, &[UNREACHABLE, "[2001:db8::2]:1404"], switch)
}

/// No connection reached its destination around the proxy; the proxy's `SO_ORIGINAL_DST` and the
/// app's `getpeername()` both name the address dialled. A connection recorded by the programs
/// being replaced in the very instant of a map-layout switch can miss its original destination
/// (the proxy refuses it: fails closed): at most one in a hundred.
fn assert_none_bypassed(lines: &[String], what: &str) {
    assert!(lines.len() > 100, "{what}: {} connections", lines.len());
    let bypassed: Vec<&String> = lines
        .iter()
        .filter(|l| !l.starts_with("who=proxy:outbound "))
        .collect();
    assert!(bypassed.is_empty(), "{what}: {bypassed:#?}");
    let right = |l: &&String| {
        ["192.0.2.2:1404", "[2001:db8::2]:1404"]
            .iter()
            .any(|dialled| {
                l.contains(&format!(" orig={dialled} "))
                    && l.ends_with(&format!(" app_peer={dialled}"))
            })
    };
    let wrong: Vec<&String> = lines.iter().filter(|l| !right(l)).collect();
    assert!(
        wrong.len() * 100 <= lines.len(),
        "{what}: {} of {} connections had another original destination or peer: {:#?}",
        wrong.len(),
        lines.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// The pinned map layouts in an agent's bpffs directory (`maps-vN`).
fn pinned_layouts(home: &AgentHome) -> Vec<String> {
    let mut layouts: Vec<String> = std::fs::read_dir(&home.bpffs)
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with("maps-v"))
                .collect()
        })
        .unwrap_or_default();
    layouts.sort();
    layouts
}

/// The pod's entry as an agent lists it, with what must not change across releases.
fn listed(home: &AgentHome) -> (String, serde_json::Value) {
    let pods = home.pods();
    assert_eq!(pods.len(), 1, "{pods:#?}");
    (
        pods[0]["meta"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        pods[0]["netns_cookie"].clone(),
    )
}

/// eBPF: the previous release meshes a pod and holds a connection open; this tree's agent takes
/// over under load (migrating the map layout where it changed), then the previous release takes
/// the node back as `helm rollback` would.
#[test]
fn an_ebpf_node_upgrades_from_the_previous_release_and_rolls_back() {
    if !privileged() {
        return;
    }
    let Some((previous, name)) = previous_release() else {
        return;
    };
    let fixture = PodFixture::new("upgebpf");
    let _servers = Servers::start(&fixture);
    let mut home = AgentHome::new(&fixture.cgroup.path).with_binary(previous.clone());
    let log = home.log_path();
    let old = home.agent().log_to(&log).start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    let before = listed(&home);
    let old_layouts = pinned_layouts(&home);
    assert_eq!(
        old_layouts.len(),
        1,
        "{name} pins one layout: {old_layouts:?}"
    );
    assert_meshed(&fixture);
    // Made under the previous release's programs, asked about under this tree's.
    let held = fixture.in_pod().uid(APP_UID).hold(UNREACHABLE);
    assert!(
        matches!(held.landing(), Landing::Proxy { ref name, orig: Ok(orig), .. }
            if name == "outbound" && orig.to_string() == UNREACHABLE),
        "{}",
        held.line
    );
    assert!(
        held.line.ends_with(&format!(" app_peer={UNREACHABLE}")),
        "{}",
        held.line
    );

    // The rolling update.
    let (lines, new) = connections_across(&fixture, || {
        old.stop();
        home.binary = interceptor_bin();
        home.agent().log_to(&log).start()
    });
    let upgrade_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_none_bypassed(&lines, &format!("upgrade from {name}"));
    assert_eq!(
        held.peer_now(),
        UNREACHABLE,
        "getpeername() of a connection made before the upgrade"
    );
    assert_eq!(listed(&home), before, "the pod is kept as it was");
    assert_eq!(home.pods()[0]["inbound_listener"], true, "{upgrade_log}");
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    let current = format!("maps-v{}", interceptor_common::MAP_LAYOUT_VERSION);
    assert_eq!(
        pinned_layouts(&home),
        [current],
        "no older layout stays pinned; the log:\n{upgrade_log}"
    );
    assert_meshed(&fixture);
    assert!(!upgrade_log.contains(" ERROR "), "{upgrade_log}");

    // The rollback.
    let held = fixture.in_pod().uid(APP_UID).hold(UNREACHABLE);
    let (lines, old) = connections_across(&fixture, || {
        new.stop();
        home.binary = previous.clone();
        home.agent().log_to(&log).start()
    });
    let rollback_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_none_bypassed(&lines, &format!("rollback to {name}"));
    assert_eq!(
        held.peer_now(),
        UNREACHABLE,
        "getpeername() of a connection made before the rollback"
    );
    assert_eq!(
        listed(&home),
        before,
        "the pod is kept as it was: {rollback_log}"
    );
    assert_eq!(pinned_layouts(&home), old_layouts, "{rollback_log}");
    assert_meshed(&fixture);
    old.stop();
    // Removed by this tree's CLI, as the home's clean-up does.
    home.binary = interceptor_bin();
}

/// proxy-init's chains: the previous release's iptables agent meshes a pod; this tree's agent
/// takes its record over without writing the chains again, and the previous release takes it
/// back.
#[test]
fn an_iptables_node_upgrades_from_the_previous_release_and_rolls_back() {
    if !privileged() {
        return;
    }
    let Some((previous, name)) = previous_release() else {
        return;
    };
    let fixture = PodFixture::new("upgipt");
    let _servers = Servers::start(&fixture);
    let mut home = AgentHome::new(&fixture.cgroup.path).with_binary(previous.clone());
    let log = home.log_path();
    let args = ["--mode", "iptables", "-w"];
    let old = home.agent().args(&args).log_to(&log).start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    let before = listed(&home);
    assert_meshed(&fixture);

    let (lines, new) = connections_across(&fixture, || {
        old.stop();
        home.binary = interceptor_bin();
        home.agent().args(&args).log_to(&log).start()
    });
    let upgrade_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_none_bypassed(&lines, &format!("upgrade from {name}"));
    assert_eq!(listed(&home), before, "the pod is kept as it was");
    assert_eq!(home.pods()[0]["backend"], "iptables");
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    assert!(
        !upgrade_log.contains("written again"),
        "the chains in force are kept: {upgrade_log}"
    );
    assert_meshed(&fixture);

    let (lines, old) = connections_across(&fixture, || {
        new.stop();
        home.binary = previous.clone();
        home.agent().args(&args).log_to(&log).start()
    });
    let rollback_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_none_bypassed(&lines, &format!("rollback to {name}"));
    assert_eq!(
        listed(&home),
        before,
        "the pod is kept as it was: {rollback_log}"
    );
    assert_meshed(&fixture);
    old.stop();
    home.binary = interceptor_bin();
}
