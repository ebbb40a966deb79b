//! The interceptor node agent's API: one JSON request per connection on its Unix socket
//! (default `/run/interceptor/agent.sock`, root only), one JSON response. This crate has no eBPF
//! or aya dependency, so clients such as the CNI plugin build without the eBPF toolchain.
//!
//! A pod's configuration travels as plain data ([`InterceptionConfig`], from the
//! `interceptor-config` crate), validated by that crate on the way in, so a bad value gets the
//! same message whichever way it arrives (CLI, `pod add`, the CNI plugin's `linkerd` block). A
//! client older than that may still send proxy-init's flags (`args`).
#![forbid(unsafe_code)]
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

pub use interceptor_common::{NetnsCookie, PodSlot};
pub use interceptor_config::{
    ConfigError, InterceptionConfig,
    kube::{KubePod, PodFacts},
};
use serde::{Deserialize, Serialize};

pub mod node_status;
pub mod records;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "a request is built once per call and sent: boxing the large `Add` would buy nothing"
)]
pub enum Request {
    /// Registers a pod and answers once its interception is in force. Idempotent: the same pod
    /// with the same configuration changes nothing; another configuration is a conflict unless
    /// `update` asks to apply it in place.
    Add(PodAdd),
    /// Unregisters the pod whose network namespace is at `netns`; a pod that is not registered
    /// is not an error.
    Remove {
        netns: PathBuf,
    },
    List,
    Get {
        netns: PathBuf,
    },
    /// Whether interception is in force as configured: the node's links attached to the
    /// agent's cgroup, every pod's entries complete.
    Health,
    /// A pod the CNI plugin let through unmeshed, and why (a stable label such as
    /// `not_injected`): the agent logs it and counts it. Registers nothing.
    Skipped {
        #[serde(default)]
        meta: PodMeta,
        reason: String,
    },
    /// A Kubernetes pod's annotations, from the agent's watch of its node's pods or the
    /// Kubernetes API: for the CNI plugin when the runtime passed none. `uid`, when given, must
    /// match (a pod of the same name may have been deleted and created again).
    PodAnnotations {
        namespace: String,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uid: Option<String>,
    },
    /// The watching CNI installer had to chain the plugin again into `conf`, the node's primary
    /// network configuration, which the primary CNI had rewritten without it: the agent logs it
    /// and counts it. Best effort: the installer does not wait long for the answer, nor retry.
    ChainRestored {
        conf: PathBuf,
    },
}

/// A registration. Decoded through [`PodAddRequest`], so a configuration that is not valid never
/// becomes one.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "PodAddRequest")]
pub struct PodAdd {
    /// The pod's network namespace (`/run/netns/NAME`, `/proc/PID/ns/net`, a CNI netns path).
    pub netns: PathBuf,
    pub meta: PodMeta,
    /// How the pod is intercepted.
    pub config: InterceptionConfig,
    pub update: bool,
    /// Once interception is in force, remove the nat-table chains proxy-init wrote in the pod
    /// (legacy and nft, both families): how a pod meshed with iptables moves to eBPF without
    /// a restart and without a gap (both are in force for a moment, which is harmless).
    pub takeover_iptables: bool,
}

/// `add` as it arrives: from this version's clients with `config`, from clients that predate
/// it with the configuration as proxy-init's flags in `args`, which are read here and nowhere
/// else.
#[derive(Deserialize)]
pub struct PodAddRequest {
    netns: PathBuf,
    #[serde(default)]
    meta: PodMeta,
    #[serde(default)]
    config: Option<InterceptionConfig>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    update: bool,
    #[serde(default)]
    takeover_iptables: bool,
}

impl PodAddRequest {
    /// The request's configuration: `config`, or else `args` read as proxy-init's flags.
    pub fn config(&self) -> Result<InterceptionConfig, ConfigError> {
        config_or_flags(self.config.as_ref(), &self.args)
    }
}

/// A configuration as this version writes it (`config`), or else as what predates it wrote it
/// (`args`, proxy-init's flags): a registration of an older client, a record of an older agent.
fn config_or_flags(
    config: Option<&InterceptionConfig>,
    args: &[String],
) -> Result<InterceptionConfig, ConfigError> {
    match config {
        Some(config) => Ok(config.clone()),
        None => InterceptionConfig::from_proxy_init_args(args),
    }
}

