//! A stand-in Kubernetes API server on 127.0.0.1, for the agent's pod lookups
//! (`tests/kube_api.rs`), its repair of pods started without the CNI plugin
//! (`tests/containerd.rs`) and the CNI installer's check of its DaemonSet
//! (`tests/cni_install_kube.rs`).
//!
//! No `kube-apiserver` can be installed on these machines (Debian has none, and only crates.io,
//! PyPI and npm are reachable), so this small HTTP server answers as the API server does, in
//! its shapes: the object or a `NotFound` Status naming it for a GET of a namespaced object
//! (`/api/v1/...` and `/apis/GROUP/VERSION/...`) or of a Namespace, a `PodList` for the list of
//! pods, a chunked stream of watch events (`ADDED`, `MODIFIED`). It lists nodes, namespaces and
//! one namespace's pods too, and filters lists by `labelSelector` (`key`, `!key`, `key=value`,
//! `key!=value`), and a Namespace takes merge patches, as `interceptor check` and `interceptor
//! namespace-metadata` need (`tests/extension_check.rs`). Its pods ([`pod`]) have the
//! status the kubelet reports ([`reported`]: phase, init and app container statuses with the
//! runtime's container IDs) and may be `hostNetwork`. It can end the watch streams (a client watches
//! again), refuse every request (401 or 403, as when the caller's account or role is deleted; 500,
//! as an API server failing) or those of some paths (403, as a role without a rule for them),
//! close connections without an answer, or keep them open without one (the API is down).
//!
//! It also takes what the agent writes (see [`write`]): Events, kept for the tests to read
//! ([`ApiState::events`]), and merge patches of Nodes ([`node`]), with the resourceVersion
//! precondition the API server applies; it can refuse the next ones with 409 Conflict
//! ([`ApiState::node_conflicts`]).
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
    },
    time::Duration,
};

use serde_json::{Value, json};

pub enum WatchEvent {
    Added(Value),
    Modified(Value),
    /// The server ends the stream, as an API server does when a watch times out.
    End,
}

/// How the server answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// As the API server does.
    #[default]
    Answer,
    /// Every request gets this status (401 Unauthorized, 403 Forbidden or 500, an API server
    /// failing) as a Status.
    Refuse(u16),
    /// Connections are closed without an answer.
    Down,
    /// Requests are read and never answered.
    Silent,
}

#[derive(Default)]
pub struct ApiState {
    /// The objects, as the API server returns them (each with `apiVersion`, `kind` and
    /// `metadata.namespace` and `name`).
    pub objects: Vec<Value>,
    /// Every request's path and query, in order.
    pub requests: Vec<String>,
    watches: Vec<Sender<WatchEvent>>,
    pub mode: Mode,
    /// Requests of these paths are forbidden (403), as for a role without a rule for them.
    pub forbidden: Vec<String>,
    /// The Events posted (events.k8s.io/v1 or core v1), as stored: a repeat's PATCH updates
    /// the one it repeats.
    pub events: Vec<Value>,
    /// Every write, as `METHOD PATH`, in order.
    pub writes: Vec<String>,
    /// The next this many PATCHes of a Node made on the condition of its resourceVersion find
    /// it changed meanwhile, as if by another client (its resourceVersion moves on): 409
    /// Conflict.
    pub node_conflicts: u32,
}

impl ApiState {
    /// The object of `kind` named `namespace`/`name`.
    pub fn object_mut(&mut self, kind: &str, namespace: &str, name: &str) -> Option<&mut Value> {
        self.objects.iter_mut().find(|o| {
            o["kind"] == kind
                && o["metadata"]["namespace"] == namespace
                && o["metadata"]["name"] == name
        })
    }

    /// Removes the object of `kind` named `namespace`/`name`, as a deletion does.
    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) {
        self.objects.retain(|o| {
            !(o["kind"] == kind
                && o["metadata"]["namespace"] == namespace
                && o["metadata"]["name"] == name)
        });
    }
}

pub struct FakeApi {
    pub addr: String,
    state: Arc<Mutex<ApiState>>,
}

