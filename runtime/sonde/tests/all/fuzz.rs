//! Fuzzing on stable Rust: seeded generators in ordinary tests, so the
//! same targets run in CI (a few hundred cases each, bounded in time) and
//! for hours on a workstation. `docs/security.md` says why this shape and
//! how to run it long:
//!
//! ```text
//! SONDE_FUZZ_ITERS=100000 cargo test --workspace --release --test all -- fuzz::
//! ```
//!
//! Every case is made from one 64-bit seed. A failing case prints its seed;
//! `SONDE_FUZZ_SEED=<seed> SONDE_FUZZ_ITERS=1` replays exactly it. What a
//! target finds is kept as a named test of its own (the numeric-host one
//! below, found by the name-pattern target).
//!
//! Targets and invariants:
//! - the config parser and the whole load (`sonde validate`'s path):
//!   never a panic or a hang, every error names a place;
//! - `net` grant patterns: a pattern never admits an address outside its
//!   range, in any spelling (v4-mapped, compressed, expanded, bracketed,
//!   upper case, zone ids, decimal, octal and hex IPv4 forms);
//! - uploads through a real agent's API (random and mutated bodies,
//!   headers, paths): never a 5xx, nothing stored on refusal, the agent
//!   stays up;
//! - the plugin loader: random bytes, generated core modules (a small
//!   typed generator over `wasm-encoder`), components wrapping them,
//!   mutated real components: a typed error or a plugin that runs, never a
//!   panic.

use crate::abuse::{self, ACME, BETA, OP};
use crate::support::engine;
use crate::support::seeded::{self, Case};
use sonde_sandbox::host::NetPattern;
use sonde_tests::{HttpServer, guests};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// The cases of `target` ([`crate::support::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("fuzz", target, default)
}

fn bytes(rng: &mut fastrand::Rng, max: usize) -> Vec<u8> {
    let n = rng.usize(..=max);
    std::iter::repeat_with(|| rng.u8(..)).take(n).collect()
}

/// `seed` with a few random edits: flips, inserted `tokens`, deleted and
/// repeated ranges.
fn mutate(rng: &mut fastrand::Rng, seed: &[u8], tokens: &[&str]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.usize(1..=8) {
        let at = rng.usize(..=v.len());
        match rng.u8(..6) {
            0 if !v.is_empty() => {
                let i = rng.usize(..v.len());
                v[i] ^= 1 << rng.u8(..8);
            }
            1 | 2 if !tokens.is_empty() => {
                let t = tokens[rng.usize(..tokens.len())];
                v.splice(at..at, t.bytes());
            }
            3 if at < v.len() => {
                let end = rng.usize(at..=v.len().min(at + 64));
                v.drain(at..end);
            }
            4 if at < v.len() => {
                let end = rng.usize(at..=v.len().min(at + 64));
                let piece = v[at..end].to_vec();
                for _ in 0..rng.usize(1..4) {
                    v.splice(at..at, piece.iter().copied());
                }
            }
            _ => {
                let i = rng.usize(..=v.len());
                v.insert(i, rng.u8(..));
            }
        }
    }
    v
}

// ---------------------------------------------------------------------
// The config parser and `sonde validate`.

const YAML_TOKENS: &[&str] = &[
    ":",
    ": ",
    "\n",
    "\n  ",
    "- ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "'",
    "\"",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "? ",
    "#",
    "~",
    "null",
    "true",
    "-1",
    "0",
    "99999999999999999999",
    "1e400",
    "0x10",
    "NaN",
    "500ms",
    "1ns",
    "999999999h",
    "64MiB",
    "0B",
    "18446744073709551615B",
    "*",
    "*:*",
    "[::1]:9",
    "::ffff:127.0.0.1:80",
    "10.0.0.0/8:*",
    "127.0.0.1:99999",
    "/proc",
    "/dev/zero",
    "../..",
    "\u{0}",
    "\u{202e}",
    "\u{1b}[2J",
    "name",
    "tenant",
    "probes",
    "targets",
    "plugin",
    "grants",
    "net",
    "exec",
    "files",
    "env",
    "limits",
    "fuel",
    "memory",
    "timeout",
    "period",
    "kind",
    "liveness",
    "startup",
    "ceiling",
    "quotas",
    "max_probes",
    "api",
    "max_connections",
    "state_dir",
    "token_env",
    "token_file",
    "on_failure",
    "command",
    "groups",
    "<<: *a",
];

