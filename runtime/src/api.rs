//! The agent's HTTP API (`sonde run --api ADDR`), read by `sonde status`,
//! people and other tools. It reads the [`ResultCache`] and never waits on a
//! probe run, except `POST /v1/probes/{name}/run`, which asks for one.
//!
//! | endpoint | what |
//! | --- | --- |
//! | `GET /v1/probes` | every probe: state, stale, consecutive, last outcome |
//! | `GET /v1/probes/{name}` | one probe, with its history |
//! | `POST /v1/probes/{name}/run` | run it now; the outcome |
//! | `GET /v1/targets` | every target: started, ready, live |
//! | `GET /v1/status` | the config in force and the last reload error |
//!
//! Errors are JSON `{"error": "..."}` with 400, 404 or 405.

use crate::results::ResultCache;
use crate::scheduler::{self, TriggerError};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// What the agent tells about its config.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AgentStatus {
    /// The config file, or `<embedded default>`.
    pub config: String,
    /// When the config in force was loaded.
    #[serde(serialize_with = "rfc3339")]
    pub loaded_at: Option<SystemTime>,
    /// Why the last reload was refused, if it was (the old config stays).
    pub reload_error: Option<String>,
    /// The number of probes.
    pub probes: usize,
    /// The agent's version.
    pub version: &'static str,
}

fn rfc3339<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(&humantime::format_rfc3339_millis(*t)),
        None => s.serialize_none(),
    }
}

/// What the API serves from.
#[derive(Clone)]
pub struct ApiState {
    /// Results to read.
    pub results: ResultCache,
    /// The scheduler, for manual runs.
    pub scheduler: scheduler::Handle,
    /// Config status.
    pub status: Arc<Mutex<AgentStatus>>,
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
                    async move { Ok::<_, std::convert::Infallible>(route(&state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

fn json(status: StatusCode, body: &impl Serialize) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec_pretty(body).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .unwrap_or_default()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": message.into() }))
}

async fn route(state: &ApiState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let method = req.method().clone();
    match (segments.as_slice(), &method) {
        (["v1", "probes"], &Method::GET) => json(StatusCode::OK, &state.results.list()),
        (["v1", "probes", name], &Method::GET) => match state.results.get(name) {
            Some(p) => json(StatusCode::OK, &p),
            None => error(StatusCode::NOT_FOUND, format!("no probe named {name:?}")),
        },
        (["v1", "probes", name, "run"], &Method::POST) => match state.scheduler.trigger(name).await {
            Ok(r) => json(StatusCode::OK, &r),
            Err(e @ TriggerError::NotFound(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
            Err(e) => error(StatusCode::CONFLICT, e.to_string()),
        },
        (["v1", "targets"], &Method::GET) => json(StatusCode::OK, &state.results.targets()),
        (["v1", "status"], &Method::GET) => {
            let status = state.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
            json(StatusCode::OK, &status)
        }
        (["v1", "probes"] | ["v1", "probes", _] | ["v1", "targets"] | ["v1", "status"], _)
        | (["v1", "probes", _, "run"], _) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        ),
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint: {path}")),
    }
}
