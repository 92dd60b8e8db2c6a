//! How the host connects for a plugin (`http`, `tcp`, `tls`, `grpc`): one
//! name lookup, one TCP connection, the time of each, and a socket that
//! closes with a reset. The caller has checked the grants.

use std::time::{Duration, Instant};
use tokio::net::TcpStream;

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
    let addr = match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        Ok(ip) => std::net::SocketAddr::new(ip, port),
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| DialError::Dns(format!("{host}: {e}")))?
            .next()
            .ok_or_else(|| DialError::Dns(format!("{host}: no address")))?,
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