/// The valid config cases, the corpus the mutations start from. References
/// to OCI registries are left out: a mutated one would wait on a network.
fn config_corpus() -> Vec<(PathBuf, String)> {
    let dir = crate::support::repo().join("tests/cases/config");
    let mut out = Vec::new();
    for sub in ["valid", "invalid"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "yaml") {
                let text = std::fs::read_to_string(&p).unwrap();
                if !text.contains("oci://") {
                    out.push((p, text));
                }
            }
        }
    }
    out.sort();
    assert!(out.len() >= 3, "the config corpus is missing");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_files_never_crash_the_parser_or_the_load() {
    let corpus = config_corpus();
    let dir = tempfile::tempdir().unwrap();
    // The corpus's token files, so the load goes past them.
    for (p, _) in &corpus {
        for e in std::fs::read_dir(p.parent().unwrap()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "token") {
                let to = dir.path().join(e.file_name());
                std::fs::copy(e.path(), &to).unwrap();
                std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            }
        }
    }
    let path = dir.path().join("sonde.yaml");
    let (mut parsed, mut loaded) = (0, 0);
    for (_case, mut rng) in cases("config_files_never_crash_the_parser_or_the_load", 1500) {
        let text = match rng.u8(..8) {
            0 => bytes(&mut rng, 512),
            _ => {
                let (_, seed) = &corpus[rng.usize(..corpus.len())];
                mutate(&mut rng, seed.as_bytes(), YAML_TOKENS)
            }
        };
        let text = String::from_utf8_lossy(&text).replace("oci://", "oci:");
        match sonde_core::config::parse(&path, &text) {
            Err(errors) => {
                for e in &errors.0 {
                    assert_eq!(e.place.file, path, "an error that names no file: {e}");
                }
            }
            Ok(_) => {
                parsed += 1;
                let engine = engine();
                let load = sonde_core::catalog::Catalog::load_text(&engine, &path, &text);
                // A load waits on nothing outside: bounded loosely.
                match tokio::time::timeout(std::time::Duration::from_secs(60), load)
                    .await
                    .unwrap_or_else(|_| panic!("loading this config hung:\n{text}"))
                {
                    Ok(_) => loaded += 1,
                    Err(errors) => assert!(!errors.0.is_empty()),
                }
            }
        }
    }
    eprintln!("config: {parsed} parsed, {loaded} loaded");
}

