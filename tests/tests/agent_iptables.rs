//! The node agent with the iptables backend (`daemon --mode iptables`), as it runs where the eBPF
//! programs cannot load: each pod registered through `pod add` or the CNI plugin gets proxy-init's
//! chains in its own namespace, the contract holds (outbound on the proxy with its original
//! destination from conntrack, inbound on the inbound port, the proxy's UID exempt), a restart
//! keeps the pods without writing again what is in force, removal takes the chains away, and an
//! eBPF agent takes the pods over (and an iptables agent back) with no connection bypassing the
//! proxy. Each test has its own agent, state directory, bpffs directory, namespaces and cgroup.
use std::{path::Path, process::Command, time::Duration};

use interceptor::ebpf::features::{FEATURES_ENV, KernelFeatures};
use interceptor_tests::{
    Landing, PodFixture,
    agent_home::{
        AgentHome, UNREACHABLE, all_reached_the_proxy, check_load, free_loopback_addr, http_get,
        stderr,
    },
    cni_network::{CniNetwork, injected},
    privileged,
    scenario::{APP_UID, Servers, assert_meshed},
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");
const PLUGIN: &str = env!("CARGO_BIN_EXE_interceptor-cni-under-test");

/// The pod's nat table as `save` (`iptables-legacy-save`, `ip6tables-legacy-save`) lists it,
/// with each rule's packet counters when `counters`.
fn nat(pod: &Path, save: &str, counters: bool) -> String {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", pod.display()))
        .arg(save)
        .args(["-t", "nat"]);
    if counters {
        cmd.arg("-c");
    }
    let out = cmd.output().expect("run iptables-save");
    assert!(out.status.success(), "{save}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// How many jumps to `chain` there are from `from` in the listing.
fn jumps(listing: &str, from: &str, chain: &str) -> usize {
    listing
        .lines()
        .filter(|l| l.contains(&format!("-A {from} ")) && l.ends_with(&format!("-j {chain}")))
        .count()
}

/// proxy-init's chains are in the pod, once, in both families.
fn assert_chains_once(pod: &Path) {
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let listing = nat(pod, save, false);
        assert_eq!(
            jumps(&listing, "PREROUTING", "PROXY_INIT_REDIRECT"),
            1,
            "{save}:\n{listing}"
        );
        assert_eq!(
            jumps(&listing, "OUTPUT", "PROXY_INIT_OUTPUT"),
            1,
            "{save}:\n{listing}"
        );
        assert!(
            listing.contains("proxy-init/redirect-all-outgoing-to-proxy-port"),
            "{save}:\n{listing}"
        );
    }
}

fn assert_no_chains(pod: &Path) {
    for save in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let listing = nat(pod, save, false);
        assert!(!listing.contains("PROXY_INIT"), "{save}:\n{listing}");
    }
}

/// The packets the outbound redirect rule has matched: reset if the chain is written again.
fn redirected_packets(pod: &Path) -> u64 {
    let listing = nat(pod, "iptables-legacy-save", true);
    let line = listing
        .lines()
        .find(|l| l.contains("redirect-all-outgoing-to-proxy-port"))
        .unwrap_or_else(|| panic!("no outbound redirect rule:\n{listing}"));
    line.trim_start_matches('[')
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counters on {line}"))
}

fn pod_path(fixture: &PodFixture) -> String {
    fixture.pod.path().display().to_string()
}

#[test]
fn an_iptables_agent_meshes_pods_with_proxy_inits_chains_through_restarts() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aipt");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let addr = free_loopback_addr();
    let args = ["--mode", "iptables", "-w", "--metrics-addr", &addr];
    let agent = home.agent().args(&args).start();
    home.mesh(
        &fixture.pod.path(),
        &["--name", "web", "--namespace", "shop"],
    );
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);
    assert!(
        !home.bpffs.join("link_icpt_connect4").exists(),
        "nothing of eBPF is loaded"
    );

    let pods = home.pods();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["backend"], "iptables");
    assert_eq!(pods[0]["meta"]["name"], "web");
    for absent in ["counters", "slot", "inbound_listener"] {
        assert!(pods[0].get(absent).is_none(), "{absent}: {:#}", pods[0]);
    }
    assert!(home.problems().is_empty(), "{:?}", home.problems());

    let (_, body) = http_get(&addr, "/metrics");
    for line in [
        r#"interceptor_backend_info{backend="iptables"} 1"#,
        r#"interceptor_pods_registered{backend="iptables"} 1"#,
        r#"interceptor_pod_registration_seconds_count{backend="iptables"} 1"#,
    ] {
        assert!(body.contains(line), "{line} not in:\n{body}");
    }
    for absent in ["interceptor_decisions_total{", "interceptor_map_entries"] {
        assert!(!body.contains(absent), "{absent} in:\n{body}");
    }
    let (status, _) = http_get(&addr, "/ready");
    assert!(status.contains(" 200 "), "{status}");

    // A restart: the chains in force are left as they are (their counters go on), not written
    // again, and the pod is the same.
    let packets = redirected_packets(&fixture.pod.path());
    assert!(packets >= 1);
    // Only its names change: nothing is written again.
    home.mesh(
        &fixture.pod.path(),
        &["--name", "web2", "--namespace", "shop"],
    );
    assert_eq!(home.pods()[0]["meta"]["name"], "web2");
    assert_eq!(redirected_packets(&fixture.pod.path()), packets);
    agent.kill();
    let log = home.log_path();
    let agent = home.agent().args(&args).log_to(&log).start();
    assert_eq!(home.pods()[0]["netns_cookie"], pods[0]["netns_cookie"]);
    assert_eq!(redirected_packets(&fixture.pod.path()), packets);
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);
    let restart_log = std::fs::read_to_string(&log).unwrap();
    assert!(!restart_log.contains("written again"), "{restart_log}");

    // Chains removed while no agent ran are written again by the next one.
    agent.kill();
    let cleanup = Command::new(BIN)
        .args(["iptables-cleanup", "-w", "--netns", &pod_path(&fixture)])
        .output()
        .unwrap();
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    assert_no_chains(&fixture.pod.path());
    let agent = home.agent().args(&args).log_to(&log).start();
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);
    let repair_log = std::fs::read_to_string(&log).unwrap();
    assert!(repair_log.contains("written again"), "{repair_log}");
    assert!(home.problems().is_empty(), "{:?}", home.problems());

    // Chains removed while the agent runs: reported, and written again by a registration.
    let cleanup = Command::new(BIN)
        .args(["iptables-cleanup", "-w", "--netns", &pod_path(&fixture)])
        .output()
        .unwrap();
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    let problems = home.problems();
    assert!(
        problems.len() == 1 && problems[0].contains("iptables chains are missing"),
        "{problems:?}"
    );
    home.mesh(
        &fixture.pod.path(),
        &["--name", "web2", "--namespace", "shop"],
    );
    assert_chains_once(&fixture.pod.path());
    assert!(home.problems().is_empty(), "{:?}", home.problems());

    // Removed: the chains are gone and the app's connects go where they were going.
    let removed = home.cli(&["pod", "remove", "--netns", &pod_path(&fixture)]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(home.pods().is_empty());
    assert_no_chains(&fixture.pod.path());
    assert_eq!(
        fixture.in_pod().uid(APP_UID).connect(UNREACHABLE),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    agent.stop();
}

#[test]
fn an_iptables_agent_meshes_pods_added_through_the_cni_plugin() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aiptcni");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home.agent().args(&["--mode", "iptables", "-w"]).start();
    let network = CniNetwork::new("aiptcni-node");
    let installed = network
        .install(Path::new(BIN), Path::new(PLUGIN), &home.socket())
        // IPv6 too (ip6tables chains, checked below): the plugin's default is off.
        .args([
            "--linkerd",
            r#"{"inbound-ports-to-ignore": ["4190", "4191"], "ipv6": true}"#,
        ])
        .output()
        .unwrap();
    assert!(installed.status.success(), "{}", stderr(&installed));

    // As the kubelet does, ADD (and DEL) are tried again when they say "try again later" (11):
    // in the kernel matrix's emulated guests, with the other tests' iptables runs queued on the
    // xtables lock (-w), writing the chains of both families can take longer than the plugin
    // waits (15 s); the agent finishes the registration meanwhile, and a later ADD finds it.
    let as_the_kubelet = |what: &str, call: &dyn Fn() -> Result<(), String>| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        let mut attempts = 0;
        loop {
            attempts += 1;
            match call() {
                Ok(()) => return,
                Err(e) if e.contains(r#""code":11"#) && std::time::Instant::now() < deadline => {
                    eprintln!("{what} {attempts}: {e}");
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    };
    as_the_kubelet("ADD", &|| {
        network
            .add("web", &fixture.pod.path(), &injected())
            .map(drop)
    });
    let pods = home.pods();
    assert_eq!(pods.len(), 1, "{pods:#?}");
    assert_eq!(pods[0]["backend"], "iptables");
    assert_eq!(pods[0]["meta"]["namespace"], "shop");
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);

    as_the_kubelet("DEL", &|| network.del("web", &fixture.pod.path()));
    assert!(home.pods().is_empty());
    assert_no_chains(&fixture.pod.path());
    agent.stop();
}

/// An agent upgraded onto a kernel that loads eBPF (here: started with `--mode ebpf`) takes
/// over the pods an iptables agent meshed: registered in the maps first, their chains removed
/// after, under load, with no connection bypassing the proxy. An iptables agent started after it
/// (a downgrade) writes their chains again and leaves the pinned eBPF state alone.
#[test]
fn an_ebpf_agent_takes_over_the_pods_an_iptables_agent_meshed() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aiptup");
    let _servers = Servers::start(&fixture);
    let home = AgentHome::new(&fixture.cgroup.path);
    let iptables_agent = home.agent().args(&["--mode", "iptables", "-w"]).start();
    home.mesh(&fixture.pod.path(), &["--name", "web"]);
    assert_chains_once(&fixture.pod.path());
    let cookie = home.pods()[0]["netns_cookie"].clone();
    iptables_agent.stop();

    let app = fixture.in_pod().uid(APP_UID);
    let log = home.log_path();
    let (lines, ebpf_agent) = std::thread::scope(|s| {
        // Longer than the agents' tests' loads: loading the programs as well as taking the
        // pods back must fit in it, also on a busy machine.
        let load = s.spawn(|| check_load(&app, "6"));
        std::thread::sleep(Duration::from_millis(200));
        let agent = home.agent().args(&["--mode", "ebpf"]).log_to(&log).start();
        assert!(!load.is_finished(), "the load outlasts the takeover");
        (load.join().expect("load"), agent)
    });
    all_reached_the_proxy(&lines);
    assert_no_chains(&fixture.pod.path());
    let pods = home.pods();
    assert_eq!(pods[0]["backend"], "ebpf");
    assert_eq!(pods[0]["netns_cookie"], cookie);
    assert_eq!(pods[0]["inbound_listener"], true, "{:#}", pods[0]);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("took over a pod from iptables"),
        "{log_text}"
    );
    let before = pods[0]["counters"]["outbound_redirected"].as_u64().unwrap();
    assert_meshed(&fixture);
    let after = &home.pods()[0]["counters"];
    assert!(
        after["outbound_redirected"].as_u64().unwrap() > before,
        "the programs intercept now: {after}"
    );
    assert!(home.problems().is_empty(), "{:?}", home.problems());
    ebpf_agent.stop();

    // Back to iptables: chains again, the pinned programs left in place.
    let agent = home
        .agent()
        .args(&["--mode", "iptables", "-w"])
        .log_to(&log)
        .start();
    let pods: Vec<Value> = home.pods();
    assert_eq!(pods[0]["backend"], "iptables");
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);
    assert!(home.bpffs.join("link_icpt_connect4").exists());
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        log_text.contains("left alone"),
        "the pinned eBPF state is left alone, and said so: {log_text}"
    );
    agent.stop();
}

