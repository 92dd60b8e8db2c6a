//! sonde's `icmp` interface: one ICMP echo by the host, without privilege.
//!
//! The host uses a Linux ping socket (`SOCK_DGRAM` with `IPPROTO_ICMP` or
//! `IPPROTO_ICMPV6`), which the kernel grants to the groups within the
//! `net.ipv4.ping_group_range` sysctl (IPv6 included); when it refuses, the
//! plugin is told which sysctl and which group. The echo goes the way a
//! connection does ([`super::dial`]): the grants are checked for what the
//! plugin wrote (`Use::Icmp`, which only a `net` pattern of any port
//! covers), a name is looked up once through the same gate, and every
//! address found is checked by [`CallGrants::authorize_peer`] before a
//! packet leaves. Each echo counts as a socket of the call
//! ([`super::bounds::CallBounds::take_socket`]), a call sends at most
//! [`MAX_ECHOES`], and a reply is read into a buffer of the request's size
//! (plus one byte, to tell an oversized reply), skipping at most
//! [`MAX_SKIPPED`] stale replies.
//!
//! [`CallGrants::authorize_peer`]: sonde_policy::grants::CallGrants::authorize_peer

use super::dial::lookup;
use super::tcp::reason;
use super::tls::{Tls, TlsView};
use crate::bindings::sonde::probe::icmp::{self as probe_icmp, IcmpError, IpProtocol, Options, Reply, Timings};
use crate::verdict::observed::IcmpSeen;
use socket2::{Domain, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, SockRef, Socket, Type};
use sonde_policy::grants::{Host, Use};
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use wasmtime::component::Linker;

/// The largest payload a plugin may ask for, in bytes.
pub const MAX_PAYLOAD: u32 = 16 * 1024;

/// The most echoes one call may send.
pub const MAX_ECHOES: usize = 8;

/// The most replies to earlier requests (another sequence number) one echo
/// skips before it gives up.
pub const MAX_SKIPPED: usize = 16;

/// The sysctl that opens ping sockets, for IPv4 and IPv6 alike.
const SYSCTL: &str = "net.ipv4.ping_group_range";

/// Adds the `icmp` interface to `linker` (the once-per-process phase); it
/// sees the call as `tls` and `tcp` do, whose per-call counts it shares.
pub(crate) fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> TlsView<'_>,
) -> wasmtime::Result<()> {
    probe_icmp::add_to_linker::<T, Tls>(linker, get)
}

fn family(ip: IpAddr) -> IpProtocol {
    match ip {
        IpAddr::V4(_) => IpProtocol::Ip4,
        IpAddr::V6(_) => IpProtocol::Ip6,
    }
}

/// `found` in the order the options ask for: the preferred version first,
/// then (with `fallback`) the other; none left is a `dns` error.
fn ordered(host: &str, found: Vec<IpAddr>, options: &Options) -> Result<Vec<IpAddr>, IcmpError> {
    let (mut first, other): (Vec<IpAddr>, Vec<IpAddr>) =
        found.into_iter().partition(|ip| family(*ip) == options.preferred);
    if options.fallback {
        first.extend(other);
    }
    if first.is_empty() {
        let version = match options.preferred {
            IpProtocol::Ip4 => "IPv4",
            IpProtocol::Ip6 => "IPv6",
        };
        return Err(IcmpError::Dns(if options.fallback {
            format!("{host}: no address")
        } else {
            format!("{host}: no {version} address, and no fallback to the other version")
        }));
    }
    Ok(first)
}