impl TryFrom<PodAddRequest> for PodAdd {
    type Error = ConfigError;

    fn try_from(request: PodAddRequest) -> Result<Self, ConfigError> {
        Ok(Self {
            config: request.config()?,
            netns: request.netns,
            meta: request.meta,
            update: request.update,
            takeover_iptables: request.takeover_iptables,
        })
    }
}

/// What a pod is called, for display and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Kubernetes pod's UID (`K8S_POD_UID`): tells a pod from a later one of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// Which backend intercepts a pod (and which one an agent uses): the eBPF programs, or
/// proxy-init's nat-table chains in the pod's network namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Records and answers from agents that predate the choice are eBPF.
    #[default]
    Ebpf,
    Iptables,
}

impl Backend {
    /// `ebpf` or `iptables`, as in metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ebpf => "ebpf",
            Self::Iptables => "iptables",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A registered pod, as `pod list` and `pod get` show it. What only the eBPF maps know (the
/// counter slot, the counters, whether the proxy's inbound listener is known) is absent for a
/// pod the iptables backend meshes: not zero, unknown.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodInfo {
    pub netns: PathBuf,
    /// The pod's key: its netns cookie, or where the kernel cannot tell it (before Linux 5.14,
    /// iptables backend only) a key derived from the namespace's inode.
    pub netns_cookie: NetnsCookie,
    pub meta: PodMeta,
    #[serde(default)]
    pub backend: Backend,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<PodSlot>,
    /// The configuration as proxy-init's flags, for display.
    pub args: Vec<String>,
    pub config: InterceptionConfig,
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_listener: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<BTreeMap<String, u64>>,
    /// Why the pod's interception is not exactly what its configuration asks for, when it is
    /// not (see [`Health`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The agent's answer to [`Request::Health`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// What is not in force as configured, the node's and each pod's; empty when all is.
    pub problems: Vec<String>,
    /// The agent's backend.
    #[serde(default)]
    pub backend: Backend,
    /// The node's problems only (also in `problems`): what keeps new pods from being meshed,
    /// which the agent's `/ready` answers. `None` from an agent that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_problems: Option<Vec<String>>,
    /// What the node should know but is no failure: how the agent works around a missing
    /// capability, say. Empty from an agent that predates it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    Ok { pods: Vec<PodInfo> },
    Health(Health),
    Annotations(KubePod),
    Error { kind: ErrorKind, message: String },
}

/// How long the CNI plugin waits for the agent, by request: connecting, sending and the answer
/// together. A runtime gives ADD no deadline of its own (the kubelet gives up on
/// `RunPodSandbox` after its runtime request timeout, 2 minutes by default), so each bound is
/// how long an agent that takes the connection and never answers can hold up a pod.
pub mod deadline {
    use std::time::Duration;

