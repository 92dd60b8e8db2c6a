//! sonde's `grpc` interface: one unary gRPC call, made by the host for a
//! plugin. The plugin brings the serialized request message and decodes the
//! response message; the host owns the connection (a new one per call, HTTP/2
//! with prior knowledge in plaintext or over the host's TLS client with ALPN
//! `h2`, closed with a reset), the gRPC framing, the status in the trailers
//! and the caps on what it reads.
//!
//! The authority is checked against the probe's grants
//! ([`CallGrants::authorize`], `Use::Grpc`) before any name lookup or
//! connection.

use super::bounds::CallBounds;
use super::dial::dial;
use super::tasks::{AbortOnDrop, ConnTasks};
use super::tls_client::{TlsClient, TlsError, TlsOptions};
use crate::bindings::sonde::probe::grpc as probe_grpc;
use crate::bindings::sonde::probe::http::Timings;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full};
use probe_grpc::{GrpcError, Request as GrpcRequest, Response as GrpcResponse};
use sonde_policy::grants::{CallGrants, Use};
use sonde_policy::secrets::scrub::{Scrubber, WITHHELD};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use wasmtime::component::{HasData, Linker};

/// What `grpc` sees of one call: its grants and deadline, and the engine's
/// TLS client.
pub(crate) struct GrpcView<'a> {
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// When the call ends.
    pub(crate) deadline: Instant,
    /// The engine's TLS client.
    pub(crate) tls: &'a TlsClient,
    /// The call's bounds: every connection counts as a socket.
    pub(crate) bounds: &'a CallBounds,
    /// The client certificates the call registered (`credentials`).
    pub(crate) certs: &'a super::client_certs::ClientCerts,
}

struct Grpc;

impl HasData for Grpc {
    type Data<'a> = GrpcView<'a>;
}

/// Adds the `grpc` interface to `linker` (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
mod metadata;

pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> GrpcView<'_>,
) -> wasmtime::Result<()> {
    probe_grpc::add_to_linker::<T, Grpc>(linker, get)
}

/// The largest response message the host reads for a plugin.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The largest header (or trailer) block the host accepts from a server.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

const USER_AGENT: &str = concat!("sonde/", env!("CARGO_PKG_VERSION"));

/// gRPC runs over HTTP/2 only.
const ALPN: &[&[u8]] = &[b"h2"];

/// gRPC's length prefix: a compression flag and a big-endian length.
const PREFIX_BYTES: usize = 5;

/// The request checked and turned into what goes on the wire.
struct Call {
    host: String,
    port: u16,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    /// For a TLS call: how to verify the server.
    tls: Option<TlsOptions>,
}

fn prepare(grants: &CallGrants, req: &GrpcRequest) -> Result<Call, GrpcError> {
    let authority: http::uri::Authority = req
        .authority
        .parse()
        .map_err(|e| GrpcError::Invalid(format!("authority {:?}: {e}", req.authority)))?;
    if authority.as_str().contains('@') {
        return Err(GrpcError::Invalid(format!(
            "authority {:?}: user info is not allowed",
            req.authority
        )));
    }
    let Some(port) = authority.port_u16() else {
        return Err(GrpcError::Invalid(format!(
            "authority {:?}: expected HOST:PORT",
            req.authority
        )));
    };
    let host = authority.host().to_string();
    if host.is_empty() {
        return Err(GrpcError::Invalid(format!("authority {:?} has no host", req.authority)));
    }
    let well_formed = req
        .path
        .strip_prefix('/')
        .and_then(|p| p.split_once('/'))
        .is_some_and(|(service, method)| !service.is_empty() && !method.is_empty() && !method.contains('/'));
    if !well_formed || req.path.contains(['?', '#']) {
        return Err(GrpcError::Invalid(format!(
            "method path {:?}: expected /package.Service/Method",
            req.path
        )));
    }
    let uri = http::Uri::builder()
        .scheme(if req.tls.is_some() { "https" } else { "http" })
        .authority(authority)
        .path_and_query(req.path.as_str())
        .build()
        .map_err(|e| GrpcError::Invalid(format!("method path {:?}: {e}", req.path)))?;

    let mut headers = metadata::headers(grants, &req.metadata, &host, port)?;
    headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
    // gRPC's timeout header allows at most eight digits.
    let millis = req.timeout_ms.min(99_999_999);
    headers.insert(
        HeaderName::from_static("grpc-timeout"),
        HeaderValue::from_str(&format!("{millis}m")).expect("digits are a valid header value"),
    );

    let len = u32::try_from(req.message.len())
        .map_err(|_| GrpcError::Invalid("the request message is larger than 4 GiB".into()))?;
    let mut body = BytesMut::with_capacity(PREFIX_BYTES + req.message.len());
    body.extend_from_slice(&[0]);
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(&req.message);
    let tls = match req.tls.clone() {
        Some(options) => Some(super::tls::options_from_wit(options).map_err(tls_error)?),
        None => None,
    };
    Ok(Call {
        host,
        port,
        uri,
        headers,
        body: body.freeze(),
        tls,
    })
}

