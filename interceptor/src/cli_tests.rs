use clap::Parser as _;

use super::*;

/// The configuration crate's table of proxy-init's flags.
#[path = "../../interceptor-config/src/flag_cases.rs"]
mod flag_cases;

/// A pod's configuration as `interceptor run` parses its flags, or clap's message.
fn run(flags: &[&str]) -> Result<InterceptionConfig, String> {
    let argv = ["interceptor", "run"].iter().chain(flags);
    match Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Run(run) => Ok(run.interception.config),
        other => panic!("unexpected command {other:?}"),
    }
}

/// A pod's configuration as `interceptor pod add` parses the flags after its `--`.
fn pod_add(flags: &[&str]) -> Result<InterceptionConfig, String> {
    let argv = [
        "interceptor",
        "pod",
        "add",
        "--netns",
        "/run/netns/pod",
        "--",
    ]
    .iter()
    .chain(flags);
    match Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .command
    {
        Command::Pod(PodArgs {
            command: PodCommand::Add { config, .. },
            ..
        }) => Ok(config.config),
        other => panic!("unexpected command {other:?}"),
    }
}

#[test]
fn run_and_pod_add_read_proxy_init_flags_as_the_configuration_crate_does() {
    for (parser, parse) in [("run", run as fn(&[&str]) -> _), ("pod add", pod_add)] {
        for (flags, expected) in flag_cases::FLAG_CASES {
            match (parse(flags), expected) {
                (Ok(config), Ok(expected)) => {
                    assert_eq!(&config.to_args().join(" "), expected, "{parser} {flags:?}")
                }
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{parser} {flags:?}: {e}"),
                (got, expected) => panic!("{parser} {flags:?}: {got:?}, expected {expected:?}"),
            }
        }
    }
}

#[test]
fn a_refused_configuration_reads_as_clap_refuses_a_flag() {
    let err = Cli::try_parse_from(["interceptor", "run", "-p", "0", "-o", "4140"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let message = err.to_string();
    // clap's own refusal: the configuration crate's parser is its value parser.
    assert!(
        message.starts_with(
            "error: invalid value '0' for '--incoming-proxy-port <PORT>': port 0 is out of range"
        ),
        "{message}"
    );
    let message = pod_add(&["-p", "4143"]).unwrap_err();
    assert!(
        message.starts_with("error: --outgoing-proxy-port is required")
            && message.contains("Usage: interceptor pod add "),
        "{message}"
    );
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
