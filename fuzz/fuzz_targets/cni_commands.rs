//! The CNI plugin's DEL, CHECK, GC and STATUS, each run by the plugin's own entry
//! (`interceptor_cni::run`) on a node the input plays: the runtime's environment and
//! configuration, and the agent's answers. What each sends the agent, and what it answers the
//! runtime, is checked against the spec's rules and the plugin's promises: DEL and STATUS never
//! fail because the agent is down, GC removes exactly the pods of attachments the runtime no
//! longer has, CHECK passes only for a pod registered with the configuration it is given.
//!
//! Input: `NAME=VALUE` lines up to the first empty line, then stdin (the configuration). Names
//! other than the runtime's (`CNI_NETNS`, `CNI_CONTAINERID`, `CNI_ARGS`, ...): `AGENT=down`,
//! `AGENT=slow` or `AGENT=refuses:<kind>` (else it answers), `POD=<netns> <container id or ->
//! [proxy-init flags]` for each pod it has (Linkerd's defaults without flags), and
//! `KUBEPOD=<KubePod JSON>`, its view of the pod in the Kubernetes API.
#![no_main]

use std::{
    cell::RefCell,
    path::{Path, PathBuf},
    time::Duration,
};

use interceptor_api::{
    Backend, ClientError, ErrorKind, InterceptionConfig, KubePod, NetnsCookie, PodInfo, PodMeta,
    Request,
};
use interceptor_cni::{CniError, Node, code, run};
use libfuzzer_sys::fuzz_target;

/// How the agent answers.
#[derive(Clone, Debug)]
enum Agent {
    Answers,
    Down,
    Slow,
    Refuses(ErrorKind),
}

struct FuzzNode {
    agent: Agent,
    pods: Vec<PodInfo>,
    kube_pod: Option<KubePod>,
    sent: RefCell<Vec<Request>>,
}

impl FuzzNode {
    fn failure(&self, socket: &Path) -> Option<ClientError> {
        match &self.agent {
            Agent::Answers => None,
            Agent::Down => Some(ClientError::Unreachable {
                path: socket.to_owned(),
                io_error: std::io::ErrorKind::NotFound.into(),
            }),
            Agent::Slow => Some(ClientError::TimedOut {
                path: socket.to_owned(),
                deadline: Duration::from_secs(1),
                step: "the answer",
            }),
            Agent::Refuses(kind) => Some(ClientError::Refused {
                kind: *kind,
                message: format!("refused: {kind:?}"),
            }),
        }
    }
}

impl Node for FuzzNode {
    fn call(
        &self,
        socket: &Path,
        request: &Request,
        _deadline: Duration,
    ) -> Result<Vec<PodInfo>, ClientError> {
        self.sent.borrow_mut().push(request.clone());
        if let Some(e) = self.failure(socket) {
            return Err(e);
        }
        Ok(match request {
            Request::List => self.pods.clone(),
            Request::Get { netns } => {
                let pod = self.pods.iter().find(|p| p.netns == *netns).cloned();
                match pod {
                    Some(pod) => vec![pod],
                    None => {
                        return Err(ClientError::Refused {
                            kind: ErrorKind::UnknownNetns,
                            message: format!("{} is not registered", netns.display()),
                        });
                    }
                }
            }
            _ => Vec::new(),
        })
    }

    fn pod_annotations(
        &self,
        socket: &Path,
        _namespace: &str,
        _name: &str,
        _uid: Option<&str>,
        _deadline: Duration,
    ) -> Result<KubePod, ClientError> {
        if let Some(e) = self.failure(socket) {
            return Err(e);
        }
        self.kube_pod.clone().ok_or(ClientError::Refused {
            kind: ErrorKind::NoKubernetes,
            message: "no Kubernetes API".into(),
        })
    }

    fn log(&self, _file: &Path, line: &str) {
        assert!(!line.is_empty());
    }
}

