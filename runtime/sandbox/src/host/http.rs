//! sonde's `http` interface: the host-owned HTTP/1.1 transport for probes.
//! A new connection per request (timed phase by phase, closed with a
//! reset), or on request one from the keep-alive [`Pool`]; either way the
//! URL's authority is checked against the grants before anything is sent.

use super::bounds::CallBounds;
use super::dial::dial;
use super::pool::{Conn, Pool, PoolKey};
use super::reflections;
use super::tls_client::{TlsClient, TlsError, TlsInfo, TlsOptions};
use crate::bindings::sonde::probe::http as probe_http;
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use probe_http::{HttpError, Request as ProbeRequest, Response as ProbeResponse, Timings};
use sonde_policy::grants::{CallGrants, SecretUseError, Use};
use sonde_policy::secrets::scrub::{LAG, Scrubber, WITHHELD};
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

/// What the transport offers by ALPN: it speaks HTTP/1.1 only.
const ALPN: &[&[u8]] = &[b"http/1.1"];

/// The most of a response body the host reads for a plugin.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The most header names a `send-keeping` call may name.
pub(crate) const MAX_KEPT_HEADERS: usize = 64;

/// Whether the response header `name` goes back to the plugin: all of
/// them for `send`, those named for `send-keeping`.
fn kept(keep: Option<&[String]>, name: &str) -> bool {
    keep.is_none_or(|names| names.iter().any(|k| k.eq_ignore_ascii_case(name)))
}

/// Where one request goes, as checked against the grants.
struct Target {
    uri: http::Uri,
    host: String,
    port: u16,
    /// For `https://`: how to verify the server.
    tls: Option<TlsOptions>,
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

/// Starts HTTP/1.1 over `io`, a connection to `peer`; the connection's
/// task runs until the returned [`Conn`] is dropped.
async fn http1<I>(io: I, peer: SocketAddr, tls: Option<Arc<TlsInfo>>) -> Result<Conn, HttpError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| HttpError::Protocol(e.to_string()))?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(Conn::new(sender, peer, tls, task))
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
        None => http1(dialed.stream, peer, None).await?,
        Some(options) => {
            let start = Instant::now();
            let (stream, mut info) = client
                .connect(dialed.stream, &target.host, options, ALPN)
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
            http1(stream, peer, Some(Arc::new(info))).await?
        }
    };
    Ok((conn, phases))
}

/// The request to send: its header values with their handles expanded
/// toward `target` ([`CallGrants::expand`]), marked sensitive.
fn build_request(
    grants: &CallGrants,
    req: &ProbeRequest,
    target: &Target,
) -> Result<http::Request<Full<bytes::Bytes>>, HttpError> {
    let method = http::Method::from_bytes(req.method.as_bytes())
        .map_err(|e| HttpError::Invalid(format!("method {:?}: {e}", req.method)))?;
    let path = target.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = http::Request::builder().method(method).uri(path);
    if !req.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        builder = builder.header(
            http::header::HOST,
            target.uri.authority().map_or(target.host.as_str(), |a| a.as_str()),
        );
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
    Ok(request)
}

/// A refused use of a secret, as the `http-error` a plugin gets.
fn secret_error(e: SecretUseError) -> HttpError {
    match e {
        SecretUseError::Denied(d) => HttpError::Denied(d.0),
        SecretUseError::Invalid(m) | SecretUseError::Unavailable(m) => HttpError::Invalid(m),
    }
}

