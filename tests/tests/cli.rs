//! The `interceptor` command line end to end: `run` meshes a pod until SIGTERM, `status` reports
//! from another process, bad flags change nothing.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use interceptor_tests::{
    Landing, PodFixture,
    agent_home::PROXY_FLAGS,
    eventually,
    meshed::{self, Meshed},
    privileged,
    scenario::{APP_UID, Servers},
    unique_name,
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");

/// `interceptor run` for the fixture's pod, with the proxy's flags.
fn run_args(fixture: &PodFixture, instance: &str) -> Vec<String> {
    let mut args = meshed::run_args(fixture, instance);
    args.extend(
        PROXY_FLAGS
            .iter()
            .chain(&["--outbound-ports-to-ignore", "443"])
            .map(|a| a.to_string()),
    );
    args
}

/// Sets `flag` to `value`, replacing the value `run_args` gave it (by long or short name).
fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let short = match flag {
        "--proxy-uid" => "-u",
        "--incoming-proxy-port" => "-p",
        "--outgoing-proxy-port" => "-o",
        _ => flag,
    };
    match args.iter().position(|a| a == flag || a == short) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
    args
}

fn status(instance: &str) -> Value {
    meshed::status(Path::new(BIN), instance)
}

/// `interceptor run` in the background with `extra` flags, its log piped.
fn run(fixture: &PodFixture, extra: &[&str]) -> Meshed {
    run_named(fixture, &unique_name("cli"), extra)
}

fn run_named(fixture: &PodFixture, instance: &str, extra: &[&str]) -> Meshed {
    let mut args = run_args(fixture, instance);
    args.extend(extra.iter().map(|s| s.to_string()));
    Meshed::start(Path::new(BIN), instance, &args, Stdio::piped())
}

/// The programs' own log lines (rare failures, here an inbound connection refused because the
/// proxy is not listening) are off by default and written with `interceptor::ebpf=debug`.
#[test]
fn the_programs_log_lines_are_written_only_when_asked_for() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("clikernlog");
    let _servers = Servers::without_inbound_proxy(&fixture);
    for (log_level, written) in [("info", false), ("info,interceptor::ebpf=debug", true)] {
        let running = run(&fixture, &["--log-level", log_level]);
        assert_eq!(
            fixture.on_remote().connect("10.77.0.1:80"),
            Landing::Failed("connect:ECONNREFUSED".into()),
            "{log_level}: fails closed"
        );
        let (status, logs) = running.stop();
        assert!(status.success(), "{log_level}: {logs:#?}");
        let line = logs.iter().find(|l| {
            l.contains("interceptor::ebpf::kernel_log")
                && l.contains("port 80 refused: the proxy has no inbound listener")
        });
        assert_eq!(line.is_some(), written, "{log_level}: {logs:#?}");
        if let Some(line) = line {
            assert!(line.contains("program=\"icpt_sk_lookup\""), "{line}");
        }
    }
}

