//! The grants as configured: the `net` patterns (`HOST:PORT`, parsed into
//! [`NetPattern`]), a host in its canonical form ([`Host`]), path
//! containment ([`path_within`]) and a probe's [`Grants`]. Parsing and
//! matching only; the per-call check that uses them is [`super::call`].

use crate::reach::Reach;
use std::fmt;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// A bad grant or target.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrantError {
    /// A `net` pattern that does not parse.
    #[error(
        "net grant {pattern:?}: {why} (expected HOST:PORT, where HOST is a name, `*.domain`, an IP, a CIDR or `*`, and PORT a number or `*`)"
    )]
    Net {
        /// The pattern as written.
        pattern: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A target that does not parse.
    #[error("target {target:?}: {why} (expected HOST:PORT or an http(s) URL)")]
    Target {
        /// The target as written.
        target: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// The host part of a `net` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum HostPattern {
    /// `*`: any host.
    Any,
    /// A DNS name, lower case, without a trailing dot.
    Name(String),
    /// `*.domain`: any name under `domain` (not `domain` itself).
    Suffix(String),
    /// An IP network: an address with a prefix length (`/32` or `/128` for
    /// a single address).
    Cidr(IpAddr, u8),
}

/// The port part of a `net` pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PortPattern {
    Any,
    Exact(u16),
}

impl PortPattern {
    pub(super) fn matches(self, port: u16) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(p) => p == port,
        }
    }
}

/// One `net` grant: `HOST:PORT` where HOST is a name, `*.domain`, an IP
/// (`[v6]` in brackets), a CIDR (`10.0.0.0/8`) or `*`, and PORT a number or
/// `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetPattern {
    pub(super) host: HostPattern,
    pub(super) port: PortPattern,
    pub(super) text: String,
}

impl fmt::Display for NetPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A name as patterns keep it: lower case, without a trailing dot.
fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Splits `host:port` (with `[v6]:port` brackets) into its two parts.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, rest) = rest.split_once(']')?;
        return match rest {
            "" => Some((host, None)),
            _ => Some((host, Some(rest.strip_prefix(':')?))),
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 address without brackets has several colons.
        Some((host, _)) if host.contains(':') => Some((s, None)),
        Some((host, port)) => Some((host, Some(port))),
        None => Some((s, None)),
    }
}

impl FromStr for NetPattern {
    type Err = GrantError;

