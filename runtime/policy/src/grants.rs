//! What a probe may reach: its target, plus the `net` patterns and read-only
//! `files` the operator granted. [`Grants`] is the parsed configuration;
//! [`CallGrants`] is its per-call form, and [`CallGrants::authorize`] the one
//! check every capability makes before it acts on a plugin's behalf
//! (`Use::Http`, `Use::Exec`…), recording each denial the same way.
//!
//! Addresses are compared in canonical form: a v4-mapped IPv6 address is its
//! IPv4 address, and an IPv6 network never covers an IPv4 address. The
//! containment of one pattern in another ([`NetPattern::within`], for tenant
//! ceilings) and of a path in granted paths ([`path_within`]) live here too,
//! so the matching rules exist once.

use crate::reach::{self, OwnListeners, Reach};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

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
enum HostPattern {
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
enum PortPattern {
    Any,
    Exact(u16),
}

impl PortPattern {
    fn matches(self, port: u16) -> bool {
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
    host: HostPattern,
    port: PortPattern,
    text: String,
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
fn canonical_ip(ip: IpAddr) -> IpAddr {
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
    fn matches(&self, host: &Host<'_>) -> bool {
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

    fn matches(&self, host: &Host<'_>, port: u16) -> bool {
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
}

/// The most denials one call keeps; the rest are counted.
const MAX_DENIALS: usize = 8;

/// One use of a capability, as the host is about to make it for a plugin:
/// what [`CallGrants::authorize`] decides on.
#[derive(Clone, Copy, Debug)]
pub enum Use<'a> {
    /// `wasi:sockets`: looking up a name.
    Lookup(&'a str),
    /// `wasi:sockets`: a TCP connect, or a UDP send or receive.
    Connect(SocketAddr),
    /// `wasi:sockets`: binding a local address (port 0 only: a plugin
    /// holds no fixed port).
    Bind(SocketAddr),
    /// `wasi:sockets`: listening or accepting (never).
    Listen(SocketAddr),
    /// An HTTP request, through `wasi:http` or sonde's `http`.
    Http {
        /// The URL's host.
        host: &'a str,
        /// Its port, the scheme's default filled in.
        port: u16,
    },
    /// A connection by sonde's `tcp`.
    Tcp {
        /// The host to dial.
        host: &'a str,
        /// The port.
        port: u16,
    },
    /// A handshake by sonde's `tls`.
    Tls {
        /// The host to dial.
        host: &'a str,
        /// The port.
        port: u16,
    },
    /// A call by sonde's `grpc`.
    Grpc {
        /// The authority's host.
        host: &'a str,
        /// Its port.
        port: u16,
    },
    /// Running a program by sonde's `exec`.
    Exec(&'a str),
    /// A `wasi:filesystem` path operation inside a `files` grant that the
    /// filesystem refused before making it: the path leads outside the
    /// grant, or names what is not a regular file or directory.
    FileRefused {
        /// The descriptor method, such as `open-at`.
        method: &'a str,
        /// The path it names.
        path: &'a str,
        /// Why it is refused (`leads outside the files grant`, `a FIFO`).
        why: &'a str,
    },
    /// A `wasi:filesystem` path operation (`method`) on `path`.
    File {
        /// The descriptor method, such as `open-at`.
        method: &'a str,
        /// The path it names, if any.
        path: Option<&'a str>,
    },
}

/// Why a use of a capability is refused.
#[derive(Debug)]
enum Refusal {
    /// Nothing grants it.
    NotGranted,
    /// A rule refuses it; the words say which.
    Because(String),
}

/// What `what` is, as a denial names it: `TCP connection to db:5432`.
fn describe(what: Use<'_>) -> String {
    match what {
        Use::Lookup(name) => format!("look up {name:?}"),
        Use::Connect(addr) => format!("connect to {addr}"),
        Use::Bind(addr) => format!("bind {addr}"),
        Use::Listen(addr) => format!("listen on {addr}"),
        Use::Http { host, port } => format!("HTTP request to {host}:{port}"),
        Use::Tcp { host, port } => format!("TCP connection to {host}:{port}"),
        Use::Tls { host, port } => format!("TLS handshake with {host}:{port}"),
        Use::Grpc { host, port } => format!("gRPC call to {host}:{port}"),
        Use::Exec(program) => format!("exec {program}"),
        Use::FileRefused { method, path, .. } => format!("filesystem {method} {path}"),
        Use::File { method, path } => {
            format!(
                "filesystem {method} /{}",
                path.unwrap_or_default().trim_start_matches('/')
            )
        }
    }
}

impl<'a> Use<'a> {
    /// The host and port a connection for this use goes to: for `http`,
    /// `tcp`, `tls` and `grpc`.
    pub fn authority(self) -> Option<(&'a str, u16)> {
        match self {
            Use::Http { host, port } | Use::Tcp { host, port } | Use::Tls { host, port } | Use::Grpc { host, port } => {
                Some((host, port))
            }
            _ => None,
        }
    }
}

/// A use of a capability the grants do not allow; it has been recorded.
/// The message is what the plugin is told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

/// The most addresses one call's `wasi:sockets` lookups may add to what it
/// may connect to (and the most refused ones kept to explain a denial).
const MAX_RESOLVED: usize = 256;

/// The grants of one call, consulted by every host capability through
/// [`CallGrants::authorize`] (what a plugin asks for) and
/// [`CallGrants::authorize_peer`] (the address a connection is about to
/// reach). Names the plugin resolves through a granted pattern extend what
/// it may connect to, so a name grant covers the addresses the name
/// resolved to in this call — those a name may lead to ([`crate::reach`]).
#[derive(Debug)]
pub struct CallGrants {
    target: Option<NetPattern>,
    config: Arc<Grants>,
    /// The agent's own listeners, which the engine keeps.
    listeners: Arc<OwnListeners>,
    resolved: Mutex<Resolved>,
    denials: Mutex<(Vec<String>, usize)>,
}

/// What this call's `wasi:sockets` lookups found: the addresses admitted
/// (with the ports the name was granted for) and, to explain a later
/// connection to one, those refused.
#[derive(Debug, Default)]
struct Resolved {
    admitted: Vec<(IpAddr, PortPattern)>,
    refused: Vec<(IpAddr, String)>,
}

impl CallGrants {
    /// The grants of one call of a probe whose target is `target`, on an
    /// agent listening on `listeners`.
    pub fn new(target: Option<NetPattern>, config: Arc<Grants>, listeners: Arc<OwnListeners>) -> Self {
        Self {
            target,
            config,
            listeners,
            resolved: Mutex::new(Resolved::default()),
            denials: Mutex::new((Vec::new(), 0)),
        }
    }

    /// The probe's grants as configured.
    pub fn config(&self) -> &Grants {
        &self.config
    }

    fn patterns(&self) -> impl Iterator<Item = &NetPattern> {
        self.target.iter().chain(&self.config.net)
    }

    /// The one grant check: whether the plugin may make `what`. A refusal
    /// is recorded (so the run is reported as `denied` whatever the plugin
    /// makes of it) and returned with the message for the plugin.
    pub fn authorize(&self, what: Use<'_>) -> Result<(), Denied> {
        match self.refusal(what) {
            None => Ok(()),
            Some(refusal) => Err(self.refuse(what, refusal)),
        }
    }

    fn refusal(&self, what: Use<'_>) -> Option<Refusal> {
        let allowed = match what {
            Use::Lookup(name) => {
                let host = Host::parse(name);
                self.patterns().any(|p| p.host.matches(&host))
            }
            // A plugin's own socket: the address is all there is to check.
            Use::Connect(addr) => return self.peer_refusal(None, addr),
            Use::Bind(addr) => addr.port() == 0,
            Use::Listen(_) => false,
            Use::Http { host, port } | Use::Tcp { host, port } | Use::Tls { host, port } | Use::Grpc { host, port } => {
                let host = Host::parse(host);
                self.patterns().any(|p| p.matches(&host, port))
            }
            Use::Exec(program) => {
                let path = Path::new(program);
                path.is_absolute() && self.config.exec.iter().any(|p| p == path)
            }
            // The filesystem shows only the granted paths, read-only; a path
            // operation reaches this check only where none is granted.
            Use::File { .. } | Use::FileRefused { .. } => false,
        };
        (!allowed).then_some(Refusal::NotGranted)
    }

    /// Records `what` as refused, and returns the denial for the plugin.
    fn refuse(&self, what: Use<'_>, refusal: Refusal) -> Denied {
        let not_granted = "not the target and not granted";
        let (reason, tell) = match (refusal, what) {
            (Refusal::Because(why), _) => (why.clone(), why),
            (_, Use::Lookup(name)) => (not_granted.into(), format!("{name:?} is {not_granted}")),
            (_, Use::Connect(addr)) => (not_granted.into(), format!("{addr} is {not_granted}")),
            (_, Use::Bind(addr)) => (
                "only port 0 may be bound".into(),
                format!("binding {addr} is not allowed"),
            ),
            (_, Use::Listen(addr)) => (
                "a plugin never listens".into(),
                format!("listening on {addr} is not allowed"),
            ),
            (
                _,
                Use::Http { host, port } | Use::Tcp { host, port } | Use::Tls { host, port } | Use::Grpc { host, port },
            ) => (not_granted.into(), format!("{host}:{port} is {not_granted}")),
            (_, Use::Exec(program)) => (
                "not granted".into(),
                format!("{program} is not in the probe's exec grant"),
            ),
            (_, Use::FileRefused { path, why, .. }) => (why.to_string(), format!("{path}: {why}")),
            (_, Use::File { path, .. }) => (
                "no `files` granted".into(),
                format!(
                    "/{} is not in the probe's files grant",
                    path.unwrap_or_default().trim_start_matches('/')
                ),
            ),
        };
        self.record(format!("{}: {reason}", describe(what)));
        Denied(tell)
    }

    /// Whether a pattern that names addresses (an IP, a CIDR or `*`) lets
    /// the probe reach `ip` on `port`; `explicit` leaves `*` out.
    fn address_granted(&self, ip: IpAddr, port: u16, explicit: bool) -> bool {
        let host = Host::Ip(canonical_ip(ip));
        self.patterns()
            .filter(|p| !explicit || matches!(p.host, HostPattern::Cidr(..)))
            .any(|p| p.matches(&host, port))
    }

    /// Why a connection to `addr` may not be made, or `None` if it may:
    /// the rule every connection a plugin makes the host open obeys, by
    /// any path. `name` is the name `addr` was resolved from by the host,
    /// if it was; a plugin's own socket connects to an address, which its
    /// own lookups in this call may have admitted.
    ///
    /// The agent's own listeners come first: never a tenant's, and the
    /// operator's only through an IP or CIDR grant. Then an address grant
    /// (IP, CIDR or `*`) reaches any address it covers, and a granted name
    /// only the addresses its [`Reach`] allows.
    fn peer_refusal(&self, name: Option<&str>, addr: SocketAddr) -> Option<Refusal> {
        let (ip, port) = (canonical_ip(addr.ip()), addr.port());
        let shown = SocketAddr::new(ip, port);
        if let Some(listener) = self.listeners.reached_by(shown) {
            let via = name.map_or_else(String::new, |n| format!("{n} resolved to {ip}: "));
            if !self.config.reach.own_listeners {
                return Some(Refusal::Because(format!(
                    "{via}{shown} reaches the agent's own listener {listener}, which no tenant's probe may reach"
                )));
            }
            if !self.address_granted(ip, port, true) {
                return Some(Refusal::Because(format!(
                    "{via}{shown} reaches the agent's own listener {listener}: only an IP or CIDR grant of it reaches it, not a name or `*`"
                )));
            }
            return None;
        }
        if self.address_granted(ip, port, false) {
            return None;
        }
        match name {
            Some(name) => {
                let host = Host::parse(name);
                if !self.patterns().any(|p| p.matches(&host, port)) {
                    return Some(Refusal::NotGranted);
                }
                reach::name_refusal(self.config.reach, name, ip).map(Refusal::Because)
            }
            None => {
                let resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
                if resolved.admitted.iter().any(|(r, p)| *r == ip && p.matches(port)) {
                    return None;
                }
                let refused = resolved.refused.iter().find(|(r, _)| *r == ip);
                Some(refused.map_or(Refusal::NotGranted, |(_, why)| Refusal::Because(why.clone())))
            }
        }
    }

    /// The one check of the addresses a connection is about to try, by any
    /// path (the host's `tcp`, `tls`, `http` and `grpc`, `wasi:http`): those
    /// of `candidates` (the addresses `name` resolved to, in the resolver's
    /// order, or the one address the plugin wrote) that
    /// [`Self::peer_refusal`] allows, in order and in canonical form. When
    /// none is allowed, the first refusal is recorded as the denial of
    /// `what`; addresses left out while another is allowed are not (a name
    /// may resolve to several, and the host connects only to one it
    /// checked).
    pub fn authorize_peer(
        &self,
        what: Use<'_>,
        name: Option<&str>,
        candidates: &[SocketAddr],
    ) -> Result<Vec<SocketAddr>, Denied> {
        let mut allowed = Vec::with_capacity(candidates.len());
        let mut first_refusal = None;
        for addr in candidates {
            match self.peer_refusal(name, *addr) {
                None => allowed.push(SocketAddr::new(canonical_ip(addr.ip()), addr.port())),
                Some(refusal) => {
                    tracing::debug!(name, %addr, ?refusal, "address left out");
                    first_refusal.get_or_insert(refusal);
                }
            }
        }
        if !allowed.is_empty() {
            return Ok(allowed);
        }
        let refusal = first_refusal
            .unwrap_or_else(|| Refusal::Because(format!("{} resolved to no address", name.unwrap_or("the host"))));
        Err(self.refuse(what, refusal))
    }

    /// Whether a connection already open to `peer` (a pooled one, opened
    /// for the name `name` by another call) may serve this call: the same
    /// rule as [`Self::authorize_peer`], recording nothing (a refused
    /// connection is set aside and a new one checked and opened).
    pub fn permits_peer(&self, name: Option<&str>, peer: SocketAddr) -> bool {
        self.peer_refusal(name, peer).is_none()
    }

    /// Admits what a plugin's `wasi:sockets` lookup of the granted `name`
    /// found: the addresses the name may lead to ([`crate::reach`]) are
    /// returned and may be connected to on the ports granted for `name`;
    /// the others are left out. When every address is left out, the first
    /// refusal is recorded as a denial of the lookup.
    pub fn admit_resolved(&self, name: &str, ips: Vec<IpAddr>) -> Result<Vec<IpAddr>, Denied> {
        let host = Host::parse(name);
        let ports: Vec<PortPattern> = self
            .patterns()
            .filter(|p| p.host.matches(&host))
            .map(|p| p.port)
            .collect();
        let mut admitted = Vec::with_capacity(ips.len());
        let mut first_refusal = None;
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        for ip in ips {
            let ip = canonical_ip(ip);
            let refusal = if self.patterns().any(|p| p.host.matches(&Host::Ip(ip))) {
                None
            } else {
                reach::name_refusal(self.config.reach, name, ip)
            };
            match refusal {
                None => {
                    for port in &ports {
                        if resolved.admitted.len() < MAX_RESOLVED && !resolved.admitted.contains(&(ip, *port)) {
                            resolved.admitted.push((ip, *port));
                        }
                    }
                    admitted.push(ip);
                }
                Some(why) => {
                    if resolved.refused.len() < MAX_RESOLVED {
                        resolved.refused.push((ip, why.clone()));
                    }
                    first_refusal.get_or_insert(why);
                }
            }
        }
        drop(resolved);
        match (admitted.is_empty(), first_refusal) {
            (true, Some(why)) => Err(self.refuse(Use::Lookup(name), Refusal::Because(why))),
            _ => Ok(admitted),
        }
    }

    /// Records a denied use of a capability.
    fn record(&self, what: String) {
        let what = crate::text::plugin_text(what, 1024);
        tracing::debug!(denied = %what, "capability denied");
        let mut d = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        if d.0.len() < MAX_DENIALS {
            d.0.push(what);
        }
        d.1 += 1;
    }

    /// The denials recorded so far, as one message, or `None`.
    pub fn denial_message(&self) -> Option<String> {
        let d = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        let (list, total) = (&d.0, d.1);
        let first = list.first()?;
        Some(match total {
            1 => format!("denied: {first}"),
            n => format!("denied: {first} (and {} more)", n - 1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl CallGrants {
        fn allows(&self, what: Use<'_>) -> bool {
            self.refusal(what).is_none()
        }
    }

    fn call(target: &str, net: &[&str]) -> CallGrants {
        let grants = Grants {
            net: net.iter().map(|s| s.parse().unwrap()).collect(),
            ..Grants::default()
        };
        CallGrants::new(
            Some(NetPattern::for_target(target).unwrap()),
            Arc::new(grants),
            Arc::default(),
        )
    }

    fn connect(g: &CallGrants, addr: &str) -> bool {
        g.allows(Use::Connect(addr.parse().unwrap()))
    }

    fn lookup(g: &CallGrants, name: &str) -> bool {
        g.allows(Use::Lookup(name))
    }

    fn http(g: &CallGrants, host: &str, port: u16) -> bool {
        g.allows(Use::Http { host, port })
    }

    fn sock(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A call of a probe with `reach` on an agent listening on `listening`.
    fn call_with(target: &str, net: &[&str], reach: Reach, listening: &[&str]) -> CallGrants {
        let grants = Grants {
            net: net.iter().map(|s| s.parse().unwrap()).collect(),
            reach,
            ..Grants::default()
        };
        let listeners = Arc::new(OwnListeners::default());
        for l in listening {
            listeners.add(sock(l));
        }
        CallGrants::new(
            Some(NetPattern::for_target(target).unwrap()),
            Arc::new(grants),
            listeners,
        )
    }

    fn tcp(host: &str, port: u16) -> Use<'_> {
        Use::Tcp { host, port }
    }

    #[test]
    fn a_name_leads_only_where_an_address_grant_would() {
        let g = call("lo.acme.test:80", &[]);
        let lo = sock("127.0.0.1:80");
        let denied = g
            .authorize_peer(tcp("lo.acme.test", 80), Some("lo.acme.test"), &[lo])
            .unwrap_err();
        let why = "lo.acme.test resolved to 127.0.0.1: loopback is not reachable through a name; grant the address";
        assert_eq!(denied.0, why);
        assert_eq!(
            g.denial_message().unwrap(),
            format!("denied: TCP connection to lo.acme.test:80: {why}")
        );
        // Of several addresses, the first one allowed; those left out are
        // not denials.
        let g = call("mixed.acme.test:80", &[]);
        let picked = g.authorize_peer(
            tcp("mixed.acme.test", 80),
            Some("mixed.acme.test"),
            &[sock("[::ffff:169.254.169.254]:80"), lo, sock("10.0.0.1:80")],
        );
        assert_eq!(picked, Ok(vec![sock("10.0.0.1:80")]));
        assert_eq!(g.denial_message(), None);
        // An address grant reaches the address, whatever name led there;
        // `*` is every address.
        let g = call("lo.acme.test:80", &["127.0.0.1:80"]);
        assert_eq!(
            g.authorize_peer(tcp("lo.acme.test", 80), Some("lo.acme.test"), &[lo]),
            Ok(vec![lo])
        );
        let g = call("lo.acme.test:80", &["*:80"]);
        assert!(g.permits_peer(Some("lo.acme.test"), lo));
        // The name itself must be granted, on that port.
        let g = call("db.acme.test:80", &["127.0.0.1:81"]);
        assert!(!g.permits_peer(Some("other.acme.test"), sock("8.8.8.8:80")));
        assert!(!g.permits_peer(Some("db.acme.test"), sock("8.8.8.8:81")));
        assert!(g.permits_peer(Some("db.acme.test"), sock("8.8.8.8:80")));
    }

    #[test]
    fn a_tenant_s_names_lead_to_public_addresses_unless_its_ceiling_says_more() {
        let private = sock("10.1.2.3:443");
        let public = sock("93.184.216.34:443");
        let g = call_with("www.acme.test:443", &[], Reach::TENANT, &[]);
        assert!(g.permits_peer(Some("www.acme.test"), public));
        assert!(!g.permits_peer(Some("www.acme.test"), private));
        let both = Reach {
            names_private: true,
            ..Reach::TENANT
        };
        let g = call_with("www.acme.test:443", &[], both, &[]);
        assert!(g.permits_peer(Some("www.acme.test"), private));
        let none = Reach {
            names_public: false,
            ..Reach::TENANT
        };
        let g = call_with("www.acme.test:443", &["10.0.0.0/8:443"], none, &[]);
        assert!(!g.permits_peer(Some("www.acme.test"), public));
        assert!(g.permits_peer(Some("www.acme.test"), private), "an address grant");
    }

    #[test]
    fn wasi_lookups_answer_only_where_the_name_may_lead() {
        let g = call("lo.acme.test:6379", &[]);
        let ips = |s: &[&str]| s.iter().map(|a| a.parse().unwrap()).collect::<Vec<IpAddr>>();
        assert_eq!(
            g.admit_resolved("lo.acme.test", ips(&["127.0.0.1", "10.0.0.7", "::1"])),
            Ok(ips(&["10.0.0.7"]))
        );
        assert_eq!(g.denial_message(), None, "left out, not denied");
        assert!(g.allows(Use::Connect(sock("10.0.0.7:6379"))));
        assert!(!g.allows(Use::Connect(sock("10.0.0.7:6380"))));
        // A connection to an address left out says why.
        let denied = g.authorize(Use::Connect(sock("127.0.0.1:6379"))).unwrap_err();
        assert!(
            denied.0.starts_with("lo.acme.test resolved to 127.0.0.1: loopback"),
            "{}",
            denied.0
        );
        // A name that leads only where it may not is a denial of the lookup.
        let g = call("lo.acme.test:6379", &[]);
        assert!(g.admit_resolved("lo.acme.test", ips(&["127.0.0.1"])).is_err());
        assert_eq!(
            g.denial_message().unwrap(),
            "denied: look up \"lo.acme.test\": lo.acme.test resolved to 127.0.0.1: loopback is not reachable through a name; grant the address"
        );
    }

    #[test]
    fn the_agent_s_own_listeners_are_the_operator_s_by_address_only() {
        let api = "127.0.0.1:9464";
        let g = call_with(api, &[], Reach::OPERATOR, &[api]);
        assert!(g.permits_peer(None, sock(api)), "the embedded default config");
        let g = call_with("lo.acme.test:9464", &["*:*"], Reach::OPERATOR, &[api]);
        assert!(!g.permits_peer(Some("lo.acme.test"), sock(api)));
        assert!(!g.permits_peer(None, sock(api)), "`*` is no address grant of it");
        let g = call_with(api, &[], Reach::TENANT, &[api]);
        let denied = g.authorize(Use::Connect(sock(api))).unwrap_err();
        assert_eq!(
            denied.0,
            "127.0.0.1:9464 reaches the agent's own listener 127.0.0.1:9464, which no tenant's probe may reach"
        );
        // A listener on every address is reached through any of the node's.
        let g = call_with("127.0.0.1:1", &["127.0.0.0/8:*"], Reach::TENANT, &["0.0.0.0:9464"]);
        assert!(!g.permits_peer(None, sock("127.0.0.5:9464")));
        assert!(!g.permits_peer(None, sock("[::ffff:127.0.0.1]:9464")));
        assert!(g.permits_peer(None, sock("127.0.0.5:9465")));
    }

    #[test]
    fn target_is_granted_and_nothing_else() {
        let g = call("127.0.0.1:8080", &[]);
        assert!(connect(&g, "127.0.0.1:8080"));
        assert!(!connect(&g, "127.0.0.1:8081"));
        assert!(!connect(&g, "127.0.0.2:8080"));
        assert!(connect(&g, "[::ffff:127.0.0.1]:8080"));
    }

    #[test]
    fn names_grant_what_they_resolve_to() {
        let g = call("localhost:6379", &[]);
        assert!(lookup(&g, "LOCALHOST."));
        assert!(!lookup(&g, "example.com"));
        assert!(!connect(&g, "127.0.0.1:6379"));
        let found = g.admit_resolved("localhost", vec!["127.0.0.1".parse().unwrap()]);
        assert_eq!(found, Ok(vec!["127.0.0.1".parse().unwrap()]), "localhost is loopback");
        assert!(connect(&g, "127.0.0.1:6379"));
        assert!(connect(&g, "[::ffff:127.0.0.1]:6379"));
        assert!(!connect(&g, "127.0.0.1:6380"));
    }

    #[test]
    fn patterns() {
        let g = call(
            "10.0.0.1:80",
            &["*.acme.internal:443", "192.168.0.0/16:*", "[::1]:9000"],
        );
        assert!(lookup(&g, "db.acme.internal"));
        assert!(lookup(&g, "DB.Acme.Internal."));
        assert!(!lookup(&g, "acme.internal"));
        assert!(!lookup(&g, "evilacme.internal"));
        assert!(connect(&g, "192.168.4.5:1"));
        assert!(!connect(&g, "192.169.0.1:1"));
        assert!(connect(&g, "[::1]:9000"));
        assert!(!connect(&g, "8.8.8.8:53"));
        let any_host = call("10.0.0.1:80", &["*:53"]);
        assert!(connect(&any_host, "8.8.8.8:53"));
        assert!(!connect(&any_host, "8.8.8.8:54"));
        assert!(lookup(&any_host, "anything.example"));
        assert!(http(&g, "db.acme.internal", 443));
        assert!(!http(&g, "db.acme.internal", 80));
        assert!(http(&g, "10.0.0.1", 80));
        assert!(http(&g, "[::1]", 9000));
    }

    /// issue 16, escape 1: an IPv6 grant must not reach IPv4 through a
    /// v4-mapped address, by any capability.
    #[test]
    fn a_v4_mapped_address_is_its_ipv4_address() {
        let g = call("10.0.0.1:80", &["[::/0]:8080"]);
        for host in ["::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::FFFF:7f00:1"] {
            for what in [
                Use::Http { host, port: 8080 },
                Use::Tcp { host, port: 8080 },
                Use::Tls { host, port: 8080 },
                Use::Grpc { host, port: 8080 },
            ] {
                assert!(!g.allows(what), "{what:?}");
            }
        }
        assert!(!connect(&g, "[::ffff:127.0.0.1]:8080"));
        assert!(!lookup(&g, "::ffff:127.0.0.1"));
        assert!(http(&g, "::1", 8080));
        assert!(connect(&g, "[2001:db8::1]:8080"));

        // An IPv4 grant reaches the address however it is written.
        let g = call("10.0.0.1:80", &["127.0.0.0/8:8080"]);
        assert!(http(&g, "[::ffff:127.0.0.1]", 8080));
        assert!(g.allows(Use::Tcp {
            host: "::ffff:127.0.0.1",
            port: 8080
        }));
        assert!(connect(&g, "[::ffff:127.0.0.1]:8080"));
        // A grant in the v4-mapped range is IPv6, and grants no IPv4.
        let g = call("10.0.0.1:80", &["[::ffff:127.0.0.0/104]:8080"]);
        assert!(!http(&g, "127.0.0.1", 8080));
        assert!(!http(&g, "::ffff:127.0.0.1", 8080));
        assert!(!connect(&g, "[::ffff:127.0.0.1]:8080"));
    }

    #[test]
    fn an_address_is_not_a_name() {
        let g = call("10.0.0.1:80", &["*.1:80"]);
        assert!(!http(&g, "127.0.0.1", 80));
        assert!(http(&g, "host.1", 80));
    }

    /// issue 16: every spelling a resolver takes for an IPv4 address is
    /// that address, in patterns, targets and the hosts plugins dial.
    #[test]
    fn a_numeric_host_is_an_address_in_every_spelling() {
        let loopback = Some(IpAddr::from([127, 0, 0, 1]));
        for spelled in [
            "127.0.0.1",
            "127.0.0.1.",
            "0177.0.0.1",
            "127.1",
            "127.0.1",
            "0x7f.1",
            "0X7F.0.0.01",
            "2130706433",
            "0x7f000001",
            "[127.0.0.1]",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(host_address(spelled), loopback, "{spelled}");
        }
        for not_an_address in ["999.1.1.1", "1.2.3.4.5", "08.1", "4294967296", "127.256.1"] {
            assert_eq!(Host::parse(not_an_address), Host::Numeric, "{not_an_address}");
        }
        assert_eq!(Host::parse("db.0x7f"), Host::Name("db.0x7f"));
        assert_eq!(Host::parse("0x7g.1"), Host::Name("0x7g.1"));

        let g = call("10.0.0.1:80", &["*.0.1:80", "*.1:80"]);
        for spelled in ["127.0.0.1", "0177.0.0.1", "127.0.1", "2130706433."] {
            assert!(!http(&g, spelled, 80), "{spelled}");
            assert!(!lookup(&g, spelled), "{spelled}");
        }
        assert!(http(&g, "db.0.1", 80));
        // The target, however spelled, is the address it names.
        assert!(http(&g, "0xa.1", 80));
        assert!(http(&g, "167772161", 80));
        let g = call("0177.1:8080", &["10.1:443"]);
        assert!(connect(&g, "127.0.0.1:8080"));
        assert!(connect(&g, "10.0.0.1:443"));
        assert!(http(&g, "127.0.0.1", 8080));
        let e = "999.1.1.1:80".parse::<NetPattern>().unwrap_err();
        assert!(e.to_string().contains("a number but not an IP address"), "{e}");
    }

    #[test]
    fn containment() {
        let within = |g: &str, c: &str| g.parse::<NetPattern>().unwrap().within(&c.parse().unwrap());
        assert!(within("db.acme.internal:5432", "*.acme.internal:*"));
        assert!(!within("db.acme.internal:*", "*.acme.internal:5432"));
        assert!(within("10.1.2.0/24:80", "10.0.0.0/8:80"));
        assert!(!within("10.0.0.0/8:80", "10.1.2.0/24:80"));
        // A pattern in the v4-mapped range is IPv6 (and grants no address,
        // since addresses are compared as IPv4).
        assert!(within("[::ffff:10.1.2.3]:80", "[::/0]:80"));
        assert!(!within("[::ffff:10.1.2.3]:80", "10.0.0.0/8:80"));
        assert!(!within("10.1.2.3:80", "[::/0]:80"));
        assert!(within("[2001:db8::1]:80", "[::/0]:*"));
        assert!(!within("*:80", "10.0.0.0/8:80"));
    }

    #[test]
    fn targets() {
        assert_eq!(
            NetPattern::for_target("http://example.com/x").unwrap().text,
            "example.com:80"
        );
        assert_eq!(
            NetPattern::for_target("https://u:p@[::1]:8443/").unwrap().text,
            "[::1]:8443"
        );
        assert_eq!(NetPattern::for_target("db").unwrap().text, "db:*");
        assert!(NetPattern::for_target("*:80").is_err());
        assert!(NetPattern::for_target("ftp://x").is_err());
        assert!(NetPattern::for_target("host:99999").is_err());
    }

    #[test]
    fn bad_patterns_say_why() {
        let e = "example.com".parse::<NetPattern>().unwrap_err();
        assert!(e.to_string().contains("no port"), "{e}");
        let e = "10.0.0.0/40:1".parse::<NetPattern>().unwrap_err();
        assert!(e.to_string().contains("prefix length"), "{e}");
        assert!("bad host!:1".parse::<NetPattern>().is_err());
    }

    #[test]
    fn tls_handshakes_reach_only_granted_authorities() {
        let g = call("db.internal:5432", &["*.acme.internal:636"]);
        let tls = |host, port| g.authorize(Use::Tls { host, port });
        assert!(tls("db.internal", 5432).is_ok());
        assert!(tls("ldap.acme.internal", 636).is_ok());
        assert_eq!(
            tls("ldap.acme.internal", 443),
            Err(Denied(
                "ldap.acme.internal:443 is not the target and not granted".into()
            ))
        );
        assert!(tls("127.0.0.1", 5432).is_err());
        let message = g.denial_message().unwrap();
        assert!(
            message.starts_with("denied: TLS handshake with ldap.acme.internal:443"),
            "{message}"
        );
        assert!(message.ends_with("(and 1 more)"), "{message}");
    }

    #[test]
    fn exec_runs_only_granted_absolute_paths() {
        let grants = Grants {
            exec: vec!["/bin/true".into()],
            ..Grants::default()
        };
        let g = CallGrants::new(None, Arc::new(grants), Arc::default());
        assert!(g.authorize(Use::Exec("/bin/true")).is_ok());
        assert!(g.authorize(Use::Exec("true")).is_err());
        assert!(g.authorize(Use::Exec("/bin/false")).is_err());
        assert_eq!(
            g.denial_message().unwrap(),
            "denied: exec true: not granted (and 1 more)"
        );
    }

    #[test]
    fn sockets_bind_only_ephemeral_ports_and_never_listen() {
        let g = call("127.0.0.1:80", &[]);
        assert!(g.allows(Use::Bind("0.0.0.0:0".parse().unwrap())));
        assert!(!g.allows(Use::Bind("0.0.0.0:8080".parse().unwrap())));
        assert!(!g.allows(Use::Listen("127.0.0.1:80".parse().unwrap())));
    }

    #[test]
    fn denials_are_kept_and_counted() {
        let g = call("127.0.0.1:1", &[]);
        assert_eq!(g.denial_message(), None);
        for i in 0..20 {
            let _ = g.authorize(Use::Connect(format!("10.0.0.{i}:1").parse().unwrap()));
        }
        assert_eq!(
            g.denial_message().unwrap(),
            "denied: connect to 10.0.0.0:1: not the target and not granted (and 19 more)"
        );
    }
}