impl FakeApi {
    pub fn start(objects: Vec<Value>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(ApiState {
            objects,
            ..ApiState::default()
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Self { addr, state }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, ApiState> {
        self.state.lock().unwrap()
    }

    /// How many requests so far contain `needle`.
    pub fn requests_with(&self, needle: &str) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|r| r.contains(needle))
            .count()
    }

    /// Sends `event` to every open watch.
    pub fn broadcast(&self, event: impl Fn() -> WatchEvent) {
        self.state().watches.retain(|w| w.send(event()).is_ok());
    }

    /// Stores `object` (a new one, or a new version of one of the same kind, namespace and name)
    /// and tells every open watch, as the API server does when the kubelet creates a pod or
    /// reports its status.
    pub fn put(&self, object: Value) {
        let mut state = self.state();
        let (kind, namespace, name) = (
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let modified = match state.object_mut(kind, namespace, name) {
            Some(stored) => {
                *stored = object.clone();
                true
            }
            None => {
                state.objects.push(object.clone());
                false
            }
        };
        state.watches.retain(|w| {
            let event = if modified {
                WatchEvent::Modified(object.clone())
            } else {
                WatchEvent::Added(object.clone())
            };
            w.send(event).is_ok()
        });
    }

    /// A kubeconfig in `dir` for this server, with a bearer token.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: test-token\n",
                self.addr
            ),
        )
        .unwrap();
        path
    }
}

/// A DaemonSet as the API server returns it (`apps/v1`, the fields it always fills in), ours as
/// the chart renders it: our label on its metadata, linkerd-cni's `k8s-app` selector.
pub fn daemonset(namespace: &str, name: &str) -> Value {
    let labels = json!({ "app.kubernetes.io/name": "interceptor", "k8s-app": name });
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": format!("uid-{name}"),
            "resourceVersion": "20",
            "generation": 1,
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": labels,
        },
        "spec": {
            "selector": { "matchLabels": labels },
            "template": {
                "metadata": { "labels": labels },
                "spec": { "containers": [{ "name": "agent", "image": "interceptor" }] },
            },
            "updateStrategy": { "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 1 } },
        },
        "status": {
            "currentNumberScheduled": 1,
            "desiredNumberScheduled": 1,
            "numberMisscheduled": 0,
            "numberReady": 1,
            "observedGeneration": 1,
        },
    })
}

/// A Namespace as the API server returns it, with `annotations`.
pub fn namespace(name: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": format!("uid-ns-{name}"),
            "resourceVersion": "5",
            "annotations": annotations,
        },
        "spec": { "finalizers": ["kubernetes"] },
        "status": { "phase": "Active" },
    })
}

/// A pod of `node` as the API server returns it once created, before the kubelet reported
/// anything of it: `Pending`, no container statuses. Its containers are `app` and
/// `linkerd-proxy`; `init_containers` are its init containers (e.g. `linkerd-init`, or the
/// `linkerd-network-validator` Linkerd's CNI mode injects).
pub fn pod(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    annotations: &[(&str, &str)],
    init_containers: &[&str],
) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    let init: Vec<Value> = init_containers
        .iter()
        .map(|name| json!({ "name": name, "image": "init:1" }))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "11",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "initContainers": init,
            "containers": [
                { "name": "app", "image": "app:1" },
                { "name": "linkerd-proxy", "image": "proxy:1" },
            ],
        },
        "status": { "phase": "Pending", "qosClass": "BestEffort" },
    })
}

/// `pod` with `hostNetwork: true`.
pub fn host_network(mut pod: Value) -> Value {
    pod["spec"]["hostNetwork"] = json!(true);
    pod
}

