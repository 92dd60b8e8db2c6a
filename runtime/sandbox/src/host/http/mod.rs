//! sonde's `http` interface: the host-owned HTTP transport for probes.
//! A new connection per request (timed phase by phase, closed with a
//! reset), or on request one from the keep-alive [`Pool`]; either way the
//! URL's authority is checked against the grants before anything is sent.
//! HTTP/1.1, or HTTP/2 when the request offers it (`send-with`) and an
//! `https://` server chooses it by ALPN; a response read either way goes
//! through the same bounds and the same check for reflected secrets.

mod response;

use super::bounds::CallBounds;
use super::dial::dial;
use super::pool::{Conn, Pool, PoolKey, Sender};
use super::reflections;
use super::tasks::{AbortOnDrop, ConnTasks};
use super::tls_client::{TlsClient, TlsError, TlsInfo, TlsOptions};
use crate::bindings::sonde::probe::http as probe_http;
use http_body_util::Full;
use probe_http::{HttpError, Request as ProbeRequest, Response as ProbeResponse, SendOptions, Timings};
use response::{ResponseSeen, body_for_plugin, kept_headers, read_body};
use sonde_policy::grants::{CallGrants, SecretUseError, Use};
use sonde_policy::secrets::scrub::LAG;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime::component::{HasData, Linker};

/// What `http` sees of one call: its grants and deadline, and the
/// engine's TLS client and connection pool.
pub(crate) struct HttpView<'a> {
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// When the call ends.
    pub(crate) deadline: Instant,
    /// The engine's TLS client.
    pub(crate) tls: &'a TlsClient,
    /// The engine's keep-alive pool.
    pub(crate) pool: &'a Pool,
    /// The tenant the call runs for: its pooled connections are its own.
    pub(crate) tenant: &'a Arc<str>,
    /// The call's bounds: every new connection counts as a socket.
    pub(crate) bounds: &'a CallBounds,
    /// The client certificates the call registered (`credentials`).
    pub(crate) certs: &'a super::client_certs::ClientCerts,
}

struct Http;

impl HasData for Http {
    type Data<'a> = HttpView<'a>;
}

/// Adds the `http` interface to `linker` (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> HttpView<'_>,
) -> wasmtime::Result<()> {
    probe_http::add_to_linker::<T, Http>(linker, get)
}

/// What the transport offers by ALPN: HTTP/1.1 only, or HTTP/2 first
/// for a request that asks for it (as Go's client offers them).
fn alpn(http2: bool) -> &'static [&'static [u8]] {
    if http2 { &[b"h2", b"http/1.1"] } else { &[b"http/1.1"] }
}

/// The largest header (or trailer) block the host accepts from an HTTP/2
/// server, decoded.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

/// The most of a response body the host reads for a plugin.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The most header names a `send-keeping` call may name.
pub(crate) const MAX_KEPT_HEADERS: usize = 64;

/// Where one request goes, as checked against the grants.
struct Target {
    uri: http::Uri,
    host: String,
    port: u16,
    /// For `https://`: how to verify the server.
    tls: Option<TlsOptions>,
    /// Whether to offer HTTP/2 (over TLS only).
    http2: bool,
}

/// The phases a new connection went through.
#[derive(Default)]
struct Phases {
    dns: Duration,
    connect: Duration,
    tls: Duration,
}

fn tls_error(e: TlsError) -> HttpError {
    match e {
        TlsError::ServerName { .. } | TlsError::Ca(_) | TlsError::ClientCert(_) => HttpError::Invalid(e.to_string()),
        TlsError::Handshake(_) | TlsError::Certificate(_) => HttpError::Tls(e.to_string()),
    }
}

