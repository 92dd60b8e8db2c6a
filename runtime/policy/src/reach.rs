//! What a name may reach: the classes of address a name must never lead to
//! by itself, and the agent's own listeners, which no tenant's probe may
//! reach at all.
//!
//! A probe reaches an address either because a grant names the address
//! (its target or a `net` pattern that is an IP, a CIDR or `*`), or
//! because a granted *name* resolved to it. A name may resolve anywhere
//! its owner's DNS says, so the second way is narrower: it never leads to
//! a [`Class::Special`] address (loopback, unspecified, link-local,
//! multicast, broadcast and reserved, in any IPv6 spelling), and it leads
//! to a [`Class::Private`] or [`Class::Public`] one only where the probe's
//! [`Reach`] allows. `localhost` and names under `.localhost` are the
//! exception that proves the rule: they are loopback by definition
//! (RFC 6761), so a grant of such a name is a grant of the loopback
//! addresses.
//!
//! Whatever the grants, an address one of the agent's own sockets listens
//! on ([`OwnListeners`]) is never reached by a tenant's probe, and by the
//! operator's only through an address grant: a plugin's traffic must never
//! become an API caller.
//!
//! [`crate::grants::CallGrants`] applies these rules; this module only
//! classifies.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::RwLock;

/// What a probe's names may lead to besides public addresses, and whether
/// an address grant may name the agent's own listeners. Part of a probe's
/// [`super::Grants`]; set by its tenant (`sonde_core::tenants::Tenant::reach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reach {
    /// Whether a granted name may lead to a public address.
    pub names_public: bool,
    /// Whether a granted name may lead to a private address (RFC 1918,
    /// shared address space, unique-local IPv6).
    pub names_private: bool,
    /// Whether an address grant may reach the agent's own listeners: the
    /// operator's probes only.
    pub own_listeners: bool,
}

impl Reach {
    /// The operator's probes: names reach public and private addresses, and
    /// an address grant may name the agent's API (the embedded default
    /// config probes it).
    pub const OPERATOR: Reach = Reach {
        names_public: true,
        names_private: true,
        own_listeners: true,
    };

    /// A tenant's probes by default (`ceiling.names_may_reach: [public]`):
    /// names reach public addresses only, and nothing reaches the agent.
    pub const TENANT: Reach = Reach {
        names_public: true,
        names_private: false,
        own_listeners: false,
    };

    /// Whether a name may lead to an address of class `class`.
    fn names_reach(self, class: Class) -> bool {
        match class {
            Class::Special(_) => false,
            Class::Private(_) => self.names_private,
            Class::Public => self.names_public,
        }
    }
}

impl Default for Reach {
    fn default() -> Self {
        Self::OPERATOR
    }
}

/// An address no name leads to by itself (and the registry client never
/// reaches: `sonde_oci`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// 0.0.0.0/8, `::`: this host.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// 169.254.0.0/16 (cloud metadata), fe80::/10.
    LinkLocal,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 240.0.0.0/4.
    Reserved,
    /// `::a.b.c.d`, deprecated.
    V4Compatible,
}

impl Special {
    /// The kind in one or two words: `loopback`, `link-local`.
    pub fn word(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved",
            Self::V4Compatible => "IPv4-compatible",
        }
    }

    /// The kind as a denial explains it.
    fn described(self) -> &'static str {
        match self {
            Self::Unspecified => "the unspecified address (0.0.0.0/8 or ::, \"this host\")",
            Self::Loopback => "loopback",
            Self::LinkLocal => "link-local (cloud metadata lives there)",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Reserved => "reserved (240.0.0.0/4)",
            Self::V4Compatible => "an IPv4-compatible IPv6 address (deprecated, ::/96)",
        }
    }
}

/// The class of an address, as far as reaching it through a name goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Never reached through a name (only through an address grant).
    Special(Special),
    /// A private network: the words name the range.
    Private(&'static str),
    /// Anything else.
    Public,
}

/// The kind of special address `ip` is, if it is one ([`classify`]).
pub fn special(ip: IpAddr) -> Option<Special> {
    match classify(ip) {
        Class::Special(what) => Some(what),
        _ => None,
    }
}