/// `pod` as the kubelet reports it once its sandbox runs: in `phase`, with a status for each of
/// its containers, those named in `started` with the container ID the runtime gave them, the
/// others still waiting without one. A `Pending` pod whose only started container is its
/// `linkerd-network-validator` is one whose validator is crash-looping (exit 95).
pub fn reported(pod: &Value, phase: &str, started: &[&str]) -> Value {
    let mut pod = pod.clone();
    let uid = pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let status = |container: &Value| {
        let name = container["name"].as_str().unwrap_or_default();
        let id = format!("containerd://{uid}-{name}");
        let mut status = json!({
            "name": name,
            "image": container["image"],
            "imageID": "",
            "ready": false,
            "restartCount": 0,
            "state": { "waiting": { "reason": "PodInitializing" } },
        });
        if started.contains(&name) {
            status["containerID"] = json!(id);
            status["state"] = if phase == "Running" {
                json!({ "running": { "startedAt": "2025-01-01T00:00:00Z" } })
            } else {
                json!({ "waiting": { "reason": "CrashLoopBackOff" } })
            };
            status["restartCount"] = json!(2);
        }
        status
    };
    let statuses = |key: &str| -> Vec<Value> {
        pod["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .map(status)
            .collect()
    };
    let (init, containers) = (statuses("initContainers"), statuses("containers"));
    pod["status"]["phase"] = json!(phase);
    pod["status"]["initContainerStatuses"] = json!(init);
    pod["status"]["containerStatuses"] = json!(containers);
    pod
}

/// The resource name of `kind` in a path (`Pod` → `pods`, `DaemonSet` → `daemonsets`).
fn plural(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

fn serve(mut stream: TcpStream, state: &Mutex<ApiState>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let (mut content_length, mut content_type) = (0, String::new());
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().unwrap_or(0);
            } else if name.eq_ignore_ascii_case("content-type") {
                content_type = value.trim().to_owned();
            }
        }
    }
    let mut body = vec![0; content_length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let method = request_line
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut guard = state.lock().unwrap();
    guard.requests.push(target.clone());
    let mode = if guard.forbidden.iter().any(|p| p == path) {
        Mode::Refuse(403)
    } else {
        guard.mode
    };
    match mode {
        Mode::Answer => {}
        Mode::Down => return,
        Mode::Silent => {
            drop(guard);
            // Held open, unanswered, until the client gives up.
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            return;
        }
        Mode::Refuse(code) => {
            drop(guard);
            let reason = match code {
                401 => "Unauthorized",
                500 => "InternalError",
                _ => "Forbidden",
            };
            let status = format!("{code} {reason}");
            return respond(
                &mut stream,
                &status,
                &json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": reason, "code": code, "message": reason,
                }),
            );
        }
    }
    if method != "GET" {
        return write(&mut stream, &mut guard, &method, path, &content_type, &body);
    }
    let on_node = |pod: &&Value| {
        !query.contains("spec.nodeName")
            || query.contains(&format!(
                "%3D{}",
                pod["spec"]["nodeName"].as_str().unwrap_or("")
            ))
    };
    if path == "/api/v1/pods" && query.contains("watch=true") {
        let (sender, events) = mpsc::channel();
        guard.watches.push(sender);
        drop(guard);
        stream_watch(stream, &events);
    } else if let Some((kind, namespace)) = list_path(path) {
        let items: Vec<Value> = guard
            .objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .filter(|o| namespace.is_none_or(|ns| o["metadata"]["namespace"] == ns))
            .filter(on_node)
            .filter(|o| labels_match(query, o))
            .cloned()
            .collect();
        drop(guard);
        respond(
            &mut stream,
            "200 OK",
            &json!({
                "apiVersion": "v1",
                "kind": format!("{kind}List"),
                "metadata": { "resourceVersion": "10" },
                "items": items,
            }),
        );
    } else if let Some(name) = path
        .strip_prefix("/api/v1/nodes/")
        .filter(|name| !name.contains('/'))
    {
        let found = guard
            .objects
            .iter()
            .find(|o| o["kind"] == "Node" && o["metadata"]["name"] == name)
            .cloned();
        drop(guard);
        match found {
            Some(object) => respond(&mut stream, "200 OK", &object),
            None => respond(&mut stream, "404 Not Found", &not_found("nodes", "", name)),
        }
    } else if let Some(name) = path
        .strip_prefix("/api/v1/namespaces/")
        .filter(|name| !name.contains('/'))
    {
        let found = guard
            .objects
            .iter()
            .find(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == name)
            .cloned();
        drop(guard);
        match found {
            Some(object) => respond(&mut stream, "200 OK", &object),
            None => respond(
                &mut stream,
                "404 Not Found",
                &json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": "NotFound", "code": 404,
                    "message": format!("namespaces \"{name}\" not found"),
                    "details": { "name": name, "kind": "namespaces" },
                }),
            ),
        }
    } else if let Some((api_version, namespace, resource, name)) = object_path(path) {
        let found = guard
            .objects
            .iter()
            .find(|o| {
                o["apiVersion"] == api_version
                    && plural(o["kind"].as_str().unwrap_or_default()) == resource
                    && o["metadata"]["namespace"] == namespace
                    && o["metadata"]["name"] == name
            })
            .cloned();
        drop(guard);
        let group = api_version.split_once('/').map_or("", |(g, _)| g);
        match found {
            Some(object) => respond(&mut stream, "200 OK", &object),
            None => respond(
                &mut stream,
                "404 Not Found",
                &json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": "NotFound", "code": 404,
                    "message": format!("{resource} \"{name}\" not found"),
                    "details": { "name": name, "group": group, "kind": resource },
                }),
            ),
        }
    } else {
        drop(guard);
        respond(
            &mut stream,
            "404 Not Found",
            &json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": "NotFound", "code": 404, "details": {},
                "message": "the server could not find the requested resource",
            }),
        );
    }
}

