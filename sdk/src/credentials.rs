//! Secrets the plugin uses but never sees (`sonde:probe/credentials`).
//!
//! An operator grants a probe secrets (`grants.secrets`), and the probe's
//! config names them by *handle*: `$(secret:NAME)` in a text stands for the
//! secret's bytes (and `$(base64:...)` for the base64 of what it
//! encloses). The plugin passes such text to the host, which expands it
//! only toward the probe's target and its `net` grants and puts the bytes
//! on the wire itself; the plugin never holds them, and what a peer answers
//! that reflects one (in any encoding servers write) reaches it as
//! `[withheld: the peer reflected a secret]`.
//!
//! - [`postgres_login`] and [`redis_login`] log in on a [`Session`] the
//!   plugin opened with [`crate::tcp::connect`] (or [`crate::tls::connect`]);
//! - [`client_certificate`] registers a client certificate (PEM text or
//!   handles) that the host presents to a peer in every TLS handshake of
//!   the call (`tls`, `http`, `grpc`).
//!
//! A probe granted secrets reaches peers only through the host's
//! transports: `std::net` (`wasi:sockets`) is refused to it. A password
//! that holds no handle is sent as it is written, so the same plugin code
//! serves plain configs too.

use crate::ProbeError;
use crate::bindings::sonde::probe::credentials as host_credentials;
use crate::bindings::sonde::probe::tls::TlsError;
use crate::tls::{Session, millis};
use alloc::format;
use alloc::string::String;
use core::time::Duration;

/// How a handle starts: `$(secret:NAME)`, or `$(base64:...)` around text
/// and secret handles.
const HANDLES: [&str; 2] = ["$(secret:", "$(base64:"];

/// Whether `text` holds a handle (well formed or not): text the host must
/// expand, which only the host's logins and transports can send.
pub fn has_handle(text: &str) -> bool {
    HANDLES.iter().any(|h| text.contains(h))
}

/// What a login came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Login {
    /// The server accepted it. The method: `trust`, `password`, `md5` or
    /// `scram-sha-256` (PostgreSQL), `auth` (Redis).
    Accepted(String),
    /// The server refused it: its error (PostgreSQL: `SEVERITY CODE:
    /// message (detail)`; Redis: the error reply without its `-`), withheld
    /// whole when it reflects a secret.
    Refused(String),
}

/// Why a login could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoginError {
    /// The server failed: it closed the connection, did not answer in
    /// time, or broke the protocol (a SCRAM signature that does not
    /// verify, a malformed message). The message says which.
    Failed(String),
    /// The check could not be made: a secret not granted toward this peer
    /// ([`ProbeError::Denied`]), a malformed handle, or a login the host
    /// does not speak (GSSAPI) ([`ProbeError::InvalidConfig`]).
    Probe(ProbeError),
}

impl core::fmt::Display for LoginError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Failed(m) => f.write_str(m),
            Self::Probe(e) => write!(f, "{e}"),
        }
    }
}

fn login_error(e: TlsError) -> LoginError {
    match e {
        TlsError::Denied(m) => LoginError::Probe(ProbeError::Denied(m)),
        TlsError::Invalid(m) => LoginError::Probe(ProbeError::InvalidConfig(m)),
        TlsError::Dns(m) | TlsError::Connect(m) | TlsError::Timeout(m) | TlsError::Handshake(m) => {
            LoginError::Failed(m)
        }
    }
}

fn from_wit(l: host_credentials::Login) -> Login {
    match l {
        host_credentials::Login::Accepted(m) => Login::Accepted(m),
        host_credentials::Login::Refused(m) => Login::Refused(m),
    }
}

/// Logs in to the PostgreSQL server at the other end of `session` as
/// `user`, the host answering its authentication requests (cleartext,
/// md5, SCRAM-SHA-256 with the server's signature verified) with
/// `password`, a handle such as `$(secret:pg-password)`. Call it right
/// after sending the StartupMessage naming `user`; on
/// [`Login::Accepted`], the messages that follow AuthenticationOk
/// (ParameterStatus, BackendKeyData, ReadyForQuery) are yours to read.
/// Waits at most `timeout` in all.
pub fn postgres_login(session: &Session, user: &str, password: &str, timeout: Duration) -> Result<Login, LoginError> {
    host_credentials::postgres_login(session.wit(), user, password, millis(timeout))
        .map(from_wit)
        .map_err(login_error)
}

/// Logs in to the Redis server at the other end of `session` with `AUTH
/// [username] password` (`password` a handle) and reads its reply: `+OK` is
/// [`Login::Accepted`], an error reply [`Login::Refused`]. Call it right
/// after connecting. Waits at most `timeout`.
pub fn redis_login(
    session: &Session,
    username: Option<&str>,
    password: &str,
    timeout: Duration,
) -> Result<Login, LoginError> {
    host_credentials::redis_login(session.wit(), username, password, millis(timeout))
        .map(from_wit)
        .map_err(login_error)
}

/// A client certificate as a plugin's config gives it,
/// `"client_cert": {"cert": "$(secret:crt)", "key": "$(secret:key)"}`:
/// each part a handle or PEM text.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCert {
    /// The certificate chain (PEM), or a handle.
    pub cert: String,
    /// The private key (PEM), or a handle.
    pub key: String,
}

impl ClientCert {
    /// Has the host present it to `host:port` ([`client_certificate`]).
    pub fn present(&self, host: &str, port: u16) -> Result<(), ProbeError> {
        client_certificate(host, port, &self.cert, &self.key)
    }
}

/// From now until the call ends, every TLS handshake the host makes for
/// the call with `host:port` presents this client certificate: `cert` (a
/// PEM chain) and `key` (a PEM private key), each PEM text or a handle
/// such as `$(secret:client-key)`. The peer must be the target or a `net`
/// grant; at most 4 per call, and a second one for a peer replaces the
/// first. A denied peer or secret is [`ProbeError::Denied`], a certificate
/// that does not parse [`ProbeError::InvalidConfig`].
pub fn client_certificate(host: &str, port: u16, cert: &str, key: &str) -> Result<(), ProbeError> {
    host_credentials::client_certificate(host, port, cert, key).map_err(|e| match e {
        TlsError::Denied(m) => ProbeError::Denied(m),
        TlsError::Invalid(m) => ProbeError::InvalidConfig(m),
        TlsError::Dns(m) | TlsError::Connect(m) | TlsError::Timeout(m) | TlsError::Handshake(m) => {
            ProbeError::Io(format!("client certificate for {host}:{port}: {m}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn handles_are_told_from_plain_text() {
        assert!(has_handle("$(secret:pg)"));
        assert!(has_handle("Basic $(base64:alice:$(secret:pw))"));
        assert!(has_handle("$(secret:"), "malformed, still the host's to refuse");
        assert!(!has_handle("s3cret $(HOME) $secret:x"));
    }

    #[test]
    fn host_errors_are_the_target_s_failure_or_the_check_s() {
        assert_eq!(
            login_error(TlsError::Denied("secret \"x\" is not granted".into())),
            LoginError::Probe(ProbeError::Denied("secret \"x\" is not granted".into()))
        );
        assert!(matches!(
            login_error(TlsError::Invalid("GSSAPI".into())),
            LoginError::Probe(ProbeError::InvalidConfig(_))
        ));
        assert_eq!(
            login_error(TlsError::Handshake("protocol error: x".into())),
            LoginError::Failed("protocol error: x".into())
        );
        assert_eq!(LoginError::Failed("closed".into()).to_string(), "closed");
    }
}
