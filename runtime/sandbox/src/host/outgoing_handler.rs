//! `wasi:http/outgoing-handler`, filtered: the host sends a plugin's request
//! only when its authority is the probe's target or a `net` grant. Anything
//! else fails with `HTTP-request-denied` and is recorded as a denial; no
//! connection is opened. Each request sent opens a connection, which
//! counts against the call's socket bound ([`super::bounds`]); past it, the
//! request fails with `connection-limit-reached` and the run is reported
//! as `host-limit`.
//!
//! The connection is the host's own ([`super::dial`]), not
//! wasmtime-wasi-http's default: the name is looked up once, every address
//! it found is checked ([`CallGrants::authorize_peer`]), and the connection
//! goes to an address so checked. (The default client hands the name to a
//! resolver of its own after the grant check, so what was checked would not
//! be what was reached.) `https://` is verified against the system's roots
//! by the engine's TLS client, as sonde's own `http` does.

use super::Shared;
use super::bounds::CallBounds;
use super::dial::dial;
use super::reflections;
use super::tls_client::{TlsError, TlsOptions};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use sonde_policy::grants::{CallGrants, SecretUseError, Use};
use sonde_policy::secrets::scrub::{Passed, Scrubber, Stream, WITHHELD};
use sonde_policy::secrets::template::has_handle;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The `wasi:http` hooks of one call (built per call): its grants, checked
/// before the host sends anything, its bounds, and what the engine's calls
/// share (the TLS client).
pub(crate) struct Hooks {
    grants: Arc<CallGrants>,
    bounds: CallBounds,
    shared: Arc<Shared>,
}

impl Hooks {
    pub(crate) fn new(grants: Arc<CallGrants>, bounds: CallBounds, shared: Arc<Shared>) -> Self {
        Self { grants, bounds, shared }
    }
}

type ResponseFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// How long a request may wait for each step when the plugin sets no
/// `request-options`: the call's own deadline ends it sooner.
const NO_TIMEOUT: Duration = Duration::from_secs(600);

