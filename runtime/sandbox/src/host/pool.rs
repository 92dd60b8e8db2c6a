//! The keep-alive pool of the host's HTTP transport, shared by every call of
//! an engine (opt-in per request: `keepalive`).
//!
//! Connections are kept per [`PoolKey`]: the tenant whose call opened it,
//! the scheme, the host in canonical form (lower case, no trailing dot, an
//! IP address as its canonical text, a v4-mapped IPv6 address as its IPv4
//! address) and port, and the TLS options that verified the server, so a
//! connection set up with `insecure_skip_verify` never serves a request that
//! wants verification, and one tenant's connection never serves another.
//! The pool never decides who may use a connection: the grant check runs
//! before every request, and a request that is refused never reaches
//! [`Pool::checkout`].
//!
//! Bounds: [`MAX_IDLE_PER_HOST`] idle connections per key,
//! [`MAX_IDLE_PER_TENANT`] per tenant, [`MAX_IDLE`] in all and
//! [`MAX_HOSTS`] keys (each a file descriptor; a connection past a bound is
//! closed instead of kept), and [`IDLE_TIMEOUT`] after which an idle
//! connection is closed (checked when the pool is used; a sweep of every
//! key runs at most once per [`SWEEP_EVERY`]).

use super::tasks::AbortOnDrop;
use super::tls_client::{TlsInfo, TlsOptions};
use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::{TrySendError, http1, http2};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Idle connections kept per scheme, host, port and TLS options: enough for
/// the runs to one service that are usually in flight at once, so keep-alive
/// probes at a high rate reuse connections instead of opening new ones.
pub(crate) const MAX_IDLE_PER_HOST: usize = 32;
/// Distinct keys with idle connections; beyond it, connections are closed
/// instead of kept.
pub(crate) const MAX_HOSTS: usize = 1024;
/// Idle connections kept for one tenant's calls, over all its keys: two
/// services' worth at [`MAX_IDLE_PER_HOST`].
pub(crate) const MAX_IDLE_PER_TENANT: usize = 2 * MAX_IDLE_PER_HOST;
/// Idle connections kept in all: 1024 file descriptors at most.
pub(crate) const MAX_IDLE: usize = 1024;
/// How long a connection may sit idle in the pool.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often at most every key is swept for expired connections.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What a pooled connection may serve.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PoolKey {
    tenant: Arc<str>,
    https: bool,
    host: String,
    port: u16,
    /// For https: how the server is verified and who the client is.
    tls: Option<TlsKey>,
}

/// What tells one https connection's TLS from another's: the CA digest,
/// skip-verify, the server name, the client certificate's digest (a
/// connection authenticated with one certificate never serves a request
/// made without it), and whether HTTP/2 was offered (a request that did
/// not ask for it never goes over HTTP/2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TlsKey {
    ca: Option<[u8; 32]>,
    insecure: bool,
    server_name: Option<String>,
    client: Option<[u8; 32]>,
    http2: bool,
}

impl PoolKey {
    /// The key of a request to `host:port` for `tenant`, over TLS verified
    /// as `tls` says (none for `http://`), offering HTTP/2 when `http2`
    /// (over TLS only).
    pub(crate) fn new(tenant: &Arc<str>, host: &str, port: u16, tls: Option<&TlsOptions>, http2: bool) -> Self {
        Self {
            tenant: tenant.clone(),
            https: tls.is_some(),
            host: canonical_host(host),
            port,
            tls: tls.map(|o| TlsKey {
                ca: o.ca_digest(),
                insecure: o.insecure_skip_verify,
                server_name: o.server_name.clone(),
                client: o.client.as_ref().map(|c| c.digest()),
                http2,
            }),
        }
    }
}

/// `host` in the one spelling the pool keys on: lower case without a
/// trailing dot; an IP address in any spelling ([`sonde_policy::grants::host_address`])
/// as its canonical text.
pub(crate) fn canonical_host(host: &str) -> String {
    match sonde_policy::grants::host_address(host) {
        Some(ip) => ip.to_string(),
        None => host.trim_end_matches('.').to_ascii_lowercase(),
    }
}

/// An HTTP/1.1 or HTTP/2 client connection: the request handle, the TLS
/// session it runs over, and the tasks driving it, which are ended (and
/// the socket reset) when the connection is dropped.
pub(crate) struct Conn {
    pub(crate) sender: Sender,
    /// The address it is connected to, as checked when it was opened; a
    /// call that takes it from the pool checks it again for itself.
    pub(crate) peer: SocketAddr,
    pub(crate) tls: Option<Arc<TlsInfo>>,
    /// Declared last: the handle goes first, then the tasks.
    _tasks: AbortOnDrop,
}

impl Conn {
    pub(crate) fn new(sender: Sender, peer: SocketAddr, tls: Option<Arc<TlsInfo>>, tasks: AbortOnDrop) -> Self {
        Self {
            sender,
            peer,
            tls,
            _tasks: tasks,
        }
    }
}

