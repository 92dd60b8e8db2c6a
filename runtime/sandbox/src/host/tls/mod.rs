//! sonde's `tls` interface: the host connects to `host:port`, completes a
//! TLS handshake with its own client ([`super::tls_client`]) and reports the
//! session and the server's certificate. For checks that need TLS but not
//! HTTP (the `tcp` plugin's `tls` option) without running a TLS stack in the
//! sandbox.
//!
//! `connect` keeps the connection open as a `session` the plugin sends and
//! receives over (send/expect steps over TLS), at most [`MAX_SESSIONS`] per
//! call; dropping it, or the end of the call, resets the connection.
//!
//! The `tcp` interface ([`super::tcp`]) makes the same kind of session over
//! plain TCP, counted in the same [`TlsCtx`]; its `starttls` ([`starttls`])
//! upgrades such a session to TLS in place.
//!
//! The host must be the probe's target or a `net` grant, checked before any
//! name lookup or connection; a refusal is recorded, so the run is reported
//! as `denied` whatever the plugin does with the error.

mod starttls;

use super::bounds::CallBounds;
use super::dial::dial;
use super::tls_client::{MAX_CA_PEM_BYTES, TlsClient, TlsError, TlsInfo, TlsOptions};
use crate::bindings::sonde::probe::tls as probe_tls;
use crate::bindings::{Session, SessionStream};
use probe_tls::{HandshakeResult, Info, Options, Timings, TlsError as WitError};
use sonde_policy::grants::{CallGrants, Use};
use sonde_policy::secrets::scrub::{QUIET, Scrubber, Stream, WITHHELD};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};

/// TLS sessions one call may hold open at once.
pub(crate) const MAX_SESSIONS: usize = 4;
/// The most one `receive` returns.
pub(crate) const MAX_RECEIVE_BYTES: usize = 64 * 1024;

impl SessionStream {
    /// Sends all of `data`.
    pub(crate) async fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Self::Tls(s) => {
                s.write_all(data).await?;
                s.flush().await
            }
            Self::Plain(s) => s.write_all(data).await,
            Self::Closed => Err(starttls::closed()),
        }
    }

    /// Reads what arrived, at most `buf.len()` bytes (never more: a login
    /// reads exactly what is its own, `host::credentials`); 0 when the
    /// peer closed.
    pub(crate) async fn receive(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tls(s) => s.read(buf).await,
            Self::Plain(s) => s.read(buf).await,
            Self::Closed => Err(starttls::closed()),
        }
    }
}

/// The `tls` state of one call (built per call): how many sessions the
/// plugin holds open, over `tls` or `tcp`.
#[derive(Default)]
pub(crate) struct TlsCtx {
    sessions: usize,
    /// The ICMP echoes the call has sent (`host::icmp`).
    pub(crate) echoes: usize,
}

/// What `tls` (and `tcp`, whose connections are `tls` sessions) sees of one
/// call: its [`TlsCtx`], the resource table its sessions live in, its
/// grants and deadline, and the engine's TLS client.
pub(crate) struct TlsView<'a> {
    /// The call's sessions.
    pub(crate) ctx: &'a mut TlsCtx,
    /// The call's resource table.
    pub(crate) table: &'a mut ResourceTable,
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// When the call ends.
    pub(crate) deadline: Instant,
    /// The engine's TLS client.
    pub(crate) tls: &'a TlsClient,
    /// The call's bounds: every connection counts as a socket.
    pub(crate) bounds: &'a mut CallBounds,
    /// The client certificates the call registered (`credentials`).
    pub(crate) certs: &'a super::client_certs::ClientCerts,
}

/// The [`HasData`] of `tls` and `tcp`: both see a [`TlsView`].
pub(crate) struct Tls;

impl HasData for Tls {
    type Data<'a> = TlsView<'a>;
}

/// Adds the `tls` interface to `linker` (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> TlsView<'_>,
) -> wasmtime::Result<()> {
    probe_tls::add_to_linker::<T, Tls>(linker, get)
}

impl TlsView<'_> {
    /// Refuses a new session once the call holds [`MAX_SESSIONS`] (checked
    /// before dialing, and again when the session is stored).
    pub(crate) fn room_for_session(&self) -> Result<(), WitError> {
        if self.ctx.sessions >= MAX_SESSIONS {
            return Err(WitError::Invalid(format!(
                "at most {MAX_SESSIONS} sessions may be open at once"
            )));
        }
        Ok(())
    }

    /// Puts a connection in the call's table as a session, within the
    /// per-call limit. A table that refuses it is the host's failure, a
    /// trap.
    pub(crate) fn open_session(
        &mut self,
        stream: SessionStream,
        peer: (String, u16),
    ) -> wasmtime::Result<Result<Resource<Session>, WitError>> {
        if let Err(e) = self.room_for_session() {
            return Ok(Err(e));
        }
        let session = self.table.push(Session {
            stream,
            peer,
            scan: Stream::default(),
            ready: Vec::new(),
        })?;
        self.ctx.sessions += 1;
        Ok(Ok(session))
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
        client: None,
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
        TlsError::ServerName { .. } | TlsError::Ca(_) | TlsError::ClientCert(_) => WitError::Invalid(e.to_string()),
        TlsError::Handshake(_) | TlsError::Certificate(_) => WitError::Handshake(e.to_string()),
    }
}

