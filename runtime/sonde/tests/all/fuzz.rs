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
//! Targets and invariants here, those that run the `sonde` command or a
//! real agent (the parser's, the `net` patterns' and the plugin loader's
//! are in the tests of sonde-core, sonde-policy and sonde-sandbox, under
//! the same `fuzz::` module path):
//! - `sonde validate` on mutated configs: a verdict, never a panic;
//! - uploads through a real agent's API (random and mutated bodies,
//!   headers, paths): never a 5xx, nothing stored on refusal, the agent
//!   stays up.

use crate::abuse::{self, ACME, BETA, OP};
use crate::support::seeded::{self, Case, YAML_TOKENS, bytes, config_corpus, mutate, plugin_body};
use sonde_tests::{HttpServer, guests};
use std::path::Path;

/// The cases of `target` ([`sonde_tests::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("fuzz", target, default)
}

// ---------------------------------------------------------------------
// The config parser and `sonde validate`.

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