/// Starts HTTP/1.1, or HTTP/2 when `http2`, over `io`, a connection to
/// `peer`; the connection's tasks run until the returned [`Conn`] is
/// dropped.
async fn handshake<I>(io: I, peer: SocketAddr, tls: Option<Arc<TlsInfo>>, http2: bool) -> Result<Conn, HttpError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(io);
    let tasks = ConnTasks::default();
    let abort = AbortOnDrop(tasks.clone());
    let protocol = |e: hyper::Error| HttpError::Protocol(e.to_string());
    let sender = if http2 {
        let (sender, conn) = hyper::client::conn::http2::Builder::new(tasks.clone())
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            .handshake(io)
            .await
            .map_err(protocol)?;
        hyper::rt::Executor::execute(&tasks, async move {
            let _ = conn.await;
        });
        Sender::Http2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(protocol)?;
        hyper::rt::Executor::execute(&tasks, async move {
            let _ = conn.await;
        });
        Sender::Http1(sender)
    };
    Ok(Conn::new(sender, peer, tls, abort))
}

/// Opens a new connection to `target`, with TLS for `https://`; it counts
/// against the call's socket bound (a pooled one does not: the pool's own
/// bounds hold it).
async fn open(
    client: &TlsClient,
    grants: &CallGrants,
    bounds: &CallBounds,
    target: &Target,
) -> Result<(Conn, Phases), HttpError> {
    bounds.take_socket().map_err(|e| HttpError::Invalid(e.to_string()))?;
    let what = Use::Http {
        host: &target.host,
        port: target.port,
    };
    let dialed = dial(grants, what, bounds).await?;
    let peer = dialed.peer;
    let mut phases = Phases {
        dns: dialed.dns,
        connect: dialed.connect,
        tls: Duration::ZERO,
    };
    let conn = match &target.tls {
        None => handshake(dialed.stream, peer, None, false).await?,
        Some(options) => {
            let start = Instant::now();
            let (stream, mut info) = client
                .connect(dialed.stream, &target.host, options, alpn(target.http2))
                .await
                .map_err(|e| {
                    bounds.observe(|o| o.http.get_or_insert_default().handshake_failed = true);
                    tls_error(e)
                })?;
            phases.tls = start.elapsed();
            let seen = Arc::new(super::tls_client::seen(stream.get_ref().1, options));
            bounds.observe(|o| {
                o.handshake += phases.tls;
                o.tls = Some(seen.clone());
            });
            info.seen = Some(seen);
            // The server chose among what was offered.
            let http2 = info.alpn.as_deref() == Some("h2");
            handshake(stream, peer, Some(Arc::new(info)), http2).await?
        }
    };
    Ok((conn, phases))
}

/// The request to send: its header values with their handles expanded
/// toward `target` ([`CallGrants::expand`]), marked sensitive; with the
/// run's `traceparent` when the probe propagates one.
fn build_request(
    grants: &CallGrants,
    req: &ProbeRequest,
    target: &Target,
    traceparent: Option<http::HeaderValue>,
) -> Result<http::Request<Full<bytes::Bytes>>, HttpError> {
    let method = http::Method::from_bytes(req.method.as_bytes())
        .map_err(|e| HttpError::Invalid(format!("method {:?}: {e}", req.method)))?;
    let path = target.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = http::Request::builder().method(method).uri(path);
    if !req.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        builder = builder.header(http::header::HOST, authority(target));
    }
    let toward = Use::Http {
        host: &target.host,
        port: target.port,
    };
    for (name, value) in &req.headers {
        match grants.expand(value, toward).map_err(secret_error)? {
            None => builder = builder.header(name.as_str(), value.as_str()),
            Some(bytes) => {
                let mut value = http::HeaderValue::from_bytes(&bytes).map_err(|_| {
                    HttpError::Invalid(format!(
                        "header {name:?}: the value built from secrets is not a valid header value"
                    ))
                })?;
                value.set_sensitive(true);
                builder = builder.header(name.as_str(), value);
            }
        }
    }
    let mut request = builder
        .body(Full::new(bytes::Bytes::from(req.body.clone())))
        .map_err(|e| HttpError::Invalid(e.to_string()))?;
    if grants.holds_secrets() {
        reflections::ask_identity(request.headers_mut());
    }
    // The run's trace context, when the probe propagates it: the host's,
    // replacing any the plugin set.
    if let Some(traceparent) = traceparent {
        request
            .headers_mut()
            .insert(http::header::HeaderName::from_static("traceparent"), traceparent);
    }
    Ok(request)
}

