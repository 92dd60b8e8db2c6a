//! The agent's HTTP API (`sonde run --api ADDR`), read by `sonde status`,
//! kubelets, load balancers, Prometheus and people. It reads the
//! [`ResultCache`] and never waits on a probe run, except
//! `POST /v1/probes/{name}/run`, which asks for one (bounded by the probe's
//! deadline and retries).
//!
//! | endpoint | what |
//! | --- | --- |
//! | `GET /` | the status page (HTML, live from `/v1/watch`) |
//! | `GET /v1/probes` | every probe: state, stale, consecutive, last outcome |
//! | `GET /v1/probes/{name}` | one probe, with its history |
//! | `POST /v1/probes/{name}/run` | run it now; the outcome |
//! | `GET /v1/targets`, `/v1/targets/{name}` | started, ready, live, and the probes behind them |
//! | `GET /v1/ready/{group}`, `/v1/live/{group}` | 200 when every readiness (liveness) probe of the group passes, else 503 |
//! | `GET /v1/watch` | Server-Sent Events: state changes (`?all=1`: every outcome) |
//! | `GET /v1/status` | the config in force and the last reload error |
//! | `GET /metrics` | Prometheus exposition ([`crate::metrics`]) |
//! | `GET /livez`, `/healthz` | sonde's own health (kube-proxy's rule); `/healthz` is also 503 while draining |
//!
//! Errors are JSON `{"error": "..."}` with 400, 404 or 405.

pub mod auth;
mod page;
mod watch;

pub use auth::{ApiAuth, Principal};

use crate::config::Kind;
use crate::control::{AgentStatus, Control, ControlError};
use crate::metrics::Metrics;
use crate::results::{ProbeView, ResultCache};
use crate::scheduler::{self, TriggerError};
use crate::verdict::Status;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde::Serialize;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// `/livez` and `/healthz` fail once a due run has waited this long to start.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API serves from.
#[derive(Clone)]
pub struct ApiState {
    /// Results to read.
    pub results: ResultCache,
    /// The scheduler, for manual runs and its progress.
    pub scheduler: scheduler::Handle,
    /// Config status.
    pub status: Arc<Mutex<AgentStatus>>,
    /// What `/metrics` reads.
    pub metrics: Metrics,
    /// Set when the agent is shutting down: `/healthz` answers 503.
    pub draining: Arc<AtomicBool>,
    /// How long a due run may wait to start before sonde calls itself unhealthy.
    pub health_timeout: Duration,
    /// Reloads and runtime management.
    pub control: Arc<Control>,
    /// Whether callers need a token ([`ApiAuth::Token`] or [`ApiAuth::None`]).
    pub auth: ApiAuth,
}

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve the API on {addr}: {source}")]
pub struct ApiError {
    /// The address.
    pub addr: SocketAddr,
    /// The I/O error.
    pub source: std::io::Error,
}

/// A response body: whole, or a stream (the watch).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Binds `addr` and serves the API until the task is dropped; returns the
/// bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, state: ApiState) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ApiError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError { addr, source })?;
    let bound = listener.local_addr().map_err(|source| ApiError { addr, source })?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(route(&state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(body.into()).boxed_unsync())
        .unwrap_or_default()
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    full(status, "application/json", bytes)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json(status, &serde_json::json!({ "error": message.into() }))
}

/// The value of query parameter `key`, percent-decoded.
fn query<'a>(req: &'a Request<Incoming>, key: &str) -> Option<std::borrow::Cow<'a, str>> {
    form_urlencoded::parse(req.uri().query()?.as_bytes()).find_map(|(k, v)| (k == key).then_some(v))
}

/// Whether a probe's state lets its group through.
fn passes(kind: Kind, state: Status) -> bool {
    match kind {
        Kind::Liveness => state != Status::Failure,
        Kind::Readiness | Kind::Startup => matches!(state, Status::Success | Status::Warning),
    }
}

#[derive(Serialize)]
struct GroupView {
    group: String,
    kind: Kind,
    ok: bool,
    probes: usize,
    failing: Vec<Failing>,
}

#[derive(Serialize)]
struct Failing {
    probe: String,
    target: String,
    state: Status,
    stale: bool,
    reason: Option<String>,
    message: String,
}