#[test]
fn run_meshes_a_pod_reports_status_and_detaches_on_sigterm() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-run");
    let _servers = Servers::start(&fixture);
    let app = fixture.in_pod().uid(APP_UID);
    let running = run(&fixture, &["--log-format", "json", "--ipv6=false"]);
    let instance = running.instance.clone();

    assert_eq!(
        app.connect("192.0.2.2:1404").proxy_orig().to_string(),
        "192.0.2.2:1404"
    );
    assert_eq!(app.connect("10.77.0.2:443").server_name(), "remote-443");
    // The dual-stack bypass: run with --ipv6=false, an AF_INET6 socket connecting to the
    // IPv4-mapped address is still an IPv4 connection, and is intercepted.
    assert_eq!(
        app.connect("[::ffff:192.0.2.2]:1404")
            .proxy_orig()
            .to_string(),
        "192.0.2.2:1404"
    );

    let report = status(&instance);
    assert_eq!(report["backend"], "ebpf");
    assert_eq!(report["cgroup"], fixture.cgroup.path.display().to_string());
    // One program per hook (the sk_lookup one loaded once and tail-called by every pod's own),
    // the variant this kernel's features pick, and why where it is not the first choice.
    let programs: Vec<(&str, &str, &str)> = report["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["variant"].as_str().unwrap(),
                p["reason"].as_str().unwrap(),
            )
        })
        .collect();
    let chosen =
        interceptor::ebpf::variants::choose(interceptor::ebpf::features::KernelFeatures::get())
            .expect("the eBPF programs run here");
    let expected: Vec<(&str, &str, &str)> = chosen
        .iter()
        .map(|(_, v, c)| (v.program, v.name, c.reason.as_str()))
        .collect();
    assert_eq!(programs, expected);
    let text = Command::new(BIN)
        .args(["status", "--instance", &instance])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    for (name, variant, _) in &programs {
        assert!(
            text.lines()
                .any(|l| l.contains(name) && l.contains(&format!("variant {variant}"))),
            "{name} {variant}: {text}"
        );
    }
    assert_eq!(
        report["pods"][0]["netns"],
        fixture.pod.path().display().to_string()
    );
    assert_eq!(
        report["pods"][0]["config"]["outbound_ports_to_ignore"],
        "443"
    );
    let addresses = report["pods"][0]["addresses"].to_string();
    assert!(
        addresses.contains("\"10.77.0.1\"") && addresses.contains("\"fd77::1\""),
        "both families of the pod's addresses are tracked: {addresses}"
    );
    let counters = &report["counters"][0]["counters"];
    assert_eq!(counters["outbound_redirected"], 2, "{counters}");
    // netprobe's proxy asks twice, to check repeated calls give the same answer.
    assert_eq!(counters["orig_dst_served"], 4, "{counters}");
    assert_eq!(counters["outbound_exempt_ignored_port"], 1, "{counters}");
    assert_eq!(report["pending_orig_dst"], 0);
    assert_eq!(report["counters"][0]["inbound_listener"], true);
    let text = Command::new(BIN)
        .args(["status", "--instance", &instance])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("inbound->4143 outbound->4140 proxy-uid=2102 outbound-ports-to-ignore=443"),
        "{text}"
    );
    let landing = fixture.on_remote().connect("10.77.0.1:80");
    assert!(
        matches!(&landing, Landing::Proxy { name, .. } if name == "inbound"),
        "{landing:?}"
    );
    assert_eq!(
        status(&instance)["counters"][0]["counters"]["inbound_steered"],
        1
    );

    let (exit, logs) = running.stop();
    assert!(exit.success(), "run exits 0 on SIGTERM: {exit} {logs:#?}");
    for line in &logs {
        let json: Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not a JSON log line: {line}"));
        assert!(
            json["level"].is_string() && json["message"].is_string(),
            "{line}"
        );
    }
    assert!(
        logs.iter().any(|l| l.contains("interception active")),
        "{logs:#?}"
    );

    // Detached: direct connections again, and no state left behind.
    assert_eq!(app.connect("10.77.0.2:80").server_name(), "remote-80");
    assert_eq!(
        fixture.on_remote().connect("10.77.0.1:80").server_name(),
        "app-80"
    );
    assert_eq!(
        app.connect("192.0.2.2:1404"),
        Landing::Failed("connect:ECONNREFUSED".into())
    );
    assert!(
        !std::path::Path::new("/run/interceptor")
            .join(&instance)
            .exists()
    );
    assert!(
        !std::path::Path::new("/sys/fs/bpf/interceptor")
            .join(&instance)
            .exists()
    );
}

#[test]
fn a_second_run_of_the_same_instance_is_refused() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-twice");
    let running = run(&fixture, &[]);
    let out = Command::new(BIN)
        .args(run_args(&fixture, &running.instance))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is already running"), "{stderr}");
    // The first one is unaffected.
    assert_eq!(status(&running.instance)["running"], true);
}

/// No state for the instance, and the pod's connections go direct.
fn assert_nothing_attached(fixture: &PodFixture, instance: &str) {
    assert!(!Path::new("/run/interceptor").join(instance).exists());
    let landing = fixture.in_pod().uid(APP_UID).connect("10.77.0.2:80");
    assert_eq!(landing.server_name(), "remote-80");
}

