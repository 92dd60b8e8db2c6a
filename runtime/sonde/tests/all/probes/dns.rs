//! The dns plugin as `sonde check` runs it: a name that resolves to
//! loopback through the system resolver is denied before any datagram.
//! The plugin's own contract is in sonde-sandbox's tests.

use crate::support::sonde_with_mounts;
use sonde_tests::dns::{RESPONSE, Responder, a_record, reply};
use std::time::Duration;

/// A name that resolves to loopback (through a hosts file mounted over
/// `/etc/hosts` for `sonde check`) is denied before any datagram is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_leading_to_loopback_is_denied_before_any_datagram() {
    let server = Responder::answering(|q| reply(q, RESPONSE, [1, 0, 0], &a_record([192, 0, 2, 1]))).await;
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 lo.acme.test\n").unwrap();
    let target = format!("lo.acme.test:{}", server.addr.port());
    let out = tokio::process::Command::from(sonde_with_mounts(&[(&hosts, "/etc/hosts")]))
        .args([
            "check",
            "dns",
            "--target",
            &target,
            "--timeout",
            "3s",
            "-o",
            "json",
            "--config",
            &a_query(),
        ])
        .output()
        .await
        .expect("unshare");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["reason"], "denied", "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("denied: UDP exchange with {target}")),
        "{message}"
    );
    assert!(
        message.contains("loopback is not reachable through a name"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(server.received(), 0, "nothing sent");
}

fn a_query() -> String {
    serde_json::json!({"query_name": "x.example.test", "query_type": "A"}).to_string()
}