    fn from_str(s: &str) -> Result<Self, GrantError> {
        let err = |why| GrantError::Net {
            pattern: s.to_string(),
            why,
        };
        let (host, port) = split_host_port(s.trim()).ok_or_else(|| err("unbalanced brackets"))?;
        let port = match port {
            None => return Err(err("no port")),
            Some("*") => PortPattern::Any,
            Some(p) => PortPattern::Exact(p.parse().map_err(|_| err("the port is not a number from 0 to 65535"))?),
        };
        let host = if host == "*" {
            HostPattern::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            if !valid_name(domain) {
                return Err(err("the domain after `*.` is not a valid DNS name"));
            }
            HostPattern::Suffix(normalize_name(domain))
        } else if let Some((ip, len)) = host.split_once('/') {
            let ip: IpAddr = ip.parse().map_err(|_| err("the CIDR's address is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| err("the CIDR's prefix length is out of range"))?;
            HostPattern::Cidr(ip, len)
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            HostPattern::Cidr(ip, if ip.is_ipv4() { 32 } else { 128 })
        } else if let Host::Ip(ip) = Host::parse(host) {
            // `127.1`, `0177.0.0.1`: an address however it is spelled.
            HostPattern::Cidr(ip, if ip.is_ipv4() { 32 } else { 128 })
        } else if matches!(Host::parse(host), Host::Numeric) {
            return Err(err("the host is a number but not an IP address"));
        } else if valid_name(host) {
            HostPattern::Name(normalize_name(host))
        } else {
            return Err(err("the host is not a DNS name, an IP address, a CIDR or `*`"));
        };
        Ok(Self {
            host,
            port,
            text: s.trim().to_string(),
        })
    }
}

/// Whether the address `ip`, in canonical form ([`canonical_ip`]), is in the
/// network `net/len`. An address of one family is never in a network of the
/// other: an IPv6 network, even `::/0` or one in the v4-mapped range, never
/// holds an IPv4 address, so reaching IPv4 takes an IPv4 grant.
fn in_cidr(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// An address in the form every comparison uses: a v4-mapped IPv6 address
/// (`::ffff:127.0.0.1`) is its IPv4 address, since a connection to it
/// reaches that IPv4 address.
pub(super) fn canonical_ip(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// A host as a plugin or an operator names it, in the one canonical form
/// every comparison and every connection uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host<'a> {
    /// An address: an IPv6 literal (bracketed or not) or any spelling a
    /// resolver takes for an IPv4 address (`127.0.0.1`, `0177.0.0.1`,
    /// `127.1`, `0x7f.1`, `2130706433`, with or without a trailing dot),
    /// a v4-mapped IPv6 address as its IPv4 address.
    Ip(IpAddr),
    /// A DNS name, as written (the comparisons ignore case and a trailing
    /// dot).
    Name(&'a str),
    /// Looks like a number but is no address (`999.1.1.1`, `1.2.3.4.5`):
    /// neither a name nor an address, so only `*` covers it.
    Numeric,
}

impl<'a> Host<'a> {
    /// Parses `host`: the one place where a host's spelling becomes an
    /// address or a name.
    pub fn parse(host: &'a str) -> Self {
        if let Some(bare) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return match bare.parse::<IpAddr>() {
                Ok(ip) => Self::Ip(canonical_ip(ip)),
                Err(_) => Self::Numeric,
            };
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Self::Ip(canonical_ip(ip));
        }
        let name = host.strip_suffix('.').unwrap_or(host);
        if looks_numeric(name) {
            return match inet_aton(name) {
                Some(v4) => Self::Ip(IpAddr::V4(v4)),
                None => Self::Numeric,
            };
        }
        Self::Name(name)
    }

    /// The address, if `self` is one.
    pub fn ip(self) -> Option<IpAddr> {
        match self {
            Self::Ip(ip) => Some(ip),
            _ => None,
        }
    }
}

/// The address `host` names, if it names one in any spelling
/// ([`Host::parse`]); what the host connects to instead of asking a
/// resolver, so that what is checked is what is reached.
pub fn host_address(host: &str) -> Option<IpAddr> {
    Host::parse(host).ip()
}

/// Whether every dot-separated part of `host` is a number as `inet_aton`
/// reads one (decimal, `0` octal or `0x` hex): such a host is never a
/// name, whether or not it is a valid address.
fn looks_numeric(host: &str) -> bool {
    !host.is_empty()
        && host.split('.').all(|part| {
            let hex = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X"));
            match hex {
                Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
                None => !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()),
            }
        })
}

/// An IPv4 address in the forms `inet_aton` (and so a system resolver, and
/// the WHATWG URL parser) takes: one to four parts, each decimal, octal
/// (a leading `0`) or hex (`0x`); the last part fills the bytes the others
/// leave (`127.1` is 127.0.0.1, `2130706433` too).
fn inet_aton(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(4);
    for part in &parts {
        let value = if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            if h.is_empty() {
                0
            } else {
                u64::from_str_radix(h, 16).ok()?
            }
        } else if part.len() > 1 && part.starts_with('0') {
            u64::from_str_radix(&part[1..], 8).ok()?
        } else {
            part.parse::<u64>().ok()?
        };
        values.push(value);
    }
    let (last, head) = values.split_last()?;
    let mut n: u64 = 0;
    for (i, v) in head.iter().enumerate() {
        if *v > 0xff {
            return None;
        }
        n |= v << (24 - 8 * i);
    }
    let room = 32 - 8 * head.len() as u32;
    if room < 64 && *last >> room != 0 {
        return None;
    }
    Some(std::net::Ipv4Addr::from((n | last) as u32))
}

/// Whether `name` (any case, no trailing dot) is a strict subdomain of
/// `domain` (lower case).
fn under(name: &str, domain: &str) -> bool {
    name.len() > domain.len() + 1
        && name.as_bytes()[name.len() - domain.len() - 1] == b'.'
        && name.as_bytes()[name.len() - domain.len()..].eq_ignore_ascii_case(domain.as_bytes())
}

impl PortPattern {
    /// Whether every port `self` matches, `ceiling` matches too.
    fn within(self, ceiling: Self) -> bool {
        match (self, ceiling) {
            (_, Self::Any) => true,
            (Self::Exact(g), Self::Exact(c)) => g == c,
            (Self::Any, Self::Exact(_)) => false,
        }
    }
}

impl HostPattern {
    pub(super) fn matches(&self, host: &Host<'_>) -> bool {
        match (self, host) {
            (Self::Any, _) => true,
            (Self::Name(n), Host::Name(name)) => n.eq_ignore_ascii_case(name),
            (Self::Suffix(d), Host::Name(name)) => under(name, d),
            (Self::Cidr(net, len), Host::Ip(ip)) => in_cidr(*net, *len, *ip),
            // An address is never a name, nor a name an address: a name may
            // resolve to anything, and an address literal is reached as is.
            (Self::Name(_) | Self::Suffix(_), Host::Ip(_)) | (Self::Cidr(..), Host::Name(_)) => false,
            (_, Host::Numeric) => false,
        }
    }

