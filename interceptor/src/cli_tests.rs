use clap::Parser as _;

use super::*;

fn run(args: &[&str]) -> Result<InterceptionConfig, String> {
    let mut argv = vec!["interceptor", "run"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Run(run) => Ok(run.interception.config()),
        other => panic!("unexpected command {other:?}"),
    }
}

#[test]
fn parses_the_default_linkerd_arguments() {
    let config = run(&[
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
    ])
    .unwrap();
    assert_eq!(config.incoming_proxy_port, 4143);
    assert_eq!(config.outgoing_proxy_port, 4140);
    assert_eq!(config.proxy_uid, Some(2102));
    assert_eq!(config.proxy_gid, None);
    assert_eq!(
        config.inbound_ports_to_ignore.to_string(),
        "4190,4191,4567,4568"
    );
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "443,6443");
    assert!(!config.ipv6);
}

#[test]
fn list_flags_repeat_and_skip_empty_entries() {
    let config = run(&[
        "-p",
        "4143",
        "-o",
        "4140",
        "-r",
        "80,8080",
        "-r",
        "9090",
        "--outbound-ports-to-ignore",
        "",
        "--outbound-ports-to-ignore",
        "25-30,,22",
        "--subnets-to-ignore",
        "10.0.0.0/8,192.0.2.1",
        "--outbound-subnets-to-ignore",
        "198.51.100.0/24",
        "-u",
        "0",
    ])
    .unwrap();
    assert_eq!(config.ports_to_redirect, vec![80, 8080, 9090]);
    assert_eq!(config.outbound_ports_to_ignore.to_string(), "25-30,22");
    assert_eq!(config.subnets_to_ignore.len(), 2);
    assert_eq!(
        config.outbound_subnets_to_ignore[0].to_string(),
        "198.51.100.0/24"
    );
    assert_eq!(config.proxy_uid, None, "uid 0 is never the proxy");
    assert!(config.ipv6, "ipv6 defaults to true, as in proxy-init");
}

#[test]
fn rejects_bad_values_naming_them() {
    for (args, needle) in [
        (&["-p", "0", "-o", "4140"][..], "port 0 is out of range"),
        (
            &["-p", "4143", "-o", "70000"][..],
            "port 70000 is out of range",
        ),
        (
            &[
                "-p",
                "4143",
                "-o",
                "4140",
                "--outbound-ports-to-ignore",
                "443,99999",
            ][..],
            "port 99999",
        ),
        (
            &[
                "-p",
                "4143",
                "-o",
                "4140",
                "--inbound-ports-to-ignore",
                "30-20",
            ][..],
            "\"30-20\"",
        ),
        (
            &["-p", "4143", "-o", "4140", "-u", "proxy"][..],
            "\"proxy\" is not a numeric id",
        ),
        (
            &[
                "-p",
                "4143",
                "-o",
                "4140",
                "--subnets-to-ignore",
                "10.0.0.0/40",
            ][..],
            "\"10.0.0.0/40\"",
        ),
        (
            &["-p", "4143", "-o", "4140", "-r", "80-90"][..],
            "\"80-90\" is not a port number",
        ),
        (&["-o", "4140"][..], "--incoming-proxy-port"),
    ] {
        let err = run(args).unwrap_err();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn a_configuration_survives_the_round_trip_through_its_flags() {
    let full = run(&[
        "-p",
        "4143",
        "-o",
        "4140",
        "-u",
        "2102",
        "-g",
        "2103",
        "--inbound-ports-to-ignore",
        "4190,4191,25-30",
        "--outbound-ports-to-ignore",
        "443",
        "--outbound-ports-to-ignore",
        "6443",
        "-r",
        "80,8080",
        "--subnets-to-ignore",
        "10.0.0.0/8,fd00::/8",
        "--outbound-subnets-to-ignore",
        "192.0.2.0/24",
        "--ipv6=false",
    ])
    .unwrap();
    let minimal = run(&["-p", "4143", "-o", "4140"]).unwrap();
    for config in [full, minimal] {
        assert_eq!(parse_pod_config(&config.to_args()), Ok(config.clone()));
    }
}

#[test]
fn pod_configuration_errors_are_the_cli_messages() {
    let err = parse_pod_config(&["-p".into(), "0".into(), "-o".into(), "4140".into()]).unwrap_err();
    assert!(
        err.contains("invalid value '0' for '--incoming-proxy-port"),
        "{err}"
    );
    let err = parse_pod_config(&["-p".into(), "4143".into()]).unwrap_err();
    assert!(err.contains("--outgoing-proxy-port"), "{err}");
}

#[test]
fn listen_addresses_take_ipv6_with_or_without_brackets() {
    use super::parse_listen_addr;
    let addr = |s: &str| parse_listen_addr(s).map(|a| a.to_string());
    assert_eq!(addr("10.0.0.7:9990").as_deref(), Ok("10.0.0.7:9990"));
    assert_eq!(addr("[fd00::7]:9990").as_deref(), Ok("[fd00::7]:9990"));
    // `$(HOST_IP):9990` on an IPv6 node.
    assert_eq!(addr("fd00::7:9990").as_deref(), Ok("[fd00::7]:9990"));
    assert_eq!(addr("::1:9990").as_deref(), Ok("[::1]:9990"));
    for bad in ["10.0.0.7", "fd00::7", "node:9990", "10.0.0.7:99999", ""] {
        assert!(parse_listen_addr(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_daemon_takes_a_cgroup_or_a_directory_to_find_the_kubelets_in_not_both() {
    let daemon = |args: &[&str]| {
        let mut argv = vec!["interceptor", "daemon"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Daemon(daemon) => (daemon.cgroup, daemon.kubepods_under),
            other => panic!("unexpected command {other:?}"),
        })
    };
    assert_eq!(
        daemon(&["--kubepods-under", "/host/sys/fs/cgroup"]).unwrap(),
        (None, Some(PathBuf::from("/host/sys/fs/cgroup")))
    );
    let both = daemon(&["--cgroup", "/a", "--kubepods-under", "/b"]).unwrap_err();
    assert!(both.to_string().contains("cannot be used with"), "{both}");
}
