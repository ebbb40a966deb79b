//! `cargo xtask demo`: a self-contained demo of interception on this machine.
//!
//! A throwaway dual-stack pod (see `sandbox`), a stand-in proxy as the proxy UID (outbound
//! 127.0.0.1:4140 and [::1]:4140, inbound 0.0.0.0:4143 and [::]:4143) and the app's server; then
//! `interceptor run` meshes the pod and the demo shows connects of both families (and IPv4
//! through an IPv6 socket) landing on the proxy with the right original destination, the
//! exemptions, the counters, and the detach.
use std::process::Command;

use anyhow::ensure;

use crate::{
    cmd,
    sandbox::{APP_UID, PEER_ADDR, POD_ADDR, POD_ADDR6, PROXY_ARGS, PROXY_UID, Pod},
};

pub fn run() -> anyhow::Result<()> {
    let mut pod = Pod::create("demo", None)?;
    // One socket per family, as Linkerd's proxy listens ([::] with IPV6_V6ONLY).
    let listener = |uid: &str, role: &str, addrs: [&str; 2], name: &str| {
        let mut cmd = pod.probe(uid);
        cmd.arg(role).args(addrs).args(["--v6only", "--name", name]);
        cmd
    };
    let listeners = [
        listener(
            PROXY_UID,
            "proxy",
            ["127.0.0.1:4140", "[::1]:4140"],
            "proxy-outbound",
        ),
        listener(
            PROXY_UID,
            "proxy",
            ["0.0.0.0:4143", "[::]:4143"],
            "proxy-inbound",
        ),
        listener(APP_UID, "server", ["0.0.0.0:8080", "[::]:8080"], "app"),
        listener(
            PROXY_UID,
            "server",
            ["0.0.0.0:4191", "[::]:4191"],
            "proxy-admin",
        ),
    ];
    for cmd in listeners {
        pod.listen(cmd)?;
    }

    step(
        "A pod",
        &format!(
            "network namespace {} ({POD_ADDR} and {POD_ADDR6}, default routes to a peer namespace that refuses everything),\n  \
         cgroup {},\n  a stand-in proxy as UID {PROXY_UID} on 127.0.0.1:4140 and [::1]:4140 (outbound), :4143 of both families (inbound), the app on :8080.",
            pod.netns.display(),
            pod.cgroup.display()
        ),
    );
    step(
        "Before meshing",
        "the app (UID 1000) connects to Linkerd's validator address 192.0.2.2:1404",
    );
    app_connect(&pod, APP_UID, "192.0.2.2:1404")?;

    let mut args = PROXY_ARGS.to_vec();
    args.extend([
        "--inbound-ports-to-ignore",
        "4190,4191",
        "--outbound-ports-to-ignore",
        "443,6443",
    ]);
    step(
        "Meshing",
        &format!(
            "{} run --netns {} --cgroup {} {}",
            pod.interceptor.display(),
            pod.netns.display(),
            pod.cgroup.display(),
            args.join(" ")
        ),
    );
    pod.mesh_ebpf(&args)?;

    step(
        "Outbound",
        "the same connect lands on the proxy, whose getsockopt(SO_ORIGINAL_DST) reports where the app meant to go",
    );
    app_connect(&pod, APP_UID, "192.0.2.2:1404")?;
    app_connect(&pod, APP_UID, "198.51.100.7:80")?;
    step(
        "Outbound, IPv6 and IPv4 through an IPv6 socket",
        "native IPv6 lands on the proxy's [::1]:4140 (SOL_IPV6 original destination); an AF_INET6 socket connecting to an IPv4-mapped address is IPv4 and is intercepted too",
    );
    app_connect(&pod, APP_UID, "[2001:db8::2]:1404")?;
    app_connect(&pod, APP_UID, "[::ffff:192.0.2.2]:1404")?;
    step(
        "Outbound exemptions",
        "an ignored port (443), the proxy's own UID, loopback and the pod's own address",
    );
    app_connect(&pod, APP_UID, "198.51.100.7:443")?;
    app_connect(&pod, PROXY_UID, "192.0.2.2:1404")?;
    app_connect(&pod, APP_UID, "127.0.0.1:8080")?;
    app_connect(&pod, APP_UID, &format!("{POD_ADDR}:8080"))?;
    step(
        "Inbound",
        &format!(
            "a client ({PEER_ADDR}) connects to the app; sk_lookup hands it to the proxy's inbound listener"
        ),
    );
    client_connect(&pod, &format!("{POD_ADDR}:8080"))?;
    client_connect(&pod, &format!("[{POD_ADDR6}]:8080"))?;
    client_connect(&pod, &format!("{POD_ADDR}:4191"))?;

    step(
        "Status",
        &format!(
            "{} status --instance {}",
            pod.interceptor.display(),
            pod.name
        ),
    );
    cmd::run(Command::new(&pod.interceptor).args(["status", "--instance", &pod.name]))?;

    step(
        "Detaching",
        "SIGTERM to interceptor run: programs detach, connections go direct again",
    );
    let status = pod.unmesh()?;
    ensure!(status.success(), "interceptor run exited with {status}");
    app_connect(&pod, APP_UID, "192.0.2.2:1404")?;
    client_connect(&pod, &format!("{POD_ADDR}:8080"))?;
    println!("\nDemo done; the namespaces and the cgroup are removed.");
    Ok(())
}

fn app_connect(pod: &Pod, uid: &str, target: &str) -> anyhow::Result<()> {
    let out = cmd::output(pod.probe(uid).args(["connect", target]))?;
    let who = if uid == PROXY_UID { "proxy UID" } else { "app" };
    println!("  {who:>9} -> {target:<24} {}", describe(out.trim()));
    Ok(())
}

fn client_connect(pod: &Pod, target: &str) -> anyhow::Result<()> {
    let out = cmd::output(pod.peer_probe().args(["connect", target]))?;
    println!("  {:>9} -> {target:<24} {}", "client", describe(out.trim()));
    Ok(())
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