    /// The notice of a pod let through unmeshed: best effort, and that pod must never wait on
    /// the agent. The agent answers it at once, unless its lock is held.
    pub const SKIPPED: Duration = Duration::from_millis(250);
    /// STATUS's question to the agent, which only decides what the plugin logs.
    pub const STATUS: Duration = Duration::from_secs(1);
    /// DEL, CHECK and GC: listing, getting and removing pods, answered under the agent's lock
    /// (removing an iptables pod runs iptables in it).
    pub const QUERY: Duration = Duration::from_secs(5);
    /// A pod's annotations and labels from the agent's view of the Kubernetes API. The agent
    /// bounds each read of the API to 3 s (`LOOKUP_DEADLINE` in the agent's `kube_pods`) and
    /// makes at most two in a row (the pod, then for a control-plane pod the `kubernetes`
    /// Service): waiting longer than those 6 s lets its answer, "unavailable" with the reason,
    /// arrive rather than a timeout of ours. Either is error 11.
    pub const POD_ANNOTATIONS: Duration = Duration::from_secs(10);
    /// Registration, which answers once interception is in force: opening the pod's
    /// namespace, looking for its proxy's listener in `/proc`, running iptables with that
    /// backend, maybe after other pods of a node starting many at once. Timed out, error 11:
    /// the runtime retries the sandbox (a repeated registration is idempotent), and the pod
    /// never starts unmeshed.
    pub const REGISTER: Duration = Duration::from_secs(15);
}

/// Why a request was refused; nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is not valid JSON of this API.
    BadRequest,
    /// A flag or value of the pod's configuration is not valid (the CLI's message).
    InvalidConfig,
    /// The network namespace path does not open as a network namespace.
    UnknownNetns,
    /// The pod is registered with another configuration (pass `update`).
    Conflict,
    /// No free pod slot.
    PodTableFull,
    /// The pod's configuration or addresses need more room than a node-wide table (or the
    /// per-pod address limit) has left; the message names the table, its size and what is free.
    TableFull,
    /// The caller is not root.
    PermissionDenied,
    /// The kernel refused an operation; the message says which.
    Internal,
    /// Something the answer depends on cannot answer now (the Kubernetes API, a netlink dump of
    /// the pod's namespace); the message says what. Worth trying again later.
    Unavailable,
    /// The agent cannot read the Kubernetes API at all: started without `--kubernetes` or
    /// `--kubeconfig`, or without usable credentials.
    NoKubernetes,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the interceptor agent at {path}: {io_error} (is `interceptor daemon` running? its API is root-only)"
    )]
    Unreachable {
        path: PathBuf,
        io_error: std::io::Error,
    },
    /// The agent took the connection but did not answer within the caller's deadline (it may
    /// still act on the request).
    #[error(
        "the interceptor agent at {path} did not answer within {} ms ({step})",
        deadline.as_millis()
    )]
    TimedOut {
        path: PathBuf,
        deadline: Duration,
        step: &'static str,
    },
    #[error("{message}")]
    Refused { kind: ErrorKind, message: String },
    #[error("talking to the interceptor agent at {path}: {detail}")]
    Protocol { path: PathBuf, detail: String },
}

/// How long [`call`], [`health`] and [`agent_running`] wait for the agent: connecting, sending
/// and the answer together. Long enough for a registration on a busy node; callers that must
/// not wait that long (the CNI plugin) pass their own deadline to [`call_within`].
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// Sends one request to the agent and waits for its answer (registration answers only once the
/// pod is intercepted), for up to [`DEFAULT_DEADLINE`].
pub fn call(socket: &Path, request: &Request) -> Result<Vec<PodInfo>, ClientError> {
    call_within(socket, request, DEFAULT_DEADLINE)
}

/// [`call`], giving up after `deadline` (connecting, sending and the answer together) with
/// [`ClientError::TimedOut`].
pub fn call_within(
    socket: &Path,
    request: &Request,
    deadline: Duration,
) -> Result<Vec<PodInfo>, ClientError> {
    match exchange(socket, request, deadline)? {
        Response::Ok { pods } => Ok(pods),
        other => Err(unexpected(socket, &other)),
    }
}

/// Asks the agent whether interception is in force as configured.
pub fn health(socket: &Path) -> Result<Health, ClientError> {
    match exchange(socket, &Request::Health, DEFAULT_DEADLINE)? {
        Response::Health(health) => Ok(health),
        other => Err(unexpected(socket, &other)),
    }
}

fn unexpected(socket: &Path, response: &Response) -> ClientError {
    ClientError::Protocol {
        path: socket.to_owned(),
        detail: format!("unexpected answer {response:?}"),
    }
}

