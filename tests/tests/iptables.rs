//! The iptables backend on the real kernel: the exact chains proxy-init leaves, idempotence,
//! cleanup that removes only ours, failures that leave nothing behind, and the auto mode.
use std::{
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
};

use interceptor::iptables::{self, Family, IptablesError, IptablesMode, IptablesOptions};
use interceptor_tests::{
    Netns, PodFixture,
    agent_home::PROXY_FLAGS,
    meshed::{self, Meshed},
    privileged,
    scenario::{APP_UID, Servers, linkerd_config},
    unique_name,
};

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");

/// Linkerd's default arguments to proxy-init, as its `linkerd-init` container runs it.
fn linkerd_args(netns: &Netns) -> Vec<String> {
    [
        "run",
        "--mode",
        "iptables",
        "--netns",
        &netns.path().display().to_string(),
        "--ipv6=false",
        "--incoming-proxy-port",
        "4143",
        "--outgoing-proxy-port",
        "4140",
        "--proxy-uid",
        "2102",
        "--inbound-ports-to-ignore",
        "4190,4191,4567,4568",
        "--outbound-ports-to-ignore",
        "443,6443",
        "-w",
    ]
    .map(String::from)
    .to_vec()
}

fn options(netns: &Netns, mode: IptablesMode) -> IptablesOptions {
    IptablesOptions {
        mode,
        wait: true,
        ipv6: false,
        netns: Some(netns.path()),
    }
}

/// `iptables-save -t nat` without the lines that change from run to run.
fn nat_rules(netns: &Netns, mode: IptablesMode, family: Family) -> String {
    let save = iptables::save_nat(&options(netns, mode), family).expect("iptables-save");
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What proxy-init leaves in a pod for Linkerd's default configuration, as iptables-save prints
/// it (the same for the legacy and the nft binaries).
const DEFAULT_LINKERD_NAT: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment "proxy-init/ignore-proxy-user-id" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 443,6443 -m comment --comment "proxy-init/ignore-port-443,6443" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment "proxy-init/redirect-all-outgoing-to-proxy-port" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4190,4191,4567,4568 -m comment --comment "proxy-init/ignore-port-4190,4191,4567,4568" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment "proxy-init/redirect-all-incoming-to-proxy-port" -j REDIRECT --to-ports 4143
COMMIT
"#;

fn run_cli(args: &[String]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run interceptor")
}

#[test]
fn the_default_linkerd_configuration_lists_exactly_as_proxy_init() {
    if !privileged() {
        return;
    }
    for (mode, name) in [(IptablesMode::Legacy, "legacy"), (IptablesMode::Nft, "nft")] {
        let netns = Netns::new("ipt-list");
        let mut args = linkerd_args(&netns);
        args.extend(["--iptables-mode".into(), name.into()]);
        let out = run_cli(&args);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            nat_rules(&netns, mode, Family::V4),
            DEFAULT_LINKERD_NAT,
            "{name}"
        );
    }
}

#[test]
fn running_twice_is_idempotent() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-twice");
    for _ in 0..2 {
        let out = run_cli(&linkerd_args(&netns));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        nat_rules(&netns, IptablesMode::Legacy, Family::V4),
        DEFAULT_LINKERD_NAT
    );
}

