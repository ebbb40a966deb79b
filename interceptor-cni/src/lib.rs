//! `interceptor-cni`: a chained CNI plugin (spec 1.1; configurations of versions 0.3.0 to
//! 1.1.0 are accepted) that registers a pod's network namespace with the interceptor node agent
//! on ADD, before any container of the pod starts, and answers only once interception is in
//! force. It passes `prevResult` through unchanged and talks to the agent over its API, so it
//! builds without aya or the eBPF toolchain.
//!
//! - ADD: register (or update) the pod; the agent unreachable, or not answering in time, is
//!   error 11 ("try again later"): the runtime retries the sandbox, and a pod never starts
//!   unmeshed. Which pods: those Linkerd injected, by the annotations the runtime passes
//!   (`"pods": "injected"`, the default for a Kubernetes pod), or all of them (`"all"`); the
//!   others pass through untouched, never held up by the agent (see [`deadline`]).
//! - DEL: unregister; succeeds when the pod or the agent is already gone.
//! - CHECK: fails unless the pod is registered with this configuration.
//! - STATUS: fails only when the plugin cannot work at all: its own configuration is not valid
//!   (7). The agent down is not that: only the pods Linkerd injected wait for it (ADD answers
//!   11), and a runtime that polls STATUS (containerd 2 for `cniVersion` 1.1.0 networks) would
//!   otherwise mark the node NotReady and evict every pod on it. STATUS then succeeds and says
//!   so in the log.
//! - GC: unregisters pods whose container is not among `cni.dev/valid-attachments`.
//! - VERSION.
//!
//! Errors are the spec's JSON on stdout; the plugin logs to `log_file`
//! (default `/var/log/interceptor-cni.log`), as stdout belongs to the runtime.
#![forbid(unsafe_code)]
mod config;
pub mod install;

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub use config::{
    NetConf, POD_ANNOTATIONS, SUPPORTED_VERSIONS, parse_cni_args, pod_selection, pod_settings,
};
use interceptor_api::{ClientError, ErrorKind, KubePod, PodAdd, PodInfo, PodMeta, Request};
use interceptor_config::{
    annotations::{self, Decision, SkipReason},
    mesh::{Plan, PodSettings, Pods, pod_plan},
};
use serde_json::{Value, json};

/// A CNI error: the spec's codes below 100, ours from 100.
#[derive(Debug)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The agent refused the registration (the details say why).
    pub const AGENT_REFUSED: u32 = 100;
    /// CHECK: the pod is not registered, or with another configuration.
    pub const NOT_REGISTERED: u32 = 101;
}

pub use interceptor_api::deadline;

fn error(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.into(),
        details: details.into(),
    }
}

/// What the plugin talks to on its node: the agent's API at a socket, and its log file. The
/// plugin's binary has [`Host`]; the `cni_commands` fuzz target plays both.
pub trait Node {
    /// A request to the agent at `socket` (`interceptor_api::call_within`).
    fn call(
        &self,
        socket: &Path,
        request: &Request,
        deadline: Duration,
    ) -> Result<Vec<PodInfo>, ClientError>;
    /// The agent's view of a pod's Kubernetes object (`interceptor_api::pod_annotations`).
    fn pod_annotations(
        &self,
        socket: &Path,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        deadline: Duration,
    ) -> Result<KubePod, ClientError>;
    /// Appends `line` to the log file `file`; a log that cannot be written never fails the
    /// command.
    fn log(&self, file: &Path, line: &str);
}

/// The node the plugin's binary runs on.
pub struct Host;

impl Node for Host {
    fn call(
        &self,
        socket: &Path,
        request: &Request,
        deadline: Duration,
    ) -> Result<Vec<PodInfo>, ClientError> {
        interceptor_api::call_within(socket, request, deadline)
    }

    fn pod_annotations(
        &self,
        socket: &Path,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        deadline: Duration,
    ) -> Result<KubePod, ClientError> {
        interceptor_api::pod_annotations(socket, namespace, name, uid, deadline)
    }

