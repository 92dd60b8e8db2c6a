//! How the host connects for a plugin (`http`, `tcp`, `tls`, `grpc`,
//! `wasi:http`; `udp` shares the lookup and check, [`resolve_checked`]): one name lookup (bounded agent-wide by
//! the engine's gate of lookups and run on its gate of blocking threads,
//! [`CallBounds::pass`] and [`CallBounds::run_blocking`]), one check of the
//! addresses it found ([`CallGrants::authorize_peer`]), a TCP connection
//! to an address so checked (the first that answers) — never a second
//! lookup —, the time of each,
//! and a socket that closes with a reset. The caller has checked the
//! grants for what the plugin asked ([`CallGrants::authorize`]) and counted
//! the socket.

use super::bounds::CallBounds;
use crate::bindings::sonde::probe::{grpc as probe_grpc, http as probe_http, tls as probe_tls, udp as probe_udp};
use sonde_policy::grants::{CallGrants, Denied, Host, Use};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// Resolves the name `host` for a plugin's call: every address, in
/// canonical form. Waits (without a thread) for a lookup slot and a
/// blocking thread; both are held by the thread doing the lookup until the
/// resolver answers, even if the caller has given up. The caller bounds
/// the wait with its deadline; cut off while waiting, the call is recorded
/// as having run into the bound.
pub(crate) async fn lookup(host: &str, bounds: &CallBounds) -> Result<Vec<IpAddr>, LookupError> {
    let slot = bounds.pass(bounds.gates().lookups()).await;
    let name = host.to_string();
    let addrs = bounds
        .run_blocking(Some(slot), move || {
            (name.as_str(), 0)
                .to_socket_addrs()
                .map(|a| a.map(|a| a.ip().to_canonical()).collect::<Vec<_>>())
        })
        .await;
    let host = || host.to_string();
    match addrs {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(source)) => Err(LookupError::Resolver { host: host(), source }),
        Err(source) => Err(LookupError::Lost { host: host(), source }),
    }
}

/// Why a name lookup for a plugin failed; each names the host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LookupError {
    /// The resolver's answer.
    #[error("{host}: {source}")]
    Resolver { host: String, source: std::io::Error },
    /// The thread doing the lookup gave no answer.
    #[error("{host}: {source}")]
    Lost {
        host: String,
        source: super::blocking::WorkLost,
    },
}

/// A connection the host opened for a plugin, and the time each phase took.
pub(crate) struct Dialed {
    pub(crate) stream: TcpStream,
    /// The address connected to, as checked.
    pub(crate) peer: SocketAddr,
    pub(crate) dns: Duration,
    pub(crate) connect: Duration,
}

/// Why [`dial`] failed, with what caused it. Each capability turns it into
/// its own WIT error through one conversion (below), as the plugin reads
/// it: the `Display` of each variant is the message the plugin is told.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    /// The name did not resolve: the resolver's error, or no answer.
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The name resolved, to no address (or none the check let through).
    #[error("{host}: no address")]
    NoAddress {
        /// The name looked up.
        host: String,
    },
    /// The name led to no address of the one IP version the probe holds
    /// to (`grants.ip_protocol` without fallback).
    #[error("{host}: no {version} address (grants.ip_protocol: {version}, ip_protocol_fallback: false)")]
    NoAddressOfVersion {
        /// The name looked up, or the address written.
        host: String,
        /// The version held to.
        version: sonde_policy::grants::IpVersion,
    },
    /// Every address found is one the probe may not reach; the denial is
    /// recorded, and its message is the plugin's.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// No allowed address answered: the last one tried, and why.
    #[error("{addr}: {source}")]
    Connect {
        /// The address tried last.
        addr: SocketAddr,
        /// The connection's error.
        #[source]
        source: std::io::Error,
    },
    /// The use handed to [`dial`] names no host (a caller's mistake).
    #[error("{what} names no host to connect to")]
    NoAuthority {
        /// The use, as `Debug` shows it.
        what: String,
    },
}

/// The three kinds of failure sonde's own WIT errors tell apart (`dns`,
/// `denied`, `connect`), each with the message the plugin is told.
enum Failed {
    Dns(String),
    Denied(String),
    Connect(String),
}

impl From<DialError> for Failed {
    fn from(e: DialError) -> Self {
        let message = e.to_string();
        match e {
            DialError::Lookup(_) | DialError::NoAddress { .. } | DialError::NoAddressOfVersion { .. } => {
                Self::Dns(message)
            }
            DialError::Denied(_) => Self::Denied(message),
            DialError::Connect { .. } | DialError::NoAuthority { .. } => Self::Connect(message),
        }
    }
}

