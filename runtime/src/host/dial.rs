//! How the host connects for a plugin (`http`, `tcp`, `tls`, `grpc`): one
//! name lookup (bounded agent-wide: [`MAX_LOOKUPS_IN_FLIGHT`]), one TCP
//! connection, the time of each, and a socket that closes with a reset.
//! The caller has checked the grants.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// The most name lookups the host makes for plugins at once, agent-wide.
/// A lookup holds a thread until the system resolver answers — a dead
/// resolver takes tens of seconds, and a call cut off at its deadline does
/// not stop it — so this bounds the threads plugins can keep blocked that
/// way. One call looks up one name at a time.
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 32;

static LOOKUPS: Semaphore = Semaphore::const_new(MAX_LOOKUPS_IN_FLIGHT);

/// Since when every lookup slot has been taken, if they are.
static SATURATED_SINCE: Mutex<Option<Instant>> = Mutex::new(None);

/// How long every lookup slot has been taken (`None` when one is free): a
/// resolver that stopped answering, or plugins flooding it. `/livez`
/// reports the agent unable to serve when this lasts.
pub fn lookups_exhausted_for() -> Option<Duration> {
    if LOOKUPS.available_permits() > 0 {
        return None;
    }
    let since = *SATURATED_SINCE.lock().unwrap_or_else(|e| e.into_inner());
    since.map(|t| t.elapsed())
}

fn note_saturation() {
    let mut since = SATURATED_SINCE.lock().unwrap_or_else(|e| e.into_inner());
    match (LOOKUPS.available_permits(), *since) {
        (0, None) => *since = Some(Instant::now()),
        (n, Some(_)) if n > 0 => *since = None,
        _ => {}
    }
}

/// Resolves `host` to its first address, waiting (without a thread) for
/// one of the [`MAX_LOOKUPS_IN_FLIGHT`] lookup slots; the slot is held by
/// the thread doing the lookup until the resolver answers, even if the
/// caller has given up. The caller bounds the wait with its deadline.
pub(crate) async fn resolve(host: &str, port: u16) -> Result<SocketAddr, DialError> {
    let permit = LOOKUPS
        .acquire()
        .await
        .map_err(|_| DialError::Dns(format!("{host}: the resolver is shut down")))?;
    note_saturation();
    let name = host.to_string();
    let lookup = tokio::task::spawn_blocking(move || {
        let addrs = (name.as_str(), port).to_socket_addrs();
        drop(permit);
        note_saturation();
        addrs.map(|mut a| a.next())
    });
    match lookup.await {
        Ok(Ok(Some(addr))) => Ok(addr),
        Ok(Ok(None)) => Err(DialError::Dns(format!("{host}: no address"))),
        Ok(Err(e)) => Err(DialError::Dns(format!("{host}: {e}"))),
        Err(e) => Err(DialError::Dns(format!("{host}: {e}"))),
    }
}

/// A connection the host opened for a plugin, and the time each phase took.
pub(crate) struct Dialed {
    pub(crate) stream: TcpStream,
    pub(crate) dns: Duration,
    pub(crate) connect: Duration,
}

/// Why [`dial`] failed.
#[derive(Debug)]
pub(crate) enum DialError {
    /// The name did not resolve.
    Dns(String),
    /// The connection failed.
    Connect(String),
}

/// Resolves `host` and connects to `host:port` for a plugin; the caller has
/// checked the grants. The socket closes with a reset: a probe every few
/// seconds must not pile up TIME_WAIT sockets on either side.
pub(crate) async fn dial(host: &str, port: u16) -> Result<Dialed, DialError> {
    let start = Instant::now();
    // An address in any spelling is reached as the grant check read it,
    // never handed to a resolver that might read it otherwise.
    let addr = match super::grants::host_address(host) {
        Some(ip) => SocketAddr::new(ip, port),
        None => resolve(host, port).await?,
    };
    let dns = start.elapsed();
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| DialError::Connect(format!("{addr}: {e}")))?;
    // tokio deprecates SO_LINGER because a non-zero linger blocks on drop;
    // a zero linger never does.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    let _ = stream.set_nodelay(true);
    Ok(Dialed {
        stream,
        dns,
        connect: start.elapsed() - dns,
    })
}
