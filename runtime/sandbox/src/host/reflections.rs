//! What the HTTP transports (`http`, `wasi:http`, `grpc`) do for a probe
//! that holds secrets, around the scrubber ([`Scrubber`]): ask for an
//! uncompressed answer (a compressed one cannot be searched for a
//! reflection, so its body is withheld), and withhold a header field whose
//! name or value reflects a secret, whole.

use http::HeaderMap;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, HeaderName, HeaderValue, TRANSFER_ENCODING};
use sonde_policy::secrets::scrub::{Scrubber, WITHHELD, WITHHELD_HEADER};

/// Asks for an answer without content coding, in place of whatever the
/// plugin asked for.
pub(crate) fn ask_identity(headers: &mut HeaderMap) {
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
}

/// Whether the answer's body is coded in a way the scrubber cannot read
/// through (gzip, deflate, br, zstd...): any `Content-Encoding` but
/// `identity`, or a `Transfer-Encoding` other than `chunked`.
pub(crate) fn coded(headers: &HeaderMap) -> bool {
    let other = |name: HeaderName, plain: &[&str]| {
        headers.get_all(name).iter().any(|v| {
            v.to_str().map_or(true, |v| {
                v.split(',')
                    .map(str::trim)
                    .any(|c| !c.is_empty() && !plain.iter().any(|p| c.eq_ignore_ascii_case(p)))
            })
        })
    };
    other(CONTENT_ENCODING, &["identity"]) || other(TRANSFER_ENCODING, &["chunked", "identity"])
}

/// The field that stands for one withheld.
pub(crate) fn withheld_field() -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(WITHHELD_HEADER),
        HeaderValue::from_static(WITHHELD),
    )
}

/// `headers` with every field whose name or value reflects a secret
/// replaced by a [`withheld_field`], in place.
pub(crate) fn withhold_fields(scrubber: &Scrubber, headers: &mut HeaderMap) {
    let reflecting = headers
        .iter()
        .any(|(n, v)| scrubber.reflects_field(n.as_str().as_bytes(), v.as_bytes()));
    if !reflecting {
        return;
    }
    let mut kept = HeaderMap::with_capacity(headers.len());
    let mut last: Option<HeaderName> = None;
    for (name, value) in std::mem::take(headers) {
        // `into_iter` names a field only at the first of its values.
        let name = name.or_else(|| last.clone()).expect("the first value has its name");
        last = Some(name.clone());
        if scrubber.reflects_field(name.as_str().as_bytes(), value.as_bytes()) {
            let (n, v) = withheld_field();
            kept.append(n, v);
        } else {
            kept.append(name, value);
        }
    }
    *headers = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reflecting_field_is_withheld_by_name_or_value_and_codings_are_seen() {
        let s = Scrubber::new([b"s3cr3t-passw0rd".as_slice()]);
        let mut h = HeaderMap::new();
        h.append("x-echo", HeaderValue::from_static("S3CR3T-PASSW0RD"));
        h.append("x-s3cr3t-passw0rd", HeaderValue::from_static("1"));
        h.append("server", HeaderValue::from_static("echo"));
        withhold_fields(&s, &mut h);
        assert_eq!(h.get_all(WITHHELD_HEADER).iter().count(), 2);
        assert_eq!(h["server"], "echo");
        let coded_with = |name: HeaderName, v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(v));
            coded(&h)
        };
        assert!(coded_with(CONTENT_ENCODING, "gzip"));
        assert!(coded_with(CONTENT_ENCODING, "identity, br"));
        assert!(!coded_with(CONTENT_ENCODING, "identity"));
        assert!(coded_with(TRANSFER_ENCODING, "gzip, chunked"));
        assert!(!coded_with(TRANSFER_ENCODING, "chunked"));
    }
}
