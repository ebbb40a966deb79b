//! `cargo xtask demo`: a self-contained demo of interception on this machine, as it is used.
//!
//! The kit's throwaway dual-stack pod (`PodFixture`: a network namespace whose default routes
//! lead to a peer namespace that refuses everything, and a child cgroup, never the root cgroup),
//! a stand-in proxy as the proxy UID (outbound 127.0.0.1:4140 and [::1]:4140, inbound
//! 0.0.0.0:4143 and [::]:4143) and the app's server. Part 1 meshes the pod as a node does: the
//! node agent, the CNI plugin chained into a node network of the demo's own, the pod (injected
//! by Linkerd) and a second one that was not added and deleted through it, an agent restart
//! under load, the metrics. Part 2 meshes it with
//! `interceptor run` and shows connects of both families (and IPv4 through an IPv6 socket)
//! landing on the proxy with the right original destination, the exemptions, the counters, and
//! the detach.
use std::{
    path::Path,
    process::{Command, ExitCode, Stdio},
    time::Duration,
};

use anyhow::{Context as _, ensure};
use interceptor_tests::{
    PodFixture, Probe,
    agent_home::{
        AgentHome, LINKERD_FLAGS, all_reached_the_proxy, check_load, free_loopback_addr, http_get,
    },
    cni_network::{CniNetwork, injected},
    fixture::{POD_ADDR, POD_ADDR6, REMOTE_ADDR},
    meshed::{self, Meshed},
    probe::sibling_binary,
    program,
    scenario::{APP_UID, PROXY_UID},
};
use serde_json::json;

fn main() -> ExitCode {
    program::main(run)
}

fn run() -> anyhow::Result<()> {
    if std::env::args().len() > 1 {
        anyhow::bail!("the demo takes no arguments");
    }
    let interceptor = sibling_binary("interceptor");
    let pod = PodFixture::new("demo");
    let (proxy, app) = (pod.in_pod().uid(PROXY_UID), pod.in_pod().uid(APP_UID));
    // One socket per family, as Linkerd's proxy listens ([::] with IPV6_V6ONLY).
    let listen = |probe: &Probe, role, [v4, v6]: [&str; 2], name| {
        probe.listen(&[role, v4, v6, "--v6only", "--name", name])
    };
    let _listeners = [
        listen(
            &proxy,
            "proxy",
            ["127.0.0.1:4140", "[::1]:4140"],
            "proxy-outbound",
        ),
        listen(
            &proxy,
            "proxy",
            ["0.0.0.0:4143", "[::]:4143"],
            "proxy-inbound",
        ),
        listen(&app, "server", ["0.0.0.0:8080", "[::]:8080"], "app"),
        listen(
            &proxy,
            "server",
            ["0.0.0.0:4191", "[::]:4191"],
            "proxy-admin",
        ),
    ];

    node_agent(&interceptor, &pod, &app)?;

    println!("\n\n# Part 2: one pod meshed on its own, with `interceptor run`");
    step(
        "A pod",
        &format!(
            "network namespace {} ({POD_ADDR} and {POD_ADDR6}, default routes to a peer namespace that refuses everything),\n  \
         cgroup {},\n  a stand-in proxy as UID {PROXY_UID} on 127.0.0.1:4140 and [::1]:4140 (outbound), :4143 of both families (inbound), the app on :8080.",
            pod.pod.path().display(),
            pod.cgroup.path.display()
        ),
    );
    step(
        "Before meshing",
        &format!("the app (UID {APP_UID}) connects to Linkerd's validator address 192.0.2.2:1404"),
    );
    connect(&app, "app", "192.0.2.2:1404");

    let mut flags = LINKERD_FLAGS.to_vec();
    flags.extend(["--outbound-ports-to-ignore", "443,6443"]);
    step(
        "Meshing",
        &format!(
            "{} run --netns {} --cgroup {} {}",
            interceptor.display(),
            pod.pod.path().display(),
            pod.cgroup.path.display(),
            flags.join(" ")
        ),
    );
    let instance = pod.pod.name.clone();
    let mut args = meshed::run_args(&pod, &instance);
    args.extend(
        ["--mode", "ebpf"]
            .iter()
            .chain(&flags)
            .map(|a| a.to_string()),
    );
    let meshed = Meshed::start(&interceptor, &instance, &args, Stdio::inherit());

    step(
        "Outbound",
        "the same connect lands on the proxy, whose getsockopt(SO_ORIGINAL_DST) reports where the app meant to go",
    );
    connect(&app, "app", "192.0.2.2:1404");
    connect(&app, "app", "198.51.100.7:80");
    step(
        "Outbound, IPv6 and IPv4 through an IPv6 socket",
        "native IPv6 lands on the proxy's [::1]:4140 (SOL_IPV6 original destination); an AF_INET6 socket connecting to an IPv4-mapped address is IPv4 and is intercepted too",
    );
    connect(&app, "app", "[2001:db8::2]:1404");
    connect(&app, "app", "[::ffff:192.0.2.2]:1404");
    step(
        "Outbound exemptions",
        "an ignored port (443), the proxy's own UID, loopback and the pod's own address",
    );
    connect(&app, "app", "198.51.100.7:443");
    connect(&proxy, "proxy UID", "192.0.2.2:1404");
    connect(&app, "app", "127.0.0.1:8080");
    connect(&app, "app", &format!("{POD_ADDR}:8080"));
    step(
        "Inbound",
        &format!(
            "a client ({REMOTE_ADDR}) connects to the app; sk_lookup hands it to the proxy's inbound listener"
        ),
    );
    let client = pod.on_remote();
    connect(&client, "client", &format!("{POD_ADDR}:8080"));
    connect(&client, "client", &format!("[{POD_ADDR6}]:8080"));
    connect(&client, "client", &format!("{POD_ADDR}:4191"));

    step(
        "Status",
        &format!("{} status --instance {instance}", interceptor.display()),
    );
    let status = Command::new(&interceptor)
        .args(["status", "--instance", &instance])
        .status()
        .with_context(|| format!("could not start {}", interceptor.display()))?;
    ensure!(status.success(), "interceptor status failed ({status})");

    step(
        "Detaching",
        "SIGTERM to interceptor run: programs detach, connections go direct again",
    );
    let (status, _) = meshed.stop();
    ensure!(status.success(), "interceptor run exited with {status}");
    connect(&app, "app", "192.0.2.2:1404");
    connect(&client, "client", &format!("{POD_ADDR}:8080"));
    println!("\nDemo done; the namespaces and the cgroup are removed.");
    Ok(())
}

