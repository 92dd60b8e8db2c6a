//! HTTP over the host's `wasi:http/outgoing-handler`.
//!
//! The host owns the connection: the request reaches only the probe's target
//! and its `net` grants; anything else fails with [`ProbeError::Denied`] and
//! the run is recorded as `denied`.

use crate::ProbeError;
use std::time::Duration;

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
        }
    }
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
}

impl HttpResponse {
    /// The first value of header `name` (case-insensitive), as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }
}

/// Splits an absolute URL into scheme, authority and path-with-query.
fn split_url(url: &str) -> Result<(&str, &str, &str), ProbeError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| ProbeError::invalid_config(format!("{url:?} is not an absolute URL")))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(ProbeError::invalid_config(format!("{url:?} has no host")));
    }
    Ok((scheme, authority, if path.starts_with('?') { "/" } else { path }))
}

/// Sends `req` and reads the response, within `req.timeout`.
#[cfg(target_arch = "wasm32")]
pub fn send(req: &HttpRequest) -> Result<HttpResponse, ProbeError> {
    use wasi::http::outgoing_handler;
    use wasi::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme};
    use wasi::io::streams::StreamError;

    let (scheme, authority, path) = split_url(&req.url)?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => return Err(ProbeError::invalid_config(format!("unsupported URL scheme {other:?}"))),
    };
    let method = match req.method.as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_string()),
    };
    let entries: Vec<(String, Vec<u8>)> = req
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.clone().into_bytes()))
        .collect();
    let headers = Fields::from_list(&entries).map_err(|e| ProbeError::invalid_config(format!("bad header: {e:?}")))?;
    let outgoing = OutgoingRequest::new(headers);
    let bad = |what: &str| ProbeError::invalid_config(format!("invalid {what} in {:?}", req.url));
    outgoing.set_method(&method).map_err(|_| bad("method"))?;
    outgoing.set_scheme(Some(&scheme)).map_err(|_| bad("scheme"))?;
    outgoing.set_authority(Some(authority)).map_err(|_| bad("authority"))?;
    outgoing.set_path_with_query(Some(&path)).map_err(|_| bad("path"))?;
    let body = outgoing
        .body()
        .map_err(|_| ProbeError::internal("request body taken twice"))?;

    let options = RequestOptions::new();
    let nanos = req.timeout.as_nanos().min(u64::MAX as u128) as u64;
    // Hosts may refuse some options; the deadline still holds without them.
    let _ = options.set_connect_timeout(Some(nanos));
    let _ = options.set_first_byte_timeout(Some(nanos));
    let _ = options.set_between_bytes_timeout(Some(nanos));

    let future = outgoing_handler::handle(outgoing, Some(options)).map_err(http_error)?;
    if !req.body.is_empty() {
        let stream = body
            .write()
            .map_err(|_| ProbeError::internal("request body stream taken twice"))?;
        for chunk in req.body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| ProbeError::io(format!("sending request body: {e:?}")))?;
        }
        drop(stream);
    }
    OutgoingBody::finish(body, None).map_err(http_error)?;

    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(http_error(code)),
        Some(Err(())) | None => return Err(ProbeError::internal("response future polled twice")),
    };
    let status = response.status();
    let headers = response.headers().entries();
    let incoming = response
        .consume()
        .map_err(|_| ProbeError::internal("response body taken twice"))?;
    let stream = incoming
        .stream()
        .map_err(|_| ProbeError::internal("response stream taken twice"))?;
    let mut body = Vec::new();
    while body.len() < req.max_body {
        match stream.blocking_read((req.max_body - body.len()).min(16 * 1024) as u64) {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(ProbeError::io(format!(
                    "reading response body: {}",
                    e.to_debug_string()
                )));
            }
        }
    }
    drop(stream);
    drop(incoming);

    fn http_error(code: ErrorCode) -> ProbeError {
        match code {
            ErrorCode::HttpRequestDenied => ProbeError::denied("the host refused the request: target not granted"),
            other => ProbeError::io(format!("{other:?}")),
        }
    }

    Ok(HttpResponse { status, headers, body })
}

/// Sends `req` and reads the response, within `req.timeout`.
///
/// Only plugins built for `wasm32-wasip2` can send requests; elsewhere this
/// returns [`ProbeError::Internal`].
#[cfg(not(target_arch = "wasm32"))]
pub fn send(req: &HttpRequest) -> Result<HttpResponse, ProbeError> {
    split_url(&req.url)?;
    Err(ProbeError::internal(
        "sonde_sdk::http works only inside a wasm32-wasip2 plugin",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_urls() {
        assert_eq!(split_url("http://a:80/x?y").unwrap(), ("http", "a:80", "/x?y"));
        assert_eq!(split_url("https://a").unwrap(), ("https", "a", "/"));
        assert!(split_url("a:80").is_err());
        assert!(split_url("http:///x").is_err());
    }
}
