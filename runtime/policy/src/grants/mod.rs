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
//!
//! The patterns and the configured [`Grants`] are parsed in `pattern`; the
//! per-call check ([`CallGrants`], [`Use`], [`Denied`]) is in `call`. Both
//! are re-exported here, the one path other crates use.

mod call;
mod family;
mod pattern;
mod secrets;

pub use call::{CallGrants, Denied, Use};
pub use family::{IpProtocol, IpVersion, IpVersionError};
pub use pattern::{GrantError, Grants, Host, NetPattern, host_address, path_within};
pub use secrets::SecretUseError;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reach::{OwnListeners, Reach};
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Arc;

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

    /// ICMP has no port: only a pattern of any port covers a host for it,
    /// and the addresses a name found obey the same rules as a
    /// connection's, the agent's own listeners aside (an echo reaches no
    /// port).
    #[test]
    fn icmp_needs_a_grant_of_any_port_and_names_obey_the_reach() {
        let icmp = |host| Use::Icmp { host };
        let g = call_with(
            "10.0.0.1",
            &["db.acme.test:5432", "*.acme.test:*", "192.168.0.0/16:*"],
            Reach::TENANT,
            &["0.0.0.0:8080"],
        );
        assert!(g.allows(icmp("10.0.0.1")));
        assert!(g.allows(icmp("www.acme.test")));
        assert!(g.allows(icmp("192.168.1.1")));
        assert!(!g.allows(icmp("10.0.0.2")));
        let port_only = call("10.0.0.1:80", &["db.acme.test:5432"]);
        assert!(!port_only.allows(icmp("10.0.0.1")));
        assert!(!port_only.allows(icmp("db.acme.test")));
        let peer = |g: &CallGrants, name, ip: &str| {
            g.authorize_peer(icmp(name), Some(name), &[SocketAddr::new(ip.parse().unwrap(), 0)])
        };
        assert!(peer(&g, "www.acme.test", "203.0.113.5").is_ok());
        let denied = peer(&g, "www.acme.test", "10.1.1.1").unwrap_err();
        assert!(denied.0.contains("a private address"), "{denied}");
        let denied = peer(&g, "www.acme.test", "127.0.0.1").unwrap_err();
        assert!(denied.0.contains("loopback is not reachable"), "{denied}");
        let literal = g.authorize_peer(icmp("10.0.0.1"), None, &[sock("10.0.0.1:0")]);
        assert_eq!(literal, Ok(vec![sock("10.0.0.1:0")]));
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
