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
use super::tls_client::{TlsError, TlsOptions};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use sonde_policy::grants::{CallGrants, Use};
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
        request: http::Request<WasiBody>,
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
    grants: &CallGrants,
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
    let response = response.map(|body| IdleTimeoutBody {
        inner: body,
        idle: between_bytes,
        timer: Box::pin(tokio::time::sleep(between_bytes)),
    });
    Ok((response, io))
}

/// A response body that fails when no frame comes for `idle` (the
/// request's `between-bytes-timeout`).
struct IdleTimeoutBody {
    inner: Incoming,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Body for IdleTimeoutBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + this.idle;
                this.timer.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_timeout() => Poll::Ready(Some(Err(Error::HttpResponseTimeout))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::from(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