/// A Node as the API server returns it, with `taints` (key and effect).
pub fn node(name: &str, taints: &[(&str, &str)]) -> Value {
    let taints: Vec<Value> = taints
        .iter()
        .map(|(key, effect)| json!({ "key": key, "effect": effect }))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("uid-node-{name}"),
            "resourceVersion": "30",
            "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" },
        },
        "spec": { "taints": taints },
        "status": { "conditions": [{ "type": "Ready", "status": "True" }] },
    })
}

/// A `NotFound` Status naming the object, as the API server answers.
fn not_found(resource: &str, group: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "reason": "NotFound", "code": 404,
        "message": format!("{resource} \"{name}\" not found"),
        "details": { "name": name, "group": group, "kind": resource },
    })
}

/// A failure Status with `code` and `reason`.
fn failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "reason": reason, "code": code, "message": message,
    })
}

/// The writes the agent makes: an Event created (POST, events.k8s.io/v1 or core v1) or
/// updated as a repeat (PATCH), and a Node changed by a JSON merge patch, which may carry the
/// Node's `metadata.resourceVersion` to be applied only to that version (409 Conflict if the
/// Node changed since). Each Node change moves its resourceVersion on.
fn write(
    stream: &mut TcpStream,
    state: &mut ApiState,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) {
    state.writes.push(format!("{method} {path}"));
    let Ok(mut sent) = serde_json::from_slice::<Value>(body) else {
        return respond(
            stream,
            "400 Bad Request",
            &failure(400, "BadRequest", "not JSON"),
        );
    };
    if method == "PATCH" && content_type != "application/merge-patch+json" {
        let message = format!("this server applies merge patches only, not {content_type}");
        return respond(
            stream,
            "415 Unsupported Media Type",
            &failure(415, "UnsupportedMediaType", &message),
        );
    }
    if let Some((namespace, name)) = events_path(path) {
        match (method, name) {
            ("POST", None) => {
                sent["metadata"]["namespace"] = json!(namespace);
                state.events.push(sent.clone());
                respond(stream, "201 Created", &sent);
            }
            ("PATCH", Some(name)) => {
                let stored = state.events.iter_mut().find(|e| {
                    e["metadata"]["namespace"] == namespace && e["metadata"]["name"] == name
                });
                match stored {
                    Some(event) => {
                        merge_patch(event, &sent);
                        respond(stream, "200 OK", event);
                    }
                    None => respond(stream, "404 Not Found", &not_found("events", "", name)),
                }
            }
            _ => respond(
                stream,
                "405 Method Not Allowed",
                &failure(405, "MethodNotAllowed", "not an event write"),
            ),
        }
        return;
    }
    let namespace = path
        .strip_prefix("/api/v1/namespaces/")
        .filter(|name| !name.contains('/') && method == "PATCH");
    if let Some(name) = namespace {
        let stored = state
            .objects
            .iter_mut()
            .find(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == name);
        return match stored {
            Some(stored) => {
                merge_patch(stored, &sent);
                let stored = stored.clone();
                respond(stream, "200 OK", &stored)
            }
            None => respond(stream, "404 Not Found", &not_found("namespaces", "", name)),
        };
    }
    let node = path
        .strip_prefix("/api/v1/nodes/")
        .filter(|name| !name.contains('/') && method == "PATCH");
    let Some(name) = node else {
        return respond(
            stream,
            "405 Method Not Allowed",
            &failure(405, "MethodNotAllowed", "this server takes no such write"),
        );
    };
    let precondition = sent["metadata"]
        .as_object_mut()
        .and_then(|metadata| metadata.remove("resourceVersion"));
    let changed_meanwhile = precondition.is_some() && state.node_conflicts > 0;
    if changed_meanwhile {
        state.node_conflicts -= 1;
    }
    let Some(stored) = state
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Node" && o["metadata"]["name"] == name)
    else {
        return respond(stream, "404 Not Found", &not_found("nodes", "", name));
    };
    let version = |node: &Value| {
        node["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_default()
    };
    if changed_meanwhile {
        stored["metadata"]["resourceVersion"] = json!((version(stored) + 1).to_string());
    }
    if precondition.is_some_and(|v| v != stored["metadata"]["resourceVersion"]) {
        let message = format!(
            "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
        );
        return respond(stream, "409 Conflict", &failure(409, "Conflict", &message));
    }
    let next = json!((version(stored) + 1).to_string());
    merge_patch(stored, &sent);
    stored["metadata"]["resourceVersion"] = next;
    let stored = stored.clone();
    respond(stream, "200 OK", &stored);
}

/// `(namespace, name)` of an Events path (`None` for the collection).
fn events_path(path: &str) -> Option<(&str, Option<&str>)> {
    let rest = path
        .strip_prefix("/apis/events.k8s.io/v1/namespaces/")
        .or_else(|| path.strip_prefix("/api/v1/namespaces/"))?;
    let mut parts = rest.split('/');
    let namespace = parts.next()?;
    if parts.next()? != "events" {
        return None;
    }
    match (parts.next(), parts.next()) {
        (None, _) => Some((namespace, None)),
        (Some(name), None) => Some((namespace, Some(name))),
        _ => None,
    }
}

/// Applies a JSON merge patch (RFC 7386): objects merge key by key, `null` removes a key,
/// anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("an object");
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// The annotation `key` of the Node `name` as stored, parsed as JSON.
pub fn node_annotation(state: &ApiState, name: &str, key: &str) -> Option<Value> {
    let node = state
        .objects
        .iter()
        .find(|o| o["kind"] == "Node" && o["metadata"]["name"] == name)?;
    serde_json::from_str(node["metadata"]["annotations"][key].as_str()?).ok()
}

/// `(kind, namespace)` of a list: pods (of all namespaces or one), nodes, namespaces.
fn list_path(path: &str) -> Option<(&'static str, Option<&str>)> {
    match path {
        "/api/v1/pods" => Some(("Pod", None)),
        "/api/v1/nodes" => Some(("Node", None)),
        "/api/v1/namespaces" => Some(("Namespace", None)),
        _ => {
            let namespace = path
                .strip_prefix("/api/v1/namespaces/")?
                .strip_suffix("/pods")
                .filter(|ns| !ns.contains('/'))?;
            Some(("Pod", Some(namespace)))
        }
    }
}

/// Whether `object` has the labels the query's `labelSelector` asks for (`key`, `!key`,
/// `key=value`, `key!=value`, separated by commas); no selector selects everything.
fn labels_match(query: &str, object: &Value) -> bool {
    let Some(selector) = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("labelSelector="))
        .map(percent_decoded)
    else {
        return true;
    };
    let label = |key: &str| object["metadata"]["labels"][key.trim()].as_str();
    selector
        .split(',')
        .filter(|r| !r.is_empty())
        .all(|requirement| {
            if let Some((key, value)) = requirement.split_once("!=") {
                label(key) != Some(value.trim())
            } else if let Some((key, value)) = requirement.split_once('=') {
                label(key) == Some(value.trim_start_matches('=').trim())
            } else if let Some(key) = requirement.strip_prefix('!') {
                label(key).is_none()
            } else {
                label(requirement).is_some()
            }
        })
}