/// The class of `ip`. An IPv6 address that carries an IPv4 address (the
/// v4-mapped, IPv4-compatible, NAT64 and 6to4 forms) is of the class of the
/// IPv4 address it carries, since a connection to it may end there.
pub fn classify(ip: IpAddr) -> Class {
    match ip.to_canonical() {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn classify_v4(ip: Ipv4Addr) -> Class {
    const SPECIAL: &[([u8; 4], u32, Special)] = &[
        ([0, 0, 0, 0], 8, Special::Unspecified),
        ([127, 0, 0, 0], 8, Special::Loopback),
        ([169, 254, 0, 0], 16, Special::LinkLocal),
        ([224, 0, 0, 0], 4, Special::Multicast),
        ([255, 255, 255, 255], 32, Special::Broadcast),
        ([240, 0, 0, 0], 4, Special::Reserved),
    ];
    const PRIVATE: &[([u8; 4], u32, &str)] = &[
        ([10, 0, 0, 0], 8, "10.0.0.0/8"),
        ([172, 16, 0, 0], 12, "172.16.0.0/12"),
        ([192, 168, 0, 0], 16, "192.168.0.0/16"),
        ([100, 64, 0, 0], 10, "100.64.0.0/10 (shared address space)"),
    ];
    if let Some((_, _, what)) = SPECIAL.iter().find(|(net, len, _)| in_v4(ip, *net, *len)) {
        return Class::Special(*what);
    }
    if let Some((_, _, what)) = PRIVATE.iter().find(|(net, len, _)| in_v4(ip, *net, *len)) {
        return Class::Private(what);
    }
    Class::Public
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let bits = u128::from(ip);
    let prefix = |len: u32| bits >> (128 - len);
    let low_v4 = Ipv4Addr::from(bits as u32);
    if ip.is_unspecified() {
        return Class::Special(Special::Unspecified);
    }
    if ip.is_loopback() {
        return Class::Special(Special::Loopback);
    }
    if prefix(10) == 0xfe80 >> 6 {
        return Class::Special(Special::LinkLocal);
    }
    if prefix(8) == 0xff {
        return Class::Special(Special::Multicast);
    }
    // ::a.b.c.d, the deprecated IPv4-compatible form.
    if prefix(96) == 0 {
        return match classify_v4(low_v4) {
            Class::Special(what) => Class::Special(what),
            _ => Class::Special(Special::V4Compatible),
        };
    }
    // NAT64: the well-known prefix 64:ff9b::/96 and the local-use
    // 64:ff9b:1::/48 reach the IPv4 address in the last 32 bits.
    if prefix(96) == 0x0064_ff9b_0000_0000_0000_0000 || prefix(48) == 0x0064_ff9b_0001 {
        return classify_v4(low_v4);
    }
    // 6to4: 2002:AABB:CCDD::/48 is routed through the IPv4 address AA.BB.CC.DD.
    if prefix(16) == 0x2002 {
        let carried = Ipv4Addr::from((bits >> 80) as u32);
        if let Class::Special(what) = classify_v4(carried) {
            return Class::Special(what);
        }
    }
    if prefix(7) == 0xfc >> 1 {
        return Class::Private("fc00::/7 (unique local)");
    }
    if prefix(10) == 0xfec0 >> 6 {
        return Class::Private("fec0::/10 (site-local)");
    }
    Class::Public
}

/// Whether `name` (any case, with or without a trailing dot) is `localhost`
/// or a name under it, which RFC 6761 reserves for loopback.
pub fn is_localhost(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost")
        || name.len() > 10 && name.as_bytes()[name.len() - 10..].eq_ignore_ascii_case(b".localhost")
}

/// Why a name may not lead to `ip` for a probe with `reach`, or `None` if
/// it may. `name` is the name as the plugin wrote it.
pub fn name_refusal(reach: Reach, name: &str, ip: IpAddr) -> Option<String> {
    let ip = ip.to_canonical();
    let class = classify(ip);
    if reach.names_reach(class) || is_localhost(name) && class == Class::Special(Special::Loopback) {
        return None;
    }
    Some(match class {
        Class::Special(what) => format!(
            "{name} resolved to {ip}: {} is not reachable through a name; grant the address",
            what.described()
        ),
        Class::Private(range) => format!(
            "{name} resolved to {ip}: a private address ({range}) is not reachable through a name for this tenant; grant the address, or add `private` to the tenant's ceiling.names_may_reach"
        ),
        Class::Public => format!(
            "{name} resolved to {ip}: a public address is not reachable through a name for this tenant; grant the address, or add `public` to the tenant's ceiling.names_may_reach"
        ),
    })
}

/// The addresses the agent's own sockets listen on (its API): what no
/// tenant's plugin may reach. Kept by the engine, filled by the agent when
/// it binds.
#[derive(Debug, Default)]
pub struct OwnListeners {
    addrs: RwLock<Vec<SocketAddr>>,
}

impl OwnListeners {
    /// Records that the agent listens on `addr` (as bound, so with its real
    /// port when it asked for port 0).
    pub fn add(&self, addr: SocketAddr) {
        let mut addrs = self.addrs.write().unwrap_or_else(|e| e.into_inner());
        if !addrs.contains(&addr) {
            addrs.push(addr);
        }
    }

    /// Records that the agent no longer listens on `addr`.
    pub fn remove(&self, addr: SocketAddr) {
        let mut addrs = self.addrs.write().unwrap_or_else(|e| e.into_inner());
        addrs.retain(|a| *a != addr);
    }

    /// The listener a connection to `addr` would reach, if any. A listener
    /// on an unspecified address (`0.0.0.0`, `::`) is reached through every
    /// address of this host, and a connection to an unspecified address
    /// reaches this host; whether an address is this host's is asked of the
    /// kernel (binding a socket to it succeeds only if it is).
    pub fn reached_by(&self, addr: SocketAddr) -> Option<SocketAddr> {
        let addrs = self.addrs.read().unwrap_or_else(|e| e.into_inner());
        let ip = addr.ip().to_canonical();
        let mut local = None;
        addrs.iter().copied().find(|l| {
            if l.port() != addr.port() {
                return false;
            }
            let lip = l.ip().to_canonical();
            if lip == ip {
                return true;
            }
            if lip.is_unspecified() || ip.is_unspecified() {
                return *local.get_or_insert_with(|| is_this_host(ip));
            }
            false
        })
    }
}

/// Whether `ip` is an address of this host: unspecified and loopback
/// addresses are, and any other is if a socket can be bound to it.
fn is_this_host(ip: IpAddr) -> bool {
    ip.is_unspecified() || ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Class {
        classify(s.parse().unwrap())
    }

    #[test]
    fn special_addresses_in_every_family_and_spelling() {
        for ip in [
            "127.0.0.1",
            "127.255.0.9",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
            "240.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::7f00:1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(matches!(class(ip), Class::Special(_)), "{ip}: {:?}", class(ip));
        }
    }

    #[test]
    fn private_and_public_addresses() {
        for ip in [
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "fd00::1",
            "fc00::1",
            "fec0::1",
            "::ffff:10.1.2.3",
            "64:ff9b::10.1.2.3",
        ] {
            assert!(matches!(class(ip), Class::Private(_)), "{ip}: {:?}", class(ip));
        }
        for ip in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.2.1",
            "2001:db8::1",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "fe00::1",
        ] {
            assert_eq!(class(ip), Class::Public, "{ip}");
        }
    }

    #[test]
    fn names_reach_by_class_and_localhost_is_loopback() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let private: IpAddr = "10.0.0.1".parse().unwrap();
        let public: IpAddr = "8.8.8.8".parse().unwrap();
        let why = name_refusal(Reach::OPERATOR, "lo.acme.test", lo).unwrap();
        assert_eq!(
            why,
            "lo.acme.test resolved to 127.0.0.1: loopback is not reachable through a name; grant the address"
        );
        assert_eq!(name_refusal(Reach::OPERATOR, "db.internal", private), None);
        assert_eq!(name_refusal(Reach::OPERATOR, "example.com", public), None);
        let why = name_refusal(Reach::TENANT, "db.acme.test", private).unwrap();
        assert!(why.contains("a private address (10.0.0.0/8)"), "{why}");
        assert_eq!(name_refusal(Reach::TENANT, "www.acme.test", public), None);
        for name in ["localhost", "LOCALHOST.", "db.localhost"] {
            assert_eq!(name_refusal(Reach::TENANT, name, lo), None, "{name}");
            assert!(name_refusal(Reach::TENANT, name, "169.254.1.1".parse().unwrap()).is_some());
        }
        assert!(name_refusal(Reach::OPERATOR, "notlocalhost", lo).is_some());
        assert!(name_refusal(Reach::OPERATOR, "localhost.evil.test", lo).is_some());
        let v6 = name_refusal(Reach::OPERATOR, "x.test", "::ffff:127.0.0.1".parse().unwrap()).unwrap();
        assert!(v6.contains("resolved to 127.0.0.1: loopback"), "{v6}");
    }

    #[test]
    fn own_listeners_are_reached_by_their_address_or_any_local_one() {
        let own = OwnListeners::default();
        own.add("127.0.0.1:9464".parse().unwrap());
        let at = |s: &str| own.reached_by(s.parse().unwrap());
        assert!(at("127.0.0.1:9464").is_some());
        assert!(at("[::ffff:127.0.0.1]:9464").is_some());
        assert!(at("0.0.0.0:9464").is_some(), "0.0.0.0 reaches the host");
        assert!(at("127.0.0.1:9465").is_none());
        assert!(at("127.0.0.2:9464").is_none(), "bound to one address only");
        own.add("0.0.0.0:7000".parse().unwrap());
        assert!(at("127.0.0.1:7000").is_some());
        assert!(at("127.9.9.9:7000").is_some());
        assert!(at("[::1]:7000").is_some());
        assert!(at("192.0.2.1:7000").is_none(), "not this host's address");
        own.remove("0.0.0.0:7000".parse().unwrap());
        assert!(at("127.0.0.1:7000").is_none());
    }
}
