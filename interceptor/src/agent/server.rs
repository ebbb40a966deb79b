//! The agent's API: one JSON request per connection on its Unix socket, one JSON response.
//!
//! Each connection is served by a task of its own with a deadline, and its request is handled
//! and answered on a blocking thread, so a client that connects and says nothing delays nobody:
//! not another client's `pod add` (a pod waiting to start), nor the periodic reconciliation. The
//! agent's lock is held only for the map and record changes themselves (see `registration`).
use std::{io::Write as _, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::UnixStream,
    time::timeout,
};
use tracing::{info, warn};

use super::{
    Refusal, Shared,
    api::{ErrorKind, InterceptionConfig, PodAddRequest, Request, Response},
    lock, registration,
};

/// How long a client has to send its request, and then to take its answer.
pub(super) const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// A request is one line of JSON; a pod's configuration is small.
const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// Serves one connection: reads its request within the deadline, handles it, answers.
pub(super) async fn serve(agent: Arc<Shared>, stream: UnixStream) {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
    let read = timeout(REQUEST_DEADLINE, reader.read_line(&mut line)).await;
    // The socket is mode 0600 already; the peer's credentials are checked too, in case it is
    // reached through a descriptor passed on.
    let response = if uid != Some(0) {
        refuse(Refusal::new(
            ErrorKind::PermissionDenied,
            "the interceptor agent's API is for root only",
        ))
    } else {
        match read {
            Ok(Ok(n)) if n > 0 => match serde_json::from_str::<Request>(&line) {
                // Waits on the Kubernetes API, not on the agent: answered here, off the lock.
                Ok(Request::PodAnnotations {
                    namespace,
                    name,
                    uid,
                }) => {
                    let kube = agent.kube.clone();
                    pod_annotations(kube, &namespace, &name, uid.as_deref()).await
                }
                Ok(request) => {
                    // The answer leaves from the thread that made it, not once this task has
                    // been woken to send it: one thread wake-up less in each request's round
                    // trip (a registration's answer is what a pod's start waits for).
                    let stream = reader.into_inner().into_inner().reunite(write);
                    match stream.map_err(|e| e.to_string()).and_then(blocking_stream) {
                        Ok(stream) => drop(tokio::task::spawn_blocking(move || {
                            answer_blocking(stream, &handle_or_refuse(&agent, request));
                        })),
                        // Not seen: the halves are this connection's own. The client sees the
                        // connection close unanswered, as if the agent had stopped.
                        Err(e) => warn!(error = %e, "an API connection could not be answered"),
                    }
                    return;
                }
                Err(e) => refuse(not_a_request(&line, e)),
            },
            Ok(_) => refuse(Refusal::new(ErrorKind::BadRequest, "no request read")),
            Err(_) => refuse(Refusal::new(
                ErrorKind::BadRequest,
                format!("no request within {} s", REQUEST_DEADLINE.as_secs_f32()),
            )),
        }
    };
    let _ = timeout(
        REQUEST_DEADLINE,
        write.write_all(answer(&response).as_bytes()),
    )
    .await;
}

/// A response as its line on the wire.
fn answer(response: &Response) -> String {
    let mut out = serde_json::to_string(response).unwrap_or_default();
    out.push('\n');
    out
}

/// The connection as a blocking socket whose writes give up after the deadline.
fn blocking_stream(stream: UnixStream) -> Result<std::os::unix::net::UnixStream, String> {
    let stream = stream.into_std().map_err(|e| e.to_string())?;
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(REQUEST_DEADLINE))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Answers on a blocking thread. A client gone meanwhile has nobody to tell.
fn answer_blocking(mut stream: std::os::unix::net::UnixStream, response: &Response) {
    let _ = stream.write_all(answer(response).as_bytes());
}

async fn pod_annotations(
    kube: Option<Arc<super::kube_pods::KubePods>>,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Response {
    let Some(kube) = kube else {
        return refuse(Refusal::new(
            ErrorKind::NoKubernetes,
            "this agent does not read the Kubernetes API (start it with --kubernetes)",
        ));
    };
    if let Some(why) = kube.no_client() {
        return refuse(Refusal::new(
            ErrorKind::NoKubernetes,
            format!("this agent has no Kubernetes client: {why}"),
        ));
    }
    match kube.pod(namespace, name, uid).await {
        Ok(pod) => Response::Annotations(pod),
        Err(message) => refuse(Refusal::new(ErrorKind::Unavailable, message)),
    }
}

/// [`handle`], with a panic while handling answered as an `internal` refusal, as the runtime
/// answered it when requests were handled on its tasks: the client learns that its request
/// failed instead of seeing its connection close, and the agent serves on (see `lock`).
fn handle_or_refuse(agent: &Shared, request: Request) -> Response {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(agent, request)))
        .unwrap_or_else(|_| {
            refuse(Refusal::new(
                ErrorKind::Internal,
                "the agent failed while handling the request (its log says why)",
            ))
        })
}

fn handle(agent: &Shared, request: Request) -> Response {
    let result = match request {
        Request::Add(add) => {
            let netns = add.netns.clone();
            let added = registration::add(agent, add);
            if let Err(Refusal { kind, message }) = &added {
                warn!(netns = %netns.display(), ?kind, error = %message, "pod registration refused");
                agent.metrics.registrations_refused.count(*kind);
            }
            added
        }
        Request::Remove { netns } => lock(agent).remove_by_path(&netns),
        Request::List => Ok(lock(agent).all_info()),
        Request::Get { netns } => {
            let agent = lock(agent);
            agent
                .find(&netns)
                .map(|cookie| agent.info(cookie).into_iter().collect())
        }
        Request::Health => return Response::Health(lock(agent).health()),
        Request::Skipped { meta, reason } => {
            info!(
                name = meta.name.as_deref().unwrap_or("-"),
                namespace = meta.namespace.as_deref().unwrap_or("-"),
                uid = meta.uid.as_deref().unwrap_or("-"),
                reason,
                "pod not meshed"
            );
            agent.metrics.pods_skipped.count(&reason);
            Ok(Vec::new())
        }
        Request::ChainRestored { conf } => {
            info!(conf = %conf.display(), "the CNI installer chained the plugin again: the primary CNI had rewritten its configuration without it");
            agent.metrics.cni_chain_restored.inc();
            Ok(Vec::new())
        }
        Request::PodAnnotations { .. } => {
            unreachable!("answered in serve, without the agent's lock")
        }
    };
    match result {
        Ok(pods) => Response::Ok { pods },
        Err(refusal) => refuse(refusal),
    }
}

/// Why a line is not a request: a registration whose configuration (`config`, or an older
/// client's `args`) is not valid is `invalid_config`, with the configuration's own words;
/// anything else is `bad_request`.
fn not_a_request(line: &str, e: serde_json::Error) -> Refusal {
    let invalid_config = serde_json::from_str::<serde_json::Value>(line)
        .ok()
        .filter(|request| request.get("op").and_then(|op| op.as_str()) == Some("add"))
        .and_then(|request| match request.get("config") {
            Some(config) => serde_json::from_value::<InterceptionConfig>(config.clone())
                .err()
                .map(|e| e.to_string()),
            None => serde_json::from_value::<PodAddRequest>(request)
                .ok()?
                .config()
                .err()
                .map(|e| e.to_string()),
        });
    match invalid_config {
        Some(e) => Refusal::new(ErrorKind::InvalidConfig, e),
        None => Refusal::new(ErrorKind::BadRequest, format!("not a request: {e}")),
    }
}

fn refuse(Refusal { kind, message }: Refusal) -> Response {
    Response::Error { kind, message }
}
