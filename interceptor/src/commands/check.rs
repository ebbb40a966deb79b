//! `interceptor check`, and the `linkerd-interceptor` binary whose `check` `linkerd check` runs
//! (with `--output=json` and the flags of `getExtensionCheckFlags`, linkerd2
//! `cli/cmd/check.go:261-278`) for the namespace labelled `linkerd.io/extension: interceptor`.
use clap::Parser as _;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use super::Exit;
use crate::{
    cli::{CheckArgs, CheckFormat, LinkerdCli, LinkerdCommand},
    health::{
        self, Event,
        cluster::Scope,
        output::{Format, Printer},
    },
};

/// The client `args` describe, as Linkerd's `k8s.NewAPI` builds it (`pkg/k8s/api.go:48-95`):
/// the kubeconfig (`--kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`; else in-cluster) and
/// its context; `--as` impersonates, with `--as-group` only together with it.
async fn client(args: &CheckArgs) -> Result<kube::Client, String> {
    let options = KubeConfigOptions {
        context: args.context.clone().filter(|c| !c.is_empty()),
        ..KubeConfigOptions::default()
    };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("reading the kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| format!("the kubeconfig {}: {e}", path.display()))?
        }
        None if options.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("$KUBECONFIG or ~/.kube/config: {e}"))?,
        None => Config::infer().await.map_err(|e| {
            format!("no $KUBECONFIG, ~/.kube/config or in-cluster service account: {e}")
        })?,
    };
    if let Some(user) = args.as_user.as_ref().filter(|u| !u.is_empty()) {
        config.auth_info.impersonate = Some(user.clone());
        let groups = impersonate_groups(&args.as_group);
        if !groups.is_empty() {
            config.auth_info.impersonate_groups = Some(groups);
        }
    }
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// `--as-group`'s values. `linkerd check` passes its own flag's value as pflag prints a string
/// array, `[a,b]` (and `[]` when none was given, so always), to every extension:
/// such a value is the list it holds.
pub fn impersonate_groups(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(
            |value| match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                Some(list) => list
                    .split(',')
                    .map(|g| g.trim().trim_matches('"').to_owned())
                    .filter(|g| !g.is_empty())
                    .collect(),
                None => vec![value.clone()],
            },
        )
        .collect()
}

/// Runs the checks and writes their results; fails (exit 1, as Linkerd's checks) when one
/// fails with an error.
pub fn check(args: CheckArgs) -> anyhow::Result<()> {
    for (flag, given) in [
        ("--api-addr", args.api_addr.is_some()),
        ("--linkerd-namespace", args.linkerd_namespace.is_some()),
        ("--proxy", args.proxy),
        ("--pre", args.pre),
    ] {
        if given {
            tracing::debug!(flag, "accepted for Linkerd's protocol, and of no use here");
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = match client(&args).await {
            Ok(client) => client,
            Err(e) => {
                // As `linkerd viz check` says it (viz/cmd/check.go:87-91).
                eprintln!("Error initializing k8s API client: {e}");
                return Err(Exit { code: 1 }.into());
            }
        };
        let scope = Scope {
            install_namespace: args.cni_namespace.clone().filter(|n| !n.is_empty()),
            pods_namespace: args.namespace.clone().filter(|n| !n.is_empty()),
        };
        let mut printer = Printer::stdout(match args.output {
            CheckFormat::Table => Format::Table,
            CheckFormat::Short => Format::Short,
            CheckFormat::Json => Format::Json,
        });
        let results = health::run(&client, &scope, args.wait, |event| {
            // A closed stdout shows at `finish`.
            let _ = match event {
                Event::Retrying(result) => printer.retrying(result),
                Event::Done(result) => printer.result(result),
            };
        })
        .await;
        printer.finish(&results)?;
        if health::success(&results) {
            Ok(())
        } else {
            Err(Exit { code: 1 }.into())
        }
    })
}