/// What the plugin gets of a body read to `read.len()` bytes (at most
/// `max`, plus [`LAG`] past it for a probe that holds secrets, so that a
/// reflection across the cut is seen whole): the first `max` bytes, or
/// [`WITHHELD`] when the bytes read reflect a secret or are coded
/// (`Content-Encoding`) so that they cannot be searched. Whether it is
/// withheld does not depend on where a partial match would end.
fn body_for_plugin(scrubber: Option<&Scrubber>, mut read: Vec<u8>, max: usize, coded: bool) -> Vec<u8> {
    if let Some(s) = scrubber
        && (coded || s.reflects(&read))
    {
        return WITHHELD.as_bytes().to_vec();
    }
    read.truncate(max);
    read
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
    let request = build_request(grants, &req, &target)?;
    let key = req
        .keepalive
        .then(|| PoolKey::new(tenant, &target.host, target.port, target.tls.as_ref()));
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
    let response = match conn.sender.try_send_request(request).await {
        Ok(response) => response,
        Err(mut e) if reused => {
            // The server closed the idle connection as the request went out;
            // a request that was not sent is sent once more, on a new one.
            let Some(request) = e.take_message() else {
                return Err(HttpError::Protocol(e.into_error().to_string()));
            };
            (conn, phases) = open(client, grants, bounds, &target).await?;
            reused = false;
            conn.sender
                .send_request(request)
                .await
                .map_err(|e| HttpError::Protocol(e.to_string()))?
        }
        Err(e) => return Err(HttpError::Protocol(e.into_error().to_string())),
    };
    let first_byte = start.elapsed();
    let status = response.status().as_u16();
    let scrubber = grants.scrubber();
    let headers = kept_headers(response.headers(), keep, scrubber.as_deref());
    let coded = reflections::coded(response.headers());
    let seen = ResponseSeen::of(&req.method, &response, target.tls.is_some());
    let max = (req.max_body as usize).min(MAX_BODY_BYTES);
    let read_to = if scrubber.is_some() { max + LAG } else { max };
    // Only a connection whose response was read to its end can serve the
    // next request; any other is dropped, which resets it.
    let (read, ended) = read_body(response.into_body(), read_to).await?;
    let body = body_for_plugin(scrubber.as_deref(), read, max, coded);
    let setup = phases.dns + phases.connect + phases.tls;
    let processing = first_byte.saturating_sub(setup);
    bounds.observe(|o| seen.record(o, processing, start.elapsed().saturating_sub(first_byte), body.len()));
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

/// What a run's observations keep of one response, read from its head.
struct ResponseSeen {
    status: u16,
    version: (u8, u8),
    content_length: i64,
    redirect: bool,
    last_modified: Option<i64>,
    ssl: bool,
}

impl ResponseSeen {
    fn of(method: &str, response: &http::Response<hyper::body::Incoming>, ssl: bool) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers();
        let version = match response.version() {
            http::Version::HTTP_09 => (0, 9),
            http::Version::HTTP_10 => (1, 0),
            http::Version::HTTP_2 => (2, 0),
            http::Version::HTTP_3 => (3, 0),
            _ => (1, 1),
        };
        // As Go's client counts it: for HEAD, the header (the length a GET
        // would have); else no body for 1xx, 204 and 304; otherwise the
        // header. -1 (unknown) without one.
        let header = || {
            headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.trim().parse().ok())
                .unwrap_or(-1)
        };
        let content_length = if method.eq_ignore_ascii_case("HEAD") {
            header()
        } else if status < 200 || status == 204 || status == 304 {
            0
        } else {
            header()
        };
        let redirect = (300..400).contains(&status) && headers.contains_key(http::header::LOCATION);
        let last_modified = headers
            .get(http::header::LAST_MODIFIED)
            .and_then(|v| httpdate::parse_http_date(v.to_str().ok()?).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_secs()).ok());
        Self {
            status,
            version,
            content_length,
            redirect,
            last_modified,
            ssl,
        }
    }

    fn record(self, o: &mut crate::verdict::Observed, processing: Duration, transfer: Duration, body: usize) {
        let http = o.http.get_or_insert_default();
        http.responses += 1;
        http.redirects += u32::from(self.redirect);
        http.status = self.status;
        http.version = self.version;
        http.content_length = self.content_length;
        http.last_modified = self.last_modified;
        http.ssl = self.ssl;
        http.body_bytes = body as u64;
        http.processing += processing;
        http.transfer = transfer;
    }
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

/// The response headers the plugin asked to keep (`keep`), as text; for
/// a probe that holds secrets, a field whose name or value (its bytes,
/// before any conversion to text) reflects one is withheld whole.
fn kept_headers(
    headers: &hyper::HeaderMap,
    keep: Option<&[String]>,
    scrubber: Option<&Scrubber>,
) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(n, v)| match scrubber {
            // A withheld field is asked for by its own name or the marker's.
            Some(s) => {
                let (name, value) = s.field(n.as_str().as_bytes(), v.as_bytes());
                (kept(keep, n.as_str()) || kept(keep, &name)).then_some((name, value))
            }
            None => kept(keep, n.as_str()).then(|| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            }),
        })
        .collect()
}

/// Reads at most `max` bytes of `incoming`; with whether it was read to
/// its end.
async fn read_body(mut incoming: hyper::body::Incoming, max: usize) -> Result<(Vec<u8>, bool), HttpError> {
    let mut body = Vec::new();
    let mut ended = false;
    while body.len() < max {
        match incoming.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(&data[..data.len().min(max - body.len())]);
                }
            }
            Some(Err(e)) => return Err(HttpError::Protocol(format!("reading the body: {e}"))),
            None => {
                ended = true;
                break;
            }
        }
    }
    Ok((body, ended || incoming.is_end_stream()))
}

impl probe_http::Host for HttpView<'_> {
    async fn send(&mut self, req: ProbeRequest) -> wasmtime::Result<Result<ProbeResponse, HttpError>> {
        Ok(self.send_checked(req, None).await)
    }

    async fn send_keeping(
        &mut self,
        req: ProbeRequest,
        keep: Vec<String>,
    ) -> wasmtime::Result<Result<ProbeResponse, HttpError>> {
        if keep.len() > MAX_KEPT_HEADERS {
            return Ok(Err(HttpError::Invalid(format!(
                "{} response headers to keep, at most {MAX_KEPT_HEADERS}",
                keep.len()
            ))));
        }
        Ok(self.send_checked(req, Some(&keep)).await)
    }
}

impl HttpView<'_> {
    async fn send_checked(&self, req: ProbeRequest, keep: Option<&[String]>) -> Result<ProbeResponse, HttpError> {
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
            self.tls.validate(&host, &options, ALPN).map_err(tls_error)?;
            Some(options)
        } else {
            None
        };
        let target = Target { uri, host, port, tls };
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
    use super::kept;

    #[test]
    fn headers_kept_are_those_named_in_any_case() {
        let names = ["location".to_string(), "X-Trace".to_string()];
        assert!(kept(None, "content-length"), "send keeps every header");
        assert!(kept(Some(&names), "location"));
        assert!(kept(Some(&names), "x-trace"));
        assert!(!kept(Some(&names), "content-length"));
        assert!(!kept(Some(&names), "locatio"));
        assert!(!kept(Some(&[]), "location"));
    }
}
