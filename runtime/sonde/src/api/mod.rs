//! The agent's HTTP API (`sonde run --api ADDR`), read by `sonde status`,
//! kubelets, load balancers, Prometheus and people. It reads the
//! [`ResultCache`] and never waits on a probe run, except
//! `POST /v1/probes/{name}/run`, which asks for one (bounded by the probe's
//! deadline and retries).
//!
//! | endpoint | what |
//! | --- | --- |
//! | `GET /` | the status page (HTML, live from `/v1/watch`) |
//! | `GET /v1/probes` | every probe: state, stale, consecutive, last outcome; a probe whose `oci://` plugin is being pulled shows `pulling` |
//! | `GET /v1/probes/{name}` | one probe, with its history |
//! | `PUT`, `DELETE /v1/probes/{name}` | add, replace or remove a probe of the caller's (with a `state_dir`) |
//! | `PUT /v1/probes` | add or replace a list of the caller's probes, all or none |
//! | `POST /v1/probes/{name}/run` | run it now; the outcome |
//! | `PUT`, `DELETE /v1/plugins/{name}` | upload, replace or remove a plugin of the caller's |
//! | `GET /v1/targets`, `/v1/targets/{name}` | started, ready, live, and the probes behind them |
//! | `GET /v1/ready/{group}`, `/v1/live/{group}` | 200 when every readiness (liveness) probe of the group passes, else 503 |
//! | `GET /v1/watch` | Server-Sent Events: state changes (`?all=1`: every outcome) |
//! | `GET /v1/status` | the config in force and the last reload error |
//! | `GET /metrics` | Prometheus exposition ([`sonde_core::metrics`]) |
//! | `GET /probe?target=&module=` | blackbox_exporter's multi-target probe: one run of a `modules:` entry (`scrape`) |
//! | `GET /livez`, `/healthz` | sonde's own health (kube-proxy's rule); `/healthz` is also 503 while draining |
//!
//! Routes, methods, 404 and 405 come from axum's [`Router`]; each handler
//! is a few lines over [`Control`], the [`ResultCache`] and the scheduler.
//! Errors are JSON `{"error": "..."}` (400, 401, 403, 404, 405, 408, 409,
//! 413, 422, 429, 503); [`ControlError`]s become status codes in one place.
//!
//! Callers prove who they are with a bearer token ([`auth`]); with
//! [`ApiAuth::Kubernetes`] a token sonde does not know is reviewed by the
//! API server ([`sonde_kubernetes::review`]) and the request allowed by
//! RBAC on its path.
//!
//! The connections are served by `limits`'s accept loop under the
//! [`ApiLimits`] of the file's `api:` block: a head read timeout, a body
//! read timeout, a connection limit that evicts idle connections first, a
//! head size limit (431) and a limit on watch streams per caller (429).

pub use sonde_core::auth;
mod blackbox;
mod error;
mod groups;
mod limits;
mod page;
mod principal;
mod probes;
pub(crate) mod scrape;
mod watch;

pub use auth::{ApiAuth, Principal};
use error::{HttpError, read_body};
use groups::{live, ready};
pub(crate) use limits::WatchStreams;
use probes::*;
pub use sonde_core::config::ApiLimits;

use axum::Router;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use http_body_util::BodyExt;
use serde::Serialize;
use sonde_core::config::Kind;
use sonde_core::control::{AgentStatus, Control, ControlError};
use sonde_core::metrics::Metrics;
use sonde_core::results::{ProbeView, ResultCache};
use sonde_core::scheduler::{self, TriggerError};
use sonde_sandbox::verdict::Status;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// `/livez` and `/healthz` fail once a due run has waited this long to start.
pub(crate) const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