/// `request`, built for HTTP/1.1 by [`build_request`], as HTTP/2 sends
/// it: the URL absolute, its authority the `Host` header's (which goes, as
/// Go's client sends it) or else the target's. Back for HTTP/1.1 when not
/// `http2` (a request that an HTTP/2 connection did not take, sent again on
/// a new connection that chose HTTP/1.1).
fn shape<B>(request: &mut http::Request<B>, http2: bool, target: &Target) -> Result<(), HttpError> {
    let invalid = |e: http::Error| HttpError::Invalid(format!("URL: {e}"));
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    if http2 == (request.version() == http::Version::HTTP_2) {
        return Ok(());
    }
    if http2 {
        let authority = match request.headers_mut().remove(http::header::HOST) {
            Some(host) => String::from_utf8_lossy(host.as_bytes()).into_owned(),
            None => authority(target),
        };
        *request.uri_mut() = http::Uri::builder()
            .scheme(if target.tls.is_some() { "https" } else { "http" })
            .authority(authority)
            .path_and_query(path)
            .build()
            .map_err(invalid)?;
        *request.version_mut() = http::Version::HTTP_2;
    } else {
        let host = request.uri().authority().map(|a| a.as_str().to_string());
        if let Some(host) = host
            && !request.headers().contains_key(http::header::HOST)
        {
            let value = http::HeaderValue::from_str(&host).map_err(|e| HttpError::Invalid(e.to_string()))?;
            request.headers_mut().insert(http::header::HOST, value);
        }
        *request.uri_mut() = path
            .parse()
            .map_err(|e: http::uri::InvalidUri| HttpError::Invalid(e.to_string()))?;
        *request.version_mut() = http::Version::HTTP_11;
    }
    Ok(())
}

/// The authority of `target`'s URL, or its host when it names none.
fn authority(target: &Target) -> String {
    target
        .uri
        .authority()
        .map_or(target.host.as_str(), |a| a.as_str())
        .to_string()
}

/// A refused use of a secret, as the `http-error` a plugin gets.
fn secret_error(e: SecretUseError) -> HttpError {
    match e {
        SecretUseError::Denied(d) => HttpError::Denied(d.0),
        SecretUseError::Invalid(m) | SecretUseError::Unavailable(m) => HttpError::Invalid(m),
    }
}

