//! A secret is never written to the state dir, the log (at `trace`), an
//! API answer, `/metrics`, `/probe` or `sonde validate -o json`: the real
//! `sonde run`, with probes and a `/probe` module that use a secret
//! toward an echoing server, then everything it wrote and answered is
//! searched for any form of the secret.

use super::{TOKEN, holds};
use crate::support::{cache_dir, call, secret, sonde};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn config(server: SocketAddr) -> String {
    format!(
        r#"state_dir: state
secrets:
  token: {{ file: token.secret }}
targets:
  - name: api
    address: {server}
    probes:
      - name: bearer
        plugin: http
        config: {{ path: /bearer, bearer_token: "$(secret:token)" }}
        grants: {{ secrets: [token] }}
        period: 200ms
      - name: echo
        plugin: http
        config: {{ path: /echo, headers: {{ x-key: "$(secret:token)" }}, show_body: true }}
        grants: {{ secrets: [token] }}
        period: 200ms
modules:
  echo:
    plugin: http
    config: {{ path: /echo, headers: {{ x-key: "$(secret:token)" }}, show_body: true }}
    grants: {{ net: ["127.0.0.1:*"], secrets: [token] }}
"#
    )
}

/// Every file under `dir`, as text.
fn all_files(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            out += &all_files(&path);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out += &format!("== {}\n{}\n", path.display(), String::from_utf8_lossy(&bytes));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_is_in_no_state_file_log_line_or_answer() {
    let server = super::token_server().await;
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "token.secret", TOKEN);
    let file = dir.path().join("sonde.yaml");
    std::fs::write(&file, config(server.addr)).unwrap();

    let validated = sonde(&["validate", "-o", "json", file.to_str().unwrap()]);
    assert!(validated.status.success(), "{validated:?}");
    let mut seen = String::from_utf8_lossy(&validated.stdout).into_owned();
    assert!(seen.contains("\"token\": \"file "), "the source is shown: {seen}");

    let mut child = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["run", "--api", "127.0.0.1:0", "--grace", "0s", "--config"])
        .arg(&file)
        .current_dir(dir.path())
        .env("RUST_LOG", "trace")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sonde run");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("sonde started") {
                let api = line
                    .split_once("api=http://")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .and_then(|a| a.parse::<SocketAddr>().ok());
                let _ = tx.send(api);
            }
            kept.lock().unwrap().push(line);
        }
    });
    let api = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap()
        .expect("the API address");

    // The probes use the secret: the bearer check passes.
    let mut passed = false;
    for _ in 0..100 {
        let (_, body) = call(api, "GET", "/v1/probes/bearer", None, b"").await;
        if body.contains("\"success\"") {
            passed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(passed, "the bearer probe never passed");
    for path in [
        "/v1/probes",
        "/v1/probes/bearer",
        "/v1/probes/echo",
        "/v1/targets",
        "/v1/targets/api",
        "/v1/status",
        "/metrics",
        "/",
        &format!("/probe?module=echo&target={}&debug=true", server.addr),
        &format!("/probe?module=echo&target={}", server.addr),
    ] {
        let (status, body) = call(api, "GET", path, None, b"").await;
        seen += &format!("== GET {path}: {status}\n{body}\n");
    }
    let (_, run) = call(api, "POST", "/v1/probes/echo/run", None, b"").await;
    seen += &run;
    assert!(
        seen.contains("[withheld: the peer reflected a secret]"),
        "the echo was run and scrubbed: {seen}"
    );
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let _ = child.wait();

    seen += &all_files(&dir.path().join("state"));
    let log = lines.lock().unwrap().join("\n");
    assert!(log.lines().count() > 20, "a trace log: {log}");
    assert!(!holds(&log, TOKEN), "the log holds the secret");
    assert!(!holds(&seen, TOKEN), "an answer or state file holds the secret: {seen}");
    // The server did get it, where the host put it.
    assert!(server.received().iter().any(|r| r.headers.contains(TOKEN)));
}

#[test]
fn a_files_grant_that_shows_a_secret_file_is_refused_whoever_owns_it() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    secret(&secrets, "db", TOKEN);
    // A link to the directory shows the file too, once resolved.
    std::os::unix::fs::symlink(&secrets, dir.path().join("link")).unwrap();
    let config = format!(
        "tenants:\n  - id: shop\n    ceiling: {{ net: ['127.0.0.1:*'], files: ['{d}'] }}\n    secrets:\n      db: {{ file: secrets/db }}\ntargets:\n  - name: a\n    address: 127.0.0.1:1\n    probes:\n      - plugin: tcp\n        grants: {{ files: ['{d}/link'] }}\n  - name: b\n    tenant: shop\n    address: 127.0.0.1:2\n    probes:\n      - plugin: tcp\n        grants: {{ files: ['{d}'] }}\n",
        d = dir.path().display()
    );
    let file = dir.path().join("sonde.yaml");
    std::fs::write(&file, config).unwrap();
    let out = sonde(&["validate", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(text.matches("shows the file of secret \"db\"").count(), 2, "{text}");
    assert!(!text.contains(TOKEN));
}
