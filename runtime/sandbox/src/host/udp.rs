//! sonde's `udp` interface: one request datagram and its reply, sent by the
//! host for request/response protocols over UDP (the `dns` built-in). The
//! host checks the grants (`Use::Udp`), resolves a name once and checks
//! every address it found through the same path as a TCP connection
//! ([`resolve_checked`]), counts the socket against the call's bounds, and
//! sends from a *connected* socket: the kernel drops datagrams from any
//! other peer, so the one reply read came from the address checked. The
//! socket is closed when the exchange returns; nothing outlives it.

use super::bounds::CallBounds;
use super::dial::{Checked, resolve_checked};
use super::tcp::reason;
use crate::bindings::sonde::probe::udp as probe_udp;
use probe_udp::{Reply, UdpError as WitError};
use sonde_policy::grants::{CallGrants, Use};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;
use wasmtime::component::{HasData, Linker};

/// The largest request a plugin may send, and the most a reply returns:
/// 64 KiB, above any UDP payload.
pub(crate) const MAX_DATAGRAM_BYTES: usize = 64 * 1024;

/// What `udp` sees of one call: its grants, deadline and bounds.
pub(crate) struct UdpView<'a> {
    /// The call's grants.
    pub(crate) grants: &'a CallGrants,
    /// When the call ends.
    pub(crate) deadline: Instant,
    /// The call's bounds: every exchange counts as a socket.
    pub(crate) bounds: &'a CallBounds,
}

struct Udp;

impl HasData for Udp {
    type Data<'a> = UdpView<'a>;
}

/// Adds the `udp` interface to `linker` (the once-per-process phase);
/// `get` gives the view of the call in the store's data.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> UdpView<'_>,
) -> wasmtime::Result<()> {
    probe_udp::add_to_linker::<T, Udp>(linker, get)
}

impl UdpView<'_> {
    async fn exchange_checked(&self, host: &str, port: u16, request: &[u8], max: u32) -> Result<Reply, WitError> {
        if host.is_empty() {
            return Err(WitError::Invalid("no host".into()));
        }
        if port == 0 {
            return Err(WitError::Invalid("port 0".into()));
        }
        if request.is_empty() || request.len() > MAX_DATAGRAM_BYTES {
            return Err(WitError::Invalid(format!(
                "a request of {} bytes: it must be 1 to {MAX_DATAGRAM_BYTES}",
                request.len()
            )));
        }
        let what = Use::Udp { host, port };
        self.grants.authorize(what).map_err(|d| WitError::Denied(d.0))?;
        self.bounds
            .take_socket()
            .map_err(|e| WitError::Invalid(e.to_string()))?;
        let start = Instant::now();
        let Checked { allowed, dns, .. } = resolve_checked(self.grants, what, self.bounds).await?;
        // A datagram gets no answer to pick the address that works, so the
        // first allowed (the resolver's first choice) is the one used.
        let Some(&peer) = allowed.first() else {
            return Err(WitError::Dns(format!("{host}: no address")));
        };
        let local = match peer {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let socket = UdpSocket::bind(local)
            .await
            .map_err(|e| WitError::Connect(format!("bind: {}", reason(&e))))?;
        // Connected: only datagrams from `peer` are ever received.
        let connected = socket.connect(peer).await;
        let connect = start.elapsed().saturating_sub(dns);
        self.bounds
            .observe(|o| o.connected(peer.ip(), connected.is_ok().then_some(connect)));
        connected.map_err(|e| WitError::Connect(reason(&e)))?;
        let sent_at = Instant::now();
        socket
            .send(request)
            .await
            .map_err(|e| WitError::Connect(format!("send: {}", reason(&e))))?;
        // One byte more than the largest reply returned, to tell an
        // oversized reply from one that fits exactly.
        let max = (max as usize).clamp(1, MAX_DATAGRAM_BYTES);
        let mut buf = vec![0; MAX_DATAGRAM_BYTES + 1];
        let n = socket
            .recv(&mut buf)
            .await
            .map_err(|e| WitError::Connect(format!("receive: {}", reason(&e))))?;
        let round_trip = sent_at.elapsed();
        buf.truncate(n);
        // A reflecting datagram is withheld whole, before its length is
        // told (as `oversized`).
        if let Some(s) = self.grants.scrubber()
            && s.reflects(&buf)
        {
            buf = sonde_policy::secrets::scrub::WITHHELD.as_bytes().to_vec();
            buf.truncate(max);
        } else if n > max {
            return Err(WitError::Oversized(u32::try_from(n).unwrap_or(u32::MAX)));
        }
        Ok(Reply {
            data: buf,
            dns: dns.as_secs_f64(),
            connect: connect.as_secs_f64(),
            round_trip: round_trip.as_secs_f64(),
        })
    }
}

impl probe_udp::Host for UdpView<'_> {
    async fn exchange(
        &mut self,
        host: String,
        port: u16,
        request: Vec<u8>,
        max: u32,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<Reply, WitError>> {
        // The call's deadline bounds the wait as well as the timeout asked.
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(timeout_ms).min(left);
        if timeout.is_zero() {
            return Ok(Err(WitError::Timeout("no time left to wait for a reply".into())));
        }
        let exchange = self.exchange_checked(&host, port, &request, max);
        Ok(match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(WitError::Timeout(format!(
                "no reply from {host}:{port} within {}ms",
                timeout.as_millis()
            ))),
        })
    }
}