impl TlsView<'_> {
    /// Counts one more echo of the call, or refuses it past [`MAX_ECHOES`].
    fn room_for_echo(&mut self) -> Result<(), IcmpError> {
        if self.ctx.echoes >= MAX_ECHOES {
            let why = self.bounds.record(format!(
                "the plugin sent more than {MAX_ECHOES} ICMP echoes in one call"
            ));
            return Err(IcmpError::Invalid(why));
        }
        self.ctx.echoes += 1;
        Ok(())
    }

    /// Checks, resolves and pings `host` within `timeout`.
    async fn echo_checked(&mut self, host: &str, options: &Options, timeout_ms: u64) -> Result<Reply, IcmpError> {
        if host.is_empty() {
            return Err(IcmpError::Invalid("no host".into()));
        }
        if options.payload_size > MAX_PAYLOAD {
            return Err(IcmpError::Invalid(format!(
                "payload-size {} is over the host's cap of {MAX_PAYLOAD} bytes",
                options.payload_size
            )));
        }
        self.room_for_echo()?;
        self.grants
            .authorize(Use::Icmp { host })
            .map_err(|d| IcmpError::Denied(d.0))?;
        self.bounds
            .take_socket()
            .map_err(|e| IcmpError::Invalid(e.to_string()))?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(timeout_ms).min(left);
        if timeout.is_zero() {
            // No time to wait for a reply: nothing is sent.
            return Err(IcmpError::Timeout(format!("no time left to ping {host}")));
        }
        match tokio::time::timeout(timeout, self.echo(host, options)).await {
            Ok(result) => result,
            Err(_) => Err(IcmpError::Timeout(format!(
                "no echo reply from {host} within {}ms",
                timeout.as_millis()
            ))),
        }
    }

    /// Resolves `host` once, checks what it found, and pings the first
    /// address allowed.
    async fn echo(&mut self, host: &str, options: &Options) -> Result<Reply, IcmpError> {
        let start = Instant::now();
        self.bounds.observe(|o| o.icmp = Some(IcmpSeen::default()));
        let (name, found) = match Host::parse(host) {
            // An address in any spelling is pinged as the grant check read
            // it, whatever version the options prefer.
            Host::Ip(ip) => (None, vec![ip]),
            _ => {
                let found = lookup(host, self.bounds)
                    .await
                    .map_err(|e| IcmpError::Dns(e.to_string()))
                    .and_then(|found| ordered(host, found, options));
                match found {
                    Ok(found) => (Some(host), found),
                    Err(e) => {
                        let took = start.elapsed();
                        self.bounds.observe(|o| o.looked_up(took, false));
                        return Err(e);
                    }
                }
            }
        };
        let candidates: Vec<SocketAddr> = found.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
        let allowed = self
            .grants
            .authorize_peer(Use::Icmp { host }, name, &candidates)
            .map_err(|d| IcmpError::Denied(d.0))?;
        let Some(peer) = allowed.first().map(SocketAddr::ip) else {
            return Err(IcmpError::Dns(format!("{host}: no address")));
        };
        let resolve = start.elapsed();
        self.bounds.observe(|o| {
            o.looked_up(resolve, true);
            o.connected(peer, None);
        });
        let socket = open(peer, options)?;
        let setup = start.elapsed() - resolve;
        self.bounds.observe(|o| {
            o.icmp = Some(IcmpSeen {
                setup,
                ..IcmpSeen::default()
            })
        });
        let (rtt, hop_limit, payload_size) = exchange(&socket, peer, options.payload_size as usize).await?;
        self.bounds.observe(|o| {
            o.icmp = Some(IcmpSeen {
                setup,
                rtt: Some(rtt),
                hop_limit,
            })
        });
        Ok(Reply {
            address: peer.to_string(),
            protocol: family(peer),
            timings: Timings {
                resolve: resolve.as_secs_f64(),
                setup: setup.as_secs_f64(),
                rtt: rtt.as_secs_f64(),
            },
            hop_limit,
            payload_size,
        })
    }
}

impl probe_icmp::Host for TlsView<'_> {
    async fn echo(
        &mut self,
        host: String,
        options: Options,
        timeout_ms: u64,
    ) -> wasmtime::Result<Result<Reply, IcmpError>> {
        Ok(self.echo_checked(&host, &options, timeout_ms).await)
    }
}

/// Opens a ping socket for `peer`'s version, set up as `options` ask,
/// registered with the runtime.
fn open(peer: IpAddr, options: &Options) -> Result<UdpSocket, IcmpError> {
    let (domain, protocol) = match peer {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
    };
    let socket = Socket::new(domain, Type::DGRAM.nonblocking().cloexec(), Some(protocol)).map_err(refused)?;
    let set = |r: io::Result<()>, what: &str| r.map_err(|e| IcmpError::Invalid(format!("{what}: {}", reason(&e))));
    match peer {
        IpAddr::V4(_) => {
            if let Some(ttl) = options.ttl {
                set(
                    rustix::net::sockopt::set_ip_ttl(&socket, u32::from(ttl)).map_err(io::Error::from),
                    "ttl",
                )?;
            }
            if options.dont_fragment {
                set(
                    rustix::net::sockopt::set_ip_mtu_discover(&socket, rustix::net::sockopt::Ipv4PathMtuDiscovery::DO)
                        .map_err(io::Error::from),
                    "dont-fragment",
                )?;
            }
            // Without it the reply's TTL is reported as absent.
            let _ = recv_ttl(&socket);
        }
        IpAddr::V6(_) => {
            if let Some(hops) = options.ttl {
                set(
                    rustix::net::sockopt::set_ipv6_unicast_hops(&socket, Some(hops)).map_err(io::Error::from),
                    "ttl",
                )?;
            }
            if options.dont_fragment {
                set(
                    rustix::net::sockopt::set_ipv6_mtu_discover(
                        &socket,
                        rustix::net::sockopt::Ipv6PathMtuDiscovery::DO,
                    )
                    .map_err(io::Error::from),
                    "dont-fragment",
                )?;
            }
            let _ = socket.set_recv_hoplimit_v6(true);
        }
    }
    // tokio's UDP socket drives any datagram socket, a ping socket too.
    UdpSocket::from_std(std::net::UdpSocket::from(socket))
        .map_err(|e| IcmpError::Connect(format!("no ping socket: {}", reason(&e))))
}