/// `daemon --mode auto` (the default) says in one line which backend it chose and why: eBPF
/// where every hook has a program variant this kernel can run, else iptables.
#[test]
fn an_agent_in_auto_mode_says_which_backend_and_why() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aiptauto");
    let home = AgentHome::new(&fixture.cgroup.path);
    let log = home.log_path();
    let agent = home.agent().args(&["--mode", "auto"]).log_to(&log).start();
    let health = interceptor::agent::api::health(&home.socket()).unwrap();
    let ebpf_runs_here = interceptor::ebpf::variants::choose(KernelFeatures::get()).is_ok();
    let expected = if ebpf_runs_here {
        interceptor::agent::api::Backend::Ebpf
    } else {
        interceptor::agent::api::Backend::Iptables
    };
    assert_eq!(health.backend, expected);
    agent.stop();
    let chosen = auto_mode_lines(&log);
    assert_eq!(chosen.len(), 1, "{chosen:?}");
    let name = if ebpf_runs_here { "ebpf" } else { "iptables" };
    assert!(
        chosen[0].contains("backend") && chosen[0].contains(name),
        "{chosen:?}"
    );
}

/// Where the eBPF programs cannot run (5.10 to 5.14 have no `bpf_get_netns_cookie` in
/// cgroup/getsockopt; here the feature is taken away, which changes nothing on such kernels),
/// `daemon --mode auto` says why in one line and meshes pods with proxy-init's chains.
#[test]
fn an_agent_in_auto_mode_meshes_pods_with_iptables_where_ebpf_cannot_run() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aiptfall");
    let _servers = Servers::start(&fixture);
    let home =
        AgentHome::new(&fixture.cgroup.path).with_env(FEATURES_ENV, "-netns_cookie_getsockopt");
    let log = home.log_path();
    let agent = home
        .agent()
        .args(&["--mode", "auto", "-w"])
        .log_to(&log)
        .start();
    let health = interceptor::agent::api::health(&home.socket()).unwrap();
    assert_eq!(health.backend, interceptor::agent::api::Backend::Iptables);
    home.mesh(&fixture.pod.path(), &[]);
    assert_chains_once(&fixture.pod.path());
    assert_meshed(&fixture);
    agent.stop();
    let chosen = auto_mode_lines(&log);
    assert_eq!(chosen.len(), 1, "{chosen:?}");
    assert!(
        chosen[0].contains("iptables") && chosen[0].contains("cgroup/getsockopt"),
        "the line names the backend and what the kernel lacks: {chosen:?}"
    );
}

