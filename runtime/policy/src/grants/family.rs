//! Which IP version a probe's connections use (`grants.ip_protocol`,
//! blackbox_exporter's `preferred_ip_protocol` and `ip_protocol_fallback`):
//! the addresses a name leads to, put in order, and with no fallback
//! narrowed to that version alone.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// An IP version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4 (`ip4`).
    V4,
    /// IPv6 (`ip6`).
    V6,
}

impl IpVersion {
    /// Whether `addr` is of this version (an IPv4-mapped IPv6 address is
    /// IPv4, as the grant check reads it).
    pub fn holds(self, addr: &SocketAddr) -> bool {
        let v4 = match addr {
            SocketAddr::V4(_) => true,
            SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
        };
        v4 == (self == IpVersion::V4)
    }
}

impl fmt::Display for IpVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpVersion::V4 => "ip4",
            IpVersion::V6 => "ip6",
        })
    }
}

/// A value that is not `ip4` or `ip6`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP version: give ip4 or ip6")]
pub struct IpVersionError(pub String);

impl FromStr for IpVersion {
    type Err = IpVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ip4" => Ok(IpVersion::V4),
            "ip6" => Ok(IpVersion::V6),
            other => Err(IpVersionError(other.to_string())),
        }
    }
}

/// The version a probe prefers, and whether the other may answer when the
/// preferred one has no address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpProtocol {
    /// Tried first.
    pub prefer: IpVersion,
    /// Whether addresses of the other version are tried after (blackbox's
    /// default, `true`) or left out.
    pub fallback: bool,
}

impl IpProtocol {
    /// `addrs` (the resolver's order) with the preferred version first, in
    /// its order; without fallback, that version's alone (possibly none).
    pub fn arrange(self, addrs: &mut Vec<SocketAddr>) {
        let (mut preferred, other): (Vec<_>, Vec<_>) = addrs.drain(..).partition(|a| self.prefer.holds(a));
        if self.fallback {
            preferred.extend(other);
        }
        *addrs = preferred;
    }

    /// Whether a connection already open to `peer` fits: any does with
    /// fallback, else one of the preferred version.
    pub fn permits(self, peer: &SocketAddr) -> bool {
        self.fallback || self.prefer.holds(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_put_in_order_and_narrowed_without_fallback() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let resolved = vec![
            a("[::1]:80"),
            a("127.0.0.1:80"),
            a("[2001:db8::1]:80"),
            a("[::ffff:10.0.0.1]:80"),
        ];
        let mut v4 = resolved.clone();
        IpProtocol {
            prefer: IpVersion::V4,
            fallback: true,
        }
        .arrange(&mut v4);
        assert_eq!(
            v4,
            [
                a("127.0.0.1:80"),
                a("[::ffff:10.0.0.1]:80"),
                a("[::1]:80"),
                a("[2001:db8::1]:80")
            ]
        );
        let mut only6 = resolved.clone();
        IpProtocol {
            prefer: IpVersion::V6,
            fallback: false,
        }
        .arrange(&mut only6);
        assert_eq!(only6, [a("[::1]:80"), a("[2001:db8::1]:80")]);
        let mut none = vec![a("127.0.0.1:80")];
        IpProtocol {
            prefer: IpVersion::V6,
            fallback: false,
        }
        .arrange(&mut none);
        assert!(none.is_empty());
        assert!(
            !IpProtocol {
                prefer: IpVersion::V6,
                fallback: false
            }
            .permits(&a("127.0.0.1:80"))
        );
        assert!(
            IpProtocol {
                prefer: IpVersion::V6,
                fallback: true
            }
            .permits(&a("127.0.0.1:80"))
        );
    }

    #[test]
    fn versions_read_as_blackbox_writes_them() {
        assert_eq!("ip4".parse(), Ok(IpVersion::V4));
        assert_eq!("ip6".parse(), Ok(IpVersion::V6));
        assert_eq!(
            "ipv4".parse::<IpVersion>().unwrap_err().to_string(),
            "\"ipv4\" is not an IP version: give ip4 or ip6"
        );
    }
}