/// The `linkerd-interceptor` binary. Flags `check` does not know are left out with a warning
/// (Linkerd's EXTENSIONS.md asks extensions to ignore them: a newer `linkerd check` may pass
/// more); a command line that still does not parse exits 1, as Linkerd's commands do.
pub fn linkerd_main() -> std::process::ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    let cli = loop {
        match LinkerdCli::try_parse_from(&argv) {
            Ok(cli) => break cli,
            Err(e) => {
                if let Some(at) = unknown_argument(&e, &argv) {
                    eprintln!("warning: ignoring {:?}, unknown to this version", argv[at]);
                    argv.remove(at);
                    continue;
                }
                let _ = e.print();
                return std::process::ExitCode::from(if e.use_stderr() { 1 } else { 0 });
            }
        }
    };
    let LinkerdCommand::Check(args) = cli.command;
    let level = if args.verbose { "debug" } else { "warn" };
    if let Err(e) = crate::logging::init(crate::logging::LogFormat::Plain, level) {
        eprintln!("error: {e:#}");
        return std::process::ExitCode::from(1);
    }
    match check(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Exit>() {
            Some(exit) => std::process::ExitCode::from(exit.code),
            None => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::from(1)
            }
        },
    }
}

/// Where in `argv` (after `check`) the argument clap did not know is, if that is the error.
fn unknown_argument(error: &clap::Error, argv: &[String]) -> Option<usize> {
    if error.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let clap::error::ContextValue::String(arg) = error.get(clap::error::ContextKind::InvalidArg)?
    else {
        return None;
    };
    let check = argv.iter().position(|a| a == "check")?;
    argv.iter()
        .enumerate()
        .skip(check + 1)
        .find(|(_, a)| *a == arg || a.starts_with(&format!("{arg}=")))
        .map(|(at, _)| at)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn go_durations_parse_as_go_writes_them() {
        use crate::cli::parse_go_duration;
        let secs = |s| parse_go_duration(s).unwrap().as_secs_f64();
        assert_eq!(secs("5m0s"), 300.0);
        assert_eq!(secs("300s"), 300.0);
        assert_eq!(secs("1h2m3.5s"), 3723.5);
        assert_eq!(secs("250ms"), 0.25);
        assert_eq!(secs("0"), 0.0);
        assert_eq!(secs("-5s"), 0.0);
        for bad in ["", "5", "5x", "m", "1.2.3s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    /// What `linkerd check --as alice --as-group devs` passes (`getExtensionCheckFlags`,
    /// linkerd2 `cli/cmd/check.go:261-278`), with a flag repeated: the last value wins, as with
    /// pflag, except for the repeatable `--as-group`.
    #[test]
    fn linkerds_flags_parse() {
        let cli = LinkerdCli::try_parse_from([
            "linkerd-interceptor",
            "check",
            "--as=alice",
            "--as-group=[devs]",
            "--kubeconfig=/k",
            "--linkerd-namespace=linkerd",
            "--verbose=false",
            "--namespace=app",
            "--proxy=true",
            "--wait=5m0s",
            "--output=json",
            "--wait=1m30s",
            "--as-group=ops",
        ])
        .unwrap();
        let LinkerdCommand::Check(args) = cli.command;
        assert_eq!(args.output, CheckFormat::Json);
        assert_eq!(args.wait, Duration::from_secs(90));
        assert_eq!(args.namespace.as_deref(), Some("app"));
        assert_eq!(args.as_user.as_deref(), Some("alice"));
        assert_eq!(impersonate_groups(&args.as_group), ["devs", "ops"]);
        assert!(args.proxy && !args.verbose);
    }

    #[test]
    fn linkerd_passes_as_group_as_a_printed_array() {
        let groups = |values: &[&str]| {
            impersonate_groups(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
        };
        assert!(groups(&["[]"]).is_empty());
        assert_eq!(groups(&["[a,b]"]), ["a", "b"]);
        assert_eq!(groups(&["devs"]), ["devs"]);
    }
}
