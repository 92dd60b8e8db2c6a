//! sonde's `tls` interface: the host connects to `host:port`, completes a
//! TLS handshake with its own client ([`super::tls`]) and reports the
//! session and the server's certificate. For checks that need TLS but not
//! HTTP (the `tcp` plugin's `tls` option) without running a TLS stack in the
//! sandbox.
//!
//! `connect` keeps the connection open as a `session` the plugin sends and
//! receives over (send/expect steps over TLS), at most [`MAX_SESSIONS`] per
//! call; dropping it, or the end of the call, resets the connection.
//!
//! The `tcp` interface's `connect` makes the same kind of session over
//! plain TCP: the `tcp` plugin's connect and send/expect checks, with the
//! host's dial (reset on close) instead of the sandbox's sockets.
//!
//! The host must be the probe's target or a `net` grant, checked before any
//! name lookup or connection; a refusal is recorded, so the run is reported
//! as `denied` whatever the plugin does with the error.

use super::http::{DialError, dial};
use super::tls::{MAX_CA_PEM_BYTES, TlsError, TlsInfo, TlsOptions};
use super::{HostState, Shared};
use crate::engine::bindings::sonde::probe::tcp as probe_tcp;
use crate::engine::bindings::sonde::probe::tls as probe_tls;
use probe_tls::{HandshakeResult, Info, Options, Timings, TlsError as WitError};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use wasmtime::component::{HasSelf, Linker, Resource};

/// TLS sessions one call may hold open at once.
pub const MAX_SESSIONS: usize = 4;
/// The most one `receive` returns.
pub const MAX_RECEIVE_BYTES: usize = 64 * 1024;

/// A connection a plugin holds (the `session` resource): over TLS, or
/// plain TCP from the `tcp` interface.
pub struct Session {
    stream: Stream,
}

enum Stream {
    Tls(Box<TlsStream<TcpStream>>),
    Plain(TcpStream),
}

impl Stream {
    async fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Tls(s) => {
                s.write_all(data).await?;
                s.flush().await
            }
            Self::Plain(s) => s.write_all(data).await,
        }
    }

    async fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tls(s) => s.read(buf).await,
            Self::Plain(s) => s.read(buf).await,
        }
    }
}

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    probe_tls::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    probe_tcp::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
}

impl HostState {
    /// Refuses a new session once the call holds [`MAX_SESSIONS`] (checked
    /// before dialing, and again when the session is stored).
    fn room_for_session(&self) -> Result<(), WitError> {
        if self.tls_sessions >= MAX_SESSIONS {
            return Err(WitError::Invalid(format!(
                "at most {MAX_SESSIONS} sessions may be open at once"
            )));
        }
        Ok(())
    }

    /// Puts a connection in the call's table as a session, within the
    /// per-call limit.
    fn open_session(&mut self, stream: Stream) -> Result<Resource<Session>, WitError> {
        self.room_for_session()?;
        let session = self
            .sandbox
            .table
            .push(Session { stream })
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        self.tls_sessions += 1;
        Ok(session)
    }
}

/// The reason alone, as a person reads it: `10.0.0.1:80: Connection
/// refused (os error 111)` becomes `connection refused`.
fn reason(message: &str) -> String {
    let r = message.rsplit_once(": ").map_or(message, |(_, r)| r);
    let r = r.split(" (os error").next().unwrap_or(r);
    let mut chars = r.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
}

