//! What a probe may reach: its target, plus the `net` patterns and read-only
//! `files` the operator granted. [`Grants`] is the parsed configuration;
//! [`CallGrants`] is its per-call form that the host capabilities consult and
//! that records every denial.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
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
pub(crate) enum HostPattern {
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
pub(crate) enum PortPattern {
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

fn in_cidr(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) if net.is_ipv4() => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => return false,
        },
        other => other,
    };
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

impl NetPattern {
    /// Its host part (for tenant ceilings, `crate::tenants`).
    pub(crate) fn host(&self) -> &HostPattern {
        &self.host
    }

    /// Its port part (for tenant ceilings, `crate::tenants`).
    pub(crate) fn port(&self) -> PortPattern {
        self.port
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

    fn matches_name(&self, name: &str) -> bool {
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Name(n) => *n == name,
            HostPattern::Suffix(d) => {
                name.len() > d.len() + 1
                    && name.ends_with(d.as_str())
                    && name.as_bytes()[name.len() - d.len() - 1] == b'.'
            }
            HostPattern::Cidr(net, len) => name.parse::<IpAddr>().is_ok_and(|ip| in_cidr(*net, *len, ip)),
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        match &self.host {
            HostPattern::Any => true,
            HostPattern::Cidr(net, len) => in_cidr(*net, *len, ip),
            HostPattern::Name(_) | HostPattern::Suffix(_) => false,
        }
    }
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
}

/// The most denials one call keeps; the rest are counted.
const MAX_DENIALS: usize = 8;

/// The grants of one call, consulted by every host capability. Names the
/// plugin resolves through a granted pattern extend what it may connect to,
/// so a name grant covers the addresses the name resolved to in this call.
#[derive(Debug)]
pub(crate) struct CallGrants {
    target: Option<NetPattern>,
    config: Arc<Grants>,
    resolved: Mutex<Vec<(IpAddr, PortPattern)>>,
    denials: Mutex<(Vec<String>, usize)>,
}

impl CallGrants {
    pub(crate) fn new(target: Option<NetPattern>, config: Arc<Grants>) -> Self {
        Self {
            target,
            config,
            resolved: Mutex::new(Vec::new()),
            denials: Mutex::new((Vec::new(), 0)),
        }
    }

    /// The probe's grants as configured.
    pub(crate) fn config(&self) -> &Grants {
        &self.config
    }

    fn patterns(&self) -> impl Iterator<Item = &NetPattern> {
        self.target.iter().chain(&self.config.net)
    }

    /// Whether the plugin may look up `name`.
    pub(crate) fn allows_lookup(&self, name: &str) -> bool {
        let name = normalize_name(name);
        self.patterns().any(|p| p.matches_name(&name))
    }

    /// Records that `name` resolved to `ip`: the ports granted for `name`
    /// now also hold for `ip`.
    pub(crate) fn note_resolved(&self, name: &str, ip: IpAddr) {
        let name = normalize_name(name);
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        for p in self.patterns().filter(|p| p.matches_name(&name)) {
            if resolved.len() < 256 && !resolved.contains(&(ip, p.port)) {
                resolved.push((ip, p.port));
            }
        }
    }

    /// Whether the plugin may connect to `addr`.
    pub(crate) fn allows_addr(&self, addr: SocketAddr) -> bool {
        let (ip, port) = (addr.ip().to_canonical(), addr.port());
        if self.patterns().any(|p| p.port.matches(port) && p.matches_ip(ip)) {
            return true;
        }
        let resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        resolved.iter().any(|(r, p)| r.to_canonical() == ip && p.matches(port))
    }

    /// Whether the host may open an HTTP connection to `host:port` for the
    /// plugin.
    fn allows_authority(&self, host: &str, port: u16) -> bool {
        let host = normalize_name(host.trim_start_matches('[').trim_end_matches(']'));
        self.patterns().any(|p| p.port.matches(port) && p.matches_name(&host))
    }

    /// Checks an HTTP request to `host:port` (either transport) and records
    /// the denial when it is not allowed; the error is the plugin's message.
    pub(crate) fn authorize_http(&self, host: &str, port: u16) -> Result<(), String> {
        if self.allows_authority(host, port) {
            return Ok(());
        }
        self.deny(format!("HTTP request to {host}:{port}: not the target and not granted"));
        Err(format!("{host}:{port} is not the target and not granted"))
    }

    /// Checks a host-made TCP connection to `host:port` (the `tcp`
    /// interface) and records the denial when it is not allowed.
    pub(crate) fn authorize_connect(&self, host: &str, port: u16) -> Result<(), String> {
        if self.allows_authority(host, port) {
            return Ok(());
        }
        self.deny(format!(
            "TCP connection to {host}:{port}: not the target and not granted"
        ));
        Err(format!("{host}:{port} is not the target and not granted"))
    }