/// What the API serves from.
#[derive(Clone)]
pub(crate) struct ApiState {
    /// Results to read.
    pub(crate) results: ResultCache,
    /// The scheduler, for manual runs and its progress.
    pub(crate) scheduler: scheduler::SchedulerHandle,
    /// Config status.
    pub(crate) status: Arc<Mutex<AgentStatus>>,
    /// What `/metrics` reads.
    pub(crate) metrics: Metrics,
    /// Set when the agent is shutting down: `/healthz` answers 503.
    pub(crate) draining: Arc<AtomicBool>,
    /// How long a due run may wait to start before sonde calls itself unhealthy.
    pub(crate) health_timeout: Duration,
    /// Reloads and runtime management.
    pub(crate) control: Arc<Control>,
    /// Whether callers need a token ([`ApiAuth::Token`], [`ApiAuth::None`]
    /// or [`ApiAuth::Kubernetes`]).
    pub(crate) auth: ApiAuth,
    /// With [`ApiAuth::Kubernetes`]: who reviews the tokens sonde does not
    /// know itself.
    pub(crate) reviews: Option<Arc<sonde_kubernetes::review::Reviewer>>,
    /// The limits that keep the API answering (`api: {...}`).
    pub limits: ApiLimits,
    /// The watch streams open now, per caller.
    pub watches: WatchStreams,
    /// The `GET /probe` runs in flight and waiting.
    pub scrapes: scrape::ScrapeGate,
    /// The runs' tracing, when an OTLP export traces: a `/probe` run that
    /// propagated its trace context is traced too.
    pub(crate) tracing: Option<Arc<sonde_otel::Tracing>>,
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
pub(crate) type Body = axum::body::Body;

/// Binds `addr` and serves the API until the task is dropped; returns the
/// bound address (useful with port 0). The bound address joins `own`, the
/// agent's listeners no plugin may reach, before the first connection is
/// accepted.
pub(crate) async fn serve(
    addr: SocketAddr,
    state: ApiState,
    own: &sonde_policy::reach::OwnListeners,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ApiError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ApiError { addr, source })?;
    let bound = listener.local_addr().map_err(|source| ApiError { addr, source })?;
    own.add(bound);
    let api_limits = state.limits;
    // A trailing slash names the same endpoint; the router never sees it.
    let app = tower::ServiceExt::<Request>::map_request(router(state), trim_trailing_slash);
    let task = tokio::spawn(limits::accept_loop(listener, app, api_limits));
    Ok((bound, task))
}

/// Every endpoint, its methods and its handler. Unknown paths answer 404,
/// known paths with another method 405, both with a JSON error, and both
/// (like every endpoint but `/livez` and `/healthz`) only to a caller who
/// may call the API at all.
pub(crate) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics))
        .route("/probe", get(scrape::probe))
        .route("/livez", get(livez))
        .route("/healthz", get(healthz))
        .route("/v1/probes", get(list_probes).put(put_probes))
        .route("/v1/probes/{name}", get(get_probe).put(put_probe).delete(delete_probe))
        .route("/v1/probes/{name}/run", post(run_probe))
        .route("/v1/plugins/{name}", put(put_plugin).delete(delete_plugin))
        .route("/v1/targets", get(list_targets))
        .route("/v1/targets/{name}", get(get_target))
        .route("/v1/ready/{group}", get(ready))
        .route("/v1/live/{group}", get(live))
        .route("/v1/watch", get(watch))
        .route("/v1/status", get(agent_status))
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

fn trim_trailing_slash(mut req: Request) -> Request {
    let path = req.uri().path();
    if path.len() > 1 && path.ends_with('/') {
        let trimmed = path.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{trimmed}?{q}"),
            None => trimmed.to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(pq) = path_and_query.parse() {
            parts.path_and_query = Some(pq);
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
    }
    req
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.into(),
    )
        .into_response()
}

fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    full(status, "application/json", bytes)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json(status, &serde_json::json!({ "error": message.into() }))
}

/// The value of query parameter `key` in `query`, percent-decoded.
fn query<'a>(query: Option<&'a str>, key: &str) -> Option<std::borrow::Cow<'a, str>> {
    form_urlencoded::parse(query?.as_bytes()).find_map(|(k, v)| (k == key).then_some(v))
}

fn not_found(what: &str, name: &str) -> Response {
    error(StatusCode::NOT_FOUND, format!("no {what} named {name:?}"))
}

/// A probe `who` may see: another tenant's is "not found".
fn visible_probe(state: &ApiState, who: &Principal, name: &str) -> Option<ProbeView> {
    state.results.get(name).filter(|p| who.sees(&p.tenant))
}

async fn no_such_endpoint(_: Principal, uri: Uri) -> Response {
    error(StatusCode::NOT_FOUND, format!("no such endpoint: {}", uri.path()))
}

