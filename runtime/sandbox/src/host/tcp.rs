//! sonde's `tcp` interface: plain TCP connections made by the host, for
//! connect checks and send/expect exchanges without a socket stack in the
//! sandbox. The host checks the grants (`Use::Tcp`), dials (reset on close,
//! so no TIME_WAIT is left behind) and times it; the connection is a `tls`
//! session without TLS, held in the same [`TlsView`] and counted against
//! the same limit.

use super::dial::{DialError, dial};
use super::tls::{Tls, TlsView};
use crate::bindings::sonde::probe::tcp as probe_tcp;
use crate::bindings::sonde::probe::tls::{Timings, TlsError as WitError};
use crate::bindings::{Session, SessionStream};
use sonde_policy::grants::Use;
use std::time::Duration;
use tokio::net::TcpStream;
use wasmtime::component::{Linker, Resource};

/// Adds the `tcp` interface to `linker` (the once-per-process phase);
/// `get` gives the same view of the call as `tls`.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> TlsView<'_>,
) -> wasmtime::Result<()> {
    probe_tcp::add_to_linker::<T, Tls>(linker, get)
}

/// The reason alone, as a person reads it: `Connection refused (os error
/// 111)` becomes `connection refused` (the address is the plugin's own).
/// `udp` and `icmp` word their failures the same way.
pub(crate) fn reason(error: &std::io::Error) -> String {
    let message = error.to_string();
    let r = message.split(" (os error").next().unwrap_or(&message);
    let mut chars = r.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
}

impl TlsView<'_> {
    /// Checks and makes one connection for the plugin, within `timeout_ms`.
    async fn dial_checked(&mut self, host: &str, port: u16, timeout_ms: u64) -> Result<(TcpStream, Timings), WitError> {
        if host.is_empty() {
            return Err(WitError::Invalid("no host".into()));
        }
        self.room_for_session()?;
        self.grants
            .authorize(Use::Tcp { host, port })
            .map_err(|d| WitError::Denied(d.0))?;
        self.bounds
            .take_socket()
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        self.bounds.observe(|o| o.tcp = true);
        let timeout = Duration::from_millis(timeout_ms);
        let dialed = match tokio::time::timeout(timeout, dial(self.grants, Use::Tcp { host, port }, self.bounds)).await
        {
            Ok(Ok(d)) => {
                self.bounds.observe(|o| o.tcp_ready = true);
                d
            }
            Ok(Err(DialError::Connect { source, .. })) => return Err(WitError::Connect(reason(&source))),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                return Err(WitError::Timeout(format!(
                    "no connection within {}ms",
                    timeout.as_millis()
                )));
            }
        };
        let timings = Timings {
            dns: dialed.dns.as_secs_f64(),
            connect: dialed.connect.as_secs_f64(),
            tls: 0.0,
        };
        Ok((dialed.stream, timings))
    }
}

impl probe_tcp::Host for TlsView<'_> {
    async fn connect(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<(Resource<Session>, Timings), WitError>> {
        let (stream, timings) = match self.dial_checked(&host, port, timeout_ms).await {
            Ok(dialed) => dialed,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self
            .open_session(SessionStream::Plain(stream), (host, port))?
            .map(|session| (session, timings)))
    }
}