async fn exchange(
    view: &HttpView<'_>,
    req: ProbeRequest,
    target: Target,
    keep: Option<&[String]>,
) -> Result<ProbeResponse, HttpError> {
    let HttpView {
        grants,
        tls: client,
        pool,
        tenant,
        bounds,
        ..
    } = *view;
    let start = Instant::now();
    let request = build_request(grants, &req, &target, bounds.traceparent())?;
    let key = req
        .keepalive
        .then(|| PoolKey::new(tenant, &target.host, target.port, target.tls.as_ref(), target.http2));
    let pooled = match &key {
        Some(key) => checkout(view, key, &target).await,
        None => None,
    };
    let (mut conn, mut phases, mut reused) = match pooled {
        Some(conn) => {
            // No lookup and no connect: the address is the one it was
            // opened to.
            let seen = conn.tls.as_ref().and_then(|t| t.seen.clone());
            bounds.observe(|o| {
                o.looked_up(Duration::ZERO, true);
                o.connected(conn.peer.ip(), None);
                if seen.is_some() {
                    o.tls = seen;
                }
            });
            (conn, Phases::default(), true)
        }
        None => {
            let (conn, phases) = open(client, grants, bounds, &target).await?;
            (conn, phases, false)
        }
    };
    let mut request = request;
    shape(&mut request, conn.sender.is_http2(), &target)?;
    let response = match conn.sender.try_send_request(request).await {
        Ok(response) => response,
        Err(mut e) if reused => {
            // The server closed the idle connection as the request went out;
            // a request that was not sent is sent once more, on a new one.
            let Some(mut request) = e.take_message() else {
                return Err(HttpError::Protocol(e.into_error().to_string()));
            };
            (conn, phases) = open(client, grants, bounds, &target).await?;
            reused = false;
            shape(&mut request, conn.sender.is_http2(), &target)?;
            conn.sender
                .try_send_request(request)
                .await
                .map_err(|e| HttpError::Protocol(e.into_error().to_string()))?
        }
        Err(e) => return Err(HttpError::Protocol(e.into_error().to_string())),
    };
    let first_byte = start.elapsed();
    let status = response.status().as_u16();
    let scrubber = grants.scrubber();
    let headers = kept_headers(response.headers(), keep, scrubber.as_deref());
    let coded = reflections::coded(response.headers());
    let seen = ResponseSeen::when(bounds.observes_all(), &req.method, &response, target.tls.is_some());
    let max = (req.max_body as usize).min(MAX_BODY_BYTES);
    let read_to = if scrubber.is_some() { max + LAG } else { max };
    // Only a connection whose response was read to its end can serve the
    // next request; any other is dropped, which resets it.
    let (read, ended) = read_body(response.into_body(), read_to).await?;
    let body = body_for_plugin(scrubber.as_deref(), read, ended, max, coded);
    let processing = first_byte.saturating_sub(phases.dns + phases.connect + phases.tls);
    let transfer = start.elapsed().saturating_sub(first_byte);
    bounds.observe(|o| ResponseSeen::record(seen, o, [processing, transfer], body.len()));
    let tls = conn.tls.as_deref().map(Into::into);
    if let Some(key) = key
        && ended
    {
        pool.checkin(key, conn);
    }
    let secs = |d: Duration| d.as_secs_f64();
    let response = ProbeResponse {
        status,
        headers,
        body,
        timings: Timings {
            dns: secs(phases.dns),
            connect: secs(phases.connect),
            tls: secs(phases.tls),
            first_byte: secs(processing),
            total: secs(start.elapsed()),
        },
        tls,
        reused,
    };
    Ok(response)
}

/// An idle connection from the pool for `key` that this call may use: a
/// pooled connection was checked for the call that opened it, so it
/// serves this one only if this call may reach where it goes. If not, it
/// goes back for the calls it may serve, and this one dials (and is
/// checked) anew. One the server has closed meanwhile is dropped.
async fn checkout(view: &HttpView<'_>, key: &PoolKey, target: &Target) -> Option<Conn> {
    let mut pooled = view.pool.checkout(key);
    let name = sonde_policy::grants::host_address(&target.host)
        .is_none()
        .then_some(target.host.as_str());
    if let Some(refused) = pooled.take_if(|c| !view.grants.permits_peer(name, c.peer)) {
        view.pool.checkin(key.clone(), refused);
    }
    if let Some(conn) = &mut pooled
        && conn.sender.ready().await.is_err()
    {
        pooled = None;
    }
    pooled
}