impl WasiHttpHooks for Hooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: ResponseFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, ResponseFuture), Error>> + Send> {
        drop(fut);
        let uri = request.uri();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let Some(host) = uri.host().filter(|h| !h.is_empty()).map(str::to_string) else {
            return Box::new(async { Err(Error::HttpRequestUriInvalid) });
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if self.grants.authorize(Use::Http { host: &host, port }).is_err() {
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        if let Err(e) = expand_headers(&self.grants, request.headers_mut(), Use::Http { host: &host, port }) {
            return Box::new(async { Err(e) });
        }
        if self.grants.holds_secrets() {
            reflections::ask_identity(request.headers_mut());
        }
        // The run's trace context, when the probe propagates it: the
        // host's, replacing any the plugin set.
        if let Some(traceparent) = self.bounds.traceparent() {
            request
                .headers_mut()
                .insert(http::header::HeaderName::from_static("traceparent"), traceparent);
        }
        if self.bounds.take_socket().is_err() {
            return Box::new(async { Err(Error::ConnectionLimitReached) });
        }
        let (grants, bounds, shared) = (self.grants.clone(), self.bounds.clone(), self.shared.clone());
        Box::new(async move {
            let target = Target { host, port, https };
            let (response, io) = send(&grants, &bounds, &shared, request, options, target).await?;
            Ok((response.map(BodyExt::boxed_unsync), Box::new(io) as ResponseFuture))
        })
    }
}

/// Expands the handles in `headers`' values toward `toward`
/// ([`CallGrants::expand`]); the values built are marked sensitive.
fn expand_headers(grants: &CallGrants, headers: &mut http::HeaderMap, toward: Use<'_>) -> Result<(), Error> {
    if !grants.holds_secrets() {
        // Nothing to expand; a handle is sent as the text it is, and
        // refused as any secret not granted when it names one.
        if let Some(text) = headers.values().filter_map(|v| v.to_str().ok()).find(|t| has_handle(t)) {
            grants.expand(text, toward).map_err(expand_error)?;
        }
        return Ok(());
    }
    for value in headers.values_mut() {
        let Ok(text) = value.to_str() else { continue };
        if let Some(bytes) = grants.expand(text, toward).map_err(expand_error)? {
            let mut built = http::HeaderValue::from_bytes(&bytes).map_err(|_| {
                Error::InternalError(Some(
                    "a header value built from secrets is not a valid header value".into(),
                ))
            })?;
            built.set_sensitive(true);
            *value = built;
        }
    }
    Ok(())
}

fn expand_error(e: SecretUseError) -> Error {
    match e {
        SecretUseError::Denied(_) => Error::HttpRequestDenied,
        SecretUseError::Invalid(m) | SecretUseError::Unavailable(m) => Error::InternalError(Some(m)),
    }
}

/// Where a request goes, as checked.
struct Target {
    host: String,
    port: u16,
    https: bool,
}

/// A connection's byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

fn tls_error(e: TlsError) -> Error {
    match e {
        TlsError::ServerName { .. } => Error::HttpRequestUriInvalid,
        TlsError::Ca(m) | TlsError::ClientCert(m) => Error::InternalError(Some(m)),
        TlsError::Certificate(_) => Error::TlsCertificateError,
        TlsError::Handshake(m) => Error::Tls(std::io::Error::other(m)),
    }
}

/// Connects (through the grant check of every address), sets up TLS for
/// `https://`, and sends `request` over HTTP/1.1; returns the response and
/// the future that drives the connection until the body is read.
async fn send(
    grants: &Arc<CallGrants>,
    bounds: &CallBounds,
    shared: &Shared,
    mut request: http::Request<WasiBody>,
    options: Option<RequestOptions>,
    target: Target,
) -> Result<
    (
        http::Response<IdleTimeoutBody>,
        impl Future<Output = Result<(), Error>> + Send + use<>,
    ),
    Error,
> {
    let option = |pick: fn(&RequestOptions) -> Option<Duration>| options.as_ref().and_then(pick).unwrap_or(NO_TIMEOUT);
    let connect_timeout = option(|o| o.connect_timeout);
    let first_byte_timeout = option(|o| o.first_byte_timeout);
    let between_bytes = option(|o| o.between_bytes_timeout).max(Duration::from_nanos(1));
    let what = Use::Http {
        host: &target.host,
        port: target.port,
    };
    let connecting = async {
        let dialed = dial(grants, what, bounds).await?;
        let io: Box<dyn Io> = if target.https {
            let (stream, _) = shared
                .tls
                .connect(dialed.stream, &target.host, &TlsOptions::default(), &[b"http/1.1"])
                .await
                .map_err(tls_error)?;
            Box::new(stream)
        } else {
            Box::new(dialed.stream)
        };
        hyper::client::conn::http1::handshake::<_, WasiBody>(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(Error::from)
    };
    let (mut sender, conn) = tokio::time::timeout(connect_timeout, connecting)
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
    // The request line carries the path alone (no proxy here).
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    *request.uri_mut() = path.parse().map_err(|_| Error::HttpRequestUriInvalid)?;

    // Drive the connection while waiting for the response head.
    let mut conn = Box::pin(conn);
    let mut conn_done = false;
    let sending = sender.send_request(request);
    tokio::pin!(sending);
    let first_byte = tokio::time::sleep(first_byte_timeout);
    tokio::pin!(first_byte);
    let response = loop {
        tokio::select! {
            r = &mut sending => break r.map_err(Error::from)?,
            r = &mut conn, if !conn_done => {
                conn_done = true;
                r.map_err(Error::from)?;
            }
            () = &mut first_byte => return Err(Error::ConnectionReadTimeout),
        }
    };
    let io = async move {
        if conn_done {
            return Ok(());
        }
        conn.await.map_err(|e| {
            if e.is_timeout() {
                Error::HttpResponseTimeout
            } else {
                Error::from(e)
            }
        })
    };
    let scrub = grants.scrubber();
    let coded = reflections::coded(response.headers());
    let mut response = response.map(|body| IdleTimeoutBody {
        inner: body,
        idle: between_bytes,
        timer: Box::pin(tokio::time::sleep(between_bytes)),
        scrub: scrub.clone().map(|scrubber| Scrubbing {
            scrubber,
            grants: grants.clone(),
            stream: Stream::default(),
            queue: VecDeque::new(),
            coded,
            done: false,
        }),
    });
    if let Some(s) = &scrub {
        reflections::withhold_fields(s, response.headers_mut());
    }
    Ok((response, io))
}

/// A response body that fails when no frame comes for `idle` (the
/// request's `between-bytes-timeout`), checked for reflections of the
/// call's secrets for a probe that holds any.
struct IdleTimeoutBody {
    inner: Incoming,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    scrub: Option<Scrubbing>,
}

/// A streamed body as a probe that holds secrets may read it
/// ([`Stream`]): [`sonde_policy::secrets::scrub::LAG`] bytes behind the
/// peer, whole at its end; on a reflection, the marker, then the end. A
/// coded body (gzip...) is the marker alone.
struct Scrubbing {
    scrubber: Arc<Scrubber>,
    grants: Arc<CallGrants>,
    stream: Stream,
    /// Frames to hand on before reading more.
    queue: VecDeque<Frame<Bytes>>,
    coded: bool,
    /// Nothing more comes from the peer.
    done: bool,
}

impl Scrubbing {
    /// Takes `frame` from the peer.
    fn frame(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => {
                let passed = self.stream.push(&self.scrubber, &data);
                self.passed(passed);
            }
            Err(frame) => match frame.into_trailers() {
                Ok(mut trailers) => {
                    self.end();
                    if !self.stream.is_withheld() {
                        reflections::withhold_fields(&self.scrubber, &mut trailers);
                        self.queue.push_back(Frame::trailers(trailers));
                    }
                }
                Err(other) => self.queue.push_back(other),
            },
        }
    }

    /// The peer's body ended: what was held comes now.
    fn end(&mut self) {
        let passed = self.stream.release(&self.scrubber);
        self.passed(passed);
        self.done = true;
    }

    fn passed(&mut self, passed: Passed) {
        if !passed.data.is_empty() {
            self.queue.push_back(Frame::data(Bytes::from(passed.data)));
        }
        if passed.withheld {
            self.queue
                .push_back(Frame::data(Bytes::from_static(WITHHELD.as_bytes())));
            self.done = true;
            if passed.spilled {
                self.grants.secrets_spilled();
            }
        }
    }
}

impl Body for IdleTimeoutBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(s) = &mut this.scrub {
                if let Some(frame) = s.queue.pop_front() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                if s.done {
                    return Poll::Ready(None);
                }
                if s.coded {
                    s.done = true;
                    s.queue.push_back(Frame::data(Bytes::from_static(WITHHELD.as_bytes())));
                    continue;
                }
            }
            return match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let next = tokio::time::Instant::now() + this.idle;
                    this.timer.as_mut().reset(next);
                    match &mut this.scrub {
                        Some(s) => {
                            s.frame(frame);
                            continue;
                        }
                        None => Poll::Ready(Some(Ok(frame))),
                    }
                }
                Poll::Ready(None) => match &mut this.scrub {
                    Some(s) => {
                        s.end();
                        continue;
                    }
                    None => Poll::Ready(None),
                },
                Poll::Ready(Some(Err(e))) if e.is_timeout() => Poll::Ready(Some(Err(Error::HttpResponseTimeout))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::from(e)))),
                Poll::Pending => match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                    Poll::Pending => Poll::Pending,
                },
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.scrub {
            Some(s) => s.done && s.queue.is_empty(),
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.scrub {
            // What is handed on is not what was sent.
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}