/// One request and its answer, all within `deadline`: the connect (which waits while the
/// agent's accept backlog is full), the write and every read are each given what is left.
fn exchange(socket: &Path, request: &Request, deadline: Duration) -> Result<Response, ClientError> {
    let started = Instant::now();
    let protocol = |detail: String| ClientError::Protocol {
        path: socket.to_owned(),
        detail,
    };
    let timed_out = |step: &'static str| ClientError::TimedOut {
        path: socket.to_owned(),
        deadline,
        step,
    };
    // What is left of the deadline, or the step that ran out of it.
    let left = |step: &'static str| {
        deadline
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| timed_out(step))
    };
    let is_timeout = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    let mut stream = connect(socket, left("connecting")?).map_err(|io_error| {
        if is_timeout(&io_error) {
            timed_out("connecting")
        } else {
            ClientError::Unreachable {
                path: socket.to_owned(),
                io_error,
            }
        }
    })?;
    let mut line = serde_json::to_string(request).map_err(|e| protocol(e.to_string()))?;
    line.push('\n');
    stream
        .set_write_timeout(Some(left("sending the request")?))
        .map_err(|e| protocol(e.to_string()))?;
    stream.write_all(line.as_bytes()).map_err(|e| {
        if is_timeout(&e) {
            timed_out("sending the request")
        } else {
            protocol(e.to_string())
        }
    })?;
    // Read by hand rather than with `read_line`, so that an agent answering a byte at a time
    // cannot stretch the deadline.
    let mut answer = Vec::new();
    let mut chunk = [0; 4096];
    while !answer.contains(&b'\n') {
        stream
            .set_read_timeout(Some(left("waiting for the answer")?))
            .map_err(|e| protocol(e.to_string()))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(timed_out("waiting for the answer")),
            Err(e) => return Err(protocol(e.to_string())),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    match serde_json::from_str(&answer).map_err(|e| protocol(format!("{e}: {answer:?}")))? {
        Response::Error { kind, message } => Err(ClientError::Refused { kind, message }),
        response => Ok(response),
    }
}

/// A connected stream, within `timeout`: on a Unix socket, `SO_SNDTIMEO` bounds a connect that
/// waits for room in the listener's backlog (it then fails with `EAGAIN`).
fn connect(socket: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    let stream = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.connect(&socket2::SockAddr::unix(socket)?)?;
    Ok(stream.into())
}

/// A Kubernetes pod's annotations and labels, as the agent has them (see
/// [`Request::PodAnnotations`]), waiting for up to `deadline`.
pub fn pod_annotations(
    socket: &Path,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    deadline: Duration,
) -> Result<KubePod, ClientError> {
    let request = Request::PodAnnotations {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.map(str::to_owned),
    };
    match exchange(socket, &request, deadline)? {
        Response::Annotations(pod) => Ok(pod),
        other => Err(unexpected(socket, &other)),
    }
}

