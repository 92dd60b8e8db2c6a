//! Plain TCP connections the host makes for the plugin: the host dials
//! (only the probe's target and its `net` grants), measures, and closes with
//! a reset when the [`Session`] is dropped. Cheaper than the sandbox's own
//! sockets for a connect check, and the same `Read`/`Write` session as
//! [`crate::tls`] for send/expect exchanges.

use crate::bindings::sonde::probe::tcp as host_tcp;
use crate::tls::{HandshakeError, Session};
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