    /// Whether every host `self` matches, `ceiling` matches too.
    ///
    /// `*` is only within `*`; a name is within the same name or a
    /// `*.domain` it is under; `*.a.b` is within `*.a.b` or `*.b`, never
    /// within a plain name; a CIDR is within a CIDR of its family that
    /// contains it. Names and CIDRs never cover each other: a name may
    /// resolve to any address.
    fn within(&self, ceiling: &Self) -> bool {
        match (self, ceiling) {
            (_, Self::Any) => true,
            (Self::Any, _) => false,
            (Self::Name(g), Self::Name(c)) => g == c,
            (Self::Name(g), Self::Suffix(d)) => under(g, d),
            (Self::Suffix(g), Self::Suffix(d)) => g == d || under(g, d),
            (Self::Suffix(_), Self::Name(_)) => false,
            (Self::Cidr(g, glen), Self::Cidr(c, clen)) => glen >= clen && in_cidr(*c, *clen, *g),
            (Self::Cidr(..), _) | (_, Self::Cidr(..)) => false,
        }
    }
}

impl NetPattern {
    /// Whether every address this pattern matches, `ceiling` matches too
    /// (a tenant's `net` ceiling, `sonde_core::tenants`): the host within the
    /// ceiling's host, and `*` ports only within `*`.
    pub fn within(&self, ceiling: &NetPattern) -> bool {
        self.port.within(ceiling.port) && self.host.within(&ceiling.host)
    }

    /// The pattern that grants exactly a probe's target: `host:port` (any
    /// port if the target has none), or an http(s) URL's host and port.
    pub fn for_target(target: &str) -> Result<Self, GrantError> {
        let err = |why| GrantError::Target {
            target: target.to_string(),
            why,
        };
        let target = target.trim();
        let (authority, default_port) = if let Some((scheme, rest)) = target.split_once("://") {
            let port = match scheme.to_ascii_lowercase().as_str() {
                "http" => 80,
                "https" => 443,
                _ => return Err(err("unsupported URL scheme")),
            };
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..end];
            // Drop any user-info: it names no host.
            (authority.rsplit_once('@').map_or(authority, |(_, a)| a), Some(port))
        } else {
            (target, None)
        };
        if authority.is_empty() {
            return Err(err("no host"));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| err("unbalanced brackets"))?;
        let port = match (port, default_port) {
            (Some(p), _) => p
                .parse::<u16>()
                .map_err(|_| err("the port is not a number from 0 to 65535"))?
                .to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) => "*".to_string(),
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        if host == "*" || host.starts_with("*.") || host.contains('/') {
            return Err(err("a target names one host, not a pattern"));
        }
        format!("{host}:{port}")
            .parse()
            .map_err(|_| err("the host is not a DNS name or an IP address"))
    }

    pub(super) fn matches(&self, host: &Host<'_>, port: u16) -> bool {
        self.port.matches(port) && self.host.matches(host)
    }

    /// Whether this pattern alone lets a plugin reach `host` (as the plugin
    /// wrote it: `[::1]`, `DB.local.`, `::ffff:10.0.0.1`) on `port`: the
    /// comparison the one grant check makes, for property tests.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        self.matches(&Host::parse(host), port)
    }
}

/// Whether `path` is one of `allowed` or under one of them. A path with
/// `.` or `..` in it is never within (it could climb out); symbolic links
/// are resolved on both sides where the paths exist, so a link inside an
/// allowed directory that points out of it is not within either.
pub fn path_within(path: &Path, allowed: &[PathBuf]) -> bool {
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return false;
    }
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    allowed.iter().any(|a| {
        let real_a = std::fs::canonicalize(a).unwrap_or_else(|_| a.clone());
        path.starts_with(a) && real.starts_with(&real_a)
    })
}

/// A probe's grants beyond its target, as configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Extra hosts and ports the plugin may connect to (`grants.net`).
    pub net: Vec<NetPattern>,
    /// Host paths the plugin may read, mounted read-only at the same path
    /// (`grants.files`).
    pub files: Vec<PathBuf>,
    /// Programs (absolute paths) the host may run for the plugin
    /// (`grants.exec`).
    pub exec: Vec<PathBuf>,
    /// The environment of those programs (`grants.env`); empty by default.
    pub env: Vec<(String, String)>,
    /// What the probe's names may lead to, and whether it may reach the
    /// agent's own listeners: its tenant's ([`crate::reach`]); the
    /// operator's by default.
    pub reach: Reach,
    /// The secrets the plugin may have the host put on the wire
    /// (`grants.secrets`), each its tenant's ([`crate::secrets`]).
    pub secrets: crate::secrets::SecretGrants,
    /// The IP version its connections prefer, and whether the other may
    /// answer (`grants.ip_protocol`, `grants.ip_protocol_fallback`); none:
    /// the resolver's order, either version.
    pub ip_protocol: Option<super::IpProtocol>,
}