    fn log(&self, file: &Path, line: &str) {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// What the runtime gives the plugin, and the node it runs on.
struct Invocation<'a> {
    node: &'a dyn Node,
    container_id: String,
    netns: Option<PathBuf>,
    cni_args: BTreeMap<String, String>,
    conf: NetConf,
}

pub fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let version = |stdin: &[u8]| {
        serde_json::from_slice::<Value>(stdin)
            .ok()
            .and_then(|v| v["cniVersion"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "1.1.0".into())
    };
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let result = std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(|e| error(code::IO_FAILURE, "reading the configuration", e.to_string()))
        .and_then(|_| run(&command, |name| std::env::var(name).ok(), &stdin, &Host));
    match result {
        Ok(Some(output)) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            let out = json!({
                "cniVersion": version(&stdin),
                "code": e.code,
                "msg": e.msg,
                "details": e.details,
            });
            println!("{out}");
            let _ = std::io::stdout().flush();
            ExitCode::FAILURE
        }
    }
}

/// Runs one command with the runtime's environment (`env`, read by name) and configuration
/// (`stdin`) on `node`; `Some(json)` is what goes to stdout. The plugin's binary runs it on
/// [`Host`]; the `cni_commands` fuzz target on a node its input plays.
pub fn run(
    command: &str,
    env: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    node: &dyn Node,
) -> Result<Option<String>, CniError> {
    if command == "VERSION" {
        return Ok(Some(
            json!({ "cniVersion": "1.1.0", "supportedVersions": SUPPORTED_VERSIONS }).to_string(),
        ));
    }
    let invocation = invocation(stdin, env, node)?;
    let log = Log::new(&invocation);
    let result = match command {
        "ADD" => add(&invocation, &log),
        "DEL" => del(&invocation, &log).map(|()| None),
        "CHECK" => check(&invocation).map(|()| None),
        "STATUS" => status(&invocation, &log).map(|()| None),
        "GC" => gc(&invocation, &log).map(|()| None),
        other => Err(error(
            code::INVALID_ENV,
            format!("CNI_COMMAND {other:?} is not a CNI command"),
            "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
        )),
    };
    match &result {
        Ok(_) => log.write(&format!("{command}: ok")),
        Err(e) => log.write(&format!(
            "{command}: error {}: {}: {}",
            e.code, e.msg, e.details
        )),
    }
    result
}

/// The runtime's configuration (`stdin`) and environment (`env`, read by name) as one
/// invocation: the configuration decoded and its version checked, `CNI_ARGS` parsed.
fn invocation<'a>(
    stdin: &[u8],
    env: impl Fn(&str) -> Option<String>,
    node: &'a dyn Node,
) -> Result<Invocation<'a>, CniError> {
    let conf: NetConf = serde_json::from_slice(stdin).map_err(|e| {
        error(
            code::DECODE_FAILURE,
            "the network configuration is not valid JSON of a CNI configuration",
            e.to_string(),
        )
    })?;
    if !SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()) {
        return Err(error(
            code::INCOMPATIBLE_VERSION,
            format!("CNI version {} is not supported", conf.cni_version),
            format!("supported: {}", SUPPORTED_VERSIONS.join(", ")),
        ));
    }
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    Ok(Invocation {
        node,
        container_id: env("CNI_CONTAINERID").unwrap_or_default(),
        netns: env("CNI_NETNS").map(PathBuf::from),
        cni_args: parse_cni_args(&env("CNI_ARGS").unwrap_or_default())
            .map_err(|e| error(code::INVALID_ENV, "CNI_ARGS is malformed", e))?,
        conf,
    })
}

/// What ADD decides for one invocation, short of the socket: the request it sends the agent
/// (`None` for a simulated pod, which sends nothing) and what it prints. `env` is the runtime's
/// environment, `stdin` its configuration; `agent` answers in place of the agent's view of the
/// Kubernetes API. What the plugin does with outside input, for the fuzz targets (`fuzz/`).
pub fn add_decision(
    env: impl Fn(&str) -> Option<String>,
    stdin: &[u8],
    agent: impl Fn(AgentLookup) -> Result<KubePod, CniError>,
) -> Result<(Option<Request>, String), CniError> {
    // The agent is asked through `agent`: nothing is sent, and nothing logged.
    let inv = invocation(stdin, env, &Host)?;
    let netns = require_netns(&inv)?;
    let request = match plan_with(&inv, agent)? {
        Plan::Mesh(settings) if settings.simulate => None,
        Plan::Mesh(settings) => Some(registration(&inv, netns, settings.config)),
        Plan::Skip(reason) => Some(skipped(&inv, reason)),
    };
    Ok((request, add_result(&inv)))
}

