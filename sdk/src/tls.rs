//! TLS by the host (`sonde:probe/tls`), and the TLS options the HTTP
//! transport takes.
//!
//! The host runs the TLS client: the system's trust roots (or a CA the
//! plugin passes), certificate checks, and the handshake. [`handshake`]
//! connects to a host, completes a handshake and reports the session and
//! the server's certificate; [`connect`] keeps the connection open as a
//! [`Session`] to send and receive over; [`Session::starttls`] upgrades a
//! plain session from [`crate::tcp::connect`] to TLS after a STARTTLS
//! exchange. All reach only the probe's target and its `net` grants.

use crate::ProbeError;
use crate::bindings::sonde::probe::tls as host_tls;
use alloc::format;
use alloc::string::{String, ToString};
use core::fmt;
use core::time::Duration;

/// How the host verifies a server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM text of the CA certificates to trust instead of the system's roots.
    pub ca_pem: Option<String>,
    /// Accept any certificate; the handshake's signatures are still checked
    /// and the certificate is still reported.
    pub insecure_skip_verify: bool,
    /// The name sent as SNI and verified, instead of the host connected to.
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Options from the usual plugin config keys: `ca_file` (a path the
    /// probe's `files` grant makes readable), `ca_pem` (inline PEM text),
    /// `insecure_skip_verify` and `server_name`. Giving both `ca_file` and
    /// `ca_pem`, or a CA together with `insecure_skip_verify`, is an invalid
    /// config; a `ca_file` that cannot be read is [`ProbeError::Denied`]
    /// when no grant covers it, else [`ProbeError::InvalidConfig`].
    pub fn from_config(
        ca_file: Option<&str>,
        ca_pem: Option<&str>,
        insecure_skip_verify: bool,
        server_name: Option<&str>,
    ) -> Result<Self, ProbeError> {
        let ca_pem = match (ca_file, ca_pem) {
            (Some(_), Some(_)) => return Err(ProbeError::invalid_config("give ca_file or ca_pem, not both")),
            (Some(path), None) => Some(read_ca_file(path)?),
            (None, pem) => pem.map(str::to_string),
        };
        if ca_pem.is_some() && insecure_skip_verify {
            return Err(ProbeError::invalid_config(
                "a CA and insecure_skip_verify exclude each other: a CA is not checked when verification is off",
            ));
        }
        Ok(Self {
            ca_pem,
            insecure_skip_verify,
            server_name: server_name.map(str::to_string),
        })
    }

    pub(crate) fn to_wit(&self) -> crate::bindings::sonde::probe::tls::Options {
        crate::bindings::sonde::probe::tls::Options {
            ca_pem: self.ca_pem.clone(),
            insecure_skip_verify: self.insecure_skip_verify,
            server_name: self.server_name.clone(),
        }
    }
}

/// Reads a `ca_file` ([`crate::fs::read_to_string`]: through the `files`
/// grants).
fn read_ca_file(path: &str) -> Result<String, ProbeError> {
    crate::fs::read_to_string(path).map_err(|e| match e.kind {
        crate::fs::FsErrorKind::Denied => ProbeError::denied(format!("ca_file {path:?}: {e} (grant it under files)")),
        _ => ProbeError::invalid_config(format!("ca_file {path:?}: {e}")),
    })
}

/// What a TLS handshake established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: String,
    /// The protocol the server chose by ALPN, if any.
    pub alpn: Option<String>,
    /// The server certificate's notBefore, in Unix seconds.
    pub not_before: i64,
    /// The server certificate's notAfter, in Unix seconds.
    pub not_after: i64,
    /// The server certificate's subject.
    pub subject: String,
    /// The server certificate's issuer.
    pub issuer: String,
}

impl TlsInfo {
    /// Seconds until the server certificate expires (negative once it has).
    pub fn expires_in_seconds(&self) -> f64 {
        self.not_after as f64 - crate::time::unix_seconds()
    }
}

impl From<crate::bindings::sonde::probe::tls::Info> for TlsInfo {
    fn from(i: crate::bindings::sonde::probe::tls::Info) -> Self {
        Self {
            version: i.version,
            alpn: i.alpn,
            not_before: i.not_before,
            not_after: i.not_after,
            subject: i.subject,
            issuer: i.issuer,
        }
    }
}