/// Whether an agent answers on `socket`.
pub fn agent_running(socket: &Path) -> bool {
    call(socket, &Request::List).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire format other clients (the CNI plugin, scripts) rely on.
    #[test]
    fn requests_and_responses_have_a_stable_json_form() {
        let add: Request = serde_json::from_str(
            r#"{"op":"add","netns":"/run/netns/p","args":["-p","4143","-o","4140"]}"#,
        )
        .unwrap();
        match add {
            Request::Add(add) => {
                assert_eq!(add.netns, Path::new("/run/netns/p"));
                assert_eq!(add.meta, PodMeta::default());
                assert!(!add.update && !add.takeover_iptables);
                let config = add.config;
                assert_eq!(
                    (config.incoming_proxy_port, config.outgoing_proxy_port),
                    (4143, 4140)
                );
            }
            other => panic!("{other:?}"),
        }
        let add = Request::Add(PodAdd {
            netns: "/run/netns/p".into(),
            meta: PodMeta::default(),
            config: InterceptionConfig::linkerd(),
            update: false,
            takeover_iptables: false,
        });
        assert_eq!(
            serde_json::to_value(&add).unwrap(),
            serde_json::json!({
                "op": "add",
                "netns": "/run/netns/p",
                "meta": {},
                "config": {
                    "incoming_proxy_port": 4143,
                    "outgoing_proxy_port": 4140,
                    "proxy_uid": 2102,
                    "proxy_gid": null,
                    "inbound_ports_to_ignore": "4190,4191",
                    "outbound_ports_to_ignore": "",
                    "ports_to_redirect": [],
                    "subnets_to_ignore": [],
                    "outbound_subnets_to_ignore": [],
                    "ipv6": true
                },
                "update": false,
                "takeover_iptables": false
            })
        );
        // A bad value is refused as the request is read, naming it, in either form.
        let bad = serde_json::from_str::<Request>(
            r#"{"op":"add","netns":"/p","config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140,"outbound_ports_to_ignore":"25,smtp"}}"#,
        )
        .unwrap_err();
        assert!(
            bad.to_string()
                .contains("invalid value '25,smtp' for 'outbound-ports-to-ignore'"),
            "{bad}"
        );
        let bad = serde_json::from_str::<Request>(
            r#"{"op":"add","netns":"/p","args":["-p","4143","-o","4140","--outbound-ports-to-ignore","25,smtp"]}"#,
        )
        .unwrap_err();
        assert!(bad.to_string().contains("'25,smtp'"), "{bad}");
        assert_eq!(
            serde_json::to_string(&Request::Remove {
                netns: "/run/netns/p".into()
            })
            .unwrap(),
            r#"{"op":"remove","netns":"/run/netns/p"}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::Error {
                kind: ErrorKind::PodTableFull,
                message: "full".into()
            })
            .unwrap(),
            r#"{"result":"error","kind":"pod_table_full","message":"full"}"#
        );
        assert_eq!(
            serde_json::to_string(&Request::ChainRestored {
                conf: "/etc/cni/net.d/05-cilium.conflist".into()
            })
            .unwrap(),
            r#"{"op":"chain_restored","conf":"/etc/cni/net.d/05-cilium.conflist"}"#
        );
        assert!(serde_json::from_str::<Request>(r#"{"op":"explode"}"#).is_err());
    }

    /// A listening socket in a directory of the test's own, removed on drop.
    struct Socket {
        dir: PathBuf,
    }

    impl Socket {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("icpt-api-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self { dir }
        }

        fn path(&self) -> PathBuf {
            self.dir.join("agent.sock")
        }
    }

    impl Drop for Socket {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Lists the pods of the agent at `socket` with a deadline of 300 ms: the call must fail
    /// once the deadline passes (not sooner, not a second later), timed out at `step`.
    fn list_times_out(socket: &Socket, step: &str) -> ClientError {
        let deadline = Duration::from_millis(300);
        let started = Instant::now();
        let e = call_within(&socket.path(), &Request::List, deadline).unwrap_err();
        let took = started.elapsed();
        assert!(
            took >= deadline && took < deadline + Duration::from_secs(1),
            "{e}: took {took:?} for a deadline of {deadline:?}"
        );
        assert!(
            matches!(&e, ClientError::TimedOut { step: s, .. } if *s == step),
            "{e:?}"
        );
        e
    }

    /// An agent that takes the connection and never answers costs the caller its deadline, not
    /// the default's minute.
    #[test]
    fn a_silent_agent_costs_the_caller_its_deadline() {
        let socket = Socket::new("silent");
        // Never accepted: the connection waits in the backlog, the request in its buffer.
        let _listener = std::os::unix::net::UnixListener::bind(socket.path()).unwrap();
        let e = list_times_out(&socket, "waiting for the answer");
        assert!(
            e.to_string().contains("did not answer within 300 ms"),
            "{e}"
        );
    }

    /// A listener whose backlog is full makes a connect wait: the deadline bounds that too.
    #[test]
    fn a_full_backlog_costs_the_caller_its_deadline() {
        let socket = Socket::new("backlog");
        let listener =
            socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        listener
            .bind(&socket2::SockAddr::unix(socket.path()).unwrap())
            .unwrap();
        // Room for one connection waiting to be accepted, which this one takes.
        listener.listen(0).unwrap();
        let _first = UnixStream::connect(socket.path()).unwrap();
        list_times_out(&socket, "connecting");
    }

    #[test]
    fn an_answer_within_the_deadline_is_taken_and_no_agent_is_unreachable() {
        let socket = Socket::new("answer");
        let listener = std::os::unix::net::UnixListener::bind(socket.path()).unwrap();
        let agent = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut request = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(&stream), &mut request)
                .unwrap();
            (&stream)
                .write_all(b"{\"result\":\"ok\",\"pods\":[]}\n")
                .unwrap();
            request
        });
        let pods = call_within(&socket.path(), &Request::List, Duration::from_secs(5)).unwrap();
        assert!(pods.is_empty());
        assert_eq!(agent.join().unwrap(), "{\"op\":\"list\"}\n");
        let gone = socket.dir.join("nobody.sock");
        let e = call_within(&gone, &Request::List, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ClientError::Unreachable { .. }), "{e:?}");
    }
}