/// What the plugin asks the agent of a pod's Kubernetes object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentLookup {
    /// The runtime passed no annotations: the pod's, or error 11.
    Pod,
    /// The runtime passed them: whether it is a control-plane pod, or has `linkerd-init`.
    ControlPlane,
}

fn socket(inv: &Invocation) -> PathBuf {
    inv.conf
        .agent_socket
        .clone()
        .unwrap_or_else(|| config::DEFAULT_AGENT_SOCKET.into())
}

fn require_netns<'a>(inv: &'a Invocation) -> Result<&'a Path, CniError> {
    inv.netns
        .as_deref()
        .ok_or_else(|| error(code::INVALID_ENV, "CNI_NETNS is not set", ""))
}

/// The pod's configuration, checked before the agent is asked: a bad value fails with the
/// invalid-configuration code and the same words the agent and the CLI use.
fn settings(inv: &Invocation) -> Result<PodSettings, CniError> {
    pod_settings(&inv.conf, &inv.cni_args)
        .map_err(|e| error(code::INVALID_CONFIG, "invalid linkerd configuration", e))
}

/// Which pods the configuration meshes.
fn selection(inv: &Invocation) -> Result<Pods, CniError> {
    pod_selection(&inv.conf, &inv.cni_args)
        .map_err(|e| error(code::INVALID_CONFIG, "invalid plugin configuration", e))
}

/// Whether the pod is meshed ([`Pods`]) and with which settings ([`pod_plan`]): the conflist's,
/// with the pod's annotations as the runtime passed them (or the agent read them), its
/// namespace's (from the agent's view of the API), and linkerd-cni's rules.
fn plan(inv: &Invocation) -> Result<Plan, CniError> {
    plan_with(inv, |lookup| match lookup {
        AgentLookup::Pod => look_up(inv),
        AgentLookup::ControlPlane => control_plane(inv),
    })
}

/// [`plan`], with `agent` answering the questions to the agent.
fn plan_with(
    inv: &Invocation,
    agent: impl Fn(AgentLookup) -> Result<KubePod, CniError>,
) -> Result<Plan, CniError> {
    let settings = settings(inv)?;
    let pods = selection(inv)?;
    let passed = inv
        .conf
        .runtime_config
        .as_ref()
        .and_then(|r| r.pod_annotations.clone());
    let pod = match (pods, passed) {
        (Pods::All, passed) => KubePod {
            annotations: passed.unwrap_or_default(),
            ..KubePod::default()
        },
        // Without them, the agent reads the pod from the Kubernetes API.
        (Pods::Injected, None) => agent(AgentLookup::Pod)?,
        (Pods::Injected, Some(annotations)) => {
            if let Decision::Skip { reason } = annotations::decide(&annotations) {
                return Ok(Plan::Skip(reason));
            }
            // The runtime passes no labels or containers: the agent tells whether it is a
            // control-plane pod, or one with a linkerd-init container.
            KubePod {
                annotations,
                ..agent(AgentLookup::ControlPlane)?
            }
        }
    };
    pod_plan(settings, pods, &pod).map_err(|e| {
        error(
            code::INVALID_CONFIG,
            "invalid linkerd annotation on the pod or its namespace",
            e.to_string(),
        )
    })
}

/// The pod's annotations and labels from the agent's view of the Kubernetes API, for a runtime
/// that passed no annotations. Unanswered, the pod may be one Linkerd injected: it must not start
/// unmeshed, and meshing a pod without a proxy would break its connections; the runtime retries
/// (11).
fn look_up(inv: &Invocation) -> Result<KubePod, CniError> {
    let Some((namespace, name, uid)) = kubernetes_pod(inv) else {
        return Err(error(
            code::TRY_AGAIN_LATER,
            "the runtime passed neither the pod's annotations nor its name: cannot tell \
             whether Linkerd injected it",
            format!(
                "declare the capability {{\"{POD_ANNOTATIONS}\": true}} in the plugin's \
                 conflist entry (interceptor cni install does), or set \"pods\": \"all\""
            ),
        ));
    };
    inv.node
        .pod_annotations(
            &socket(inv),
            namespace,
            name,
            uid,
            deadline::POD_ANNOTATIONS,
        )
        .map_err(|e| match e {
            ClientError::Refused {
                kind: ErrorKind::Unavailable | ErrorKind::NoKubernetes,
                message,
            } => error(
                code::TRY_AGAIN_LATER,
                "the runtime passed no pod annotations and the Kubernetes API could not give them: \
             cannot tell whether Linkerd injected the pod; try again later",
                format!(
                    "{message}; or declare the capability {{\"{POD_ANNOTATIONS}\": true}} in the \
                 plugin's conflist entry (interceptor cni install does)"
                ),
            ),
            e => agent_error(e),
        })
}

