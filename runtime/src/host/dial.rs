//! How the host connects for a plugin (`http`, `tcp`, `tls`, `grpc`): one
//! name lookup (bounded agent-wide by [`blocking::lookups`] and run on
//! [`blocking::threads`]), one TCP connection, the time of each, and a
//! socket that closes with a reset. The caller has checked the grants and
//! counted the socket.

use super::blocking;
use super::bounds::CallBounds;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

pub use super::blocking::MAX_LOOKUPS_IN_FLIGHT;

/// Resolves the name `host` for a plugin's call: every address, in
/// canonical form. Waits (without a thread) for a lookup slot and a
/// blocking thread; both are held by the thread doing the lookup until the
/// resolver answers, even if the caller has given up. The caller bounds
/// the wait with its deadline; cut off while waiting, the call is recorded
/// as having run into the bound.
pub(crate) async fn lookup(host: &str, bounds: &CallBounds) -> Result<Vec<IpAddr>, String> {
    let slot = blocking::lookups(bounds).enter(bounds).await;
    let name = host.to_string();
    let addrs = blocking::run(bounds, Some(slot), move || {
        (name.as_str(), 0)
            .to_socket_addrs()
            .map(|a| a.map(|a| a.ip().to_canonical()).collect::<Vec<_>>())
    })
    .await;
    match addrs {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err(format!("{host}: {e}")),
        Err(e) => Err(format!("{host}: {e}")),
    }
}

/// Resolves `host` to its first address ([`lookup`]).
async fn resolve(host: &str, port: u16, bounds: &CallBounds) -> Result<SocketAddr, DialError> {
    match lookup(host, bounds).await.map_err(DialError::Dns)?.first() {
        Some(ip) => Ok(SocketAddr::new(*ip, port)),
        None => Err(DialError::Dns(format!("{host}: no address"))),
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
pub(crate) async fn dial(host: &str, port: u16, bounds: &CallBounds) -> Result<Dialed, DialError> {
    let start = Instant::now();
    // An address in any spelling is reached as the grant check read it,
    // never handed to a resolver that might read it otherwise.
    let addr = match super::grants::host_address(host) {
        Some(ip) => SocketAddr::new(ip, port),
        None => resolve(host, port, bounds).await?,
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
