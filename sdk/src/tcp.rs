//! Plain TCP connections the host makes for the plugin: the host dials
//! (only the probe's target and its `net` grants), measures, and closes with
//! a reset when the [`Session`] is dropped. Cheaper than the sandbox's own
//! sockets for a connect check, and the same `Read`/`Write` session as
//! [`crate::tls`] for send/expect exchanges.

use crate::bindings::sonde::probe::tcp as host_tcp;
use crate::bindings::sonde::probe::tls::TlsError;
use crate::tls::{HandshakeError, Session};
use crate::{ProbeError, Request};
use alloc::format;
use core::time::Duration;

/// Seconds each phase of a connection took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Connected {
    /// Resolving the name.
    pub dns_seconds: f64,
    /// Opening the TCP connection.
    pub connect_seconds: f64,
}

/// Connects to `host:port` within `timeout` and keeps the connection open
/// as a [`Session`]. A refused, unreachable or slow server is
/// [`HandshakeError::Failed`]; an ungranted host is a denial.
pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<(Session, Connected), HandshakeError> {
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let (session, t) = host_tcp::connect(host, port, millis).map_err(crate::tls::handshake_error)?;
    let connected = Connected {
        dns_seconds: t.dns,
        connect_seconds: t.connect,
    };
    Ok((Session::new(session, timeout), connected))
}

/// Connects to the request's target (`host:port`) within the time the call
/// has left, and words what went wrong as [`crate::net::open_target`] does
/// for a `std::net` stream: `connect to TARGET: connection refused` (or
/// `timed out`, or the resolver's reason) is the target's
/// [`HandshakeError::Failed`]; a denial or a target that is not
/// `host:port` is the check's [`HandshakeError::Probe`]. The way to reach
/// the target for a probe granted secrets, which opens no socket of its
/// own ([`crate::credentials`]).
pub fn open_target(req: &Request) -> Result<(Session, Connected), HandshakeError> {
    let target = req.target();
    let (host, port) = crate::net::host_port(target).map_err(HandshakeError::Probe)?;
    let timeout = req.remaining();
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let failed = |why: &str| HandshakeError::Failed(format!("connect to {target}: {why}"));
    let (session, t) = host_tcp::connect(host, port, millis).map_err(|e| match e {
        TlsError::Denied(m) => HandshakeError::Probe(ProbeError::denied(format!("connect to {target}: {m}"))),
        TlsError::Invalid(m) => HandshakeError::Probe(ProbeError::invalid_config(format!("target {target:?}: {m}"))),
        TlsError::Timeout(_) => failed(crate::net::TIMED_OUT),
        TlsError::Dns(m) | TlsError::Connect(m) | TlsError::Handshake(m) => failed(&m),
    })?;
    let connected = Connected {
        dns_seconds: t.dns,
        connect_seconds: t.connect,
    };
    Ok((Session::new(session, timeout), connected))
}
