//! `cargo xtask demo`: a self-contained demo of interception on this machine.
//!
//! The kit's throwaway dual-stack pod (`PodFixture`: a network namespace whose default routes
//! lead to a peer namespace that refuses everything, and a child cgroup, never the root cgroup),
//! a stand-in proxy as the proxy UID (outbound 127.0.0.1:4140 and [::1]:4140, inbound
//! 0.0.0.0:4143 and [::]:4143) and the app's server; then `interceptor run` meshes the pod and
//! the demo shows connects of both families (and IPv4 through an IPv6 socket) landing on the
//! proxy with the right original destination, the exemptions, the counters, and the detach.
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context as _, ensure};
use interceptor_tests::{
    PodFixture, Probe,
    agent_home::LINKERD_FLAGS,
    fixture::{POD_ADDR, POD_ADDR6, REMOTE_ADDR},
    meshed::{self, Meshed},
    probe::sibling_binary,
    program,
    scenario::{APP_UID, PROXY_UID},
};

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
            "landed on {}, SO_ORIGINAL_DST={}, peer={}",
            &who[6..],
            field("orig="),
            field("peer=")
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