    /// Checks a TLS handshake with `host:port` (the `tls` interface) and
    /// records the denial when it is not allowed.
    pub(crate) fn authorize_tls(&self, host: &str, port: u16) -> Result<(), String> {
        if self.allows_authority(host, port) {
            return Ok(());
        }
        self.deny(format!(
            "TLS handshake with {host}:{port}: not the target and not granted"
        ));
        Err(format!("{host}:{port} is not the target and not granted"))
    }

    /// Records a denied use of a capability.
    pub(crate) fn deny(&self, what: String) {
        tracing::debug!(denied = %what, "capability denied");
        let mut d = self.denials.lock().unwrap_or_else(|e| e.into_inner());
        if d.0.len() < MAX_DENIALS {
            d.0.push(what);
        }
        d.1 += 1;
    }

    /// The denials recorded so far, as one message, or `None`.
    pub(crate) fn denial_message(&self) -> Option<String> {
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

    fn call(target: &str, net: &[&str]) -> CallGrants {
        let grants = Grants {
            net: net.iter().map(|s| s.parse().unwrap()).collect(),
            ..Grants::default()
        };
        CallGrants::new(Some(NetPattern::for_target(target).unwrap()), Arc::new(grants))
    }

    #[test]
    fn target_is_granted_and_nothing_else() {
        let g = call("127.0.0.1:8080", &[]);
        assert!(g.allows_addr("127.0.0.1:8080".parse().unwrap()));
        assert!(!g.allows_addr("127.0.0.1:8081".parse().unwrap()));
        assert!(!g.allows_addr("127.0.0.2:8080".parse().unwrap()));
        assert!(g.allows_addr("[::ffff:127.0.0.1]:8080".parse().unwrap()));
    }

    #[test]
    fn names_grant_what_they_resolve_to() {
        let g = call("localhost:6379", &[]);
        assert!(g.allows_lookup("LOCALHOST."));
        assert!(!g.allows_lookup("example.com"));
        assert!(!g.allows_addr("127.0.0.1:6379".parse().unwrap()));
        g.note_resolved("localhost", "127.0.0.1".parse().unwrap());
        assert!(g.allows_addr("127.0.0.1:6379".parse().unwrap()));
        assert!(!g.allows_addr("127.0.0.1:6380".parse().unwrap()));
    }

    #[test]
    fn patterns() {
        let g = call(
            "10.0.0.1:80",
            &["*.acme.internal:443", "192.168.0.0/16:*", "[::1]:9000"],
        );
        assert!(g.allows_lookup("db.acme.internal"));
        assert!(!g.allows_lookup("acme.internal"));
        assert!(!g.allows_lookup("evilacme.internal"));
        assert!(g.allows_addr("192.168.4.5:1".parse().unwrap()));
        assert!(!g.allows_addr("192.169.0.1:1".parse().unwrap()));
        assert!(g.allows_addr("[::1]:9000".parse().unwrap()));
        assert!(!g.allows_addr("8.8.8.8:53".parse().unwrap()));
        let any_host = call("10.0.0.1:80", &["*:53"]);
        assert!(any_host.allows_addr("8.8.8.8:53".parse().unwrap()));
        assert!(!any_host.allows_addr("8.8.8.8:54".parse().unwrap()));
        assert!(any_host.allows_lookup("anything.example"));
        assert!(g.allows_authority("db.acme.internal", 443));
        assert!(!g.allows_authority("db.acme.internal", 80));
        assert!(g.allows_authority("10.0.0.1", 80));
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
        assert!(g.authorize_tls("db.internal", 5432).is_ok());
        assert!(g.authorize_tls("ldap.acme.internal", 636).is_ok());
        assert!(g.authorize_tls("ldap.acme.internal", 443).is_err());
        assert!(g.authorize_tls("127.0.0.1", 5432).is_err());
        let message = g.denial_message().unwrap();
        assert!(
            message.starts_with("denied: TLS handshake with ldap.acme.internal:443"),
            "{message}"
        );
        assert!(message.ends_with("(and 1 more)"), "{message}");
    }

    #[test]
    fn denials_are_kept_and_counted() {
        let g = call("127.0.0.1:1", &[]);
        assert_eq!(g.denial_message(), None);
        for i in 0..20 {
            g.deny(format!("connect 10.0.0.{i}:1"));
        }
        assert_eq!(g.denial_message().unwrap(), "denied: connect 10.0.0.0:1 (and 19 more)");
    }
}