impl probe_tcp::Host for HostState {
    async fn connect(
        &mut self,
        host: String,
        port: u16,
        timeout_ms: u64,
    ) -> Result<(Resource<Session>, Timings), WitError> {
        if host.is_empty() {
            return Err(WitError::Invalid("no host".into()));
        }
        self.room_for_session()?;
        self.grants.authorize_connect(&host, port).map_err(WitError::Denied)?;
        let timeout = Duration::from_millis(timeout_ms);
        let dialed = match tokio::time::timeout(timeout, dial(&host, port)).await {
            Ok(Ok(d)) => d,
            Ok(Err(DialError::Dns(m))) => return Err(WitError::Dns(m)),
            Ok(Err(DialError::Connect(m))) => return Err(WitError::Connect(reason(&m))),
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
        Ok((self.open_session(Stream::Plain(dialed.stream))?, timings))
    }
}

/// The plugin's TLS options, bounded.
pub(crate) fn options_from_wit(o: Options) -> Result<TlsOptions, TlsError> {
    if let Some(pem) = &o.ca_pem
        && pem.len() > MAX_CA_PEM_BYTES
    {
        return Err(TlsError::Ca(format!(
            "{} bytes of PEM, more than the {MAX_CA_PEM_BYTES} allowed",
            pem.len()
        )));
    }
    Ok(TlsOptions {
        ca_pem: o.ca_pem,
        insecure_skip_verify: o.insecure_skip_verify,
        server_name: o.server_name.filter(|n| !n.is_empty()),
    })
}

impl From<&TlsInfo> for Info {
    fn from(i: &TlsInfo) -> Self {
        Self {
            version: i.version.clone(),
            alpn: i.alpn.clone(),
            not_before: i.not_before,
            not_after: i.not_after,
            subject: i.subject.clone(),
            issuer: i.issuer.clone(),
        }
    }
}

fn wit_error(e: TlsError) -> WitError {
    match e {
        TlsError::ServerName { .. } | TlsError::Ca(_) => WitError::Invalid(e.to_string()),
        TlsError::Handshake(_) | TlsError::Certificate(_) => WitError::Handshake(e.to_string()),
    }
}

async fn handshake(
    shared: &Shared,
    host: &str,
    port: u16,
    options: &TlsOptions,
) -> Result<(TlsStream<TcpStream>, HandshakeResult), WitError> {
    let dialed = dial(host, port).await.map_err(|e| match e {
        DialError::Dns(m) => WitError::Dns(m),
        DialError::Connect(m) => WitError::Connect(m),
    })?;
    let start = Instant::now();
    let (stream, info) = shared
        .tls
        .connect(dialed.stream, host, options, &[])
        .await
        .map_err(wit_error)?;
    let tls = start.elapsed();
    let result = HandshakeResult {
        info: (&info).into(),
        timings: Timings {
            dns: dialed.dns.as_secs_f64(),
            connect: dialed.connect.as_secs_f64(),
            tls: tls.as_secs_f64(),
        },
    };
    Ok((stream, result))
}

impl HostState {
    /// Checks and runs one handshake for the plugin, within `timeout_ms`.
    async fn tls_handshake(
        &mut self,
        host: String,
        port: u16,
        options: Options,
        timeout_ms: u64,
    ) -> Result<(TlsStream<TcpStream>, HandshakeResult), WitError> {
        if host.is_empty() {
            return Err(WitError::Invalid("no host".into()));
        }
        self.grants.authorize_tls(&host, port).map_err(WitError::Denied)?;
        let options = options_from_wit(options).map_err(wit_error)?;
        self.shared.tls.validate(&host, &options, &[]).map_err(wit_error)?;
        let shared = self.shared.clone();
        let left = self.exec.deadline().saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(timeout_ms);
        if timeout >= left {
            // The call's own deadline ends it first and records `timeout`.
            return handshake(&shared, &host, port, &options).await;
        }
        match tokio::time::timeout(timeout, handshake(&shared, &host, port, &options)).await {
            Ok(result) => result,
            Err(_) => Err(WitError::Timeout(format!(
                "no handshake within {}ms",
                timeout.as_millis()
            ))),
        }
    }
}

impl probe_tls::Host for HostState {
    async fn handshake(
        &mut self,
        host: String,
        port: u16,
        options: Options,
        timeout_ms: u64,
    ) -> Result<HandshakeResult, WitError> {
        // Dropping the stream closes the connection with a reset, as every
        // probe connection.
        let (_stream, result) = self.tls_handshake(host, port, options, timeout_ms).await?;
        Ok(result)
    }

    async fn connect(
        &mut self,
        host: String,
        port: u16,
        options: Options,
        timeout_ms: u64,
    ) -> Result<(Resource<Session>, HandshakeResult), WitError> {
        self.room_for_session()?;
        let (stream, result) = self.tls_handshake(host, port, options, timeout_ms).await?;
        Ok((self.open_session(Stream::Tls(Box::new(stream)))?, result))
    }
}

impl probe_tls::HostSession for HostState {
    async fn send(&mut self, session: Resource<Session>, data: Vec<u8>) -> Result<(), WitError> {
        let session = self
            .sandbox
            .table
            .get_mut(&session)
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        session
            .stream
            .send(&data)
            .await
            .map_err(|e| WitError::Connect(format!("send: {e}")))
    }

    async fn receive(&mut self, session: Resource<Session>, max: u32, timeout_ms: u64) -> Result<Vec<u8>, WitError> {
        let session = self
            .sandbox
            .table
            .get_mut(&session)
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        let mut buf = vec![0; (max as usize).clamp(1, MAX_RECEIVE_BYTES)];
        let timeout = Duration::from_millis(timeout_ms);
        // The call's deadline also ends a wait longer than the call.
        match tokio::time::timeout(timeout, session.stream.receive(&mut buf)).await {
            Ok(Ok(n)) => {
                buf.truncate(n);
                Ok(buf)
            }
            Ok(Err(e)) => Err(WitError::Connect(format!("receive: {e}"))),
            Err(_) => Err(WitError::Timeout(format!(
                "nothing received within {}ms",
                timeout.as_millis()
            ))),
        }
    }

    fn drop(&mut self, session: Resource<Session>) -> wasmtime::Result<()> {
        self.sandbox.table.delete(session)?;
        self.tls_sessions = self.tls_sessions.saturating_sub(1);
        Ok(())
    }
}
