//! The chart's containers' arguments as the kubelet expands them and this build parses them.
use std::collections::BTreeMap;

use clap::Parser as _;
use serde_json::Value;

use super::{NAMESPACE, Rendered, container};

/// The node address `status.hostIP` gives in [`args_of`].
pub const HOST_IP: &str = "fd00::7";

/// A container's arguments, with `$(VAR)` replaced by the ConfigMap value its env names, the
/// pod's `namespace` for a `metadata.namespace` field reference, or [`HOST_IP`] for
/// `status.hostIP`, as the kubelet does.
pub fn args_of(
    container: &Value,
    config: &BTreeMap<String, String>,
    namespace: &str,
) -> Vec<String> {
    let env: BTreeMap<String, String> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let from = &e["valueFrom"];
            // Another field reference (NODE_NAME) is not in an argument.
            let value = match from["configMapKeyRef"]["key"].as_str() {
                Some(key) => config[key].clone(),
                None if from["fieldRef"]["fieldPath"] == "metadata.namespace" => {
                    namespace.to_owned()
                }
                // An IPv6 node's address, as the kubelet expands it (no brackets).
                None if from["fieldRef"]["fieldPath"] == "status.hostIP" => HOST_IP.to_owned(),
                None => return None,
            };
            Some((e["name"].as_str().unwrap().to_owned(), value))
        })
        .collect();
    container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut arg = a.as_str().unwrap().to_owned();
            for (name, value) in &env {
                arg = arg.replace(&format!("$({name})"), value);
            }
            arg
        })
        .collect()
}

/// `args` as this build's command line parses them.
pub fn parse(args: &[String], what: &str) -> interceptor::cli::Cli {
    interceptor::cli::Cli::try_parse_from(
        std::iter::once("interceptor".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the {what}'s arguments {args:?}: {e}"))
}

/// The agent's `daemon` arguments, parsed, and its log level.
pub fn agent_args(rendered: &Rendered) -> (String, interceptor::cli::DaemonArgs) {
    let args = args_of(
        container(rendered.daemonset(), "agent"),
        &rendered.config(),
        NAMESPACE,
    );
    let cli = parse(&args, "agent");
    let interceptor::cli::Command::Daemon(daemon) = cli.command else {
        panic!("the agent container runs {args:?}, not `daemon`");
    };
    (cli.log_level, daemon)
}