fn tls_error(e: TlsError) -> GrpcError {
    match e {
        TlsError::ServerName { .. } | TlsError::Ca(_) | TlsError::ClientCert(_) => GrpcError::Invalid(e.to_string()),
        TlsError::Handshake(_) | TlsError::Certificate(_) => GrpcError::Tls(e.to_string()),
    }
}

fn protocol(what: &str, e: impl std::fmt::Display) -> GrpcError {
    GrpcError::Protocol(format!("{what}: {e}"))
}

/// What the server answered, before timings are added.
struct Answer {
    code: u32,
    status_message: String,
    message: Option<Vec<u8>>,
    metadata: Vec<(String, String)>,
    /// When the response head arrived.
    first_byte: Instant,
}

async fn exchange(
    client: &TlsClient,
    grants: &CallGrants,
    bounds: &CallBounds,
    call: Call,
) -> Result<GrpcResponse, GrpcError> {
    let Call {
        host,
        port,
        uri,
        headers,
        body,
        tls,
    } = call;
    let start = Instant::now();
    bounds.take_socket().map_err(|e| GrpcError::Invalid(e.to_string()))?;
    let dialed = dial(grants, Use::Grpc { host: &host, port }, bounds).await?;
    let connected = Instant::now();
    let scrubber = grants.scrubber();
    let scrubber = scrubber.as_deref();
    let (answer, info) = match &tls {
        None => (unary(dialed.stream, uri, headers, body, scrubber).await?, None),
        Some(options) => {
            let (stream, info) = client
                .connect(dialed.stream, &host, options, ALPN)
                .await
                .map_err(tls_error)?;
            let seen = super::tls_client::seen(stream.get_ref().1, options);
            let took = connected.elapsed();
            bounds.observe(|o| {
                o.handshake += took;
                o.tls = Some(std::sync::Arc::new(seen));
            });
            if let Some(alpn) = info.alpn.as_deref().filter(|a| *a != "h2") {
                return Err(GrpcError::Protocol(format!(
                    "the server chose {alpn:?} by ALPN, not h2"
                )));
            }
            let handshake = connected.elapsed();
            (
                unary(stream, uri, headers, body, scrubber).await?,
                Some((info, handshake)),
            )
        }
    };
    let secs = |d: Duration| d.as_secs_f64();
    let tls_time = info.as_ref().map_or(Duration::ZERO, |(_, t)| *t);
    Ok(GrpcResponse {
        code: answer.code,
        status_message: answer.status_message,
        message: answer.message,
        metadata: answer.metadata,
        timings: Timings {
            dns: secs(dialed.dns),
            connect: secs(dialed.connect),
            tls: secs(tls_time),
            first_byte: secs(answer.first_byte.saturating_duration_since(connected + tls_time)),
            total: secs(start.elapsed()),
        },
        tls: info.map(|(i, _)| (&i).into()),
    })
}

