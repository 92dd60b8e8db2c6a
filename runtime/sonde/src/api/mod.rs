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
//! | `GET /probe?target=&module=` | blackbox_exporter's multi-target probe: one run of a `modules:` entry ([`scrape`]) |
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
//! The connections are served by [`limits`]'s accept loop under the
//! [`ApiLimits`] of the file's `api:` block: a head read timeout, a body
//! read timeout, a connection limit that evicts idle connections first, a
//! head size limit (431) and a limit on watch streams per caller (429).

pub use sonde_core::auth;
mod limits;
mod page;
pub(crate) mod scrape;
mod watch;

pub use auth::{ApiAuth, Principal};
pub(crate) use limits::WatchStreams;
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

/// The one place a refused change becomes an HTTP status.
fn refused(e: ControlError) -> Response {
    let status = match &e {
        ControlError::BadName { .. } | ControlError::BadSpec { .. } => StatusCode::BAD_REQUEST,
        ControlError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        ControlError::NotFound { .. } => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        ControlError::Unavailable { .. } | ControlError::Pulling { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

/// Who is calling: from the bearer token, or the operator when the API
/// needs none. A caller without a valid token is answered 401.
impl FromRequestParts<ApiState> for Principal {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        if !matches!(state.auth, ApiAuth::Token | ApiAuth::Kubernetes) {
            return Ok(Principal::Operator);
        }
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(auth::bearer)
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        let known = auth::authenticate(token, state.control.tenants().credentials());
        match (known, &state.reviews) {
            (Some(who), _) => Ok(who),
            (None, Some(reviews)) => reviewed(reviews, token, &parts.method, parts.uri.path()).await,
            (None, None) => Err(unauthorized()),
        }
    }
}

/// A token sonde does not know, reviewed by the API server: the operator
/// for this request when RBAC allows it, else 401 (not authenticated) or
/// 403 (not allowed); 503 when the review cannot be made now.
async fn reviewed(
    reviews: &sonde_kubernetes::review::Reviewer,
    token: &str,
    method: &Method,
    path: &str,
) -> Result<Principal, Response> {
    use sonde_kubernetes::review::{Decision, ReviewError};
    let verb = method.as_str().to_ascii_lowercase();
    match reviews.review(token, &verb, path).await {
        Ok(Decision::Allowed { .. }) => Ok(Principal::Operator),
        Ok(Decision::Unauthenticated) => Err(unauthorized()),
        Ok(Decision::Denied { user }) => Err(error(
            StatusCode::FORBIDDEN,
            format!("{user} may not {verb} {path} (RBAC: nonResourceURLs [\"{path}\"], verbs [\"{verb}\"])"),
        )),
        Err(e) => {
            if !matches!(e, ReviewError::Busy { .. }) {
                tracing::warn!(error = %e, "api: cannot review a caller's token");
            }
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            Err(r)
        }
    }
}

fn unauthorized() -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "this API needs a token: Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// The request body, whole: at most `limit` bytes (else 413), arrived
/// within the API's `body_read_timeout` (else 408).
async fn read_body(state: &ApiState, body: Body, limit: usize) -> Result<Bytes, Response> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the {limit} byte limit"),
        )
    };
    // A declared length past the limit is refused before a byte is read.
    if hyper::body::Body::size_hint(&body).lower() > limit as u64 {
        return Err(too_large());
    }
    let timeout = state.limits.body_read_timeout;
    let read = http_body_util::Limited::new(body, limit).collect();
    let Ok(read) = tokio::time::timeout(timeout, read).await else {
        return Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the body did not arrive within {} (api: body_read_timeout)",
                humantime::format_duration(timeout)
            ),
        ));
    };
    match read {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => Err(error(StatusCode::BAD_REQUEST, format!("cannot read the body: {e}"))),
    }
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

async fn list_probes(who: Principal, State(state): State<ApiState>) -> Response {
    let mut list: Vec<serde_json::Value> = state
        .results
        .list()
        .into_iter()
        .filter(|p| who.sees(&p.tenant))
        .map(|p| serde_json::to_value(p).unwrap_or_default())
        .collect();
    list.extend(waiting(&state, &who, None));
    json(StatusCode::OK, &list)
}

