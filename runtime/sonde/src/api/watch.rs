//! `GET /v1/watch`: a Server-Sent Events stream of state changes, or with
//! `?all=1` of every outcome. Each event has an id; a client that comes
//! back with `Last-Event-ID` (the header, or `?last_event_id=` for a first
//! connection) gets every event it missed from the result cache's bounded
//! log, or a `reset` event when the log has moved past it — then it should
//! list `/v1/probes` again. `?probe=`, `?target=` and `?group=` narrow the
//! stream.
//!
//! ```text
//! id: 18f3a0c2b11-42
//! event: change
//! data: {"probe":"web-readiness","target":"web","kind":"readiness","from":"failure","to":"success",...}
//! ```

use super::limits::WatchPermit;
use super::{Body, query};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use hyper::body::Frame;
use serde::Serialize;
use sonde_core::auth::Principal;
use sonde_core::results::{EventLog, ResultCache, RunEvent, StateChange};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// A comment line goes out this often, so idle connections stay open
/// through proxies and a gone client is noticed.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(15);

/// What a client asked to follow.
#[derive(Debug, Default)]
pub(super) struct Params {
    all: bool,
    last_event_id: Option<String>,
    probe: Option<String>,
    target: Option<String>,
    group: Option<String>,
}

impl Params {
    /// Reads the query string and the `Last-Event-ID` header.
    pub(super) fn from_request(q: Option<&str>, headers: &HeaderMap) -> Result<Self, ParamsError> {
        let all = match query(q, "all").as_deref() {
            None | Some("0" | "false") => false,
            Some("" | "1" | "true") => true,
            Some(other) => return Err(ParamsError::All(other.to_string())),
        };
        let header = headers
            .get("last-event-id")
            .map(|v| v.to_str().map(str::to_string).map_err(|_| ParamsError::LastEventId))
            .transpose()?;
        Ok(Self {
            all,
            last_event_id: header.or_else(|| query(q, "last_event_id").map(|v| v.into_owned())),
            probe: query(q, "probe").map(|v| v.into_owned()),
            target: query(q, "target").map(|v| v.into_owned()),
            group: query(q, "group").map(|v| v.into_owned()),
        })
    }
}

/// A watch request the stream cannot follow (a 400 answer).
#[derive(Debug, thiserror::Error)]
pub(super) enum ParamsError {
    /// `all=` is not a boolean.
    #[error("all: {0:?} is not 1, true, 0 or false")]
    All(String),
    /// The `Last-Event-ID` header is not visible ASCII.
    #[error("Last-Event-ID is not text")]
    LastEventId,
}

/// An event the stream can show.
trait Watched: Clone + Serialize + Send + Sync + 'static {
    const NAME: &'static str;
    fn probe(&self) -> &str;
    fn target(&self) -> &str;
    fn tenant(&self) -> &str;
}

/// Both events carry `probe`, `target` and `tenant` fields.
macro_rules! watched {
    ($ty:ty, $name:literal) => {
        impl Watched for $ty {
            const NAME: &'static str = $name;
            fn probe(&self) -> &str {
                &self.probe
            }
            fn target(&self) -> &str {
                &self.target
            }
            fn tenant(&self) -> &str {
                &self.tenant
            }
        }
    };
}

watched!(StateChange, "change");
watched!(RunEvent, "run");

/// The response: headers now, events as they come.
pub(super) fn stream(results: ResultCache, params: Params, who: Principal, permit: Option<WatchPermit>) -> Response {
    let (tx, rx) = mpsc::channel(64);
    if params.all {
        tokio::spawn(follow::<RunEvent>(results, params, who, tx, |r| r.run_log()));
    } else {
        tokio::spawn(follow::<StateChange>(results, params, who, tx, |r| r.change_log()));
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::new(Channel { rx, _permit: permit }))
        .unwrap_or_default()
}

fn frame(event: &str, id: &str, data: &impl Serialize) -> Bytes {
    let data = serde_json::to_string(data).unwrap_or_default();
    Bytes::from(format!("id: {id}\nevent: {event}\ndata: {data}\n\n"))
}

