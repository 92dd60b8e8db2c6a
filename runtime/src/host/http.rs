//! `wasi:http/outgoing-handler`, filtered: the host sends a plugin's request
//! only when its authority is the probe's target or a `net` grant. Anything
//! else fails with `HTTP-request-denied` and is recorded as a denial; no
//! connection is opened.

use super::grants::CallGrants;
use std::future::Future;
use std::sync::Arc;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The HTTP hooks of one call.
pub(crate) struct Hooks {
    grants: Arc<CallGrants>,
}

impl Hooks {
    pub(crate) fn new(grants: Arc<CallGrants>) -> Self {
        Self { grants }
    }
}

type ResponseFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

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
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if self.grants.authorize_http(&host, port).is_err() {
            return Box::new(async { Err(Error::HttpRequestDenied) });
        }
        Box::new(async move {
            use http_body_util::BodyExt;
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((response.map(BodyExt::boxed_unsync), Box::new(io) as ResponseFuture))
        })
    }
}

// sonde's own `http` interface: the host-owned transport for probes.

use super::HostState;
use crate::engine::bindings::sonde::probe::http as probe_http;
use http_body_util::{BodyExt, Full};
use probe_http::{HttpError, Request as ProbeRequest, Response as ProbeResponse, Timings};
use std::time::{Duration, Instant};
use wasmtime::component::{HasSelf, Linker};

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    probe_http::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

/// The most of a response body the host reads for a plugin.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

async fn exchange(req: ProbeRequest, uri: http::Uri, host: String, port: u16) -> Result<ProbeResponse, HttpError> {
    let start = Instant::now();
    let addr = match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        Ok(ip) => std::net::SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| HttpError::Dns(format!("{host}: {e}")))?
            .next()
            .ok_or_else(|| HttpError::Dns(format!("{host}: no address")))?,
    };
    let dns = start.elapsed();
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| HttpError::Connect(format!("{addr}: {e}")))?;
    // Close with a reset: a probe every few seconds must not pile up
    // TIME_WAIT sockets on either side. tokio deprecates SO_LINGER because a
    // non-zero linger blocks on drop; a zero linger never does.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    let _ = stream.set_nodelay(true);
    let connect = start.elapsed();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| HttpError::Protocol(e.to_string()))?;
    let conn = tokio::spawn(conn);
    let method = http::Method::from_bytes(req.method.as_bytes())
        .map_err(|e| HttpError::Invalid(format!("method {:?}: {e}", req.method)))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut builder = http::Request::builder().method(method).uri(path);
    if !req.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        builder = builder.header(
            http::header::HOST,
            uri.authority().map_or(host.as_str(), |a| a.as_str()),
        );
    }
    for (name, value) in &req.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder
        .body(Full::new(bytes::Bytes::from(req.body)))
        .map_err(|e| HttpError::Invalid(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| HttpError::Protocol(e.to_string()))?;
    let first_byte = start.elapsed();
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let max = (req.max_body as usize).min(MAX_BODY_BYTES);
    let mut body = Vec::new();
    let mut incoming = response.into_body();
    while body.len() < max {
        match incoming.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    body.extend_from_slice(&data[..data.len().min(max - body.len())]);
                }
            }
            Some(Err(e)) => return Err(HttpError::Protocol(format!("reading the body: {e}"))),
            None => break,
        }
    }
    drop(incoming);
    drop(sender);
    conn.abort();
    let secs = |d: Duration| d.as_secs_f64();
    Ok(ProbeResponse {
        status,
        headers,
        body,
        timings: Timings {
            dns: secs(dns),
            connect: secs(connect - dns),
            tls: 0.0,
            first_byte: secs(first_byte - connect),
            total: secs(start.elapsed()),
        },
    })
}

impl probe_http::Host for HostState {
    async fn send(&mut self, req: ProbeRequest) -> Result<ProbeResponse, HttpError> {
        let uri: http::Uri = req
            .url
            .parse()
            .map_err(|e| HttpError::Invalid(format!("URL {:?}: {e}", req.url)))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(HttpError::Invalid(
                    "https is not supported by the host transport yet".into(),
                ));
            }
            _ => return Err(HttpError::Invalid(format!("URL {:?}: expected http://", req.url))),
        }
        let Some(host) = uri.host().filter(|h| !h.is_empty()).map(str::to_string) else {
            return Err(HttpError::Invalid(format!("URL {:?} has no host", req.url)));
        };
        let port = uri.port_u16().unwrap_or(80);
        self.grants.authorize_http(&host, port).map_err(HttpError::Denied)?;
        let left = self.exec.deadline().saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(req.timeout_ms);
        if timeout >= left {
            // The call's own deadline ends it first and records `timeout`.
            return exchange(req, uri, host, port).await;
        }
        match tokio::time::timeout(timeout, exchange(req, uri, host, port)).await {
            Ok(result) => result,
            Err(_) => Err(HttpError::Timeout(format!(
                "no response within {}ms",
                timeout.as_millis()
            ))),
        }
    }
}