fn group(state: &ApiState, who: &Principal, group: &str, kind: Kind) -> Response<Body> {
    let probes: Vec<ProbeView> = state
        .results
        .list()
        .into_iter()
        .filter(|p| who.sees(&p.tenant) && p.groups.iter().any(|g| g == group))
        .collect();
    if probes.is_empty() {
        return error(StatusCode::NOT_FOUND, format!("no probe is in group {group:?}"));
    }
    let of_kind: Vec<&ProbeView> = probes.iter().filter(|p| p.kind == kind).collect();
    let failing: Vec<Failing> = of_kind
        .iter()
        .filter(|p| !passes(kind, p.state))
        .map(|p| Failing {
            probe: p.name.clone(),
            target: p.target.clone(),
            state: p.state,
            stale: p.stale,
            reason: p.last.as_ref().and_then(|o| o.result.reason).map(|r| r.to_string()),
            message: match &p.last {
                Some(o) => o.result.message.clone(),
                None => "not run yet".into(),
            },
        })
        .collect();
    let ok = failing.is_empty();
    let view = GroupView {
        group: group.to_string(),
        kind,
        ok,
        probes: of_kind.len(),
        failing,
    };
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &view)
}

/// `/livez` and `/healthz`, with kube-proxy's rule: healthy unless a run
/// that is due has waited longer than the health timeout to start.
fn health(state: &ApiState, check_draining: bool) -> Response<Body> {
    let progress = state.scheduler.progress();
    let overdue = progress.overdue();
    let since_pass = tokio::time::Instant::now().saturating_duration_since(progress.last_pass());
    let now = SystemTime::now();
    let draining = state.draining.load(Ordering::Relaxed);
    let stalled = overdue > state.health_timeout;
    let body = serde_json::json!({
        "lastUpdated": humantime::format_rfc3339_millis(now - since_pass).to_string(),
        "currentTime": humantime::format_rfc3339_millis(now).to_string(),
        "overdueMs": overdue.as_millis() as u64,
        "draining": draining,
    });
    let unhealthy = stalled || (check_draining && draining);
    let ok = !unhealthy;
    json(
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        &body,
    )
}

/// Who is calling: from the bearer token, or the operator when the API
/// needs none. `None` is a 401.
fn principal(state: &ApiState, req: &Request<Incoming>) -> Option<Principal> {
    if state.auth != ApiAuth::Token {
        return Some(Principal::Operator);
    }
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let tenants = state.control.tenants();
    auth::authenticate(auth::bearer(value)?, tenants.credentials())
}

fn unauthorized() -> Response<Body> {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "this API needs a token: Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
    r
}

/// The one place a refused change becomes an HTTP status.
fn refused(e: ControlError) -> Response<Body> {
    let status = match &e {
        ControlError::BadName { .. } | ControlError::BadSpec { .. } => StatusCode::BAD_REQUEST,
        ControlError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        ControlError::NotFound { .. } => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, Response<Body>> {
    match http_body_util::Limited::new(req.into_body(), limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the {limit} byte limit"),
        )),
        Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}"))),
    }
}