/// Whether an injected pod whose annotations the runtime passed is one of Linkerd's control
/// plane, or has a `linkerd-init` init container, from the agent's view of the Kubernetes API
/// (runtimes pass neither labels nor containers). An agent that does not read the API cannot
/// tell: the pod is meshed without these two rules of linkerd-cni. One that reads it but gets
/// no answer in time: try again later (11), as linkerd-cni, which reads every pod from the
/// API, fails then.
fn control_plane(inv: &Invocation) -> Result<KubePod, CniError> {
    let Some((namespace, name, uid)) = kubernetes_pod(inv) else {
        return Ok(KubePod::default());
    };
    match inv.node.pod_annotations(
        &socket(inv),
        namespace,
        name,
        uid,
        deadline::POD_ANNOTATIONS,
    ) {
        Ok(pod) => Ok(pod),
        Err(ClientError::Refused {
            kind: ErrorKind::NoKubernetes,
            ..
        }) => Ok(KubePod::default()),
        Err(ClientError::Refused {
            kind: ErrorKind::Unavailable,
            message,
        }) => Err(error(
            code::TRY_AGAIN_LATER,
            "the Kubernetes API could not say whether the pod is part of Linkerd's control \
             plane (whose connections to the API server bypass its proxy); try again later",
            message,
        )),
        Err(e) => Err(agent_error(e)),
    }
}

