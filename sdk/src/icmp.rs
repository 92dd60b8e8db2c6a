//! One ICMP echo by the host, on an unprivileged ping socket: the host
//! checks the target against the probe's grants (only a `net` pattern of
//! any port, `HOST:*`, covers a host for ICMP), resolves a name once,
//! sends the request and waits for its reply. No socket is opened in the
//! sandbox.

use crate::ProbeError;
use crate::bindings::sonde::probe::icmp as host_icmp;
use alloc::format;
use alloc::string::String;
use core::time::Duration;

pub use host_icmp::IpProtocol;

/// How to ping: blackbox_exporter's `icmp` options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EchoOptions {
    /// The version to use when a name has addresses of both.
    pub preferred: IpProtocol,
    /// Use the other version when the name has none of the preferred one.
    pub fallback: bool,
    /// Bytes after the ICMP header (the host takes at most 16 KiB).
    pub payload_size: u32,
    /// Set the Don't Fragment bit (IPv4) or refuse to fragment (IPv6).
    pub dont_fragment: bool,
    /// The request's TTL or hop limit; `None` for the system's.
    pub ttl: Option<u8>,
}

impl Default for EchoOptions {
    /// blackbox_exporter's defaults: IPv6 first, with fallback.
    fn default() -> Self {
        Self {
            preferred: IpProtocol::Ip6,
            fallback: true,
            payload_size: 0,
            dont_fragment: false,
            ttl: None,
        }
    }
}

/// The reply, and the time each phase took.
#[derive(Clone, Debug, PartialEq)]
pub struct Echo {
    /// The address pinged, as the host checked it.
    pub address: String,
    /// The IP version used.
    pub protocol: IpProtocol,
    /// Resolving the name (0 for an address).
    pub resolve_seconds: f64,
    /// Opening and setting up the socket.
    pub setup_seconds: f64,
    /// From the request to its reply.
    pub rtt_seconds: f64,
    /// The reply's TTL or hop limit, when the system reported it.
    pub hop_limit: Option<u8>,
    /// Bytes of payload the reply echoed.
    pub payload_size: u32,
}

/// Why no reply came.
#[derive(Debug)]
pub enum EchoError {
    /// The target failed: no reply in time, unreachable, no usable
    /// address, or a reply that is not this request's. The message is for
    /// a failure outcome.
    Failed(String),
    /// The check could not be made: denied, invalid options, or no ping
    /// socket (the message names the sysctl to open).
    Probe(ProbeError),
}

/// Sends one echo request to `host` (a name or an address, no port) and
/// waits at most `timeout` (the call's deadline also applies) for its reply.
pub fn echo(host: &str, options: &EchoOptions, timeout: Duration) -> Result<Echo, EchoError> {
    use host_icmp::IcmpError;
    let wit = host_icmp::Options {
        preferred: options.preferred,
        fallback: options.fallback,
        payload_size: options.payload_size,
        dont_fragment: options.dont_fragment,
        ttl: options.ttl,
    };
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    match host_icmp::echo(host, wit, millis) {
        Ok(r) => Ok(Echo {
            address: r.address,
            protocol: r.protocol,
            resolve_seconds: r.timings.resolve,
            setup_seconds: r.timings.setup,
            rtt_seconds: r.timings.rtt,
            hop_limit: r.hop_limit,
            payload_size: r.payload_size,
        }),
        Err(IcmpError::Denied(m)) => Err(EchoError::Probe(ProbeError::Denied(m))),
        Err(IcmpError::Invalid(m)) => Err(EchoError::Probe(ProbeError::InvalidConfig(m))),
        Err(IcmpError::Unavailable(m)) => Err(EchoError::Probe(ProbeError::Io(m))),
        Err(IcmpError::Dns(m)) => Err(EchoError::Failed(format!("dns: {m}"))),
        Err(IcmpError::Connect(m)) => Err(EchoError::Failed(format!("connect: {m}"))),
        Err(IcmpError::Timeout(m)) => Err(EchoError::Failed(crate::net::timeout_message(&m))),
        Err(IcmpError::Reply(m)) => Err(EchoError::Failed(format!("reply: {m}"))),
    }
}