async fn method_not_allowed(_: Principal, method: Method, uri: Uri) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// `GET /`: the status page, the operator's only.
async fn status_page(who: Principal, State(state): State<ApiState>, RawQuery(q): RawQuery) -> Response {
    if who != Principal::Operator {
        return error(StatusCode::NOT_FOUND, "the status page is the operator's");
    }
    match query(q.as_deref(), "updates").map(|v| v.parse::<u32>()) {
        None => full(StatusCode::OK, "text/html; charset=utf-8", page::render(&state, None)),
        Some(Ok(n)) => full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            page::render(&state, Some(n)),
        ),
        Some(Err(_)) => error(StatusCode::BAD_REQUEST, "updates: expected a number of outcomes"),
    }
}

/// `GET /metrics`, in the format the `Accept` header asks for.
async fn metrics(who: Principal, State(state): State<ApiState>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let (content_type, text) = state.metrics.render(accept, &who);
    full(StatusCode::OK, content_type, text)
}

/// `/livez` and `/healthz`, with kube-proxy's rule: healthy unless a run
/// that is due has waited longer than the health timeout to start, or the
/// host's name lookups or blocking threads for plugins
/// ([`sonde_sandbox::host::blocking`]) have all been stuck that long.
fn health(state: &ApiState, check_draining: bool) -> Response {
    let progress = state.scheduler.progress();
    let overdue = progress.overdue();
    let since_pass = tokio::time::Instant::now().saturating_duration_since(progress.last_pass());
    let now = SystemTime::now();
    let draining = state.draining.load(Ordering::Relaxed);
    let stalled = overdue > state.health_timeout;
    // The sandbox's own capacity: every lookup slot, or every blocking
    // thread for plugins, held for longer than the health timeout means no
    // probe that needs one can run.
    let (lookups_exhausted, blocking_exhausted) = state.control.engine().gates_exhausted_for();
    let (lookups_exhausted, blocking_exhausted) = (
        lookups_exhausted.unwrap_or_default(),
        blocking_exhausted.unwrap_or_default(),
    );
    let exhausted = lookups_exhausted.max(blocking_exhausted) > state.health_timeout;
    let body = serde_json::json!({
        "last_updated": humantime::format_rfc3339_millis(now - since_pass).to_string(),
        "current_time": humantime::format_rfc3339_millis(now).to_string(),
        "overdue_ms": overdue.as_millis() as u64,
        "lookups_exhausted_ms": lookups_exhausted.as_millis() as u64,
        "blocking_threads_exhausted_ms": blocking_exhausted.as_millis() as u64,
        "draining": draining,
    });
    let healthy = !(stalled || exhausted || (check_draining && draining));
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &body)
}

async fn livez(State(state): State<ApiState>) -> Response {
    health(&state, false)
}

async fn healthz(State(state): State<ApiState>) -> Response {
    health(&state, true)
}

async fn watch(who: Principal, State(state): State<ApiState>, RawQuery(q): RawQuery, headers: HeaderMap) -> Response {
    let params = match watch::Params::from_request(q.as_deref(), &headers) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let max = state.limits.max_watch_streams;
    match state.watches.open(&who, max) {
        Some(permit) => watch::stream(state.results.clone(), params, who, Some(permit)),
        None => error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("this caller has {max} watch streams open already (api: max_watch_streams)"),
        ),
    }
}

async fn agent_status(who: Principal, State(state): State<ApiState>) -> Response {
    let mut status = state.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Principal::Tenant(t) = &who {
        // A tenant sees its own probes only, and not the operator's config.
        status.config = String::new();
        status.reload_error = None;
        status.left_out.retain(|l| l.tenant == *t);
        status.pulling.retain(|w| w.tenant == *t);
        // Other namespaces' names are not a tenant's business.
        status.namespace_tenants.retain(|n| *n.namespace == **t);
        status.probes = state.results.list().iter().filter(|p| who.sees(&p.tenant)).count();
    }
    let mut body = serde_json::to_value(&status).unwrap_or_default();
    if who == Principal::Operator {
        // The node's conditions are the operator's.
        body["node_conditions"] = node_conditions(&state.metrics.node_problems);
    }
    json(StatusCode::OK, &body)
}

/// What the node-problem-detector monitors last reported, one object per
/// condition.
fn node_conditions(board: &sonde_core::npd::Board) -> serde_json::Value {
    board
        .conditions()
        .into_iter()
        .map(|(source, c)| {
            serde_json::json!({
                "source": source,
                "type": c.kind,
                "status": c.status.as_str(),
                "reason": c.reason,
                "message": c.message,
                "last_transition": humantime::format_rfc3339_millis(c.transition).to_string(),
            })
        })
        .collect()
}