#[test]
fn bad_flags_are_rejected_by_name_and_nothing_is_attached() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-bad");
    let _servers = Servers::start(&fixture);
    let instance = unique_name("cli-bad");
    for (flag, value, needle) in [
        (
            "--outbound-ports-to-ignore",
            "443,70000",
            "port 70000 is out of range",
        ),
        ("--inbound-ports-to-ignore", "30-20", "\"30-20\""),
        (
            "--outbound-ports-to-ignore",
            "https",
            "\"https\" is not a port number",
        ),
        ("--proxy-uid", "2102.5", "\"2102.5\" is not a numeric id"),
        (
            "--proxy-gid",
            "4294967296",
            "\"4294967296\" is not a numeric id",
        ),
        ("--proxy-uid", "proxy", "\"proxy\" is not a numeric id"),
        ("--subnets-to-ignore", "10.0.0.0/33", "\"10.0.0.0/33\""),
        ("--outbound-subnets-to-ignore", "10.0.0/8", "\"10.0.0/8\""),
        ("--outgoing-proxy-port", "0", "port 0 is out of range"),
    ] {
        let out = Command::new(BIN)
            .args(with_flag(run_args(&fixture, &instance), flag, value))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(needle) && stderr.contains(flag.trim_start_matches("--")),
            "{flag} {value}: {stderr}"
        );
    }
    // A netns that does not exist: refused before anything is attached.
    let args = with_flag(
        run_args(&fixture, &instance),
        "--netns",
        "/run/netns/does-not-exist",
    );
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/run/netns/does-not-exist"));

    assert_nothing_attached(&fixture, &instance);
}

#[test]
fn simulate_prints_the_plan_and_changes_nothing() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-sim");
    let _servers = Servers::start(&fixture);
    let instance = unique_name("cli-sim");
    let mut args = run_args(&fixture, &instance);
    args.push("--simulate".into());
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("attach them to cgroup")
            && stdout.contains(&fixture.pod.path().display().to_string()),
        "{stdout}"
    );
    assert_nothing_attached(&fixture, &instance);
}

