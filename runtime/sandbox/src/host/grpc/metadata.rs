//! What a plugin's call sends besides its message, and what comes back to
//! it: the custom metadata, checked and with its handles expanded toward
//! the authority ([`CallGrants::expand`]), and the answer scrubbed of the
//! probe's secrets.

use crate::bindings::sonde::probe::grpc::{GrpcError, Response as GrpcResponse};
use http::{HeaderMap, HeaderName, HeaderValue};
use sonde_policy::grants::{CallGrants, SecretUseError, Use};

/// The most custom metadata entries, and their total size, a plugin may send.
pub(super) const MAX_METADATA_ENTRIES: usize = 64;
pub(super) const MAX_METADATA_BYTES: usize = 16 * 1024;

/// Names a plugin may not send as metadata: gRPC's own, HTTP/2's
/// connection-specific ones, and those the host sets.
pub(super) fn reserved(name: &str) -> bool {
    name.starts_with("grpc-")
        || matches!(
            name,
            "content-type"
                | "te"
                | "host"
                | "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "upgrade"
        )
}

/// The headers of `metadata` sent toward `host:port` (with sonde's
/// `user-agent` unless the plugin sets one), checked and bounded.
pub(super) fn headers(
    grants: &CallGrants,
    metadata: &[(String, String)],
    host: &str,
    port: u16,
) -> Result<HeaderMap, GrpcError> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(GrpcError::Invalid(format!(
            "{} metadata entries, at most {MAX_METADATA_ENTRIES}",
            metadata.len()
        )));
    }
    let size: usize = metadata.iter().map(|(n, v)| n.len() + v.len()).sum();
    if size > MAX_METADATA_BYTES {
        return Err(GrpcError::Invalid(format!(
            "{size} bytes of metadata, at most {MAX_METADATA_BYTES}"
        )));
    }
    let mut headers = HeaderMap::new();
    headers.insert(http::header::USER_AGENT, HeaderValue::from_static(super::USER_AGENT));
    for (name, value) in metadata {
        let lower = name.to_ascii_lowercase();
        if reserved(&lower) {
            return Err(GrpcError::Invalid(format!("metadata {name:?} is reserved")));
        }
        let header = HeaderName::from_bytes(lower.as_bytes())
            .map_err(|_| GrpcError::Invalid(format!("metadata name {name:?} is not a valid header name")))?;
        let toward = Use::Grpc { host, port };
        let value = match grants.expand(value, toward).map_err(secret_error)? {
            None => HeaderValue::from_str(value)
                .map_err(|_| GrpcError::Invalid(format!("metadata {name:?}: the value is not printable ASCII")))?,
            Some(bytes) => {
                let mut value = HeaderValue::from_bytes(&bytes).map_err(|_| {
                    GrpcError::Invalid(format!(
                        "metadata {name:?}: the value built from secrets is not printable ASCII"
                    ))
                })?;
                value.set_sensitive(true);
                value
            }
        };
        if header == http::header::USER_AGENT {
            headers.insert(header, value);
        } else {
            headers.append(header, value);
        }
    }
    Ok(headers)
}

/// A refused use of a secret, as the `grpc-error` a plugin gets.
fn secret_error(e: SecretUseError) -> GrpcError {
    match e {
        SecretUseError::Denied(d) => GrpcError::Denied(d.0),
        SecretUseError::Invalid(m) | SecretUseError::Unavailable(m) => GrpcError::Invalid(m),
    }
}

/// What the server answered (or the error it caused), for a probe that
/// holds secrets: the message withheld when it reflects one, as is an
/// error's text (the status message and the metadata were checked on their
/// raw bytes as they were read).
pub(super) fn scrubbed(
    grants: &CallGrants,
    result: Result<GrpcResponse, GrpcError>,
) -> Result<GrpcResponse, GrpcError> {
    let Some(s) = grants.scrubber() else {
        return result;
    };
    match result {
        Ok(mut r) => {
            if let Some(m) = &mut r.message {
                s.vec(m);
            }
            Ok(r)
        }
        Err(GrpcError::Protocol(mut m)) => {
            s.string(&mut m);
            Err(GrpcError::Protocol(m))
        }
        Err(GrpcError::Tls(mut m)) => {
            s.string(&mut m);
            Err(GrpcError::Tls(m))
        }
        Err(other) => Err(other),
    }
}