/// The error of a ping socket the system did not give: closed by the
/// sysctl (named, with the agent's group), or another reason.
fn refused(e: io::Error) -> IcmpError {
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => IcmpError::Unavailable(format!(
            "the system refuses the agent a ping socket ({}): its group (gid {}) is not within the `{SYSCTL}` sysctl, which governs IPv4 and IPv6 (e.g. `sysctl -w {SYSCTL}=\"0 2147483647\"`)",
            reason(&e),
            rustix::process::getgid().as_raw()
        )),
        _ => IcmpError::Connect(format!("no ping socket: {}", reason(&e))),
    }
}

/// Asks the kernel for each IPv4 reply's TTL (`IP_RECVTTL`), which neither
/// socket2 nor rustix offers.
#[allow(
    unsafe_code,
    reason = "setsockopt(IP_RECVTTL), which neither socket2 nor rustix offers"
)]
fn recv_ttl(socket: &Socket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: the descriptor is open for as long as `socket` is borrowed,
    // and the option's value is a live `c_int` whose size is passed.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_RECVTTL,
            std::ptr::from_ref(&on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The bytes of `buf`, every one of which was initialised when `buf` was
/// made (a receive only overwrites them).
#[allow(unsafe_code, reason = "reading a receive buffer made initialised")]
fn initialised(buf: &[MaybeUninit<u8>]) -> &[u8] {
    // SAFETY: every buffer handed here was built from `MaybeUninit::new(0)`
    // and only ever written with bytes by the kernel, so each element is an
    // initialised `u8`; `MaybeUninit<u8>` has the layout of `u8`.
    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) }
}

/// ICMP's echo request and reply types, for IPv4 and IPv6.
fn types(peer: IpAddr) -> (u8, u8) {
    match peer {
        IpAddr::V4(_) => (8, 0),
        IpAddr::V6(_) => (128, 129),
    }
}