async fn follow<T: Watched>(
    results: ResultCache,
    params: Params,
    who: Principal,
    tx: mpsc::Sender<Bytes>,
    log: fn(&ResultCache) -> &EventLog<T>,
) {
    let log = log(&results);
    let mut wake = log.follow();
    let in_group = |probe: &str| match &params.group {
        None => true,
        Some(g) => results.groups(probe).is_some_and(|gs| gs.iter().any(|x| x == g)),
    };
    let wanted = |e: &T| {
        who.sees(e.tenant())
            && params.probe.as_deref().is_none_or(|p| p == e.probe())
            && params.target.as_deref().is_none_or(|t| t == e.target())
            && in_group(e.probe())
    };
    let reset = |log: &EventLog<T>, why: &str| -> (u64, Bytes) {
        let newest = log.newest();
        let body = serde_json::json!({ "reason": why, "relist": "/v1/probes" });
        (newest, frame("reset", &log.id(newest), &body))
    };
    let mut cursor = match params.last_event_id.as_deref() {
        None => log.newest(),
        Some(id) => match log.parse(id) {
            Some(seq) => seq,
            None => {
                let (newest, f) = reset(log, "Last-Event-ID is not from this run of the agent");
                if tx.send(f).await.is_err() {
                    return;
                }
                newest
            }
        },
    };
    if tx
        .send(Bytes::from_static(b"retry: 1000\n: sonde watch\n\n"))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let frames: Vec<Bytes> = match log.after(cursor) {
            Ok(events) => {
                if let Some((last, _)) = events.last() {
                    cursor = *last;
                }
                events
                    .iter()
                    .filter(|(_, e)| wanted(e))
                    .map(|(seq, e)| frame(T::NAME, &log.id(*seq), e))
                    .collect()
            }
            Err(_) => {
                let (newest, f) = reset(log, "events were missed: the log has moved past Last-Event-ID");
                cursor = newest;
                vec![f]
            }
        };
        for f in frames {
            if tx.send(f).await.is_err() {
                return;
            }
        }
        tokio::select! {
            changed = wake.changed() => if changed.is_err() { return },
            // The client went: end now, not at the next keepalive.
            () = tx.closed() => return,
            () = tokio::time::sleep(KEEPALIVE) => {
                if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A body fed by a channel; it ends when the sender goes. It holds the
/// stream's place among its caller's watch streams until the client goes.
struct Channel {
    rx: mpsc::Receiver<Bytes>,
    _permit: Option<WatchPermit>,
}

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn next_frame(body: &mut Body) -> String {
        let frame = body.frame().await.expect("a frame").expect("no error");
        String::from_utf8(frame.into_data().expect("data").to_vec()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_watch_gets_a_keepalive_each_interval() {
        let results = ResultCache::new(8);
        let mut body = stream(results, Params::default(), Principal::Operator, None).into_body();
        assert_eq!(next_frame(&mut body).await, "retry: 1000\n: sonde watch\n\n");
        let start = tokio::time::Instant::now();
        assert_eq!(next_frame(&mut body).await, ": keepalive\n\n");
        assert_eq!(start.elapsed(), KEEPALIVE);
        assert_eq!(next_frame(&mut body).await, ": keepalive\n\n");
        assert_eq!(start.elapsed(), 2 * KEEPALIVE);
    }

    #[test]
    fn params_come_from_the_query_and_the_header() {
        let mut headers = HeaderMap::new();
        let p = Params::from_request(Some("all=1&probe=a%20b&last_event_id=q"), &headers).unwrap();
        assert!(p.all);
        assert_eq!(p.probe.as_deref(), Some("a b"));
        assert_eq!(p.last_event_id.as_deref(), Some("q"));
        headers.insert("last-event-id", "h".parse().unwrap());
        let p = Params::from_request(Some("last_event_id=q"), &headers).unwrap();
        assert_eq!(p.last_event_id.as_deref(), Some("h"), "the header wins");
        assert!(Params::from_request(Some("all=maybe"), &headers).is_err());
    }
}