/// One unary call over `io`, a fresh connection.
async fn unary<I>(
    io: I,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    scrubber: Option<&Scrubber>,
) -> Result<Answer, GrpcError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // No task of the connection outlives the call, normal or cancelled at
    // the deadline.
    let tasks = ConnTasks::default();
    let _abort = AbortOnDrop(tasks.clone());
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(tasks.clone())
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| protocol("HTTP/2 handshake", e))?;
    hyper::rt::Executor::execute(&tasks, async move {
        let _ = conn.await;
    });

    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(uri)
        .version(http::Version::HTTP_2)
        .body(Full::new(body))
        .map_err(|e| GrpcError::Invalid(e.to_string()))?;
    *request.headers_mut() = headers;
    let response = sender.send_request(request).await.map_err(|e| protocol("HTTP/2", e))?;
    let first_byte = Instant::now();
    let (parts, mut incoming) = response.into_parts();
    let mut metadata = Vec::new();
    keep_metadata(&parts.headers, &mut metadata, scrubber);

    let answer = |code, status_message, message, metadata| Answer {
        code,
        status_message,
        message,
        metadata,
        first_byte,
    };

    if parts.status != http::StatusCode::OK {
        let status = parts.status.as_u16();
        return Ok(answer(
            code_for_http_status(status),
            format!("HTTP status {status}"),
            None,
            metadata,
        ));
    }
    check_content_type(&parts.headers, scrubber.is_none())?;
    // A trailers-only answer carries the status in the headers.
    if let Some((code, message)) = status_in(&parts.headers, scrubber)? {
        return Ok(answer(code, message, None, metadata));
    }
    let (buf, trailers) = read_response(&mut incoming).await?;
    let Some(trailers) = trailers else {
        return Err(GrpcError::Protocol("the response ended without trailers".into()));
    };
    keep_metadata(&trailers, &mut metadata, scrubber);
    let Some((code, status_message)) = status_in(&trailers, scrubber)? else {
        return Err(GrpcError::Protocol("no grpc-status in the trailers".into()));
    };
    Ok(answer(code, status_message, decode_message(buf)?, metadata))
}

/// Refuses a response whose content-type is not gRPC's; the error quotes
/// it only when `quote` (never to a probe that holds secrets: a peer's
/// bytes reach such a plugin only through the scrubber).
fn check_content_type(headers: &HeaderMap, quote: bool) -> Result<(), GrpcError> {
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if !content_type.as_deref().is_some_and(|t| {
        t == "application/grpc" || t.starts_with("application/grpc+") || t.starts_with("application/grpc;")
    }) {
        return Err(GrpcError::Protocol(if quote {
            format!("content-type {content_type:?} is not gRPC")
        } else {
            "the content-type is not gRPC".into()
        }));
    }
    Ok(())
}

/// Reads the response body: its bytes (at most one message, within
/// [`MAX_MESSAGE_BYTES`]) and its trailers, if it had any.
async fn read_response(incoming: &mut hyper::body::Incoming) -> Result<(BytesMut, Option<HeaderMap>), GrpcError> {
    let mut buf = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = incoming.frame().await {
        let frame = frame.map_err(|e| protocol("reading the response", e))?;
        match frame.into_data() {
            Ok(data) => {
                buf.extend_from_slice(&data);
                if buf.len() >= PREFIX_BYTES {
                    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
                    if len > MAX_MESSAGE_BYTES {
                        return Err(GrpcError::Protocol(format!(
                            "the response message has {len} bytes, more than the host's cap of {MAX_MESSAGE_BYTES}"
                        )));
                    }
                    if buf.len() > PREFIX_BYTES + len {
                        return Err(GrpcError::Protocol(
                            "more than one response message in a unary call".into(),
                        ));
                    }
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    trailers = Some(t);
                }
            }
        }
    }
    Ok((buf, trailers))
}

/// The message of a response body read whole: none, or one uncompressed
/// message of the length its prefix says.
fn decode_message(mut buf: BytesMut) -> Result<Option<Vec<u8>>, GrpcError> {
    Ok(match buf.len() {
        0 => None,
        n if n < PREFIX_BYTES => return Err(GrpcError::Protocol("truncated response message".into())),
        _ => {
            let compressed = buf.get_u8();
            let len = buf.get_u32() as usize;
            if compressed != 0 {
                return Err(GrpcError::Protocol(
                    "the response message is compressed, but the host offered no compression".into(),
                ));
            }
            if buf.len() != len {
                return Err(GrpcError::Protocol(format!(
                    "truncated response message: {} of {len} bytes",
                    buf.len()
                )));
            }
            Some(buf.to_vec())
        }
    })
}

