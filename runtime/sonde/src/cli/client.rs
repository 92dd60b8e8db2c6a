//! A small client of the agent's API, for `sonde status` and
//! `sonde check --group`. Every failure to reach the agent is an
//! [`Unreachable`](ClientError::Unreachable) error, which the callers turn
//! into exit code 3.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use std::time::Duration;

/// Default address of the agent's API, as `sonde status` and
/// `sonde check --group` look for it.
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:9464";

/// How long connecting to the agent may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole (non-streaming) request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--api` is not a usable URL.
    #[error("--api {0}: expected http://HOST:PORT; give the agent's API URL, such as http://127.0.0.1:9464")]
    BadUrl(String),
    /// No answer from the agent.
    #[error(
        "cannot reach the agent at {base}: {source}; is `sonde run` running there? Start it, or point --api at its API (its start line names the URL)"
    )]
    Unreachable {
        /// The API URL.
        base: String,
        /// What went wrong: the connection's or the exchange's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The agent answered with an error status.
    #[error("{path}: {status}: {message}; {}", what_to_do(status))]
    Refused {
        /// The API path asked.
        path: String,
        /// The status it answered.
        status: StatusCode,
        /// The agent's own words (its JSON `error`, else its body).
        message: String,
    },
    /// The agent's answer is not what this sonde expects.
    #[error("{path}: unexpected answer: {source}; check that --api points at a sonde agent of the same version")]
    Unexpected {
        /// The API path asked.
        path: String,
        /// Why it does not parse.
        source: serde_json::Error,
    },
    /// The agent took longer than [`CONNECT_TIMEOUT`] to accept, or
    /// [`REQUEST_TIMEOUT`] to answer.
    #[error(
        "cannot reach the agent at {base}: no answer within {}; is `sonde run` running there? Start it, or point --api at its API (its start line names the URL)",
        humantime::format_duration(*.after)
    )]
    Timeout {
        /// The API URL.
        base: String,
        /// The time waited.
        after: Duration,
    },
}

/// The API token: `$SONDE_TOKEN`, or the first line of the file named by
/// `$SONDE_TOKEN_FILE`.
fn token() -> Option<String> {
    let env = |k| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if let Some(t) = env("SONDE_TOKEN") {
        return Some(t.trim().to_string());
    }
    let file = env("SONDE_TOKEN_FILE")?;
    let text = std::fs::read_to_string(file.trim()).ok()?;
    text.lines()
        .next()
        .map(|l| l.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Sends a GET for `path` to the agent at `base` and returns the response
/// with its body still streaming.
pub async fn open(
    base: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: http::Uri = url.parse().map_err(|_| ClientError::BadUrl(base.into()))?;
    if uri.scheme_str() != Some("http") {
        return Err(ClientError::BadUrl(base.into()));
    }
    let authority = uri.authority().ok_or_else(|| ClientError::BadUrl(base.into()))?.clone();
    let host = authority.host().trim_start_matches('[').trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(80);
    let unreachable = |e: Box<dyn std::error::Error + Send + Sync>| ClientError::Unreachable {
        base: base.to_string(),
        source: e,
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| ClientError::Timeout {
            base: base.to_string(),
            after: CONNECT_TIMEOUT,
        })?
        .map_err(|e| unreachable(e.into()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(e.into()))?;
    tokio::spawn(conn);
    let mut req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, authority.as_str());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(token) = token() {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let req = req
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|_| ClientError::BadUrl(base.into()))?;
    sender.send_request(req).await.map_err(|e| unreachable(e.into()))
}

/// GETs `path` and returns the status and the whole body.
pub async fn get(base: &str, path: &str) -> Result<(StatusCode, Bytes), ClientError> {
    let fetch = async {
        let resp = open(base, path, &[]).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| ClientError::Unreachable {
            base: base.to_string(),
            source: e.into(),
        })?;
        Ok((status, body.to_bytes()))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, fetch)
        .await
        .map_err(|_| ClientError::Timeout {
            base: base.to_string(),
            after: REQUEST_TIMEOUT,
        })?
}

/// GETs `path` from the agent at `base` and parses the JSON body; a status
/// other than 2xx is an error carrying the agent's message.
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(base: &str, path: &str) -> Result<T, ClientError> {
    let (status, body) = get(base, path).await?;
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        return Err(ClientError::Refused {
            path: path.to_string(),
            status,
            message,
        });
    }
    serde_json::from_slice(&body).map_err(|source| ClientError::Unexpected {
        path: path.to_string(),
        source,
    })
}

/// What to do about an answer of `status`.
fn what_to_do(status: &StatusCode) -> &'static str {
    match *status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            "set $SONDE_TOKEN (or $SONDE_TOKEN_FILE) to a token the agent accepts"
        }
        StatusCode::NOT_FOUND => "check that --api points at a sonde agent of the same version",
        _ => "see the agent's log for why",
    }
}

/// Whether a running agent is healthy as `sonde status` reports it (exit 0,
/// else 2): every probe passes by its kind, the rule of `/v1/ready` and
/// `/v1/live` — a liveness probe unless it fails, a readiness or startup
/// probe when it succeeds (or warns). A probe not run yet is not healthy.
pub fn healthy(probes: &[serde_json::Value]) -> bool {
    probes.iter().all(|p| match (p["kind"].as_str(), p["state"].as_str()) {
        (Some("liveness"), Some(state)) => state != "failure",
        (_, Some(state)) => matches!(state, "success" | "warning"),
        (_, None) => false,
    })
}

/// One Server-Sent Event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:` (empty means `message`).
    pub event: String,
    /// `id:`.
    pub id: String,
    /// `data:` lines, joined with newlines.
    pub data: String,
}

/// Splits a Server-Sent Events byte stream into events.
#[derive(Debug, Default)]
pub struct EventParser {
    buf: Vec<u8>,
    current: Event,
}

impl EventParser {
    /// Feeds bytes; returns the events they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !self.current.data.is_empty() || !self.current.event.is_empty() {
                    out.push(std::mem::take(&mut self.current));
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.current.event = value.to_string(),
                "id" => self.current.id = value.to_string(),
                "data" => {
                    if !self.current.data.is_empty() {
                        self.current.data.push('\n');
                    }
                    self.current.data.push_str(value);
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_ready_and_live_rules() {
        let probe = |kind: &str, state: &str| serde_json::json!({ "kind": kind, "state": state });
        assert!(healthy(&[]));
        assert!(healthy(&[probe("readiness", "success"), probe("liveness", "unknown")]));
        assert!(healthy(&[probe("startup", "warning")]));
        assert!(!healthy(&[probe("readiness", "unknown")]));
        assert!(!healthy(&[probe("liveness", "failure")]));
        assert!(!healthy(&[probe("readiness", "failure"), probe("liveness", "success")]));
    }

    #[test]
    fn parses_events_split_anywhere() {
        let text = b"retry: 1000\n: comment\n\nid: a-1\nevent: change\ndata: {\"x\":1}\n\nid: a-2\nevent: run\ndata: one\ndata: two\n\n";
        for cut in 0..text.len() {
            let mut p = EventParser::default();
            let mut events = p.feed(&text[..cut]);
            events.extend(p.feed(&text[cut..]));
            assert_eq!(events.len(), 2, "cut at {cut}");
            assert_eq!(events[0].event, "change");
            assert_eq!(events[0].id, "a-1");
            assert_eq!(events[0].data, "{\"x\":1}");
            assert_eq!(events[1].data, "one\ntwo");
        }
    }
}