/// One conversion per sonde WIT error, each through [`Failed`].
macro_rules! wit_error_from_dial {
    ($($(#[$doc:meta])* $wit:ty;)*) => {$(
        $(#[$doc])*
        impl From<DialError> for $wit {
            fn from(e: DialError) -> Self {
                match Failed::from(e) {
                    Failed::Dns(m) => Self::Dns(m),
                    Failed::Denied(m) => Self::Denied(m),
                    Failed::Connect(m) => Self::Connect(m),
                }
            }
        }
    )*};
}

wit_error_from_dial! {
    probe_http::HttpError;
    probe_grpc::GrpcError;
    /// `sonde:probe/tls`'s error, which `sonde:probe/tcp` returns too (`tcp`
    /// words a connection's failure as the system's reason alone).
    probe_tls::TlsError;
    probe_udp::UdpError;
}

/// `wasi:http`'s error: the error codes wasmtime-wasi-http hands the plugin.
impl From<DialError> for wasmtime_wasi_http::Error {
    fn from(e: DialError) -> Self {
        match e {
            DialError::Lookup(_) | DialError::NoAddress { .. } | DialError::NoAddressOfVersion { .. } => {
                Self::DnsError {
                    rcode: None,
                    info_code: None,
                }
            }
            DialError::Denied(_) => Self::HttpRequestDenied,
            // The text, not the io::Error itself: wasmtime-wasi-http reads
            // an error's kind (`AddrNotAvailable` becomes a DNS error), and
            // the plugin is told what the host tried, as before.
            e @ (DialError::Connect { .. } | DialError::NoAuthority { .. }) => {
                Self::Connect(std::io::Error::other(e.to_string()))
            }
        }
    }
}

/// A lookup in progress: dropped before it found an address (it failed,
/// or the caller's deadline cut it off), it is observed as one that
/// found nothing.
struct Unresolved<'a> {
    bounds: &'a CallBounds,
    start: Instant,
}

impl Drop for Unresolved<'_> {
    fn drop(&mut self) {
        let took = self.start.elapsed();
        self.bounds.observe(|o| o.looked_up(took, false));
    }
}

/// What [`resolve_checked`] found: the host as the plugin wrote it and
/// the addresses the grants let it reach, in the resolver's order.
pub(crate) struct Checked<'a> {
    pub(crate) host: &'a str,
    pub(crate) allowed: Vec<SocketAddr>,
    /// The time the lookup and the check took.
    pub(crate) dns: Duration,
}

/// The addresses a connection for `what` (a use the caller has authorized)
/// may go to: an address as it is written, a name through one lookup whose
/// addresses are checked ([`CallGrants::authorize_peer`]). Shared by
/// [`dial`] and `udp`, so every transport reaches only what this allows.
pub(crate) async fn resolve_checked<'a>(
    grants: &CallGrants,
    what: Use<'a>,
    bounds: &CallBounds,
) -> Result<Checked<'a>, DialError> {
    let Some((host, port)) = what.authority() else {
        return Err(DialError::NoAuthority {
            what: format!("{what:?}"),
        });
    };
    let start = Instant::now();
    // An address in any spelling is reached as the grant check read it,
    // never handed to a resolver that might read it otherwise.
    let (name, candidates) = match Host::parse(host) {
        Host::Ip(ip) => (None, vec![SocketAddr::new(ip, port)]),
        _ => {
            // Failed, or cut off by the deadline: observed as found nothing.
            let unresolved = Unresolved { bounds, start };
            let found = lookup(host, bounds).await?;
            if found.is_empty() {
                return Err(DialError::NoAddress { host: host.to_string() });
            }
            std::mem::forget(unresolved);
            (
                Some(host),
                found.into_iter().map(|ip| SocketAddr::new(ip, port)).collect(),
            )
        }
    };
    let mut allowed = grants.authorize_peer(what, name, &candidates)?;
    let dns = start.elapsed();
    if let Some(protocol) = grants.ip_protocol() {
        protocol.arrange(&mut allowed);
        if allowed.is_empty() {
            // As blackbox_exporter: no address of the version is a failed lookup.
            bounds.observe(|o| o.looked_up(dns, false));
            return Err(DialError::NoAddressOfVersion {
                host: host.to_string(),
                version: protocol.prefer,
            });
        }
    }
    bounds.observe(|o| o.looked_up(dns, true));
    Ok(Checked { host, allowed, dns })
}

/// Connects for a plugin to the host and port of `what` (an `http`, `tcp`,
/// `tls` or `grpc` use the caller has authorized): an address as it is
/// written, a name through one lookup whose addresses are checked, to the
/// first address allowed that answers. The socket closes with a reset: a probe every
/// few seconds must not pile up TIME_WAIT sockets on either side.
pub(crate) async fn dial(grants: &CallGrants, what: Use<'_>, bounds: &CallBounds) -> Result<Dialed, DialError> {
    let start = Instant::now();
    let Checked { host, allowed, dns } = resolve_checked(grants, what, bounds).await?;
    // The addresses allowed, in the resolver's order, until one answers
    // (`localhost` is often ::1 first, while the service listens on IPv4);
    // the caller's deadline bounds the whole.
    let mut failed = None;
    let mut connected = None;
    for addr in allowed {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                connected = Some((stream, addr));
                break;
            }
            Err(source) => failed = Some(DialError::Connect { addr, source }),
        }
    }
    let Some((stream, addr)) = connected else {
        if let Some(DialError::Connect { addr, .. }) = &failed {
            bounds.observe(|o| o.connected(addr.ip(), None));
        }
        // `authorize_peer` allows at least one address, so one was tried.
        return Err(failed.unwrap_or_else(|| DialError::NoAddress { host: host.to_string() }));
    };
    let connect = start.elapsed() - dns;
    bounds.observe(|o| o.connected(addr.ip(), Some(connect)));
    // tokio deprecates SO_LINGER because a non-zero linger blocks on drop;
    // a zero linger never does.
    #[allow(
        deprecated,
        reason = "a zero linger never blocks on drop, which is what tokio's deprecation warns of"
    )]
    let _ = stream.set_linger(Some(Duration::ZERO));
    let _ = stream.set_nodelay(true);
    Ok(Dialed {
        stream,
        peer: addr,
        dns,
        connect,
    })
}