/// The probes waiting for their `oci://` plugin's pull (of `name` only,
/// when given), shown as probes in state `unknown` with a `pulling` field.
fn waiting(state: &ApiState, who: &Principal, name: Option<&str>) -> Vec<serde_json::Value> {
    let status = state.status.lock().unwrap_or_else(|e| e.into_inner());
    status
        .pulling
        .iter()
        .filter(|w| who.sees(&w.tenant) && name.is_none_or(|n| *w.probe == *n))
        .map(|w| {
            serde_json::json!({
                "name": w.probe,
                "target": w.target,
                "kind": w.kind,
                "groups": [],
                "tenant": &*w.tenant,
                "plugin": w.plugin,
                "state": Status::Unknown,
                "stale": false,
                "consecutive": 0,
                "last": null,
                "last_transition": null,
                "pulling": w,
            })
        })
        .collect()
}

async fn get_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    match visible_probe(&state, &who, &name) {
        Some(p) => json(StatusCode::OK, &p),
        None => match waiting(&state, &who, Some(&name)).pop() {
            Some(w) => json(StatusCode::OK, &w),
            None => not_found("probe", &name),
        },
    }
}

/// 201 for a new plugin or probe, 200 for a replaced one.
fn stored(key: &str, name: &str, replaced: bool) -> Response {
    let status = if replaced { StatusCode::OK } else { StatusCode::CREATED };
    json(status, &serde_json::json!({ key: name, "replaced": replaced }))
}

async fn put_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>, body: Body) -> Response {
    let body = match read_body(&state, body, sonde_core::managed::MAX_PROBE_BYTES).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let owner = |n: &str| state.results.get(n).map(|p| p.tenant);
    match state.control.put_probe(&who, &name, &body, owner).await {
        Ok(replaced) => stored("probe", &name, replaced),
        Err(e) => refused(e),
    }
}

/// `PUT /v1/probes`: a batch, all stored or none.
async fn put_probes(who: Principal, State(state): State<ApiState>, body: Body) -> Response {
    let body = match read_body(&state, body, sonde_core::managed::MAX_BATCH_BYTES).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let owner = |n: &str| state.results.get(n).map(|p| p.tenant);
    match state.control.put_probes(&who, &body, owner).await {
        Ok(done) => {
            let (replaced, added): (Vec<_>, Vec<_>) = done.into_iter().partition(|(_, r)| *r);
            let names = |v: Vec<(String, bool)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
            json(
                StatusCode::OK,
                &serde_json::json!({ "added": names(added), "replaced": names(replaced) }),
            )
        }
        Err(e) => refused(e),
    }
}

async fn delete_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    let visible = visible_probe(&state, &who, &name).is_some();
    match state.control.delete_probe(&who, &name, visible).await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({ "deleted": name })),
        Err(e) => refused(e),
    }
}

async fn run_probe(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    if visible_probe(&state, &who, &name).is_none() {
        return not_found("probe", &name);
    }
    match state.scheduler.trigger(&name).await {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e @ TriggerError::NotFound(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}

async fn put_plugin(who: Principal, State(state): State<ApiState>, Path(name): Path<String>, body: Body) -> Response {
    let body = match read_body(&state, body, sonde_core::managed::MAX_PLUGIN_BYTES).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    match state.control.put_plugin(&who, &name, &body).await {
        Ok(replaced) => stored("plugin", &name, replaced),
        Err(e) => refused(e),
    }
}

async fn delete_plugin(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    match state.control.delete_plugin(&who, &name).await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({ "deleted": name })),
        Err(e) => refused(e),
    }
}

async fn list_targets(who: Principal, State(state): State<ApiState>) -> Response {
    let list: Vec<_> = state
        .results
        .targets()
        .into_iter()
        .filter(|t| who.sees(&t.tenant))
        .collect();
    json(StatusCode::OK, &list)
}

async fn get_target(who: Principal, State(state): State<ApiState>, Path(name): Path<String>) -> Response {
    match state
        .results
        .targets()
        .into_iter()
        .find(|t| t.name == name && who.sees(&t.tenant))
    {
        Some(t) => json(StatusCode::OK, &t),
        None => not_found("target", &name),
    }
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

/// `/v1/ready/{group}` and `/v1/live/{group}`: 200 when every probe of
/// `kind` in the group (that `who` sees) passes, else 503 with the failing.
fn group(state: &ApiState, who: &Principal, group: &str, kind: Kind) -> Response {
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

async fn ready(who: Principal, State(state): State<ApiState>, Path(g): Path<String>) -> Response {
    group(&state, &who, &g, Kind::Readiness)
}

async fn live(who: Principal, State(state): State<ApiState>, Path(g): Path<String>) -> Response {
    group(&state, &who, &g, Kind::Liveness)
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
    json(StatusCode::OK, &status)
}
