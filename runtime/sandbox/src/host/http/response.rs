//! The response side of sonde's `http` transport, the same for HTTP/1.1
//! and HTTP/2: what a run's observations keep of a response's head, the
//! headers and the body handed to the plugin (read within their bounds,
//! and checked for reflected secrets for a probe that holds any).

use crate::bindings::sonde::probe::http::HttpError;
use http_body_util::BodyExt;
use hyper::body::Body as _;
use sonde_policy::secrets::scrub::{Scrubber, WITHHELD};
use std::time::Duration;

/// Whether the response header `name` goes back to the plugin: all of
/// them for `send`, those named for `send-keeping`.
fn kept(keep: Option<&[String]>, name: &str) -> bool {
    keep.is_none_or(|names| names.iter().any(|k| k.eq_ignore_ascii_case(name)))
}

/// What the plugin gets of a body read to `read.len()` bytes (at most
/// `max`, plus [`LAG`](sonde_policy::secrets::scrub::LAG) past it for a probe that holds secrets, so that a
/// reflection across the cut is seen whole): the first `max` bytes, or
/// [`WITHHELD`] when the bytes read reflect a secret or are coded
/// (`Content-Encoding`) so that they cannot be searched. Whether it is
/// withheld does not depend on where a partial match would end; a body
/// cut short of its end (`ended` false) is read as one that goes on.
pub(super) fn body_for_plugin(
    scrubber: Option<&Scrubber>,
    mut read: Vec<u8>,
    ended: bool,
    max: usize,
    coded: bool,
) -> Vec<u8> {
    if let Some(s) = scrubber
        && (coded
            || if ended {
                s.reflects(&read)
            } else {
                s.reflects_so_far(&read)
            })
    {
        return WITHHELD.as_bytes().to_vec();
    }
    read.truncate(max);
    read
}

/// What a run's observations keep of one response, read from its head.
pub(super) struct ResponseSeen {
    status: u16,
    version: (u8, u8),
    content_length: i64,
    redirect: bool,
    last_modified: Option<i64>,
    ssl: bool,
}

impl ResponseSeen {
    pub(super) fn of(method: &str, response: &http::Response<hyper::body::Incoming>, ssl: bool) -> Self {
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

    /// What `response`'s head says, when the call records everything
    /// (`observe`: a `/probe` run), else nothing.
    pub(super) fn when(
        observe: bool,
        method: &str,
        response: &http::Response<hyper::body::Incoming>,
        ssl: bool,
    ) -> Option<Self> {
        observe.then(|| Self::of(method, response, ssl))
    }

    /// Records one response in `o`: its phases (processing, transfer) and
    /// count always, what its head said when `seen` was read.
    pub(super) fn record(seen: Option<Self>, o: &mut crate::verdict::Observed, phases: [Duration; 2], body: usize) {
        let [processing, transfer] = phases;
        let http = o.http.get_or_insert_default();
        http.responses += 1;
        http.processing += processing;
        http.transfer = transfer;
        let Some(seen) = seen else {
            return;
        };
        http.redirects += u32::from(seen.redirect);
        http.status = seen.status;
        http.version = seen.version;
        http.content_length = seen.content_length;
        http.last_modified = seen.last_modified;
        http.ssl = seen.ssl;
        http.body_bytes = body as u64;
    }
}

/// The response headers the plugin asked to keep (`keep`), as text; for
/// a probe that holds secrets, a field whose name or value (its bytes,
/// before any conversion to text) reflects one is withheld whole.
pub(super) fn kept_headers(
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
pub(super) async fn read_body(mut incoming: hyper::body::Incoming, max: usize) -> Result<(Vec<u8>, bool), HttpError> {
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