/// `grpc-status` and the decoded `grpc-message` of a header block, if it
/// has a status; for a probe that holds secrets, a message that reflects
/// one (checked on its raw bytes) is withheld, and a bad status is not
/// quoted.
fn status_in(headers: &HeaderMap, scrubber: Option<&Scrubber>) -> Result<Option<(u32, String)>, GrpcError> {
    let Some(status) = headers.get("grpc-status") else {
        return Ok(None);
    };
    let code = status
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| {
            GrpcError::Protocol(match scrubber {
                None => format!("grpc-status {status:?} is not a number"),
                Some(_) => "the grpc-status is not a number".into(),
            })
        })?;
    let message = headers
        .get("grpc-message")
        .map(|m| {
            // Checked as the plugin reads it (decoded: a server that
            // percent-encodes a reflection once more hides nothing) and as
            // it came.
            let decoded = percent_decoded(m.as_bytes());
            match scrubber {
                Some(s) if s.reflects(m.as_bytes()) || s.reflects(&decoded) => WITHHELD.to_string(),
                _ => String::from_utf8_lossy(&decoded).into_owned(),
            }
        })
        .unwrap_or_default();
    Ok(Some((code, message)))
}

/// Keeps the headers a plugin may read: not the status, which it gets on
/// its own, and not the transport's. For a probe that holds secrets, a
/// field whose name or value (its raw bytes) reflects one is withheld.
fn keep_metadata(headers: &HeaderMap, into: &mut Vec<(String, String)>, scrubber: Option<&Scrubber>) {
    for (name, value) in headers {
        if matches!(name.as_str(), "grpc-status" | "grpc-message" | "content-type") {
            continue;
        }
        into.push(match scrubber {
            Some(s) => s.field(name.as_str().as_bytes(), value.as_bytes()),
            None => (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            ),
        });
    }
}

/// `grpc-message` is percent-encoded UTF-8.
fn percent_decoded(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The gRPC code for a non-200 HTTP status, as gRPC's spec maps them
/// (`doc/http-grpc-status-mapping.md`).
fn code_for_http_status(status: u16) -> u32 {
    match status {
        400 => 13,                   // INTERNAL
        401 => 16,                   // UNAUTHENTICATED
        403 => 7,                    // PERMISSION_DENIED
        404 => 12,                   // UNIMPLEMENTED
        429 | 502 | 503 | 504 => 14, // UNAVAILABLE
        _ => 2,                      // UNKNOWN
    }
}

impl probe_grpc::Host for GrpcView<'_> {
    async fn call(&mut self, req: GrpcRequest) -> wasmtime::Result<Result<GrpcResponse, GrpcError>> {
        Ok(self.call_checked(req).await)
    }
}

