//! Fuzzing `net` grant patterns with seeded generators (the convention of
//! `sonde_tests::seeded`): a pattern never admits an address outside its
//! range, in any spelling (v4-mapped, compressed, expanded, bracketed, upper
//! case, zone ids, decimal, octal and hex IPv4 forms).

use sonde_policy::NetPattern;
use sonde_tests::seeded::{self, Case};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The cases of `target` ([`sonde_tests::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("fuzz", target, default)
}

/// A network as the test understands it, independently of `grants.rs`.
#[derive(Clone, Copy, Debug)]
enum Net {
    V4(u32, u8),
    V6(u128, u8),
}

/// An address near `net` (inside or just outside it, often), or anywhere.
fn address_near(rng: &mut fastrand::Rng, net: Net) -> IpAddr {
    let v4 = |rng: &mut fastrand::Rng, n: u32, len: u8| {
        let keep = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
        let flip = if rng.bool() {
            1u32.checked_shl(32 - u32::from(rng.u8(1..=len.max(1)))).unwrap_or(0)
        } else {
            0
        };
        IpAddr::V4(Ipv4Addr::from(((n & keep) | (rng.u32(..) & !keep)) ^ flip))
    };
    match (rng.u8(..4), net) {
        (0, _) => IpAddr::V4(Ipv4Addr::from(rng.u32(..))),
        (1, _) => IpAddr::V6(Ipv6Addr::from(rng.u128(..))),
        (_, Net::V4(n, len)) => v4(rng, n, len),
        (_, Net::V6(n, len)) => {
            let keep = if len == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(len))
            };
            let flip = if rng.bool() {
                1u128.checked_shl(128 - u32::from(rng.u8(1..=len.max(1)))).unwrap_or(0)
            } else {
                0
            };
            IpAddr::V6(Ipv6Addr::from(((n & keep) | (rng.u128(..) & !keep)) ^ flip))
        }
    }
}

fn random_net(rng: &mut fastrand::Rng) -> Net {
    match rng.u8(..5) {
        0 => Net::V4(rng.u32(..), rng.u8(..=32)),
        1 => Net::V4(0x7f00_0000 | rng.u32(..1 << 24), rng.u8(8..=32)),
        2 => Net::V6(rng.u128(..), rng.u8(..=128)),
        // The v4-mapped range, and loopback.
        3 => Net::V6((0xffffu128 << 32) | u128::from(rng.u32(..)), rng.u8(80..=128)),
        _ => Net::V6(1, rng.u8(96..=128)),
    }
}

/// How the address a spelling reaches is named; `None` for a spelling the
/// host must never take as this address (then no IP pattern may admit it).
fn spellings(rng: &mut fastrand::Rng, ip: IpAddr) -> Vec<(String, Option<IpAddr>)> {
    let mut out = Vec::new();
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            let n = u32::from(a);
            let mapped = a.to_ipv6_mapped();
            out.push((a.to_string(), Some(ip)));
            out.push((format!("[{a}]"), Some(ip)));
            out.push((format!("{a}."), Some(ip)));
            out.push((format!("::ffff:{a}"), Some(ip)));
            out.push((format!("[::ffff:{a}]"), Some(ip)));
            out.push((mapped.to_string(), Some(ip)));
            out.push((format!("0:0:0:0:0:ffff:{:x}:{:x}", n >> 16, n & 0xffff), Some(ip)));
            out.push((format!("0:0:0:0:0:FFFF:{:X}:{:X}", n >> 16, n & 0xffff), Some(ip)));
            out.push((format!("0000:0000:0000:0000:0000:ffff:{a}"), Some(ip)));
            // Forms inet_aton takes (and so a resolver and a URL parser
            // do): decimal, octal, hex and short. They name this address
            // too, so an IP pattern admits them as it admits the address,
            // and they are never a name a name pattern may admit.
            out.push((n.to_string(), Some(ip)));
            out.push((format!("{n}."), Some(ip)));
            out.push((format!("0{:o}.{}.{}.{}", o[0], o[1], o[2], o[3]), Some(ip)));
            out.push((format!("0x{:x}.{}.{}.{}", o[0], o[1], o[2], o[3]), Some(ip)));
            out.push((format!("0X{:X}.0{:o}.{}.{}", o[0], o[1], o[2], o[3]), Some(ip)));
            out.push((format!("0x{n:08x}"), Some(ip)));
            out.push((format!("{}.{}", o[0], n & 0x00ff_ffff), Some(ip)));
            out.push((format!("{}.{}.{}", o[0], o[1], n & 0xffff), Some(ip)));
            out.push((format!("{}.{}.{}.", o[0], o[1], n & 0xffff), Some(ip)));
            // The v4-compatible form is another address (::a.b.c.d).
            out.push((format!("::{a}"), Some(IpAddr::V6(Ipv6Addr::from(u128::from(n))))));
        }
        IpAddr::V6(a) => {
            let segs = a.segments();
            out.push((a.to_string(), Some(ip.to_canonical())));
            out.push((format!("[{a}]"), Some(ip.to_canonical())));
            let full: Vec<String> = segs.iter().map(|s| format!("{s:04X}")).collect();
            out.push((full.join(":"), Some(ip.to_canonical())));
            let short: Vec<String> = segs.iter().map(|s| format!("{s:x}")).collect();
            out.push((short.join(":"), Some(ip.to_canonical())));
            // A zone id makes a scoped address; not this one as written.
            out.push((format!("{a}%eth0"), None));
            out.push((format!("[{a}%25lo]"), None));
        }
    }
    rng.shuffle(&mut out);
    out
}

/// Whether `host` is a spelling a resolver could take as an IPv4 address
/// (inet_aton's forms): dot-separated numbers, decimal, octal or hex.
fn numeric_host(host: &str) -> bool {
    let h = host.trim_end_matches('.');
    !h.is_empty()
        && h.split('.').count() <= 4
        && h.split('.').all(|part| {
            let p = part.to_ascii_lowercase();
            if let Some(hex) = p.strip_prefix("0x") {
                hex.bytes().all(|b| b.is_ascii_hexdigit())
            } else {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())
            }
        })
}

#[test]
fn a_net_pattern_never_admits_an_address_outside_its_range_in_any_spelling() {
    let mut admitted = 0;
    for (_case, mut rng) in cases(
        "a_net_pattern_never_admits_an_address_outside_its_range_in_any_spelling",
        20000,
    ) {
        let net = random_net(&mut rng);
        let port = rng.u16(..);
        let port_spec = if rng.bool() { port.to_string() } else { "*".into() };
        let text = net.pattern(&port_spec);
        let pattern: NetPattern = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        for _ in 0..4 {
            let ip = address_near(&mut rng, net);
            for (spelled, reaches) in spellings(&mut rng, ip) {
                if !pattern.admits(&spelled, port) {
                    continue;
                }
                admitted += 1;
                let reaches =
                    reaches.unwrap_or_else(|| panic!("{text} admits {spelled:?}, which is not an address as written"));
                assert!(
                    net.contains(reaches),
                    "{text} admits {spelled:?}, which reaches {reaches}, outside its range"
                );
            }
            // Another port is never admitted by an exact port.
            if port_spec != "*" {
                assert!(
                    !pattern.admits(&ip.to_string(), port.wrapping_add(1)),
                    "{text} admits port {}",
                    port.wrapping_add(1)
                );
            }
        }
    }
    eprintln!("net patterns: {admitted} admitted spellings checked");
}

/// The last `n` dot-separated labels of `host`.
fn last_labels(host: &str, n: usize) -> String {
    let labels: Vec<&str> = host.trim_end_matches('.').split('.').collect();
    labels[labels.len().saturating_sub(n)..].join(".")
}

/// issue 16: `grants.rs` took a host such as `0177.0.0.1`, `2130706433`
/// or `127.1` for a DNS name, so a `*.0.1` pattern admitted it, while the
/// resolver reaches 127.0.0.1 (the inet_aton forms). Found by this target;
/// every spelling is now an address, and only an address pattern admits it.
#[test]
fn a_numeric_host_is_an_address_and_never_a_name_a_name_pattern_admits() {
    for (_case, mut rng) in cases(
        "a_numeric_host_is_an_address_and_never_a_name_a_name_pattern_admits",
        2000,
    ) {
        let ip = IpAddr::V4(Ipv4Addr::from(rng.u32(..)));
        for (spelled, _) in spellings(&mut rng, ip) {
            if !numeric_host(&spelled) {
                continue;
            }
            // The widest name patterns that could cover the spelling.
            for n in 1..=2 {
                let text = format!("*.{}:80", last_labels(&spelled, n));
                if let Ok(pattern) = text.parse::<NetPattern>() {
                    assert!(
                        !pattern.admits(&spelled, 80),
                        "the name pattern {text} admits {spelled:?}, which a resolver takes as the address {ip}"
                    );
                }
            }
            // The address's own pattern, in any spelling, admits it.
            let exact: NetPattern = format!("{ip}:80").parse().unwrap();
            assert!(exact.admits(&spelled, 80), "{exact} does not admit {spelled:?}");
            if let Ok(spelled_pattern) = format!("{spelled}:80").parse::<NetPattern>() {
                assert!(
                    spelled_pattern.admits(&ip.to_string(), 80),
                    "{spelled}:80 does not admit {ip}"
                );
            }
        }
    }
}

impl Net {
    fn contains(self, ip: IpAddr) -> bool {
        match (self, ip) {
            (Net::V4(n, len), IpAddr::V4(a)) => len == 0 || (n ^ u32::from(a)) >> (32 - u32::from(len)) == 0,
            (Net::V6(n, len), IpAddr::V6(a)) => len == 0 || (n ^ u128::from(a)) >> (128 - u32::from(len)) == 0,
            _ => false,
        }
    }

    fn pattern(self, port: &str) -> String {
        match self {
            Net::V4(n, len) => format!("{}/{len}:{port}", Ipv4Addr::from(n)),
            Net::V6(n, len) => format!("[{}/{len}]:{port}", Ipv6Addr::from(n)),
        }
    }
}
