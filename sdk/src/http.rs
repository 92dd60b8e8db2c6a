//! HTTP through the host's probe transport (`sonde:probe/http`).
//!
//! The host owns the connection: a new one per request, closed with a reset,
//! with each phase timed; or, with [`HttpRequest::keepalive`], one from a
//! pool the host shares between probes. `https://` uses the host's TLS
//! client, verified as [`HttpRequest::tls`] says. The request reaches only
//! the probe's target and its `net` grants (checked before every request,
//! pooled or not); anything else fails with [`ProbeError::Denied`] and the
//! run is recorded as `denied`. Redirects are returned, not followed.

use crate::ProbeError;
use crate::tls::{TlsInfo, TlsOptions};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;

/// A request to send with [`send`].
#[derive(Clone, Debug)]
pub struct HttpRequest {
    /// The method, such as `GET`.
    pub method: String,
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    /// Header names and values.
    pub headers: Vec<(String, String)>,
    /// The request body; empty for none.
    pub body: Vec<u8>,
    /// The time the whole exchange may take.
    pub timeout: Duration,
    /// How much of the response body to keep; the rest is not read.
    pub max_body: usize,
    /// How to verify an `https://` server; ignored for `http://`.
    pub tls: TlsOptions,
    /// Use a connection from the host's keep-alive pool, and give it back
    /// when the whole response was read.
    pub keepalive: bool,
    /// Offer HTTP/2 to an `https://` server by ALPN (`h2`, then
    /// `http/1.1`) and speak it when the server chooses it; the response's
    /// [`TlsInfo::alpn`] says `h2` then. `http://` is HTTP/1.1 either way.
    /// The SDK sends such a request through the WIT's `send-with`, which
    /// came after the first hosts of `sonde:probe@0.1.0`: a plugin that
    /// uses [`send`] imports it, and loads on a host that has it.
    pub http2: bool,
}

impl HttpRequest {
    /// A `GET` of `url` with no headers, a 10 KiB body cap and the given timeout.
    pub fn get(url: impl Into<String>, timeout: Duration) -> Self {
        Self {
            method: "GET".into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout,
            max_body: 10 * 1024,
            tls: TlsOptions::default(),
            keepalive: false,
            http2: false,
        }
    }
}

/// Seconds spent in each phase of an exchange.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Resolving the name.
    pub dns: f64,
    /// Opening the connection.
    pub connect: f64,
    /// The TLS handshake (0 for plain HTTP).
    pub tls: f64,
    /// From sending the request to the response head.
    pub first_byte: f64,
    /// The whole exchange.
    pub total: f64,
}

/// What came back.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, cut at the request's `max_body`.
    pub body: Vec<u8>,
    /// Time spent in each phase; those a reused connection skipped are 0.
    pub timings: Timings,
    /// The TLS session of an `https://` exchange.
    pub tls: Option<TlsInfo>,
    /// Whether a pooled connection opened earlier carried the request.
    pub reused: bool,
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| core::str::from_utf8(v).ok())
    }
}

/// Sends `req` through the host's probe transport and reads the response,
/// within `req.timeout`.
pub fn send(req: &HttpRequest) -> Result<HttpResponse, ProbeError> {
    use crate::bindings::sonde::probe::http as host;
    if req.http2 {
        return send_with(req, None);
    }
    from_wit(host::send(&to_wit(req)))
}

/// Sends through `send-with`, the one host function that takes
/// [`HttpRequest::http2`].
fn send_with(req: &HttpRequest, keep: Option<Vec<String>>) -> Result<HttpResponse, ProbeError> {
    use crate::bindings::sonde::probe::http as host;
    let options = host::SendOptions { http2: req.http2, keep };
    from_wit(host::send_with(&to_wit(req), &options))
}

/// The most header names [`send_keeping`] takes.
pub const MAX_KEPT_HEADERS: usize = 64;

/// As [`send`], but the response carries only the headers named in `keep`
/// (in any case; at most [`MAX_KEPT_HEADERS`] names, or the host answers
/// [`ProbeError::InvalidConfig`]). Each header the host returns is copied
/// into the plugin's memory, so a check that reads one or two of them is
/// cheaper this way: the built-in `http` plugin keeps `location` and the
/// headers its config matches.
pub fn send_keeping(req: &HttpRequest, keep: &[&str]) -> Result<HttpResponse, ProbeError> {
    use crate::bindings::sonde::probe::http as host;
    let keep: Vec<String> = keep.iter().map(|&k| k.into()).collect();
    if req.http2 {
        return send_with(req, Some(keep));
    }
    from_wit(host::send_keeping(&to_wit(req), &keep))
}

fn to_wit(req: &HttpRequest) -> crate::bindings::sonde::probe::http::Request {
    crate::bindings::sonde::probe::http::Request {
        method: req.method.clone(),
        url: req.url.clone(),
        headers: req.headers.clone(),
        body: req.body.clone(),
        timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
        max_body: u32::try_from(req.max_body).unwrap_or(u32::MAX),
        tls: req.tls.to_wit(),
        keepalive: req.keepalive,
    }
}

fn from_wit(
    result: Result<crate::bindings::sonde::probe::http::Response, crate::bindings::sonde::probe::http::HttpError>,
) -> Result<HttpResponse, ProbeError> {
    use crate::bindings::sonde::probe::http::HttpError;
    match result {
        Ok(r) => Ok(HttpResponse {
            status: r.status,
            headers: r.headers.into_iter().map(|(n, v)| (n, v.into_bytes())).collect(),
            body: r.body,
            timings: Timings {
                dns: r.timings.dns,
                connect: r.timings.connect,
                tls: r.timings.tls,
                first_byte: r.timings.first_byte,
                total: r.timings.total,
            },
            tls: r.tls.map(Into::into),
            reused: r.reused,
        }),
        Err(HttpError::Denied(m)) => Err(ProbeError::Denied(m)),
        Err(HttpError::Invalid(m)) => Err(ProbeError::InvalidConfig(m)),
        Err(HttpError::Dns(m)) => Err(ProbeError::Io(format!("dns: {m}"))),
        Err(HttpError::Connect(m)) => Err(ProbeError::Io(format!("connect: {m}"))),
        Err(HttpError::Timeout(m)) => Err(ProbeError::Io(crate::net::timeout_message(&m))),
        Err(HttpError::Protocol(m)) => Err(ProbeError::Io(format!("protocol: {m}"))),
        Err(HttpError::Tls(m)) => Err(ProbeError::Io(format!("tls: {m}"))),
    }
}