impl GrpcView<'_> {
    async fn call_checked(&self, req: GrpcRequest) -> Result<GrpcResponse, GrpcError> {
        let mut call = prepare(self.grants, &req)?;
        if let Some(traceparent) = self.bounds.traceparent() {
            call.headers.insert(HeaderName::from_static("traceparent"), traceparent);
        }
        self.grants
            .authorize(Use::Grpc {
                host: &call.host,
                port: call.port,
            })
            .map_err(|d| GrpcError::Denied(d.0))?;
        if let Some(options) = &mut call.tls {
            options.client = self.certs.for_peer(&call.host, call.port);
            self.tls.validate(&call.host, options, ALPN).map_err(tls_error)?;
        }
        let ssl = call.tls.is_some();
        self.bounds.observe(|o| {
            o.grpc.get_or_insert_default();
        });
        let start = Instant::now();
        let left = self.deadline.saturating_duration_since(start);
        let timeout = Duration::from_millis(req.timeout_ms);
        let result = if timeout >= left {
            // The call's own deadline ends it first and records `timeout`.
            exchange(self.tls, self.grants, self.bounds, call).await
        } else {
            match tokio::time::timeout(timeout, exchange(self.tls, self.grants, self.bounds, call)).await {
                Ok(result) => result,
                Err(_) => Err(GrpcError::Timeout(format!(
                    "no answer within {}ms",
                    timeout.as_millis()
                ))),
            }
        };
        let took = start.elapsed();
        self.bounds.observe(|o| {
            let check = took.saturating_sub(o.dns);
            let grpc = o.grpc.get_or_insert_default();
            grpc.code = result.as_ref().ok().map(|r| r.code);
            grpc.ssl = ssl;
            grpc.check = check;
        });
        let result = metadata::scrubbed(self.grants, result);
        match &result {
            Ok(r) => tracing::debug!(authority = %req.authority, path = %req.path, code = r.code, "grpc call answered"),
            Err(e) => tracing::debug!(authority = %req.authority, path = %req.path, error = ?e, "grpc call failed"),
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_grants() -> CallGrants {
        CallGrants::new(None, std::sync::Arc::default(), std::sync::Arc::default())
    }

    fn request(authority: &str, path: &str, metadata: &[(&str, &str)]) -> GrpcRequest {
        GrpcRequest {
            authority: authority.into(),
            path: path.into(),
            message: vec![1, 2, 3],
            metadata: metadata.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            timeout_ms: 1500,
            tls: None,
        }
    }

    fn invalid(req: GrpcRequest) -> String {
        match prepare(&no_grants(), &req) {
            Err(GrpcError::Invalid(m)) => m,
            Err(e) => panic!("expected invalid, got {e:?}"),
            Ok(_) => panic!("expected invalid, got a call"),
        }
    }

    #[test]
    fn a_call_is_framed_with_grpc_headers() {
        let call = prepare(
            &no_grants(),
            &request("[::1]:50051", "/grpc.health.v1.Health/Check", &[("X-Team", "a")]),
        )
        .unwrap();
        assert_eq!((call.host.as_str(), call.port), ("[::1]", 50051));
        assert_eq!(call.uri.to_string(), "http://[::1]:50051/grpc.health.v1.Health/Check");
        assert_eq!(&call.body[..], &[0, 0, 0, 0, 3, 1, 2, 3]);
        assert_eq!(call.headers["content-type"], "application/grpc");
        assert_eq!(call.headers["te"], "trailers");
        assert_eq!(call.headers["grpc-timeout"], "1500m");
        assert_eq!(call.headers["x-team"], "a");
    }

    #[test]
    fn malformed_requests_are_invalid() {
        let path = "/a.B/C";
        assert!(invalid(request("127.0.0.1", path, &[])).contains("HOST:PORT"));
        assert!(invalid(request("u@127.0.0.1:1", path, &[])).contains("user info"));
        for bad in ["", "/", "a.B/C", "/a.B", "/a.B/", "//C", "/a.B/C/D", "/a.B/C?x"] {
            assert!(
                invalid(request("127.0.0.1:1", bad, &[])).contains("method path"),
                "{bad}"
            );
        }
        for name in ["grpc-timeout", "Content-Type", "te", "host"] {
            assert!(
                invalid(request("127.0.0.1:1", path, &[(name, "x")])).contains("reserved"),
                "{name}"
            );
        }
        assert!(invalid(request("127.0.0.1:1", path, &[("bad name", "x")])).contains("not a valid header name"));
        assert!(invalid(request("127.0.0.1:1", path, &[("x", "line\nbreak")])).contains("printable"));
        let many: Vec<(&str, &str)> = (0..=metadata::MAX_METADATA_ENTRIES).map(|_| ("x", "y")).collect();
        assert!(invalid(request("127.0.0.1:1", path, &many)).contains("metadata entries"));
    }

    #[test]
    fn status_messages_are_percent_decoded() {
        assert_eq!(
            String::from_utf8_lossy(&percent_decoded(b"service%20not%20found")),
            "service not found"
        );
        assert_eq!(String::from_utf8_lossy(&percent_decoded(b"50%")), "50%");
        assert_eq!(
            String::from_utf8_lossy(&percent_decoded(b"%E2%9C%93 ok %zz")),
            "\u{2713} ok %zz"
        );
    }

    #[test]
    fn http_statuses_map_as_grpc_specifies() {
        assert_eq!(code_for_http_status(404), 12);
        assert_eq!(code_for_http_status(503), 14);
        assert_eq!(code_for_http_status(500), 2);
    }
}