/// A request's sequence number and the start of its payload, different
/// for every request (the kernel picks the identifier).
fn nonce() -> (u16, u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = (now.as_nanos() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((n >> 48) as u16, n)
}

/// Sends one echo request of `payload` bytes to `peer` and waits for its
/// reply: the round trip, the reply's TTL or hop limit when the kernel
/// gave it, and the payload's size.
async fn exchange(socket: &UdpSocket, peer: IpAddr, payload: usize) -> Result<(Duration, Option<u8>, u32), IcmpError> {
    let (request_type, _) = types(peer);
    let (sequence, seed) = nonce();
    let mut packet = Vec::with_capacity(8 + payload);
    packet.extend_from_slice(&[request_type, 0, 0, 0, 0, 0]);
    packet.extend_from_slice(&sequence.to_be_bytes());
    packet.extend(seed.to_be_bytes().iter().cycle().take(payload));
    let to = SockAddr::from(SocketAddr::new(peer, 0));
    let sent = Instant::now();
    socket
        .async_io(Interest::WRITABLE, || SockRef::from(socket).send_to(&packet, &to))
        .await
        .map_err(|e| IcmpError::Connect(format!("send to {peer}: {}", reason(&e))))?;
    // One byte more than the reply should be, so a longer one shows.
    let mut buf = vec![MaybeUninit::new(0u8); packet.len() + 1];
    let mut control = [MaybeUninit::new(0u8); 64];
    let mut skipped = 0;
    loop {
        let placeholder = match peer {
            IpAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
            IpAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        };
        let mut from = SockAddr::from(placeholder);
        let (n, truncated, control_len) = socket
            .async_io(Interest::READABLE, || {
                let mut bufs = [MaybeUninitSlice::new(&mut buf)];
                let mut msg = MsgHdrMut::new()
                    .with_addr(&mut from)
                    .with_buffers(&mut bufs)
                    .with_control(&mut control);
                let n = SockRef::from(socket).recvmsg(&mut msg, 0)?;
                Ok((n, msg.flags().is_truncated(), msg.control_len()))
            })
            .await
            .map_err(|e| IcmpError::Connect(format!("{peer}: {}", reason(&e))))?;
        let rtt = sent.elapsed();
        let data = &initialised(&buf)[..n.min(buf.len())];
        let source = from.as_socket().map(|a| a.ip());
        match judge(peer, source, &packet, data, truncated)? {
            Datagram::Reply => {}
            Datagram::Stale => {
                skipped += 1;
                if skipped > MAX_SKIPPED {
                    return Err(IcmpError::Reply(format!(
                        "{MAX_SKIPPED} replies from {peer} answered other requests"
                    )));
                }
                continue;
            }
        }
        let hop_limit = hop_limit(initialised(&control), control_len);
        return Ok((rtt, hop_limit, (data.len() - 8) as u32));
    }
}

/// What a datagram on the ping socket is to the request sent.
#[derive(Debug, PartialEq)]
enum Datagram {
    /// The reply to it.
    Reply,
    /// A reply to an earlier request (another sequence number): skipped.
    Stale,
}

/// Judges `data`, a datagram that came from `source` (as much as the
/// buffer held; `truncated` when there was more) on the ping socket that
/// sent `packet` to `peer`: the reply to it, a stale reply, or what is
/// wrong with it as the failure's reason.
fn judge(
    peer: IpAddr,
    source: Option<IpAddr>,
    packet: &[u8],
    data: &[u8],
    truncated: bool,
) -> Result<Datagram, IcmpError> {
    let source = source.map(|s| s.to_canonical());
    if source != Some(peer.to_canonical()) {
        let shown = source.map_or_else(|| "an unknown address".to_string(), |s| s.to_string());
        return Err(IcmpError::Reply(format!("a reply came from {shown}, not {peer}")));
    }
    if truncated || data.len() > packet.len() {
        return Err(IcmpError::Reply(format!(
            "the reply from {peer} is longer than the {} bytes sent",
            packet.len()
        )));
    }
    if data.len() < 8 {
        return Err(IcmpError::Reply(format!(
            "a malformed reply from {peer}: {} bytes",
            data.len()
        )));
    }
    let (_, reply_type) = types(peer);
    if data[0] != reply_type || data[1] != 0 {
        return Err(IcmpError::Reply(format!(
            "not an echo reply from {peer}: type {} code {}",
            data[0], data[1]
        )));
    }
    if data[6..8] != packet[6..8] {
        return Ok(Datagram::Stale);
    }
    if data[8..] != packet[8..] {
        return Err(IcmpError::Reply(format!(
            "the reply from {peer} does not echo the payload sent ({} of {} bytes)",
            data.len() - 8,
            packet.len() - 8
        )));
    }
    Ok(Datagram::Reply)
}

/// The TTL or hop limit in the first control message of `control`, if it
/// is one (`IP_TTL` or `IPV6_HOPLIMIT`, an `int`), read without trusting
/// its lengths beyond what was received.
fn hop_limit(control: &[u8], len: usize) -> Option<u8> {
    let control = control.get(..len)?;
    let level_at = std::mem::offset_of!(libc::cmsghdr, cmsg_level);
    let type_at = std::mem::offset_of!(libc::cmsghdr, cmsg_type);
    let data_at = size_of::<libc::cmsghdr>();
    let int = |at: usize| -> Option<i32> {
        let bytes = control.get(at..at + 4)?;
        Some(i32::from_ne_bytes(bytes.try_into().ok()?))
    };
    let (level, kind, value) = (int(level_at)?, int(type_at)?, int(data_at)?);
    let known = (level == libc::IPPROTO_IP && kind == libc::IP_TTL)
        || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_HOPLIMIT);
    if !known {
        return None;
    }
    u8::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_message_is_read_only_within_what_arrived() {
        let mut control = vec![0u8; 64];
        let level_at = std::mem::offset_of!(libc::cmsghdr, cmsg_level);
        let type_at = std::mem::offset_of!(libc::cmsghdr, cmsg_type);
        let data_at = size_of::<libc::cmsghdr>();
        control[level_at..level_at + 4].copy_from_slice(&libc::IPPROTO_IPV6.to_ne_bytes());
        control[type_at..type_at + 4].copy_from_slice(&libc::IPV6_HOPLIMIT.to_ne_bytes());
        control[data_at..data_at + 4].copy_from_slice(&64i32.to_ne_bytes());
        assert_eq!(hop_limit(&control, data_at + 4), Some(64));
        assert_eq!(hop_limit(&control, data_at + 3), None);
        assert_eq!(hop_limit(&control, 0), None);
        assert_eq!(hop_limit(&control, 1000), None);
        control[data_at..data_at + 4].copy_from_slice(&300i32.to_ne_bytes());
        assert_eq!(hop_limit(&control, data_at + 4), None);
        control[type_at..type_at + 4].copy_from_slice(&libc::IPV6_TCLASS.to_ne_bytes());
        assert_eq!(hop_limit(&control, data_at + 4), None);
    }

    /// A reply that is malformed, oversized, of another type, from another
    /// address or with another payload is a failure with its reason; one to
    /// another request is skipped.
    #[test]
    fn replies_that_are_not_ours_are_failures_with_a_reason() {
        let peer: IpAddr = "192.0.2.9".parse().unwrap();
        let packet = [8, 0, 0, 0, 0, 0, 0x12, 0x34, 1, 2, 3, 4];
        let mut reply = packet;
        reply[0] = 0;
        let judged = |source: &str, data: &[u8], truncated| judge(peer, source.parse().ok(), &packet, data, truncated);
        let reason = |r: Result<Datagram, IcmpError>| match r {
            Err(IcmpError::Reply(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(judged("192.0.2.9", &reply, false).unwrap(), Datagram::Reply);
        assert_eq!(judged("::ffff:192.0.2.9", &reply, false).unwrap(), Datagram::Reply);
        assert!(reason(judged("192.0.2.10", &reply, false)).contains("came from 192.0.2.10, not 192.0.2.9"));
        assert!(reason(judged("", &reply, false)).contains("an unknown address"));
        assert!(reason(judged("192.0.2.9", &reply, true)).contains("longer than the 12 bytes sent"));
        let mut longer = reply.to_vec();
        longer.push(0);
        assert!(reason(judged("192.0.2.9", &longer, false)).contains("longer"));
        assert!(reason(judged("192.0.2.9", &reply[..7], false)).contains("malformed reply from 192.0.2.9: 7 bytes"));
        assert!(reason(judged("192.0.2.9", &packet, false)).contains("type 8 code 0"));
        let mut stale = reply;
        stale[7] = 0x35;
        assert_eq!(judged("192.0.2.9", &stale, false).unwrap(), Datagram::Stale);
        let mut other = reply;
        other[11] = 9;
        assert!(reason(judged("192.0.2.9", &other, false)).contains("does not echo the payload sent (4 of 4 bytes)"));
        assert!(reason(judged("192.0.2.9", &reply[..10], false)).contains("(2 of 4 bytes)"));
    }

    #[test]
    fn a_closed_sysctl_is_named_with_the_agent_s_group() {
        let gid = rustix::process::getgid().as_raw();
        for errno in [libc::EACCES, libc::EPERM] {
            let Err(IcmpError::Unavailable(m)) = Err::<(), _>(refused(io::Error::from_raw_os_error(errno))) else {
                panic!("{errno}");
            };
            assert!(m.contains("`net.ipv4.ping_group_range` sysctl"), "{m}");
            assert!(m.contains(&format!("(gid {gid})")), "{m}");
        }
        let other = refused(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        assert!(matches!(other, IcmpError::Connect(m) if m.starts_with("no ping socket: address family")));
    }

    #[test]
    fn names_are_ordered_by_the_preferred_version_and_fallback() {
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let options = |preferred, fallback| Options {
            preferred,
            fallback,
            payload_size: 0,
            dont_fragment: false,
            ttl: None,
        };
        assert_eq!(
            ordered("h", vec![v4, v6], &options(IpProtocol::Ip6, true)).unwrap(),
            vec![v6, v4]
        );
        assert_eq!(
            ordered("h", vec![v4, v6], &options(IpProtocol::Ip4, false)).unwrap(),
            vec![v4]
        );
        assert!(matches!(
            ordered("h", vec![v4], &options(IpProtocol::Ip6, false)),
            Err(IcmpError::Dns(m)) if m.contains("no IPv6 address, and no fallback")
        ));
        assert!(matches!(
            ordered("h", vec![], &options(IpProtocol::Ip6, true)),
            Err(IcmpError::Dns(m)) if m == "h: no address"
        ));
        assert_eq!(
            ordered("h", vec![v4], &options(IpProtocol::Ip6, true)).unwrap(),
            vec![v4]
        );
    }
}