/// The agent's log lines about the backend `--mode auto` chose.
fn auto_mode_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("auto mode"))
        .map(str::to_owned)
        .collect()
}

/// `--max-pods` bounds the iptables backend's pods as it bounds eBPF's: beyond it a pod is
/// refused with pod_table_full and nothing is written in it. `uninstall` removes the chains.
#[test]
fn an_iptables_agent_refuses_pods_beyond_max_pods_and_uninstall_removes_its_chains() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("aiptfull");
    let second = interceptor_tests::Netns::new("aiptfull2");
    let home = AgentHome::new(&fixture.cgroup.path);
    let agent = home
        .agent()
        .args(&["--mode", "iptables", "-w", "--max-pods", "1"])
        .start();
    home.mesh(&fixture.pod.path(), &[]);
    let refused = home.add(
        &second.path(),
        &[],
        &*interceptor_tests::agent_home::LINKERD_FLAGS,
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("PodTableFull") && stderr(&refused).contains("--max-pods"),
        "{}",
        stderr(&refused)
    );
    assert_no_chains(&second.path());
    assert_eq!(home.pods().len(), 1);
    agent.stop();

    // Uninstalled: the chains it wrote go with the records.
    let uninstalled = home.cli(&["uninstall"]);
    assert!(uninstalled.status.success(), "{}", stderr(&uninstalled));
    assert_no_chains(&fixture.pod.path());
    assert_eq!(home.records(), 0);
}
