//! One UDP request and its reply, sent by the host for the plugin (DNS and
//! other request/response protocols over datagrams). The host checks the
//! grants (only the probe's target and its `net` grants), sends from a
//! connected socket, so a datagram from any other peer is never seen, and
//! measures each phase. No socket stack runs in the sandbox.

use crate::ProbeError;
use crate::bindings::sonde::probe::udp as host_udp;
use crate::tls::HandshakeError;
use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

/// A reply, and the seconds each phase took.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The reply datagram.
    pub data: Vec<u8>,
    /// Resolving the name (0 for an address).
    pub dns_seconds: f64,
    /// Opening and connecting the socket.
    pub connect_seconds: f64,
    /// From sending the request to the reply.
    pub round_trip_seconds: f64,
}

/// The most a reply may hold (64 KiB).
pub const MAX_REPLY: u32 = 64 * 1024;

/// Sends `request` to `host:port` and waits at most `timeout` for one reply
/// of at most `max` bytes. No reply, a refusal, a name that does not
/// resolve or a reply over `max` is [`HandshakeError::Failed`], with the
/// reason; an ungranted host is a denial, a malformed request invalid.
pub fn exchange(host: &str, port: u16, request: &[u8], max: u32, timeout: Duration) -> Result<Reply, HandshakeError> {
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    match host_udp::exchange(host, port, request, max, millis) {
        Ok(r) => Ok(Reply {
            data: r.data,
            dns_seconds: r.dns,
            connect_seconds: r.connect,
            round_trip_seconds: r.round_trip,
        }),
        Err(e) => Err(match e {
            host_udp::UdpError::Denied(m) => HandshakeError::Probe(ProbeError::Denied(m)),
            host_udp::UdpError::Invalid(m) => HandshakeError::Probe(ProbeError::InvalidConfig(m)),
            host_udp::UdpError::Dns(m) => HandshakeError::Failed(format!("dns: {m}")),
            host_udp::UdpError::Connect(m) => HandshakeError::Failed(format!("udp: {m}")),
            host_udp::UdpError::Timeout(m) => HandshakeError::Failed(crate::net::timeout_message(&m)),
            host_udp::UdpError::Oversized(n) => {
                HandshakeError::Failed(format!("udp: a reply of {n} bytes, more than the {max} allowed"))
            }
        }),
    }
}