/// A completed handshake: the session, and the seconds each phase took.
#[derive(Clone, Debug, PartialEq)]
pub struct Handshake {
    /// What the handshake established.
    pub info: TlsInfo,
    /// Resolving the name.
    pub dns_seconds: f64,
    /// Opening the TCP connection.
    pub connect_seconds: f64,
    /// The TLS handshake.
    pub tls_seconds: f64,
}

/// Why a handshake did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// The server failed: the name did not resolve, the connection was
    /// refused, the timeout passed, or the handshake failed (an untrusted
    /// or expired certificate, a wrong name). The message says which.
    Failed(String),
    /// The check could not be made (denied, invalid options).
    Probe(ProbeError),
}

pub(crate) fn handshake_error(e: host_tls::TlsError) -> HandshakeError {
    use host_tls::TlsError;
    match e {
        TlsError::Denied(m) => HandshakeError::Probe(ProbeError::Denied(m)),
        TlsError::Invalid(m) => HandshakeError::Probe(ProbeError::InvalidConfig(m)),
        TlsError::Dns(m) => HandshakeError::Failed(format!("dns: {m}")),
        TlsError::Connect(m) => HandshakeError::Failed(format!("connect: {m}")),
        TlsError::Timeout(m) => HandshakeError::Failed(crate::net::timeout_message(&m)),
        TlsError::Handshake(m) => HandshakeError::Failed(format!("tls: {m}")),
    }
}

fn from_wit(r: host_tls::HandshakeResult) -> Handshake {
    Handshake {
        info: r.info.into(),
        dns_seconds: r.timings.dns,
        connect_seconds: r.timings.connect,
        tls_seconds: r.timings.tls,
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Connects to `host:port`, completes a TLS handshake with `options` within
/// `timeout`, and closes the connection.
pub fn handshake(host: &str, port: u16, options: &TlsOptions, timeout: Duration) -> Result<Handshake, HandshakeError> {
    host_tls::handshake(host, port, &options.to_wit(), millis(timeout))
        .map(from_wit)
        .map_err(handshake_error)
}

/// Connects to `host:port` and completes a TLS handshake with `options`
/// within `timeout`, keeping the connection open as a [`Session`].
pub fn connect(
    host: &str,
    port: u16,
    options: &TlsOptions,
    timeout: Duration,
) -> Result<(Session, Handshake), HandshakeError> {
    let (session, result) =
        host_tls::connect(host, port, &options.to_wit(), millis(timeout)).map_err(handshake_error)?;
    Ok((
        Session {
            inner: session,
            read_timeout: timeout,
        },
        from_wit(result),
    ))
}

/// An open connection the host holds for the plugin (TLS, or plain TCP
/// from [`crate::tcp::connect`]). [`send`](Session::send) and
/// [`read`](Session::read) work with or without `std`; with `std` it is
/// also `std::io::Read` and `Write`, so [`crate::net::send`] and
/// [`crate::net::read_until`] work as on a TCP stream. Dropping it closes
/// the connection.
pub struct Session {
    inner: host_tls::Session,
    read_timeout: Duration,
}

impl Session {
    pub(crate) fn new(inner: host_tls::Session, read_timeout: Duration) -> Self {
        Self { inner, read_timeout }
    }

    /// The host's resource, for the imports that take a session
    /// ([`crate::credentials`]).
    pub(crate) fn wit(&self) -> &host_tls::Session {
        &self.inner
    }

    /// How long a read waits for data before failing with
    /// [`SessionErrorKind::TimedOut`]; the connect timeout until set.
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.read_timeout = timeout;
    }

    /// Sends all of `data`.
    pub fn send(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.inner.send(data).map_err(SessionError::from_wit)
    }

    /// Waits at most the read timeout for data and copies what arrived into
    /// `buf`; 0 when the peer closed.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, SessionError> {
        let max = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let data = self
            .inner
            .receive(max, millis(self.read_timeout))
            .map_err(SessionError::from_wit)?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(n)
    }

    /// Upgrades this plain session (from [`crate::tcp::connect`]) to TLS
    /// in place, after the exchange that asked for it (SMTP's or IMAP's
    /// `STARTTLS`, PostgreSQL's SSLRequest): the host completes a handshake
    /// with `options` over the same connection within `timeout`, as
    /// [`connect`] does (the server name is the host the session was
    /// opened to unless [`TlsOptions::server_name`]), and what is sent and
    /// read afterwards goes over TLS. The handshake's `dns_seconds` and
    /// `connect_seconds` are 0.
    ///
    /// A session that is TLS already is refused as
    /// [`ProbeError::InvalidConfig`]; one that holds data the peer sent
    /// before the upgrade and that was not read yet, or whose peer closed,
    /// as [`HandshakeError::Failed`]; both are left as they were. A failed
    /// handshake is [`HandshakeError::Failed`] and leaves the session
    /// closed.
    pub fn starttls(&mut self, options: &TlsOptions, timeout: Duration) -> Result<Handshake, HandshakeError> {
        self.inner
            .starttls(&options.to_wit(), millis(timeout))
            .map(from_wit)
            .map_err(handshake_error)
    }

    /// Reads until `done` accepts what was read so far, the peer closes,
    /// `max` bytes have arrived, or a read fails (such as at the read
    /// timeout). Returns what was read, and the error that ended it, if
    /// any: [`crate::net::read_until`] for a session, with or without std.
    pub fn read_until(
        &mut self,
        max: usize,
        done: impl FnMut(&[u8]) -> bool,
    ) -> (alloc::vec::Vec<u8>, Option<SessionError>) {
        crate::net::read_until_with(|chunk| self.read(chunk), max, done)
    }
}