impl probe_http::Host for HttpView<'_> {
    async fn send(&mut self, req: ProbeRequest) -> wasmtime::Result<Result<ProbeResponse, HttpError>> {
        Ok(self.send_checked(req, None, false).await)
    }

    async fn send_with(
        &mut self,
        req: ProbeRequest,
        options: SendOptions,
    ) -> wasmtime::Result<Result<ProbeResponse, HttpError>> {
        let SendOptions { http2, keep } = options;
        if let Some(keep) = &keep
            && keep.len() > MAX_KEPT_HEADERS
        {
            return Ok(Err(too_many_kept(keep.len())));
        }
        Ok(self.send_checked(req, keep.as_deref(), http2).await)
    }

    async fn send_keeping(
        &mut self,
        req: ProbeRequest,
        keep: Vec<String>,
    ) -> wasmtime::Result<Result<ProbeResponse, HttpError>> {
        if keep.len() > MAX_KEPT_HEADERS {
            return Ok(Err(too_many_kept(keep.len())));
        }
        Ok(self.send_checked(req, Some(&keep), false).await)
    }
}

fn too_many_kept(n: usize) -> HttpError {
    HttpError::Invalid(format!("{n} response headers to keep, at most {MAX_KEPT_HEADERS}"))
}

impl HttpView<'_> {
    /// Checks and sends `req`, offering HTTP/2 over TLS when `http2`.
    async fn send_checked(
        &self,
        req: ProbeRequest,
        keep: Option<&[String]>,
        http2: bool,
    ) -> Result<ProbeResponse, HttpError> {
        self.bounds.observe(|o| {
            o.http.get_or_insert_default();
        });
        let uri: http::Uri = req
            .url
            .parse()
            .map_err(|e| HttpError::Invalid(format!("URL {:?}: {e}", req.url)))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(HttpError::Invalid(format!(
                    "URL {:?}: expected http:// or https://",
                    req.url
                )));
            }
        };
        let Some(host) = uri.host().filter(|h| !h.is_empty()).map(str::to_string) else {
            return Err(HttpError::Invalid(format!("URL {:?} has no host", req.url)));
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // Before any connection, pooled or new.
        self.grants
            .authorize(Use::Http { host: &host, port })
            .map_err(|d| HttpError::Denied(d.0))?;
        let tls = if https {
            let mut options = super::tls::options_from_wit(req.tls.clone()).map_err(tls_error)?;
            options.client = self.certs.for_peer(&host, port);
            self.tls.validate(&host, &options, alpn(http2)).map_err(tls_error)?;
            Some(options)
        } else {
            None
        };
        let http2 = http2 && tls.is_some();
        let target = Target {
            uri,
            host,
            port,
            tls,
            http2,
        };
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(req.timeout_ms);
        if timeout >= left {
            // The call's own deadline ends it first and records `timeout`.
            return exchange(self, req, target, keep).await;
        }
        match tokio::time::timeout(timeout, exchange(self, req, target, keep)).await {
            Ok(result) => result,
            Err(_) => Err(HttpError::Timeout(format!(
                "no response within {}ms",
                timeout.as_millis()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Target, shape};

    #[test]
    fn http2_sends_the_host_header_as_the_authority_and_back() {
        let target = Target {
            uri: "https://127.0.0.1:8443/x?y=1".parse().unwrap(),
            host: "127.0.0.1".into(),
            port: 8443,
            tls: Some(super::TlsOptions::default()),
            http2: true,
        };
        let mut request = http::Request::builder()
            .uri("/x?y=1")
            .header("host", "vhost.test")
            .body(())
            .unwrap();
        shape(&mut request, true, &target).unwrap();
        assert_eq!(request.uri(), "https://vhost.test/x?y=1");
        assert_eq!(request.version(), http::Version::HTTP_2);
        assert!(request.headers().get("host").is_none());
        shape(&mut request, false, &target).unwrap();
        assert_eq!(request.uri(), "/x?y=1");
        assert_eq!(request.version(), http::Version::HTTP_11);
        assert_eq!(request.headers()["host"], "vhost.test");
        // Without a Host header, the URL's authority.
        let mut request = http::Request::builder().uri("/x?y=1").body(()).unwrap();
        shape(&mut request, true, &target).unwrap();
        assert_eq!(request.uri(), "https://127.0.0.1:8443/x?y=1");
    }
}