async fn route(state: &ApiState, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let path = if path == "/" {
        path.as_str()
    } else {
        path.trim_end_matches('/')
    };
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let method = req.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    match segments.as_slice() {
        ["livez"] if get => return health(state, false),
        ["healthz"] if get => return health(state, true),
        _ => {}
    }
    let Some(who) = principal(state, &req) else {
        return unauthorized();
    };
    // What this caller may see of a probe: another tenant's is "not found".
    let probe = |name: &str| state.results.get(name).filter(|p| who.sees(&p.tenant));
    let not_found = |what: &str, name: &str| error(StatusCode::NOT_FOUND, format!("no {what} named {name:?}"));
    match segments.as_slice() {
        [""] if get && who == Principal::Operator => match query(&req, "updates").map(|v| v.parse::<u32>()) {
            None => full(StatusCode::OK, "text/html; charset=utf-8", page::render(state, None)),
            Some(Ok(n)) => full(StatusCode::OK, "text/html; charset=utf-8", page::render(state, Some(n))),
            Some(Err(_)) => error(StatusCode::BAD_REQUEST, "updates: expected a number of outcomes"),
        },
        [""] if get => error(StatusCode::NOT_FOUND, "the status page is the operator's"),
        ["metrics"] if get => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let (content_type, text) = state.metrics.render(accept, &who);
            full(StatusCode::OK, content_type, text)
        }
        ["v1", "probes"] if get => {
            let list: Vec<ProbeView> = state
                .results
                .list()
                .into_iter()
                .filter(|p| who.sees(&p.tenant))
                .collect();
            json(StatusCode::OK, &list)
        }
        ["v1", "probes", name] if get => match probe(name) {
            Some(p) => json(StatusCode::OK, &p),
            None => not_found("probe", name),
        },
        ["v1", "probes", name] if method == Method::PUT => {
            let name = name.to_string();
            let body = match read_body(req, crate::managed::MAX_PROBE_BYTES).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let owner = |n: &str| state.results.get(n).map(|p| p.tenant);
            match state.control.put_probe(&who, &name, &body, owner).await {
                Ok(replaced) => {
                    let status = if replaced { StatusCode::OK } else { StatusCode::CREATED };
                    json(status, &serde_json::json!({ "probe": name, "replaced": replaced }))
                }
                Err(r) => refused(r),
            }
        }
        ["v1", "probes", name] if method == Method::DELETE => {
            match state.control.delete_probe(&who, name, probe(name).is_some()).await {
                Ok(()) => json(StatusCode::OK, &serde_json::json!({ "deleted": name })),
                Err(r) => refused(r),
            }
        }
        ["v1", "probes", name, "run"] if method == Method::POST => {
            if probe(name).is_none() {
                return not_found("probe", name);
            }
            match state.scheduler.trigger(name).await {
                Ok(r) => json(StatusCode::OK, &r),
                Err(e @ TriggerError::NotFound(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
                Err(e) => error(StatusCode::CONFLICT, e.to_string()),
            }
        }
        ["v1", "plugins", name] if method == Method::PUT => {
            let name = name.to_string();
            let body = match read_body(req, crate::managed::MAX_PLUGIN_BYTES).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            match state.control.put_plugin(&who, &name, &body).await {
                Ok(replaced) => {
                    let status = if replaced { StatusCode::OK } else { StatusCode::CREATED };
                    json(status, &serde_json::json!({ "plugin": name, "replaced": replaced }))
                }
                Err(r) => refused(r),
            }
        }
        ["v1", "plugins", name] if method == Method::DELETE => match state.control.delete_plugin(&who, name).await {
            Ok(()) => json(StatusCode::OK, &serde_json::json!({ "deleted": name })),
            Err(r) => refused(r),
        },
        ["v1", "targets"] if get => {
            let list: Vec<_> = state
                .results
                .targets()
                .into_iter()
                .filter(|t| who.sees(&t.tenant))
                .collect();
            json(StatusCode::OK, &list)
        }
        ["v1", "targets", name] if get => {
            match state
                .results
                .targets()
                .into_iter()
                .find(|t| t.name == *name && who.sees(&t.tenant))
            {
                Some(t) => json(StatusCode::OK, &t),
                None => not_found("target", name),
            }
        }
        ["v1", "ready", g] if get => group(state, &who, g, Kind::Readiness),
        ["v1", "live", g] if get => group(state, &who, g, Kind::Liveness),
        ["v1", "watch"] if get => match watch::Params::from_request(&req) {
            Ok(p) => watch::stream(state.results.clone(), p, who),
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        },
        ["v1", "status"] if get => {
            let mut status = state.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Principal::Tenant(t) = &who {
                // A tenant sees its own probes only, and not the operator's config.
                status.config = String::new();
                status.reload_error = None;
                status.left_out.retain(|l| l.tenant == *t);
                status.probes = state.results.list().iter().filter(|p| who.sees(&p.tenant)).count();
            }
            json(StatusCode::OK, &status)
        }
        [""]
        | ["metrics"]
        | ["v1", "probes"]
        | ["v1", "probes", _]
        | ["v1", "targets"]
        | ["v1", "targets", _]
        | ["v1", "ready", _]
        | ["v1", "live", _]
        | ["v1", "watch"]
        | ["v1", "status"]
        | ["v1", "plugins", _]
        | ["v1", "probes", _, "run"]
        | ["livez"]
        | ["healthz"] => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        ),
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint: {path}")),
    }
}