/// The Kubernetes pod `CNI_ARGS` names: namespace, name and UID if given.
fn kubernetes_pod<'a>(inv: &'a Invocation) -> Option<(&'a str, &'a str, Option<&'a str>)> {
    let arg = |key: &str| {
        inv.cni_args
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    Some((
        arg("K8S_POD_NAMESPACE")?,
        arg("K8S_POD_NAME")?,
        arg("K8S_POD_UID"),
    ))
}

/// The agent's answer as a CNI error.
fn agent_error(e: ClientError) -> CniError {
    match e {
        ClientError::Unreachable { .. } => error(
            code::TRY_AGAIN_LATER,
            "the interceptor agent is not reachable; try again later",
            e.to_string(),
        ),
        ClientError::TimedOut { .. } => error(
            code::TRY_AGAIN_LATER,
            "the interceptor agent did not answer in time; try again later",
            e.to_string(),
        ),
        ClientError::Refused {
            kind: ErrorKind::InvalidConfig,
            message,
        } => error(
            code::INVALID_CONFIG,
            "invalid linkerd configuration",
            message,
        ),
        ClientError::Refused {
            kind: ErrorKind::Unavailable,
            message,
        } => error(
            code::TRY_AGAIN_LATER,
            "the interceptor agent cannot do it now; try again later",
            message,
        ),
        ClientError::Refused { kind, message } => error(
            code::AGENT_REFUSED,
            format!("the interceptor agent refused the pod ({kind:?})"),
            message,
        ),
        e @ ClientError::Protocol { .. } => error(
            code::TRY_AGAIN_LATER,
            "talking to the interceptor agent",
            e.to_string(),
        ),
    }
}

fn add(inv: &Invocation, log: &Log) -> Result<Option<String>, CniError> {
    let netns = require_netns(inv)?;
    match plan(inv)? {
        Plan::Mesh(settings) => register(inv, log, netns, settings)?,
        Plan::Skip(reason) => skip(inv, log, reason),
    }
    Ok(Some(add_result(inv)))
}

/// The previous plugin's result, unchanged; the configuration's version on an empty one.
fn add_result(inv: &Invocation) -> String {
    let mut result = inv.conf.prev_result.clone().unwrap_or_else(|| json!({}));
    if let Value::Object(map) = &mut result {
        map.insert("cniVersion".into(), json!(inv.conf.cni_version));
    }
    result.to_string()
}

/// A pod let through unmeshed: a line in the plugin's log, and the agent told so that it logs
/// and counts it. The pod does not depend on the agent: if it cannot be told within
/// [`deadline::SKIPPED`], ADD still succeeds.
fn skip(inv: &Invocation, log: &Log, reason: SkipReason) {
    let meta = pod_meta(inv);
    log.write(&format!(
        "ADD: pod {}/{} not meshed: {reason}",
        meta.namespace.as_deref().unwrap_or("-"),
        meta.name.as_deref().unwrap_or("-"),
    ));
    let request = skipped(inv, reason);
    if let Err(e) = inv.node.call(&socket(inv), &request, deadline::SKIPPED) {
        log.write(&format!("ADD: the agent was not told: {e}"));
    }
}

/// The agent's notice of a pod let through unmeshed.
fn skipped(inv: &Invocation, reason: SkipReason) -> Request {
    Request::Skipped {
        meta: pod_meta(inv),
        reason: reason.label().to_owned(),
    }
}

/// The registration of a pod to mesh.
fn registration(
    inv: &Invocation,
    netns: &Path,
    config: interceptor_config::InterceptionConfig,
) -> Request {
    Request::Add(PodAdd {
        netns: netns.to_owned(),
        meta: pod_meta(inv),
        config,
        // A runtime may repeat ADD with a changed configuration: the latest one applies.
        update: true,
        takeover_iptables: false,
    })
}

/// What the runtime says the pod is called.
fn pod_meta(inv: &Invocation) -> PodMeta {
    PodMeta {
        name: inv.cni_args.get("K8S_POD_NAME").cloned(),
        namespace: inv.cni_args.get("K8S_POD_NAMESPACE").cloned(),
        container_id: Some(inv.container_id.clone()).filter(|c| !c.is_empty()),
        uid: inv.cni_args.get("K8S_POD_UID").cloned(),
    }
}

/// A registration the agent cannot make now (it could not read the pod's namespace: nothing was
/// written) is tried this many times, [`REGISTER_PAUSE`] apart, all within
/// [`deadline::REGISTER`]; then ADD fails with error 11 and the agent's reason, and the runtime
/// retries the sandbox.
const REGISTER_ATTEMPTS: u32 = 3;
const REGISTER_PAUSE: Duration = Duration::from_millis(200);

fn register(
    inv: &Invocation,
    log: &Log,
    netns: &Path,
    settings: PodSettings,
) -> Result<(), CniError> {
    if settings.simulate {
        log.write(&format!(
            "ADD: simulate: would register {} with {}",
            netns.display(),
            settings.config.to_args().join(" ")
        ));
    } else {
        let request = registration(inv, netns, settings.config);
        let started = Instant::now();
        let left_after_a_pause =
            || deadline::REGISTER.saturating_sub(started.elapsed() + REGISTER_PAUSE);
        // The first attempt has the whole deadline, as any other request's.
        let (mut within, mut attempt) = (deadline::REGISTER, 1);
        loop {
            match inv.node.call(&socket(inv), &request, within) {
                Err(ClientError::Refused {
                    kind: ErrorKind::Unavailable,
                    message,
                }) if attempt < REGISTER_ATTEMPTS && left_after_a_pause() > REGISTER_PAUSE => {
                    log.write(&format!(
                        "ADD: {} not registered yet, trying again: {message}",
                        netns.display()
                    ));
                    std::thread::sleep(REGISTER_PAUSE);
                    within = deadline::REGISTER.saturating_sub(started.elapsed());
                    attempt += 1;
                }
                answer => {
                    answer.map_err(agent_error)?;
                    break;
                }
            }
        }
        log.write(&format!("ADD: {} registered", netns.display()));
    }
    Ok(())
}

/// The agent's pods, or `None` when the agent cannot be reached.
fn pods(inv: &Invocation) -> Result<Option<Vec<PodInfo>>, CniError> {
    match inv.node.call(&socket(inv), &Request::List, deadline::QUERY) {
        Ok(pods) => Ok(Some(pods)),
        Err(ClientError::Unreachable { .. }) => Ok(None),
        Err(e) => Err(agent_error(e)),
    }
}

fn del(inv: &Invocation, log: &Log) -> Result<(), CniError> {
    // DEL may come without a namespace (it is already gone): find the pod by container id.
    let netns = match &inv.netns {
        Some(netns) => Some(netns.clone()),
        None => pods(inv)?.and_then(|pods| {
            pods.into_iter()
                .find(|p| {
                    !inv.container_id.is_empty()
                        && p.meta.container_id.as_deref() == Some(&inv.container_id)
                })
                .map(|p| p.netns)
        }),
    };
    let Some(netns) = netns else {
        log.write("DEL: no such pod registered: nothing to do");
        return Ok(());
    };
    match inv.node.call(
        &socket(inv),
        &Request::Remove {
            netns: netns.clone(),
        },
        deadline::QUERY,
    ) {
        Ok(_) => log.write(&format!("DEL: {} removed", netns.display())),
        // The agent is gone: there is nothing left to remove the pod from.
        Err(ClientError::Unreachable { .. }) => {
            log.write("DEL: the agent is not running: nothing to do")
        }
        Err(e) => return Err(agent_error(e)),
    }
    Ok(())
}

fn check(inv: &Invocation) -> Result<(), CniError> {
    let netns = require_netns(inv)?;
    let settings = match plan(inv)? {
        Plan::Mesh(settings) if !settings.simulate => settings,
        Plan::Mesh(_) | Plan::Skip(_) => return Ok(()),
    };
    let pods = inv
        .node
        .call(
            &socket(inv),
            &Request::Get {
                netns: netns.to_owned(),
            },
            deadline::QUERY,
        )
        .map_err(|e| match e {
            ClientError::Refused {
                kind: ErrorKind::UnknownNetns,
                message,
            } => error(
                code::NOT_REGISTERED,
                "the pod is not registered with the interceptor agent",
                message,
            ),
            e => agent_error(e),
        })?;
    match pods.first() {
        // Compared as configurations: an equivalent one spelled differently is the same.
        Some(pod) if pod.config == settings.config => Ok(()),
        Some(pod) => Err(error(
            code::NOT_REGISTERED,
            "the pod is registered with another configuration",
            format!(
                "registered: {}; configured: {}",
                pod.config.to_args().join(" "),
                settings.config.to_args().join(" ")
            ),
        )),
        None => Err(error(
            code::NOT_REGISTERED,
            "the pod is not registered with the interceptor agent",
            netns.display().to_string(),
        )),
    }
}

/// Ready unless the configuration is not valid (see the module's documentation); the agent is
/// asked only to say in the log when it does not answer.
fn status(inv: &Invocation, log: &Log) -> Result<(), CniError> {
    settings(inv)?;
    selection(inv)?;
    if let Err(e) = inv
        .node
        .call(&socket(inv), &Request::List, deadline::STATUS)
    {
        log.write(&format!(
            "STATUS: ready, but the agent does not answer: pods Linkerd injected wait (ADD \
             answers 11) until it does; other pods start: {e}"
        ));
    }
    Ok(())
}

fn gc(inv: &Invocation, log: &Log) -> Result<(), CniError> {
    let valid: Vec<&str> = inv
        .conf
        .valid_attachments
        .iter()
        .flatten()
        .map(|a| a.container_id.as_str())
        .collect();
    let Some(pods) = pods(inv)? else {
        return Ok(());
    };
    // Only pods this plugin registered carry a container id: others (interceptor run) stay.
    for pod in pods {
        let Some(container) = pod.meta.container_id.as_deref() else {
            continue;
        };
        if !valid.contains(&container) {
            inv.node
                .call(
                    &socket(inv),
                    &Request::Remove {
                        netns: pod.netns.clone(),
                    },
                    deadline::QUERY,
                )
                .map_err(agent_error)?;
            log.write(&format!(
                "GC: {} (container {container}) removed",
                pod.netns.display()
            ));
        }
    }
    Ok(())
}

/// Lines for the log file, through the invocation's node.
struct Log<'a> {
    node: &'a dyn Node,
    path: PathBuf,
    prefix: String,
}

impl<'a> Log<'a> {
    fn new(inv: &Invocation<'a>) -> Self {
        Self {
            node: inv.node,
            path: inv
                .conf
                .log_file
                .clone()
                .unwrap_or_else(|| config::DEFAULT_LOG_FILE.into()),
            prefix: format!(
                "container={} netns={}",
                inv.container_id,
                inv.netns.as_deref().unwrap_or(Path::new("-")).display()
            ),
        }
    }

    fn write(&self, line: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.node
            .log(&self.path, &format!("{now:.3} {} {line}", self.prefix));
    }
}