#[test]
fn sonde_validate_answers_every_mutated_config_with_a_verdict() {
    let corpus = config_corpus();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    for (_case, mut rng) in cases("sonde_validate_answers_every_mutated_config_with_a_verdict", 20) {
        let (_, seed) = &corpus[rng.usize(..corpus.len())];
        let text = mutate(&mut rng, seed.as_bytes(), YAML_TOKENS);
        let text = String::from_utf8_lossy(&text).replace("oci://", "oci:");
        std::fs::write(&path, &text).unwrap();
        let out = crate::support::sonde(&["validate", path.to_str().unwrap()]);
        // 0 valid, 1 or 2 refused with a reason; never a panic (101) or a signal.
        assert!(
            matches!(out.status.code(), Some(0..=2)),
            "sonde validate ended with {:?} on:\n{text}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

// ---------------------------------------------------------------------
// `net` grant patterns.

/// A network as the test understands it, independently of `grants.rs`.
#[derive(Clone, Copy, Debug)]
enum Net {
    V4(u32, u8),
    V6(u128, u8),
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

// ---------------------------------------------------------------------
// Uploads through the API.

/// Every file under `state/managed`.
fn stored(state: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                let bytes = std::fs::read(&p).unwrap_or_default();
                out.push(format!("{} {}", p.display(), bytes.len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&state.join("managed"), &mut out);
    out.sort();
    out
}

fn name(rng: &mut fastrand::Rng) -> String {
    const NAMES: &[&str] = &[
        "p",
        "shop-ready",
        "bank-ready",
        "..",
        ".",
        "a%2Fb",
        "a/b",
        "%00",
        "%2e%2e",
        "CON",
        "x.wasm",
        "-",
        "_",
        "a b",
        "%C3%A9",
        "tcp",
        "http",
        "\u{7f}",
    ];
    match rng.u8(..3) {
        0 => NAMES[rng.usize(..NAMES.len())].to_string(),
        1 => format!("p{}", rng.u8(..8)),
        _ => {
            let len = rng.usize(1..300);
            std::iter::repeat_with(|| char::from(rng.u8(0x21..0x7f)))
                .take(len)
                .filter(|c| !matches!(c, '?' | '#' | ' '))
                .collect()
        }
    }
}

fn probe_spec(rng: &mut fastrand::Rng) -> Vec<u8> {
    let seeds: &[&str] = &[
        "address: 127.0.0.1:1\nplugin: tcp\nperiod: 1s\n",
        "{\"address\": \"127.0.0.1:1\", \"plugin\": \"tcp\", \"kind\": \"liveness\"}",
        "address: http://127.0.0.1:1/x\nplugin: http\nconfig: {path: /}\ngrants: {net: [\"127.0.0.1:*\"]}\n",
        "address: 127.0.0.1:1\nplugin: up\n",
        "address: 10.0.0.1:1\nplugin: tcp\n",
        "address: 127.0.0.1:1\nplugin: tcp\ngrants: {files: [/proc]}\n",
        "address: 127.0.0.1:1\nplugin: /bin/sh\n",
        "address: 127.0.0.1:1\nplugin: tcp\ntenant: beta\n",
        "- {name: p1, address: 127.0.0.1:1, plugin: tcp}\n- {name: p2, address: 127.0.0.1:2, plugin: tcp}\n",
    ];
    let seed = seeds[rng.usize(..seeds.len())];
    if rng.u8(..4) == 0 {
        seed.as_bytes().to_vec()
    } else {
        mutate(rng, seed.as_bytes(), YAML_TOKENS)
    }
}

fn plugin_body(rng: &mut fastrand::Rng, good: &[u8]) -> Vec<u8> {
    match rng.u8(..6) {
        0 => good.to_vec(),
        1 => bytes(rng, 4096),
        2 => good[..rng.usize(..good.len())].to_vec(),
        3 => b"\0asm\x01\0\0\0".to_vec(),
        _ => {
            let mut v = good.to_vec();
            for _ in 0..rng.usize(1..16) {
                let i = rng.usize(..v.len());
                v[i] = rng.u8(..);
            }
            v
        }
    }
}

/// A request with what a client controls: method, path, headers, body,
/// sometimes malformed framing.
fn request(rng: &mut fastrand::Rng, good_plugin: &[u8]) -> Vec<u8> {
    let token = [Some(ACME), Some(BETA), Some(OP), None, Some("nope")][rng.usize(..5)];
    let (method, path, body) = match rng.u8(..10) {
        0..=2 => ("PUT", format!("/v1/probes/{}", name(rng)), probe_spec(rng)),
        3 => ("PUT", "/v1/probes".to_string(), probe_spec(rng)),
        4 | 5 => (
            "PUT",
            format!("/v1/plugins/{}", name(rng)),
            plugin_body(rng, good_plugin),
        ),
        6 => (
            "DELETE",
            format!("/v1/{}/{}", ["probes", "plugins"][rng.usize(..2)], name(rng)),
            Vec::new(),
        ),
        7 => (
            ["GET", "POST", "PATCH", "HEAD", "OPTIONS", "PUT", "BREW"][rng.usize(..7)],
            format!("/v1/probes/{}/run", name(rng)),
            bytes(rng, 64),
        ),
        8 => (
            "GET",
            format!("/v1/watch?last_event_id={}&all={}", name(rng), name(rng)),
            Vec::new(),
        ),
        _ => ("PUT", format!("/{}", name(rng)), bytes(rng, 256)),
    };
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: sonde\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let chunked = rng.u8(..6) == 0;
    match rng.u8(..8) {
        0 => head.push_str("Content-Type: application/wasm\r\n"),
        1 => head.push_str("Content-Type: \u{1}\r\n"),
        2 => head.push_str(&format!("Content-Length: {}\r\n", body.len() + rng.usize(1..100))),
        3 => head.push_str("Transfer-Encoding: gzip\r\n"),
        4 => head.push_str("Expect: 100-continue\r\n"),
        _ => {}
    }
    let mut out = head.into_bytes();
    if chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        for piece in body.chunks(rng.usize(1..4096)) {
            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(if rng.bool() { b"0\r\n\r\n" } else { b"zz\r\n" });
    } else {
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(&body);
    }
    if rng.u8(..10) == 0 {
        out = mutate(
            rng,
            &out,
            &[
                "\r\n",
                ":",
                " ",
                "\0",
                "Content-Length: 5\r\n",
                "Transfer-Encoding: chunked\r\n",
            ],
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_never_get_a_5xx_store_nothing_when_refused_and_the_agent_stays_up() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = abuse::config(
        dir.path(),
        server.addr,
        "{body_read_timeout: 2s, header_read_timeout: 2s}",
    );
    let (_agent, api) = abuse::start(&config).await;
    let good = std::fs::read(guests::ALWAYS_UP).unwrap();
    // One good plugin stored, for probe specs naming `up` to resolve.
    let (status, body) = abuse::call(api, "PUT", "/v1/plugins/up", Some(ACME), &good).await;
    assert!(status == 201 || status == 200, "{status} {body}");
    let state = dir.path().join("state");
    let (mut ok, mut refused) = (0, 0);
    for (_case, mut rng) in cases(
        "uploads_never_get_a_5xx_store_nothing_when_refused_and_the_agent_stays_up",
        600,
    ) {
        let req = request(&mut rng, &good);
        let before = stored(&state);
        let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
        let _ = s.write_all(&req).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(60), s.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(
            read.is_ok(),
            "no answer within 60 s to:\n{}",
            String::from_utf8_lossy(&req)
        );
        // The final status: past any interim 100 Continue.
        let status: u16 = text
            .split("HTTP/1.1 ")
            .filter_map(|part| part.get(..3)?.parse().ok())
            .find(|s| *s >= 200)
            .unwrap_or(0);
        assert!(
            status < 500 || status == 503,
            "{status} to:\n{}\n---\n{text}",
            String::from_utf8_lossy(&req[..req.len().min(2048)])
        );
        if (200..300).contains(&status) {
            ok += 1;
        } else {
            refused += 1;
            assert_eq!(
                before,
                stored(&state),
                "a refused request ({status}) changed what is stored:\n{text}"
            );
        }
    }
    assert_eq!(abuse::call(api, "GET", "/livez", None, b"").await.0, 200);
    eprintln!("uploads: {ok} accepted, {refused} refused");
}

// ---------------------------------------------------------------------
// The plugin loader.

/// A component that embeds `module` and instantiates it (a valid component
/// whenever the module is valid and imports nothing), exporting nothing.
fn component_around(module: &[u8]) -> Vec<u8> {
    use wasm_encoder::{Component, ComponentSectionId, InstanceSection, RawSection};
    let mut c = Component::new();
    c.section(&RawSection {
        id: ComponentSectionId::CoreModule as u8,
        data: module,
    });
    let mut instances = InstanceSection::new();
    instances.instantiate(0, Vec::<(&str, wasm_encoder::ModuleArg)>::new());
    c.section(&instances);
    c.finish()
}

/// Writes an `i32` expression: constants, locals, arithmetic (which may
/// divide by zero), loads (which may be out of bounds), calls (which may
/// recurse without end), `memory.grow`.
fn expr(rng: &mut fastrand::Rng, f: &mut wasm_encoder::Function, funcs: u32, depth: u32) {
    use wasm_encoder::{Instruction as I, MemArg, MemArgTarget};
    let mem = |rng: &mut fastrand::Rng| MemArg {
        offset: u64::from(rng.u32(..1 << 17)),
        align: rng.u32(..3),
        target: MemArgTarget::Memory(0),
        ordering: None,
    };
    match if depth == 0 { rng.u8(..2) } else { rng.u8(..8) } {
        0 => {
            f.instruction(&I::I32Const(rng.i32(..)));
        }
        1 => {
            f.instruction(&I::LocalGet(rng.u32(..3)));
        }
        2 | 3 => {
            expr(rng, f, funcs, depth - 1);
            expr(rng, f, funcs, depth - 1);
            let ops = [
                I::I32Add,
                I::I32Sub,
                I::I32Mul,
                I::I32DivU,
                I::I32RemS,
                I::I32And,
                I::I32Shl,
                I::I32Xor,
            ];
            f.instruction(&ops[rng.usize(..ops.len())]);
        }
        4 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::I32Load(mem(rng)));
        }
        5 if funcs > 1 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::Call(rng.u32(1..funcs)));
        }
        6 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::MemoryGrow(0));
        }
        _ => {
            f.instruction(&I::MemorySize(0));
        }
    }
}

/// Writes statements that leave the stack as they found it: stores, local
/// sets, blocks, loops (which may never end), ifs, traps.
fn statements(rng: &mut fastrand::Rng, f: &mut wasm_encoder::Function, funcs: u32, depth: u32) {
    use wasm_encoder::{BlockType, Instruction as I, MemArg, MemArgTarget};
    for _ in 0..rng.u32(..6) {
        match if depth == 0 { rng.u8(..2) } else { rng.u8(..7) } {
            0 => {
                expr(rng, f, funcs, 3);
                f.instruction(&I::LocalSet(rng.u32(..3)));
            }
            1 => {
                expr(rng, f, funcs, 2);
                expr(rng, f, funcs, 2);
                f.instruction(&I::I32Store(MemArg {
                    offset: u64::from(rng.u32(..1 << 17)),
                    align: 2,
                    target: MemArgTarget::Memory(0),
                    ordering: None,
                }));
            }
            2 => {
                f.instruction(&I::Loop(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                expr(rng, f, funcs, 2);
                f.instruction(&I::BrIf(0));
                f.instruction(&I::End);
            }
            3 => {
                f.instruction(&I::Block(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                expr(rng, f, funcs, 2);
                f.instruction(&I::BrIf(0));
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::End);
            }
            4 | 5 => {
                expr(rng, f, funcs, 2);
                f.instruction(&I::If(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::Else);
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::End);
            }
            _ => {
                f.instruction(&I::Unreachable);
            }
        }
    }
}

/// A valid core module from a small typed generator: a memory, functions
/// of random well-typed code, an exported entry point and sometimes a
/// start function. What it does when run is anyone's guess: trap, loop,
/// recurse, grow memory.
fn generated_module(rng: &mut fastrand::Rng) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, ExportKind, ExportSection, Function, FunctionSection, Instruction, MemorySection, MemoryType,
        Module, StartSection, TypeSection, ValType,
    };
    let funcs = rng.u32(1..6);
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    types.ty().function([ValType::I32], [ValType::I32]);
    m.section(&types);
    let mut functions = FunctionSection::new();
    for i in 0..funcs {
        functions.function(u32::from(i != 0));
    }
    m.section(&functions);
    let mut memories = MemorySection::new();
    let minimum = rng.u64(..4);
    memories.memory(MemoryType {
        minimum,
        maximum: rng.bool().then(|| rng.u64(minimum..=1 << 16)),
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    m.section(&memories);
    let mut exports = ExportSection::new();
    exports.export("memory", ExportKind::Memory, 0);
    exports.export("run", ExportKind::Func, 0);
    m.section(&exports);
    if rng.bool() {
        m.section(&StartSection { function_index: 0 });
    }
    let mut code = CodeSection::new();
    for i in 0..funcs {
        // Locals 0..3 are i32s (the parameter, if any, is local 0).
        let mut f = Function::new([(if i == 0 { 3 } else { 2 }, ValType::I32)]);
        statements(rng, &mut f, funcs, 3);
        if i != 0 {
            expr(rng, &mut f, funcs, 3);
        }
        f.instruction(&Instruction::End);
        code.function(&f);
    }
    m.section(&code);
    m.finish()
}

#[test]
fn generated_modules_are_valid_wasm() {
    // The generator is only useful if what it makes gets past validation
    // and into the compiler.
    for (_case, mut rng) in cases("generated_modules_are_valid_wasm", 200) {
        let bytes = generated_module(&mut rng);
        wasmtime::Module::validate(&wasmtime::Engine::default(), &bytes)
            .unwrap_or_else(|e| panic!("an invalid generated module: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_loader_refuses_or_runs_whatever_it_is_given() {
    let good = std::fs::read(guests::ALWAYS_UP).unwrap();
    let (mut loaded, mut refused) = (0, 0);
    for (_case, mut rng) in cases("the_plugin_loader_refuses_or_runs_whatever_it_is_given", 200) {
        let bytes = match rng.u8(..5) {
            0 => bytes(&mut rng, 2048),
            1 => generated_module(&mut rng),
            2 => component_around(&generated_module(&mut rng)),
            _ => plugin_body(&mut rng, &good),
        };
        match engine().load("fuzzed", &bytes).await {
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
            Ok(plugin) => {
                loaded += 1;
                // Whatever loads runs to a verdict under its limits.
                let limits = sonde_sandbox::engine::Limits {
                    timeout: std::time::Duration::from_millis(500),
                    ..sonde_sandbox::engine::Limits::default()
                };
                let result = crate::support::run_with_limits(&plugin, limits).await;
                assert!(!result.message.contains("panicked"), "{}", result.message);
            }
        }
    }
    eprintln!("plugin loader: {loaded} loaded, {refused} refused");
}