/// A connection's request handle, by the version it speaks.
pub(crate) enum Sender {
    /// HTTP/1.1 (or 1.0 as the server answers).
    Http1(http1::SendRequest<Full<Bytes>>),
    /// HTTP/2, negotiated by ALPN.
    Http2(http2::SendRequest<Full<Bytes>>),
}

/// A request the connection could not take, maybe with the request back.
type TryError = TrySendError<http::Request<Full<Bytes>>>;

impl Sender {
    /// Whether the connection is closed.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Self::Http1(s) => s.is_closed(),
            Self::Http2(s) => s.is_closed(),
        }
    }

    /// Waits until the connection can take a request.
    pub(crate) async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Self::Http1(s) => s.ready().await,
            Self::Http2(s) => s.ready().await,
        }
    }

    /// Whether it speaks HTTP/2.
    pub(crate) fn is_http2(&self) -> bool {
        matches!(self, Self::Http2(_))
    }

    /// Sends `request`; a request that never went out comes back in the error.
    pub(crate) async fn try_send_request(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, TryError> {
        match self {
            Self::Http1(s) => s.try_send_request(request).await,
            Self::Http2(s) => s.try_send_request(request).await,
        }
    }
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// Idle connections by key.
#[derive(Default)]
pub(crate) struct Pool {
    inner: Mutex<Inner>,
}

/// The pool's maps hash with foldhash, seeded per process: SipHash was
/// ~2,400 instructions of a keep-alive run (a checkout and a checkin, each
/// hashing the key and the tenant). The keys are few (at most [`MAX_IDLE`]
/// connections, to granted hosts only), so flooding one bucket buys a
/// plugin nothing.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

#[derive(Default)]
struct Inner {
    idle: HashMap<PoolKey, Vec<Idle>>,
    /// Idle connections per tenant, and in all.
    per_tenant: HashMap<Arc<str>, usize>,
    total: usize,
    last_sweep: Option<Instant>,
    /// The engine's bounds on idle connections.
    limits: IdleLimits,
}

/// How many idle connections the pool keeps: the engine's
/// `sandbox.keepalive_idle_per_host`, `keepalive_idle_per_tenant` and
/// `keepalive_idle`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IdleLimits {
    /// Per key (tenant, host, port and TLS options).
    pub(crate) per_host: usize,
    /// Per tenant, over all its keys.
    pub(crate) per_tenant: usize,
    /// In all.
    pub(crate) total: usize,
}

impl Default for IdleLimits {
    fn default() -> Self {
        Self {
            per_host: MAX_IDLE_PER_HOST,
            per_tenant: MAX_IDLE_PER_TENANT,
            total: MAX_IDLE,
        }
    }
}

