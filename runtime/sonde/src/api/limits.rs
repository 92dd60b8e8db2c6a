//! What keeps the API answering while its clients misbehave: the accept
//! loop and its connection table ([`Connections`]), and the count of open
//! watch streams per caller ([`WatchStreams`]). The limits themselves are
//! configured in the file's `api:` block ([`ApiLimits`]).
//!
//! A connection is *busy* while a request on it is being answered (its
//! body read, its response written or streamed) and *idle* otherwise: before
//! its first request's head is complete, and between requests. Idle
//! connections are what a slow or idle client holds, so at
//! `max_connections` a new connection closes the oldest idle one, and a
//! caller of `/livez` always gets through a flood of idle sockets. Only
//! when every connection is busy is the new one refused.

use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use sonde_core::auth::Principal;
use sonde_core::config::ApiLimits;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// One open connection, as the table sees it.
#[derive(Default)]
struct Slot {
    /// Requests being answered on it (their response bodies not yet done).
    busy: AtomicUsize,
    /// Told when the connection must close (it was evicted).
    evict: Notify,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Table {
    next: u64,
    open: BTreeMap<u64, Arc<Slot>>,
}

/// The connection table of one API listener.
#[derive(Clone)]
pub(super) struct Connections {
    max: usize,
    table: Arc<Mutex<Table>>,
}

/// A connection's place in the table; dropping it frees the place.
pub(super) struct Admitted {
    id: u64,
    slot: Arc<Slot>,
    table: Arc<Mutex<Table>>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        lock(&self.table).open.remove(&self.id);
    }
}

/// Held while a request is answered; its drop ends the busy time.
pub(super) struct Busy(Arc<Slot>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Admitted {
    fn busy(&self) -> Busy {
        self.slot.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.slot.clone())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Connections {
    pub(super) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            table: Arc::default(),
        }
    }

    /// A place for a new connection: free, or taken from the oldest idle
    /// connection (which is told to close); `None` when every connection is
    /// busy.
    pub(super) fn admit(&self) -> Option<Admitted> {
        let mut t = lock(&self.table);
        if t.open.len() >= self.max {
            let oldest_idle = t
                .open
                .iter()
                .find(|(_, s)| s.busy.load(Ordering::Relaxed) == 0)
                .map(|(id, _)| *id)?;
            if let Some(evicted) = t.open.remove(&oldest_idle) {
                // `notify_one` keeps the permit if the connection's task is
                // not waiting yet: it closes as soon as it looks.
                evicted.evict.notify_one();
            }
        }
        let id = t.next;
        t.next += 1;
        let slot = Arc::new(Slot::default());
        t.open.insert(id, slot.clone());
        Some(Admitted {
            id,
            slot,
            table: self.table.clone(),
        })
    }

    /// How many connections are open.
    #[cfg(test)]
    fn open(&self) -> usize {
        lock(&self.table).open.len()
    }
}

/// The service the API serves: the router, behind its request rewriting.
pub(super) trait App:
    tower::Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

impl<S> App for S where
    S: tower::Service<Request, Response = Response, Error = Infallible, Future: Send> + Clone + Send + 'static
{
}

/// Accepts connections on `listener` and serves `app` on each, under
/// `limits`, until the task is dropped.
pub(super) async fn accept_loop<S>(listener: tokio::net::TcpListener, app: S, limits: ApiLimits)
where
    S: App,
{
    let connections = Connections::new(limits.max_connections);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors or a connection reset before it
                // was taken: the listener itself is fine. A short pause
                // keeps an fd shortage from turning into a busy loop.
                tracing::warn!(error = %e, "cannot accept an API connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = connections.admit() else {
            tracing::warn!(
                max_connections = limits.max_connections,
                "API connection refused: every connection is busy (api: max_connections)"
            );
            continue;
        };
        tokio::spawn(serve_connection(stream, app.clone(), admitted, limits));
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, app: impl App, admitted: Admitted, limits: ApiLimits) {
    let admitted = Arc::new(admitted);
    let marker = admitted.clone();
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let busy = marker.busy();
        let app = app.clone();
        async move {
            let response = tower::ServiceExt::oneshot(app, req.map(axum::body::Body::new)).await?;
            // The connection stays busy until the response body is done
            // (a watch stream, an answer still being written): the body
            // owns the guard.
            let response = response.map(|body| {
                axum::body::Body::new(http_body_util::BodyExt::map_err(body, move |e| {
                    let _held = &busy;
                    e
                }))
            });
            Ok::<_, Infallible>(response)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes.max(ApiLimits::MIN_HEADER_BYTES))
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = admitted.slot.evict.notified() => {
            // Closes at once when idle; a request that slipped in first is
            // answered.
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(limits.header_read_timeout, connection).await;
        }
    }
}

/// Open watch streams per caller, bounded by `api: max_watch_streams`.
#[derive(Clone, Default)]
pub(crate) struct WatchStreams(Arc<Mutex<HashMap<Option<Arc<str>>, usize>>>);

/// One open watch stream; its drop closes its place.
pub(super) struct WatchPermit {
    key: Option<Arc<str>>,
    streams: WatchStreams,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        let mut m = lock(&self.streams.0);
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl WatchStreams {
    /// A place for one more stream of `who`'s, unless it has `max` open.
    pub(super) fn open(&self, who: &Principal, max: usize) -> Option<WatchPermit> {
        let key = match who {
            Principal::Operator => None,
            Principal::Tenant(t) => Some(t.clone()),
        };
        let mut m = lock(&self.0);
        let n = m.entry(key.clone()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(WatchPermit {
            key,
            streams: self.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_limit_the_oldest_idle_connection_makes_room() {
        let c = Connections::new(2);
        let first = c.admit().unwrap();
        let second = c.admit().unwrap();
        let _busy = second.busy();
        // The first is idle: it is evicted for the third.
        let third = c.admit().unwrap();
        assert_eq!(c.open(), 2);
        let _b3 = third.busy();
        // Both open ones are busy: the fourth is refused.
        assert!(c.admit().is_none());
        drop(first);
        assert_eq!(c.open(), 2, "an evicted place was already freed");
        drop(_busy);
        assert!(c.admit().is_some(), "the second is idle again");
    }

    #[test]
    fn watch_streams_are_counted_per_caller() {
        let w = WatchStreams::default();
        let acme = Principal::Tenant("acme".into());
        let a1 = w.open(&acme, 2).unwrap();
        let _a2 = w.open(&acme, 2).unwrap();
        assert!(w.open(&acme, 2).is_none());
        assert!(w.open(&Principal::Operator, 2).is_some(), "another caller has its own");
        drop(a1);
        assert!(w.open(&acme, 2).is_some());
    }
}
