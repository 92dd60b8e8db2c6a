//! `require_signed` covers API uploads: a plugin uploaded with its
//! sigstore bundle in the `Sonde-Signature` header is checked against the
//! agent's `trust` keys and the tenant's `ceiling.signers` before anything
//! is compiled or stored, stored with it, and runs; anything else is
//! refused with the reason and nothing stored.

use crate::support::{secret, start_agent as start};
use base64::Engine as _;
use sonde_oci::signing::{self, SigningKey};
use sonde_tests::{HttpServer, guests};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const ACME: &str = "acme-secret";
const BETA: &str = "beta-secret";

/// `PUT path` with `token`, the `Sonde-Signature` header when given, and
/// `body`: the status and body.
async fn put(api: SocketAddr, path: &str, token: &str, signature: Option<&str>, body: &[u8]) -> (u16, String) {
    let headers: Vec<(&str, &str)> = signature.map(|s| ("Sonde-Signature", s)).into_iter().collect();
    crate::support::call_with(api, "PUT", path, Some(token), &headers, body).await
}

/// The bundle `key` makes over `bytes`, base64 for the header.
fn bundle(key: &Path, bytes: &[u8]) -> String {
    let bundle = SigningKey::read(key).unwrap().blob_bundle(bytes).unwrap();
    base64::engine::general_purpose::STANDARD.encode(bundle)
}

fn stored(state: &Path) -> Vec<String> {
    let mut out: Vec<String> = walk(&state.join("managed/plugins"));
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else {
                vec![p.file_name().unwrap().to_string_lossy().into_owned()]
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_upload_is_taken_and_runs_an_unsigned_or_foreign_one_is_refused() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (acme_key, beta_key) = (d.join("acme.key"), d.join("beta.key"));
    signing::keygen(&acme_key, "acme").unwrap();
    signing::keygen(&beta_key, "beta").unwrap();
    secret(d, "acme.token", ACME);
    secret(d, "beta.token", BETA);
    std::fs::write(
        d.join("sonde.yaml"),
        format!(
            "state_dir: state\nrequire_signed: true\ntrust: [acme.pub, beta.pub]\ntenants:\n  - id: acme\n    token_file: acme.token\n    ceiling: {{net: [\"127.0.0.1:*\"], signers: [acme]}}\n  - id: beta\n    token_file: beta.token\n    ceiling: {{net: [\"127.0.0.1:*\"]}}\ntargets:\n  - name: web\n    address: {}\n    probes:\n      - {{name: ready, plugin: http, period: 1s}}\n",
            server.addr
        ),
    )
    .unwrap();
    let (_agent, api) = start(&d.join("sonde.yaml")).await;
    let state = d.join("state");
    let up = std::fs::read(guests::ALWAYS_UP).unwrap();
    let tcp = sonde_builtins::get("tcp").unwrap();

    let other = d.join("other.key");
    signing::keygen(&other, "other").unwrap();
    let huge = "A".repeat(100 * 1024);
    let refused: [(&str, Option<String>, u16, &str); 6] = [
        ("a head over api.max_header_bytes", Some(huge), 431, ""),
        ("no signature", None, 409, "Sonde-Signature header"),
        ("not base64", Some("%%%".into()), 400, "not base64"),
        ("over other bytes", Some(bundle(&acme_key, tcp)), 422, "tampered"),
        ("by an untrusted key", Some(bundle(&other, &up)), 422, "untrusted"),
        (
            "by another tenant's signer",
            Some(bundle(&beta_key, &up)),
            422,
            "runs only plugins signed by acme",
        ),
    ];
    for (what, sig, want, says) in refused {
        let (status, body) = put(api, "/v1/plugins/up", ACME, sig.as_deref(), &up).await;
        assert_eq!(status, want, "{what}: {body}");
        assert!(body.contains(says), "{what}: {body}");
    }
    assert!(stored(&state).is_empty(), "{:?}", stored(&state));

    // Signed by acme: taken, stored with its bundle, and it runs.
    let (status, body) = put(api, "/v1/plugins/up", ACME, Some(&bundle(&acme_key, &up)), &up).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(stored(&state), ["up.wasm", "up.wasm.sigstore.json"]);
    let spec = format!("address: {}\nplugin: up\nperiod: 100ms\n", server.addr);
    let (status, body) = crate::support::call(api, "PUT", "/v1/probes/acme-up", Some(ACME), spec.as_bytes()).await;
    assert_eq!(status, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, p) = crate::support::call(api, "GET", "/v1/probes/acme-up", Some(ACME), b"").await;
        if serde_json::from_str::<serde_json::Value>(&p).is_ok_and(|v| v["state"] == "success") {
            break;
        }
        assert!(Instant::now() < deadline, "acme-up never succeeded: {p}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Beta has no signer limit: any trusted key will do.
    let (status, body) = put(api, "/v1/plugins/beta-up", BETA, Some(&bundle(&acme_key, &up)), &up).await;
    assert_eq!(status, 201, "{body}");
}