/// Part 1: the pod meshed as a cluster node meshes its pods: one agent for the node, the CNI
/// plugin chained into the node's network by its installer, the pod added by the runtime
/// through that network, an agent restart under load, the metrics, and the pod's deletion.
fn node_agent(interceptor: &Path, pod: &PodFixture, app: &Probe) -> anyhow::Result<()> {
    println!("# Part 1: the node agent and the CNI plugin, as a Kubernetes node runs them");
    let home = AgentHome::new(&pod.cgroup.path).with_binary(interceptor.to_owned());
    let metrics = free_loopback_addr();
    step(
        "The node agent",
        &format!(
            "{} daemon --cgroup {} --bpffs {} --state-dir {} --metrics-addr {metrics}\n  \
             one agent for every pod of the node: its programs attach once, to the pods' cgroup",
            interceptor.display(),
            pod.cgroup.path.display(),
            home.bpffs.display(),
            home.state_dir.display()
        ),
    );
    let agent = home
        .agent()
        .args(&["--metrics-addr", &metrics])
        .log_shown()
        .start();

    let network = CniNetwork::new("demo-node");
    let plugin = sibling_binary("interceptor-cni");
    // IPv6 on, as where Linkerd's disableIPv6 is false: the restart's load connects over both.
    let linkerd = r#"{"outbound-ports-to-ignore": ["443"], "ipv6": true}"#;
    step(
        "The CNI plugin",
        &format!(
            "{} cni install --conf-dir {} --bin-dir {} --agent-socket {} --linkerd '{linkerd}'\n  \
             chains interceptor-cni into the node's primary network (here loopback only), as the DaemonSet's installer does",
            interceptor.display(),
            network.conf_dir.display(),
            network.bin_dir.display(),
            home.socket().display()
        ),
    );
    let installed = network
        .install(interceptor, &plugin, &home.socket())
        .args(["--linkerd", linkerd])
        .status()
        .context("running cni install")?;
    ensure!(installed.success(), "cni install failed ({installed})");
    let chain: Vec<String> = network.conflist()["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["type"].as_str().unwrap_or("?").to_owned())
        .collect();
    println!("  the node's network now runs: {}", chain.join(" -> "));

    step(
        "The runtime starts two pods",
        "CNI ADD through the chain, before any container of a pod runs, with the pod's annotations as containerd passes them:\n  \
         web was injected by Linkerd (linkerd.io/proxy-version): the plugin registers it and answers once interception is in force;\n  \
         plain was not: the plugin passes it through untouched, and its connections go where they were sent",
    );
    network
        .add("web", &pod.pod.path(), &injected())
        .map_err(|e| anyhow::anyhow!("CNI ADD of web: {e}"))?;
    // The same node cgroup, where the agent's programs are attached: only the decision differs.
    let plain = PodFixture::new("demo-plain").share_cgroup_with(pod);
    let _destination =
        plain
            .on_remote()
            .listen(&["server", "192.0.2.2:1404", "--name", "real-destination"]);
    network
        .add("plain", &plain.pod.path(), &json!({ "app": "plain" }))
        .map_err(|e| anyhow::anyhow!("CNI ADD of plain: {e}"))?;
    print_output(home.cli(&["pod", "list"]));
    connect(app, "web app", "192.0.2.2:1404");
    connect(app, "web app", "198.51.100.7:443");
    connect(&pod.on_remote(), "client", &format!("{POD_ADDR}:8080"));
    connect(&plain.in_pod().uid(APP_UID), "plain app", "192.0.2.2:1404");

    step(
        "The agent restarts",
        "SIGKILL to the agent while the app connects without pause, then a new agent: the kernel keeps interception in force in between, and the new agent takes the pod back from the pins and its record",
    );
    let lines = std::thread::scope(|s| {
        let load = s.spawn(|| check_load(app, "3"));
        std::thread::sleep(Duration::from_secs(1));
        agent.kill();
        println!("  agent killed");
        std::thread::sleep(Duration::from_millis(500));
        let agent = home
            .agent()
            .args(&["--metrics-addr", &metrics])
            .log_shown()
            .start();
        (load.join(), agent)
    });
    let (load, agent) = lines;
    let count = all_reached_the_proxy(&load.map_err(|_| anyhow::anyhow!("the app's load failed"))?);
    println!(
        "  {count} connections during the restart, every one on the proxy with its original destination"
    );

    step(
        "Metrics",
        &format!(
            "GET http://{metrics}/metrics: the meshed pod's decisions, the pods registered and skipped"
        ),
    );
    let (_, body) = http_get(&metrics, "/metrics");
    for line in body.lines().filter(|l| {
        l.starts_with("interceptor_pods_registered")
            || l.starts_with("interceptor_cni_pods_skipped_total")
            || (l.contains("pod=\"web\"") && !l.ends_with(" 0"))
    }) {
        println!("  {line}");
    }

    step(
        "The runtime deletes the pods",
        "CNI DEL: the plugin unregisters web, and its connections go direct again (plain had nothing to remove)",
    );
    network
        .del("web", &pod.pod.path())
        .map_err(|e| anyhow::anyhow!("CNI DEL of web: {e}"))?;
    network
        .del("plain", &plain.pod.path())
        .map_err(|e| anyhow::anyhow!("CNI DEL of plain: {e}"))?;
    // The loopback plugin's DEL set the namespace's lo down; a runtime would delete the
    // namespace now, part 2 reuses it.
    pod.pod.ip(&["link", "set", "lo", "up"]);
    connect(app, "app", "192.0.2.2:1404");
    let uninstalled = Command::new(interceptor)
        .args(["cni", "uninstall", "--conf-dir"])
        .arg(&network.conf_dir)
        .arg("--bin-dir")
        .arg(&network.bin_dir)
        .status()
        .context("running cni uninstall")?;
    ensure!(
        uninstalled.success(),
        "cni uninstall failed ({uninstalled})"
    );
    agent.stop();
    println!("  plugin uninstalled, agent stopped; its pins are removed with its directories");
    Ok(())
}

fn print_output(out: std::process::Output) {
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

/// One connection from `process` (shown as `who`) to `target`, and where it landed.
fn connect(process: &Probe, who: &str, target: &str) {
    let lines = process.run(&["connect", target]);
    let line = lines.first().map_or("", String::as_str);
    println!("  {who:>9} -> {target:<24} {}", describe(line));
}

/// Turns netprobe's `who=... orig=... peer=...` line into a sentence.
fn describe(line: &str) -> String {
    if let Some(error) = line.strip_prefix("error=") {
        return format!("not intercepted: {error} (refused by the real destination)");
    }
    let field = |key: &str| {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(key))
            .unwrap_or("?")
    };
    let who = field("who=");
    if who.starts_with("proxy:proxy-") {
        format!(
            "landed on {}, SO_ORIGINAL_DST={}, peer={}; the app's getpeername()={}",
            &who[6..],
            field("orig="),
            field("peer="),
            field("app_peer=")
        )
    } else {
        format!(
            "reached {} directly",
            &who[who.find(':').map_or(0, |i| i + 1)..]
        )
    }
}

fn step(title: &str, text: &str) {
    println!("\n== {title}\n  {text}");
}