#[test]
fn addresses_added_to_the_pod_later_are_its_own() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-addr");
    let _servers = Servers::start(&fixture);
    // --ipv6 is on by default: IPv6 addresses are followed as IPv4 ones are.
    let _running = run(&fixture, &[]);
    let app = fixture.in_pod().uid(APP_UID);
    for (cidr, target) in [
        ("10.88.0.1/32", "10.88.0.1:8082"),
        ("fd88::1/128", "[fd88::1]:8082"),
    ] {
        // Not yet the pod's: redirected like any remote address.
        assert_eq!(app.connect(target).proxy_orig().to_string(), target);

        fixture
            .pod
            .ip(&["addr", "add", cidr, "dev", "eth0", "nodad"]);
        let _server = fixture
            .in_pod()
            .listen(&["server", target, "--name", "new-addr"]);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match app.connect(target) {
                Landing::Server { name, .. } if name == "new-addr" => break,
                other if Instant::now() > deadline => {
                    panic!("new pod address {target} still redirected: {other:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// A burst of route changes that overflows `run`'s notification socket (ENOBUFS) does not end
/// its following the pod: it reads the namespace again and applies the state the burst left.
/// The process is stopped (SIGSTOP) during the burst (1,200 notifications of about 1 KiB each
/// against a buffer of about 200 KiB), so the socket overflows every time.
#[test]
fn run_applies_the_last_state_after_a_burst_overflows_its_notifications() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-burst");
    let _servers = Servers::start(&fixture);
    let running = run(&fixture, &[]);
    // On every address: one in a route cannot be bound before the route is there.
    let _anyip = fixture
        .in_pod()
        .listen(&["server", "0.0.0.0:8091", "--name", "anyip"]);
    let routes: Vec<String> = (0..600)
        .map(|i| format!("local 10.200.{}.{}/32 dev lo", i / 250, i % 250))
        .collect();
    let mut burst: String = routes.iter().map(|r| format!("route add {r}\n")).collect();
    burst.extend(routes.iter().map(|r| format!("route del {r}\n")));
    burst.push_str("route add local 198.51.100.64/26 dev lo\n");
    burst.push_str("route add local 198.51.100.128/26 dev lo\n");
    burst.push_str("route del local 198.51.100.128/26 dev lo\n");
    let pid = nix::unistd::Pid::from_raw(running.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP the run");
    fixture.pod.ip_batch(&burst);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT the run");
    let app = fixture.in_pod().uid(APP_UID);
    eventually(
        "the route the burst left is applied",
        Duration::from_secs(10),
        || matches!(app.connect("198.51.100.70:8091"), Landing::Server { ref name, .. } if name == "anyip"),
    );
    assert!(
        matches!(app.connect("198.51.100.130:8091"), Landing::Proxy { .. }),
        "the route the burst removed is not applied"
    );
    let (_, logs) = running.stop();
    assert!(
        logs.iter().any(|l| l.contains("notifications were lost")),
        "the burst overflowed the socket: {logs:#?}"
    );
}

#[test]
fn a_killed_run_keeps_intercepting_and_the_next_run_takes_over() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("cli-crash");
    let _servers = Servers::start(&fixture);
    let app = fixture.in_pod().uid(APP_UID);
    let client = fixture.on_remote();
    let instance = unique_name("cli-crash");
    let inbound_steered = |landing: Landing| {
        assert!(
            matches!(&landing, Landing::Proxy { name, orig: Ok(orig), .. } if name == "inbound" && orig.to_string() == "10.77.0.1:80"),
            "{landing:?}"
        );
    };

    let mut first = run_named(&fixture, &instance, &[]);
    let first_generation = Path::new("/sys/fs/bpf/interceptor")
        .join(&instance)
        .join(first.child.id().to_string());
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    // Killed without detaching: interception stays in force, nothing bypasses the proxy.
    assert_eq!(
        app.connect("192.0.2.2:1404").proxy_orig().to_string(),
        "192.0.2.2:1404"
    );
    inbound_steered(client.connect("10.77.0.1:80"));
    let report = status(&instance);
    assert_eq!(report["running"], false);
    assert!(
        report["counters"][0]["counters"]["outbound_redirected"].as_u64() >= Some(1),
        "{report}"
    );
    assert!(first_generation.exists());

    // The next run attaches its own programs, then detaches the dead run's.
    let second = run_named(&fixture, &instance, &[]);
    assert!(
        !first_generation.exists(),
        "the dead run's programs are still pinned"
    );
    assert_eq!(
        app.connect("192.0.2.2:1404").proxy_orig().to_string(),
        "192.0.2.2:1404"
    );
    inbound_steered(client.connect("10.77.0.1:80"));

    let (exit, logs) = second.stop();
    assert!(exit.success(), "{logs:#?}");
    assert!(logs.iter().any(|l| l.contains("took over")), "{logs:#?}");
    assert_eq!(app.connect("10.77.0.2:80").server_name(), "remote-80");
    assert_eq!(client.connect("10.77.0.1:80").server_name(), "app-80");
    assert!(
        !Path::new("/sys/fs/bpf/interceptor")
            .join(&instance)
            .exists()
    );
    assert!(!Path::new("/run/interceptor").join(&instance).exists());
}

/// `interceptor validate` as a pod's process (its namespace, cgroup and an app UID) runs it.
fn validate(fixture: &PodFixture) -> (Option<i32>, String) {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec nsenter --net={} setpriv --reuid 1000 --regid 1000 --clear-groups {BIN} validate --timeout-ms 2000",
        fixture.cgroup.path.display(),
        fixture.pod.path().display()
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

#[test]
fn validate_exits_0_when_intercepted_and_95_when_not() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("validate");
    let (code, line) = validate(&fixture);
    assert_eq!(code, Some(95), "{line}");
    assert!(
        line.starts_with("interception does NOT work") && line.contains("1.1.1.1:20001"),
        "{line}"
    );

    let running = run(&fixture, &[]);
    let (code, line) = validate(&fixture);
    assert_eq!(code, Some(0), "{line}");
    assert!(line.starts_with("interception works"), "{line}");
    drop(running);
}