fuzz_target!(|data: &[u8]| {
    let (env, stdin) = split(data);
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    };
    let agent = match var("AGENT").as_deref() {
        Some("down") => Agent::Down,
        Some("slow") => Agent::Slow,
        Some(other) => other
            .strip_prefix("refuses:")
            .and_then(|kind| serde_json::from_value(kind.into()).ok())
            .map_or(Agent::Answers, Agent::Refuses),
        None => Agent::Answers,
    };
    let pods: Vec<PodInfo> = env
        .iter()
        .filter(|(name, _)| *name == "POD")
        .filter_map(|(_, pod)| pod_info(pod))
        .collect();
    let kube_pod = var("KUBEPOD").and_then(|json| serde_json::from_str(&json).ok());
    let conf: Option<serde_json::Value> = serde_json::from_slice(stdin).ok();
    let valid: Option<Vec<String>> = conf.as_ref().and_then(|c| {
        c.get("cni.dev/valid-attachments")?
            .as_array()?
            .iter()
            .map(|a| Some(a.get("containerID")?.as_str()?.to_owned()))
            .collect()
    });

    for command in ["DEL", "CHECK", "GC", "STATUS"] {
        let node = FuzzNode {
            agent: agent.clone(),
            pods: pods.clone(),
            kube_pod: kube_pod.clone(),
            sent: RefCell::new(Vec::new()),
        };
        let result = run(command, var, stdin, &node);
        let sent = node.sent.into_inner();
        if let Err(e) = &result {
            assert!(e.code != 0, "a CNI error has a code");
            assert!(!e.msg.is_empty(), "a CNI error says what is wrong");
        }
        let removed: Vec<&Path> = sent
            .iter()
            .filter_map(|r| match r {
                Request::Remove { netns } => Some(netns.as_path()),
                _ => None,
            })
            .collect();
        for request in &sent {
            assert!(
                matches!(
                    request,
                    Request::List | Request::Get { .. } | Request::Remove { .. }
                ),
                "{command} registers nothing: {request:?}"
            );
        }
        match command {
            "DEL" => check_del(&result, &agent, &removed, &pods, var),
            "GC" => check_gc(&result, &agent, &removed, &pods, valid.as_deref()),
            "STATUS" => {
                assert!(removed.is_empty(), "STATUS removes nothing");
                if let Err(e) = &result {
                    assert!(
                        [
                            code::INCOMPATIBLE_VERSION,
                            code::DECODE_FAILURE,
                            code::INVALID_CONFIG,
                            code::INVALID_ENV
                        ]
                        .contains(&e.code),
                        "STATUS fails only for its configuration, never for the agent: {e:?}"
                    );
                }
            }
            _ => {
                assert!(removed.is_empty(), "CHECK removes nothing");
                if result.is_ok()
                    && let Some(Request::Get { netns }) = sent.last()
                {
                    assert!(
                        matches!(agent, Agent::Answers),
                        "CHECK passes a pod it asked for only on the agent's answer"
                    );
                    assert!(pods.iter().any(|p| p.netns == *netns), "a registered pod");
                }
            }
        }
    }
});

/// DEL removes the pod of `CNI_NETNS`, or without it the pod of the container; it fails only
/// when the agent answers but refuses, or does not answer in time.
fn check_del(
    result: &Result<Option<String>, CniError>,
    agent: &Agent,
    removed: &[&Path],
    pods: &[PodInfo],
    var: impl Fn(&str) -> Option<String>,
) {
    let Ok(output) = result else {
        let e = result.as_ref().unwrap_err();
        assert!(
            !matches!(agent, Agent::Down) || e.code != code::TRY_AGAIN_LATER,
            "DEL succeeds when the agent is gone: {e:?}"
        );
        return;
    };
    assert!(output.is_none(), "DEL prints nothing");
    assert!(removed.len() <= 1, "DEL removes one pod at most");
    let netns = var("CNI_NETNS").filter(|v| !v.is_empty());
    match (netns, removed.first()) {
        (Some(netns), Some(removed)) => assert_eq!(Path::new(&netns), *removed),
        (Some(_), None) => panic!("DEL with a namespace removes it"),
        (None, Some(removed)) => {
            let container = var("CNI_CONTAINERID").unwrap_or_default();
            assert!(
                pods.iter().any(|p| p.netns == *removed
                    && !container.is_empty()
                    && p.meta.container_id.as_deref() == Some(container.as_str())),
                "DEL without a namespace removes the container's pod"
            );
        }
        (None, None) => {}
    }
}

/// GC removes exactly the registered pods with a container not among the valid attachments,
/// and never one the plugin did not register (without a container id).
fn check_gc(
    result: &Result<Option<String>, CniError>,
    agent: &Agent,
    removed: &[&Path],
    pods: &[PodInfo],
    valid: Option<&[String]>,
) {
    for netns in removed {
        assert!(
            pods.iter()
                .any(|p| p.netns == *netns && p.meta.container_id.is_some()),
            "GC removes only the plugin's pods"
        );
    }
    if let (Agent::Down, Err(e)) = (agent, result) {
        assert_ne!(
            e.code,
            code::TRY_AGAIN_LATER,
            "GC with the agent gone has nothing to do: {e:?}"
        );
    }
    if result.is_ok() && matches!(agent, Agent::Answers) {
        let valid = valid.unwrap_or_default();
        let stale: Vec<&Path> = pods
            .iter()
            .filter(|p| {
                p.meta
                    .container_id
                    .as_ref()
                    .is_some_and(|c| !valid.contains(c))
            })
            .map(|p| p.netns.as_path())
            .collect();
        assert_eq!(
            removed, stale,
            "GC removes the stale pods, in the agent's order"
        );
    }
}

/// `<netns> <container id or -> [proxy-init flags]`.
fn pod_info(line: &str) -> Option<PodInfo> {
    let mut words = line.split_whitespace();
    let netns = PathBuf::from(words.next()?);
    let container_id = words.next().filter(|c| *c != "-").map(str::to_owned);
    let args: Vec<String> = words.map(str::to_owned).collect();
    let config = if args.is_empty() {
        InterceptionConfig::linkerd()
    } else {
        InterceptionConfig::from_proxy_init_args(&args).ok()?
    };
    Some(PodInfo {
        netns,
        netns_cookie: NetnsCookie(1),
        meta: PodMeta {
            container_id,
            ..PodMeta::default()
        },
        backend: Backend::Ebpf,
        slot: None,
        args: config.to_args(),
        config,
        addresses: Vec::new(),
        inbound_listener: None,
        counters: None,
        problem: None,
    })
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