#[test]
fn cleanup_removes_ours_and_nothing_else() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-clean");
    let ipt = |args: &[&str]| {
        let status = Command::new("nsenter")
            .arg(format!("--net={}", netns.path().display()))
            .arg("iptables-legacy")
            .arg("-w")
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "iptables {args:?}");
    };
    // Someone else's chain and rules in the same table.
    ipt(&["-t", "nat", "-N", "CNI_OTHER"]);
    ipt(&["-t", "nat", "-A", "CNI_OTHER", "-p", "udp", "-j", "RETURN"]);
    ipt(&["-t", "nat", "-A", "PREROUTING", "-j", "CNI_OTHER"]);
    ipt(&[
        "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9", "-j", "RETURN",
    ]);
    let before = nat_rules(&netns, IptablesMode::Legacy, Family::V4);

    assert!(run_cli(&linkerd_args(&netns)).status.success());
    assert!(nat_rules(&netns, IptablesMode::Legacy, Family::V4).contains("PROXY_INIT_REDIRECT"));
    let cleanup = [
        "iptables-cleanup",
        "--netns",
        &netns.path().display().to_string(),
        "--ipv6=false",
        "-w",
    ];
    for _ in 0..2 {
        let out = Command::new(BIN).args(cleanup).output().unwrap();
        assert!(
            out.status.success(),
            "cleanup (idempotent): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(nat_rules(&netns, IptablesMode::Legacy, Family::V4), before);
}

#[test]
fn ipv6_applies_the_same_rules_with_ip6tables() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-v6");
    let mut config = linkerd_config();
    config.ipv6 = true;
    config.subnets_to_ignore = vec!["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()];
    let options = IptablesOptions {
        ipv6: true,
        ..options(&netns, IptablesMode::Legacy)
    };
    iptables::install(&config, &options).unwrap();
    let v4 = nat_rules(&netns, IptablesMode::Legacy, Family::V4);
    let v6 = nat_rules(&netns, IptablesMode::Legacy, Family::V6);
    assert!(
        v4.contains("-s 10.0.0.0/8") && !v4.contains("fd00::"),
        "{v4}"
    );
    assert!(
        v6.contains("-s fd00::/8") && !v6.contains("10.0.0.0"),
        "{v6}"
    );
    assert!(v6.contains("redirect-all-outgoing-to-proxy-port"), "{v6}");
    iptables::cleanup(&options).unwrap();
    assert!(!nat_rules(&netns, IptablesMode::Legacy, Family::V6).contains("PROXY_INIT"));
}

#[test]
fn a_missing_binary_is_named_and_nothing_is_installed() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-missing");
    let empty = std::env::temp_dir().join(unique_name("empty-path"));
    std::fs::create_dir_all(&empty).unwrap();
    let mut args = linkerd_args(&netns);
    args.extend(["--iptables-mode".into(), "plain".into()]);
    let out = Command::new(BIN)
        .args(&args)
        .env("PATH", &empty)
        .output()
        .unwrap();
    std::fs::remove_dir(&empty).ok();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("iptables not found on PATH")
            && stderr.contains("apt-get install iptables"),
        "{stderr}"
    );
    assert!(!nat_rules(&netns, IptablesMode::Legacy, Family::V4).contains("PROXY_INIT"));
    let err = iptables::install(&linkerd_config(), &options(&netns, IptablesMode::Plain)).err();
    assert!(matches!(
        err,
        None | Some(IptablesError::MissingBinary { .. })
    ));
}

#[test]
fn a_failing_command_is_reported_and_leaves_no_half_installed_chain() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-fail");
    // A plain `iptables` that works like iptables-legacy but fails on the outbound redirect,
    // after the whole inbound chain and its jump are in.
    let dir = std::env::temp_dir().join(unique_name("fake-iptables"));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("iptables");
    std::fs::write(&fake, "#!/bin/sh\ncase \"$*\" in *redirect-all-outgoing*) echo 'iptables: simulated failure' >&2; exit 4;; esac\nexec iptables-legacy \"$@\"\n").unwrap();
    std::fs::write(
        dir.join("iptables-save"),
        "#!/bin/sh\nexec iptables-legacy-save \"$@\"\n",
    )
    .unwrap();
    for f in ["iptables", "iptables-save"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut args = linkerd_args(&netns);
    args.extend(["--iptables-mode".into(), "plain".into()]);
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    let out = Command::new(BIN)
        .args(&args)
        .env("PATH", path)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("redirect-all-outgoing-to-proxy-port")
            && stderr.contains("simulated failure"),
        "{stderr}"
    );
    let nat = nat_rules(&netns, IptablesMode::Legacy, Family::V4);
    assert!(
        !nat.contains("PROXY_INIT"),
        "half-installed chains left behind:\n{nat}"
    );
}

