//! The CNI plugin's ADD for one invocation, short of the socket: the runtime's environment and
//! its configuration on stdin, up to the request the plugin would send the agent and what it
//! would print.
//!
//! Input: `NAME=VALUE` lines (`CNI_NETNS`, `CNI_ARGS`, ...) up to the first empty line, then
//! stdin. The line `AGENT=<KubePod JSON>` is the agent's answer about the pod; without it the
//! agent answers "try again later", as an agent without the Kubernetes API does.
#![no_main]

use interceptor_api::{KubePod, Request};
use interceptor_cni::{CniError, add_decision};
use interceptor_fuzz::assert_round_trips;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (env, stdin) = split(data);
    let agent_pod = env
        .iter()
        .find(|(name, _)| *name == "AGENT")
        .and_then(|(_, pod)| serde_json::from_str::<KubePod>(pod).ok());
    let agent = |_| {
        agent_pod.clone().ok_or_else(|| CniError {
            code: interceptor_cni::code::TRY_AGAIN_LATER,
            msg: "the fuzz target's agent has no answer".into(),
            details: String::new(),
        })
    };
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    };
    match add_decision(var, stdin, agent) {
        Ok((request, output)) => {
            let output: serde_json::Value = serde_json::from_str(&output).expect("ADD prints JSON");
            assert!(
                output.get("cniVersion").is_some() || !output.is_object(),
                "ADD's result carries the configuration's version: {output}"
            );
            if let Some(request) = request {
                check_request(&request);
            }
        }
        Err(e) => {
            assert!(e.code != 0, "a CNI error has a code");
            assert!(!e.msg.is_empty(), "a CNI error says what is wrong");
        }
    }
});

/// The request decodes as the agent decodes it, and a registration's configuration is valid.
fn check_request(request: &Request) {
    let json = serde_json::to_string(request).expect("a request serializes");
    let back: Request = serde_json::from_str(&json).expect("the agent decodes the request");
    assert_eq!(
        serde_json::to_value(&back).expect("a request serializes"),
        serde_json::from_str::<serde_json::Value>(&json).expect("JSON"),
        "the request survives the socket unchanged"
    );
    if let Request::Add(add) = request {
        assert_round_trips(&add.config, "the plugin's registration");
    }
}

/// The environment's lines, and stdin after the first empty line.
fn split(data: &[u8]) -> (Vec<(&str, &str)>, &[u8]) {
    let (head, stdin) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (&[][..], data),
    };
    let env = std::str::from_utf8(head)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('='))
        .collect();
    (env, stdin)
}
