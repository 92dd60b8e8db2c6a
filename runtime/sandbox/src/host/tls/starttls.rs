//! `session.starttls`: a plain session (`tcp.connect`) upgraded to TLS in
//! place, after a plain-text exchange asked for it (SMTP's and IMAP's
//! `STARTTLS`, PostgreSQL's SSLRequest).
//!
//! The handshake is [`TlsClient::connect`]'s, as for `tls.connect`: the
//! same client configurations, roots and CA handling, and the same name
//! (the host the session was opened to, or `server-name`), checked
//! against the grants as a TLS handshake with the session's peer. It is
//! observed as one (the run's TLS session, for `/probe`'s `probe_ssl_*`
//! series).
//!
//! The bytes around the upgrade are kept apart. rustls reads only from the
//! socket, never what the host has already read. The upgrade is refused
//! (`handshake`: the peer speaks plain text where TLS should start; the
//! session left as it was) while anything the peer sent in
//! plain text waits for the plugin: held by the host for a probe that
//! holds secrets (its scan's lag, or checked but not handed over), or
//! still in the socket. Such bytes were sent before the handshake, so they
//! are not TLS: handed to rustls they would break it, and handed to the
//! plugin after the upgrade they would pass for what the server said over
//! TLS (the plain-text injection STARTTLS is known for). Refused, they stay
//! readable as they were, through the same scrubbing. Bytes that arrive
//! after the check go to rustls, which refuses them as a handshake error.
//!
//! After the upgrade, `receive` reads the TLS stream through the same path
//! as before, the session's scan included.

use super::{TlsView, options_from_wit, wit_error};
use crate::bindings::sonde::probe::tls::{HandshakeResult, Options, Timings, TlsError as WitError};
use crate::bindings::{Session, SessionStream};
use crate::host::tls_client::TlsClient;
use sonde_policy::grants::Use;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use wasmtime::component::Resource;

/// The error `send` and `receive` give on a session whose upgrade failed.
pub(super) fn closed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the connection was closed when its TLS upgrade failed",
    )
}

/// `session.starttls`. A handle that is not in the table traps, as for
/// `send` and `receive`.
pub(super) async fn upgrade(
    view: &mut TlsView<'_>,
    session: Resource<Session>,
    options: Options,
    timeout_ms: u64,
) -> wasmtime::Result<Result<HandshakeResult, WitError>> {
    let session = view.table.get_mut(&session)?;
    let (host, port) = (session.peer.0.clone(), session.peer.1);
    if let Err(e) = ready_for_tls(session) {
        return Ok(Err(e));
    }
    if let Err(e) = view.grants.authorize(Use::Tls { host: &host, port }) {
        return Ok(Err(WitError::Denied(e.0)));
    }
    let mut options = match options_from_wit(options) {
        Ok(o) => o,
        Err(e) => return Ok(Err(wit_error(e))),
    };
    options.client = view.certs.for_peer(&host, port);
    if let Err(e) = view.tls.validate(&host, &options, &[]) {
        return Ok(Err(wit_error(e)));
    }
    let SessionStream::Plain(stream) = std::mem::replace(&mut session.stream, SessionStream::Closed) else {
        unreachable!("ready_for_tls accepts only a plain session");
    };
    let start = Instant::now();
    let handshake = handshake(view.tls, stream, &host, &options);
    let left = view.deadline.saturating_duration_since(start);
    let timeout = Duration::from_millis(timeout_ms);
    let done = if timeout >= left {
        // The call's own deadline ends it first and records `timeout`.
        handshake.await
    } else {
        tokio::time::timeout(timeout, handshake).await.unwrap_or_else(|_| {
            Err(WitError::Timeout(format!(
                "no handshake within {}ms",
                timeout.as_millis()
            )))
        })
    };
    let (stream, info) = match done {
        Ok(done) => done,
        // The session stays `Closed`: the connection went with the handshake.
        Err(e) => return Ok(Err(e)),
    };
    let took = start.elapsed();
    let seen = crate::host::tls_client::seen(stream.get_ref().1, &options);
    view.bounds.observe(|o| {
        o.handshake += took;
        o.tls = Some(std::sync::Arc::new(seen));
    });
    session.stream = SessionStream::Tls(Box::new(stream));
    Ok(Ok(HandshakeResult {
        info: (&info).into(),
        timings: Timings {
            dns: 0.0,
            connect: 0.0,
            tls: took.as_secs_f64(),
        },
    }))
}

async fn handshake(
    client: &TlsClient,
    stream: TcpStream,
    host: &str,
    options: &crate::host::tls_client::TlsOptions,
) -> Result<(TlsStream<TcpStream>, crate::host::tls_client::TlsInfo), WitError> {
    client.connect(stream, host, options, &[]).await.map_err(wit_error)
}

/// Refuses the upgrade of a session that is not plain, or that holds
/// bytes the peer sent in plain text which the plugin has not received.
fn ready_for_tls(session: &Session) -> Result<(), WitError> {
    let stream = match &session.stream {
        SessionStream::Plain(stream) => stream,
        SessionStream::Tls(_) => return Err(WitError::Invalid("starttls: the session is TLS already".into())),
        SessionStream::Closed => {
            return Err(WitError::Connect(
                "starttls: the connection was closed when an earlier TLS upgrade failed".into(),
            ));
        }
    };
    if session.scan.is_withheld() {
        // As if the peer had closed, as `receive` tells it.
        return Err(WitError::Connect(
            "starttls: the session is finished: what the peer sent was withheld".into(),
        ));
    }
    if !session.ready.is_empty() || session.scan.holds() {
        return Err(unread());
    }
    match waiting(stream) {
        Waiting::Nothing => Ok(()),
        Waiting::Bytes => Err(unread()),
        Waiting::Closed => Err(WitError::Connect("starttls: the peer closed the connection".into())),
    }
}

fn unread() -> WitError {
    WitError::Handshake(
        "starttls: the peer sent data before the upgrade that the plugin has not received; receive it first".into(),
    )
}

/// What waits in a plain connection's socket, looked at without reading.
enum Waiting {
    Nothing,
    Bytes,
    Closed,
}

/// Peeks at `stream` once, without waiting.
fn waiting(stream: &TcpStream) -> Waiting {
    let mut one = [0u8; 1];
    let mut buf = tokio::io::ReadBuf::new(&mut one);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match stream.poll_peek(&mut cx, &mut buf) {
        Poll::Ready(Ok(0)) => Waiting::Closed,
        Poll::Ready(Ok(_)) => Waiting::Bytes,
        // An error shows in the handshake, which reads the same socket.
        Poll::Ready(Err(_)) | Poll::Pending => Waiting::Nothing,
    }
}