#[test]
fn simulate_prints_the_commands_and_changes_nothing() {
    if !privileged() {
        return;
    }
    let netns = Netns::new("ipt-sim");
    let mut args = linkerd_args(&netns);
    args.push("--simulate".into());
    let out = run_cli(&args);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("iptables-legacy -w -t nat -N PROXY_INIT_REDIRECT\n"),
        "{stdout}"
    );
    assert!(stdout.contains("iptables-legacy -w -t nat -A OUTPUT -j PROXY_INIT_OUTPUT -m comment --comment proxy-init/install-proxy-init-output\n"), "{stdout}");
    assert!(!nat_rules(&netns, IptablesMode::Legacy, Family::V4).contains("PROXY_INIT"));
}

#[test]
fn auto_mode_uses_ebpf_when_the_kernel_allows_it() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("auto-ebpf");
    let _servers = Servers::start(&fixture);
    let instance = unique_name("auto");
    let mut args = meshed::run_args(&fixture, &instance);
    args.extend(
        ["--mode", "auto", "--ipv6=false"]
            .iter()
            .chain(PROXY_FLAGS.iter())
            .map(|a| a.to_string()),
    );
    let running = Meshed::start(Path::new(BIN), &instance, &args, Stdio::piped());
    let landing = fixture.in_pod().uid(APP_UID).connect("192.0.2.2:1404");
    assert_eq!(landing.proxy_orig().to_string(), "192.0.2.2:1404");
    // eBPF, not iptables: no chains in the pod.
    assert!(!nat_rules(&fixture.pod, IptablesMode::Legacy, Family::V4).contains("PROXY_INIT"));
    let (exit, lines) = running.stop();
    assert!(exit.success(), "{lines:#?}");
    let chosen: Vec<&String> = lines.iter().filter(|l| l.contains("auto mode")).collect();
    assert_eq!(
        chosen.len(),
        1,
        "one line says which backend and why: {lines:#?}"
    );
    assert!(
        chosen[0].contains("backend") && chosen[0].contains("ebpf"),
        "{lines:#?}"
    );
}

#[test]
fn auto_mode_falls_back_to_iptables_without_bpf_privileges() {
    if !privileged() {
        return;
    }
    let fixture = PodFixture::new("auto-ipt");
    let _servers = Servers::start(&fixture);
    // Inside the pod's namespace (entered as root), then without CAP_BPF, CAP_SYS_ADMIN and
    // CAP_PERFMON: NET_ADMIN is left, which is all iptables needs, and eBPF cannot load.
    let out = Command::new("nsenter")
        .arg(format!("--net={}", fixture.pod.path().display()))
        .args([
            "setpriv",
            "--bounding-set=-bpf,-sys_admin,-perfmon",
            "--inh-caps=-bpf,-sys_admin,-perfmon",
            BIN,
        ])
        .args(["run", "--mode", "auto", "--ipv6=false", "-w"])
        .args(*PROXY_FLAGS)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let chosen: Vec<&str> = stderr.lines().filter(|l| l.contains("auto mode")).collect();
    assert_eq!(chosen.len(), 1, "{stderr}");
    assert!(
        chosen[0].contains("iptables") && chosen[0].contains("reason"),
        "{stderr}"
    );
    assert!(
        nat_rules(&fixture.pod, IptablesMode::Legacy, Family::V4).contains("PROXY_INIT_OUTPUT")
    );
    let landing = fixture.in_pod().uid(APP_UID).connect("192.0.2.2:1404");
    assert_eq!(landing.proxy_orig().to_string(), "192.0.2.2:1404");
}