impl Inner {
    /// Counts `n` fewer idle connections of `tenant`.
    fn forget(&mut self, tenant: &Arc<str>, n: usize) {
        if n == 0 {
            return;
        }
        self.total -= n;
        if let Some(c) = self.per_tenant.get_mut(tenant) {
            *c -= n;
            if *c == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }
}

impl Pool {
    /// Bounds idle connections as `limits` say, from the next check-in on
    /// (connections idle past a smaller bound are closed as they expire or
    /// are taken).
    pub(crate) fn set_limits(&self, limits: IdleLimits) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).limits = limits;
    }

    /// An idle connection for `key` that is still open, if any. The caller
    /// has already checked the grants for the request it will send.
    pub(crate) fn checkout(&self, key: &PoolKey) -> Option<Conn> {
        self.checkout_at(key, Instant::now())
    }

    fn checkout_at(&self, key: &PoolKey, now: Instant) -> Option<Conn> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let list = inner.idle.get_mut(key)?;
        let before = list.len();
        let mut found = None;
        // Newest first: the least likely to have been closed by the server.
        while let Some(idle) = list.pop() {
            if now.saturating_duration_since(idle.since) < IDLE_TIMEOUT && !idle.conn.sender.is_closed() {
                found = Some(idle.conn);
                break;
            }
        }
        let taken = before - list.len();
        if list.is_empty() {
            inner.idle.remove(key);
        }
        inner.forget(&key.tenant, taken);
        found
    }

    /// Keeps `conn` for the next request with `key`, within the bounds.
    pub(crate) fn checkin(&self, key: PoolKey, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.last_sweep.is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY) {
            inner.last_sweep = Some(now);
            let mut dropped: Vec<(Arc<str>, usize)> = Vec::new();
            inner.idle.retain(|key, list| {
                let before = list.len();
                list.retain(|i| now.saturating_duration_since(i.since) < IDLE_TIMEOUT && !i.conn.sender.is_closed());
                dropped.push((key.tenant.clone(), before - list.len()));
                !list.is_empty()
            });
            for (tenant, n) in dropped {
                inner.forget(&tenant, n);
            }
        }
        let bounds = inner.limits;
        // None kept per key: the key's first would otherwise find no list
        // to be full.
        if bounds.per_host == 0 || (!inner.idle.contains_key(&key) && inner.idle.len() >= MAX_HOSTS) {
            return;
        }
        let full = inner.idle.get(&key).is_some_and(|l| l.len() >= bounds.per_host);
        if !full {
            // A new idle connection: within the tenant's and the agent's
            // bounds, or closed instead of kept.
            let of_tenant = inner.per_tenant.get(&key.tenant).copied().unwrap_or(0);
            if of_tenant >= bounds.per_tenant || inner.total >= bounds.total {
                return;
            }
            *inner.per_tenant.entry(key.tenant.clone()).or_default() += 1;
            inner.total += 1;
        }
        let list = inner.idle.entry(key).or_default();
        if full {
            // The oldest of the key makes room: the counts stay.
            list.remove(0);
        }
        list.push(Idle { conn, since: now });
    }

    /// How many idle connections the pool holds.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.idle.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real connection to a throwaway loopback listener.
    async fn conn(listener: &tokio::net::TcpListener) -> Conn {
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
        let tasks = super::super::tasks::ConnTasks::default();
        hyper::rt::Executor::execute(&tasks, async move {
            let _ = connection.await;
        });
        Conn::new(
            Sender::Http1(sender),
            listener.local_addr().unwrap(),
            None,
            AbortOnDrop(tasks),
        )
    }

    #[tokio::test]
    async fn bounded_per_host_and_keyed_by_tls_options() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::default();
        let t: Arc<str> = "t".into();
        let key = PoolKey::new(&t, "Localhost", 80, None, false);
        for _ in 0..MAX_IDLE_PER_HOST + 3 {
            pool.checkin(key.clone(), conn(&listener).await);
        }
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_HOST);
        assert!(
            pool.checkout(&PoolKey::new(&t, "localhost.", 80, None, false))
                .is_some()
        );
        assert!(pool.checkout(&PoolKey::new(&t, "localhost", 81, None, false)).is_none());

        let verified = TlsOptions::default();
        let insecure = TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        pool.checkin(
            PoolKey::new(&t, "h", 443, Some(&insecure), false),
            conn(&listener).await,
        );
        assert!(
            pool.checkout(&PoolKey::new(&t, "h", 443, Some(&verified), false))
                .is_none()
        );
        assert!(
            pool.checkout(&PoolKey::new(&t, "h", 443, Some(&insecure), false))
                .is_some()
        );
        // A connection opened offering HTTP/2 serves only requests that ask for it.
        pool.checkin(PoolKey::new(&t, "h", 443, Some(&verified), true), conn(&listener).await);
        assert!(
            pool.checkout(&PoolKey::new(&t, "h", 443, Some(&verified), false))
                .is_none()
        );
        assert!(
            pool.checkout(&PoolKey::new(&t, "h", 443, Some(&verified), true))
                .is_some()
        );
        // Over plain HTTP, there is nothing to offer.
        pool.checkin(PoolKey::new(&t, "h", 80, None, true), conn(&listener).await);
        assert!(pool.checkout(&PoolKey::new(&t, "h", 80, None, false)).is_some());
    }

    #[tokio::test]
    async fn keyed_by_tenant_and_canonical_address_and_bounded_per_tenant() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        pool.checkin(
            PoolKey::new(&a, "[::ffff:127.0.0.1]", 80, None, false),
            conn(&listener).await,
        );
        assert!(
            pool.checkout(&PoolKey::new(&b, "127.0.0.1", 80, None, false)).is_none(),
            "another tenant's connection"
        );
        assert!(pool.checkout(&PoolKey::new(&a, "127.0.0.1", 80, None, false)).is_some());
        // One tenant fills its share over many hosts; the next is closed,
        // and another tenant still keeps its own.
        for i in 0..MAX_IDLE_PER_TENANT + 5 {
            pool.checkin(
                PoolKey::new(&a, &format!("h{i}"), 80, None, false),
                conn(&listener).await,
            );
        }
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_TENANT);
        pool.checkin(PoolKey::new(&b, "h0", 80, None, false), conn(&listener).await);
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_TENANT + 1);
        assert!(pool.checkout(&PoolKey::new(&a, "h0", 80, None, false)).is_some());
        pool.checkin(PoolKey::new(&a, "h-new", 80, None, false), conn(&listener).await);
        assert_eq!(pool.idle_count(), MAX_IDLE_PER_TENANT + 1, "room made by the checkout");
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let pool = Pool::default();
        let key = PoolKey::new(&"t".into(), "h", 80, None, false);
        pool.checkin(key.clone(), conn(&listener).await);
        let later = Instant::now() + IDLE_TIMEOUT + Duration::from_secs(1);
        assert!(pool.checkout_at(&key, later).is_none());
        assert_eq!(pool.idle_count(), 0);
    }
}