/// What kind of failure a [`SessionError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionErrorKind {
    /// No data came within the read timeout.
    TimedOut,
    /// The host refused.
    Denied,
    /// The request was malformed.
    Invalid,
    /// The connection failed.
    Other,
}

/// Why a [`Session`] could not send or read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionError {
    kind: SessionErrorKind,
    message: String,
}

impl SessionError {
    fn from_wit(e: host_tls::TlsError) -> Self {
        use host_tls::TlsError;
        let (kind, message) = match e {
            TlsError::Timeout(m) => (SessionErrorKind::TimedOut, m),
            TlsError::Denied(m) => (SessionErrorKind::Denied, m),
            TlsError::Invalid(m) => (SessionErrorKind::Invalid, m),
            TlsError::Dns(m) | TlsError::Connect(m) | TlsError::Handshake(m) => (SessionErrorKind::Other, m),
        };
        Self { kind, message }
    }

    /// Its kind.
    pub fn kind(&self) -> SessionErrorKind {
        self.kind
    }

    /// A short, person-readable reason, as [`crate::net::describe_error`]
    /// gives for an I/O error: `timed out`, `denied by the host: not
    /// granted`, or the host's message.
    pub fn describe(&self) -> String {
        match self.kind {
            SessionErrorKind::TimedOut => crate::net::TIMED_OUT.into(),
            SessionErrorKind::Denied => crate::net::NOT_GRANTED.into(),
            SessionErrorKind::Invalid | SessionErrorKind::Other => self.message.clone(),
        }
    }
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl core::error::Error for SessionError {}

#[cfg(feature = "std")]
impl From<SessionError> for std::io::Error {
    fn from(e: SessionError) -> Self {
        use std::io::ErrorKind;
        let kind = match e.kind {
            SessionErrorKind::TimedOut => ErrorKind::TimedOut,
            SessionErrorKind::Denied => ErrorKind::PermissionDenied,
            SessionErrorKind::Invalid => ErrorKind::InvalidInput,
            SessionErrorKind::Other => return std::io::Error::other(e.message),
        };
        std::io::Error::new(kind, e.message)
    }
}

#[cfg(feature = "std")]
impl std::io::Read for Session {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Session::read(self, buf).map_err(Into::into)
    }
}

#[cfg(feature = "std")]
impl std::io::Write for Session {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Session::send(self, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
