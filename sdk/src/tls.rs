//! TLS by the host (`sonde:probe/tls`), and the TLS options the HTTP
//! transport takes.
//!
//! The host runs the TLS client: the system's trust roots (or a CA the
//! plugin passes), certificate checks, and the handshake. [`handshake`]
//! connects to a host, completes a handshake and reports the session and
//! the server's certificate; [`connect`] keeps the connection open as a
//! [`Session`] to send and receive over. Both reach only the probe's target
//! and its `net` grants.

use crate::ProbeError;
use crate::bindings::sonde::probe::tls as host_tls;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
            (Some(path), None) => Some(std::fs::read_to_string(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    ProbeError::denied(format!("ca_file {path:?}: {e} (grant it under files)"))
                }
                _ => ProbeError::invalid_config(format!("ca_file {path:?}: {e}")),
            })?),
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
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.not_after as f64 - now
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
        TlsError::Timeout(m) => HandshakeError::Failed(format!("timeout: {m}")),
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

fn millis(d: Duration) -> u64 {
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

/// An open TLS connection the host holds for the plugin: `std::io::Read`
/// and `Write` over it, so [`crate::net::send`] and
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

    /// How long a read waits for data before failing with
    /// [`io::ErrorKind::TimedOut`]; the connect timeout until set.
    pub fn set_read_timeout(&mut self, timeout: Duration) {
        self.read_timeout = timeout;
    }
}

fn io_error(e: host_tls::TlsError) -> io::Error {
    use host_tls::TlsError;
    match e {
        TlsError::Timeout(m) => io::Error::new(io::ErrorKind::TimedOut, m),
        TlsError::Denied(m) => io::Error::new(io::ErrorKind::PermissionDenied, m),
        TlsError::Invalid(m) => io::Error::new(io::ErrorKind::InvalidInput, m),
        TlsError::Dns(m) | TlsError::Connect(m) | TlsError::Handshake(m) => io::Error::other(m),
    }
}

impl io::Read for Session {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let max = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let data = self.inner.receive(max, millis(self.read_timeout)).map_err(io_error)?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(n)
    }
}

impl io::Write for Session {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.send(buf).map_err(io_error)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