/// A query parameter's value, its `%XX` escapes and `+` decoded.
fn percent_decoded(value: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = value.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let hex = tail
            .get(..2)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (first, hex) {
            (b'%', Some(byte)) => {
                bytes.push(byte);
                rest = &tail[2..];
            }
            (b'+', _) => {
                bytes.push(b' ');
                rest = tail;
            }
            _ => {
                bytes.push(first);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `(apiVersion, namespace, resource, name)` of a GET of a namespaced object:
/// `/api/v1/namespaces/NS/RESOURCE/NAME` or `/apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME`.
fn object_path(path: &str) -> Option<(String, &str, &str, &str)> {
    let (api_version, rest) = if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
        ("v1".to_owned(), rest)
    } else {
        let rest = path.strip_prefix("/apis/")?;
        let mut parts = rest.splitn(4, '/');
        let (group, version) = (parts.next()?, parts.next()?);
        if parts.next()? != "namespaces" {
            return None;
        }
        (format!("{group}/{version}"), parts.next()?)
    };
    let mut parts = rest.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(namespace), Some(resource), Some(name), None) => {
            Some((api_version, namespace, resource, name))
        }
        _ => None,
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &Value) {
    let body = body.to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A watch: chunked JSON events until the test ends it.
fn stream_watch(mut stream: TcpStream, events: &Receiver<WatchEvent>) {
    if write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .is_err()
    {
        return;
    }
    loop {
        let (kind, pod) = match events.recv_timeout(Duration::from_secs(300)) {
            Ok(WatchEvent::Added(pod)) => ("ADDED", pod),
            Ok(WatchEvent::Modified(pod)) => ("MODIFIED", pod),
            Ok(WatchEvent::End)
            | Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                let _ = write!(stream, "0\r\n\r\n");
                return;
            }
        };
        let line = format!("{}\n", json!({ "type": kind, "object": pod }));
        if write!(stream, "{:x}\r\n{line}\r\n", line.len()).is_err() {
            return;
        }
    }
}