async fn handshake(
    client: &TlsClient,
    grants: &CallGrants,
    bounds: &CallBounds,
    host: &str,
    port: u16,
    options: &TlsOptions,
) -> Result<(TlsStream<TcpStream>, HandshakeResult), WitError> {
    bounds.observe(|o| o.tcp = true);
    let dialed = dial(grants, Use::Tls { host, port }, bounds).await?;
    let start = Instant::now();
    let (stream, info) = client
        .connect(dialed.stream, host, options, &[])
        .await
        .map_err(wit_error)?;
    let tls = start.elapsed();
    let seen = super::tls_client::seen(stream.get_ref().1, options);
    bounds.observe(|o| {
        o.handshake += tls;
        o.tls = Some(std::sync::Arc::new(seen));
        o.tcp_ready = true;
    });
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

impl TlsView<'_> {
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
        self.grants
            .authorize(Use::Tls { host: &host, port })
            .map_err(|d| WitError::Denied(d.0))?;
        self.bounds
            .take_socket()
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        let mut options = options_from_wit(options).map_err(wit_error)?;
        options.client = self.certs.for_peer(&host, port);
        self.tls.validate(&host, &options, &[]).map_err(wit_error)?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(timeout_ms);
        if timeout >= left {
            // The call's own deadline ends it first and records `timeout`.
            return handshake(self.tls, self.grants, self.bounds, &host, port, &options).await;
        }
        match tokio::time::timeout(
            timeout,
            handshake(self.tls, self.grants, self.bounds, &host, port, &options),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(WitError::Timeout(format!(
                "no handshake within {}ms",
                timeout.as_millis()
            ))),
        }
    }
}

impl probe_tls::Host for TlsView<'_> {
    async fn handshake(
        &mut self,
        host: String,
        port: u16,
        options: Options,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<HandshakeResult, WitError>> {
        // Dropping the stream closes the connection with a reset, as every
        // probe connection.
        Ok(self
            .tls_handshake(host, port, options, timeout_ms)
            .await
            .map(|(_stream, result)| result))
    }

    async fn connect(
        &mut self,
        host: String,
        port: u16,
        options: Options,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<(Resource<Session>, HandshakeResult), WitError>> {
        if let Err(e) = self.room_for_session() {
            return Ok(Err(e));
        }
        let peer = (host.clone(), port);
        let (stream, result) = match self.tls_handshake(host, port, options, timeout_ms).await {
            Ok(done) => done,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self
            .open_session(SessionStream::Tls(Box::new(stream)), peer)?
            .map(|session| (session, result)))
    }
}

/// `receive` for a probe that holds secrets: what the peer sent, checked
/// for reflections ([`Stream`]). It is handed on a fixed lag behind the
/// peer; the bytes held are handed on once the peer has been quiet for
/// [`QUIET`], has closed, or the wait ends. On a reflection the plugin gets
/// what came before it, then [`WITHHELD`], and the session is finished:
/// every later `receive` returns nothing, as if the peer had closed.
async fn receive_scrubbed(
    session: &mut Session,
    scrubber: &Scrubber,
    grants: &CallGrants,
    max: usize,
    timeout: Duration,
) -> Result<Vec<u8>, WitError> {
    let until = tokio::time::Instant::now() + timeout;
    loop {
        if !session.ready.is_empty() {
            let n = max.min(session.ready.len());
            return Ok(session.ready.drain(..n).collect());
        }
        if session.scan.is_withheld() {
            return Ok(Vec::new());
        }
        let holding = session.scan.holds();
        let wait = if holding {
            until.min(tokio::time::Instant::now() + QUIET)
        } else {
            until
        };
        let mut buf = vec![0; MAX_RECEIVE_BYTES];
        let passed = match tokio::time::timeout_at(wait, session.stream.receive(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => session.scan.push(scrubber, &buf[..n]),
            Ok(Ok(_)) if holding => session.scan.release(scrubber),
            Ok(Ok(_)) => return Ok(Vec::new()),
            Ok(Err(_)) | Err(_) if holding => session.scan.release(scrubber),
            Ok(Err(e)) => return Err(WitError::Connect(format!("receive: {e}"))),
            Err(_) => {
                return Err(WitError::Timeout(format!(
                    "nothing received within {}ms",
                    timeout.as_millis()
                )));
            }
        };
        session.ready.extend_from_slice(&passed.data);
        if passed.withheld {
            session.ready.extend_from_slice(WITHHELD.as_bytes());
        }
        if passed.spilled {
            grants.secrets_spilled();
        }
    }
}

impl probe_tls::HostSession for TlsView<'_> {
    async fn send(&mut self, session: Resource<Session>, data: Vec<u8>) -> wasmtime::Result<Result<(), WitError>> {
        let session = self.table.get_mut(&session)?;
        Ok(session
            .stream
            .send(&data)
            .await
            .map_err(|e| WitError::Connect(format!("send: {e}"))))
    }

    async fn receive(
        &mut self,
        session: Resource<Session>,
        max: u32,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<Vec<u8>, WitError>> {
        let scrubber = self.grants.scrubber();
        let session = self.table.get_mut(&session)?;
        let max = (max as usize).clamp(1, MAX_RECEIVE_BYTES);
        let timeout = Duration::from_millis(timeout_ms);
        if let Some(scrubber) = scrubber {
            return Ok(receive_scrubbed(session, &scrubber, self.grants, max, timeout).await);
        }
        let mut buf = vec![0; max];
        // The call's deadline also ends a wait longer than the call.
        Ok(
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
            },
        )
    }

    async fn starttls(
        &mut self,
        session: Resource<Session>,
        options: Options,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<HandshakeResult, WitError>> {
        starttls::upgrade(self, session, options, timeout_ms).await
    }

    fn drop(&mut self, session: Resource<Session>) -> wasmtime::Result<()> {
        self.table.delete(session)?;
        self.ctx.sessions = self.ctx.sessions.saturating_sub(1);
        Ok(())
    }
}
