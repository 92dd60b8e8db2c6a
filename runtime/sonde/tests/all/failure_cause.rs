//! Why a probe failed, as a series: `sonde_probe_failure_cause{cause}`
//! on `/probe` and on `/metrics` (docs/prometheus.md, "Why a probe
//! failed"), from real failures against real servers: a 404, a body
//! regex, a deadline, a closed port, a 500; and none for a probe that
//! passes.

use crate::prometheus::{bearer, get};
use crate::support::{secret, start_agent};
use sonde_tests::{HttpServer, closed_port};
use std::time::{Duration, Instant};

const OP: &str = "operator-secret";

/// The `sonde_probe_failure_cause` samples of an exposition.
fn causes(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("sonde_probe_failure_cause{"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_says_why_on_probe_and_on_metrics() {
    let server = HttpServer::start().await;
    let closed = closed_port();
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "op.token", OP);
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            r#"operator_token_file: op.token
modules:
  http_2xx: {{ plugin: http, timeout: 2s, grants: {{ net: ["127.0.0.1:*"] }} }}
  http_ok: {{ plugin: http, config: {{ path: /ok }}, timeout: 2s, grants: {{ net: ["127.0.0.1:*"] }} }}
  http_body: {{ plugin: http, config: {{ path: /ok, body_regex: "^nope$" }}, timeout: 2s, grants: {{ net: ["127.0.0.1:*"] }} }}
  http_slow: {{ plugin: http, config: {{ path: /hang }}, timeout: 300ms, grants: {{ net: ["127.0.0.1:*"] }} }}
  tcp_connect: {{ plugin: tcp, timeout: 2s, grants: {{ net: ["127.0.0.1:*"] }} }}
targets:
  - name: web
    address: {web}
    probes:
      - {{ name: fine, plugin: http, config: {{ path: /ok }}, period: 100ms }}
      - {{ name: sick, plugin: http, config: {{ path: /fail }}, period: 100ms }}
  - name: gone
    address: {closed}
    probes:
      - {{ name: refused, plugin: tcp, period: 100ms }}
"#,
            web = server.addr,
        ),
    )
    .unwrap();
    let (_agent, api) = start_agent(&config).await;

    let web = server.addr.to_string();
    let gone = closed.to_string();
    for (module, target, want) in [
        ("http_ok", &web, None),
        // The module's path is `/`, where the server answers 404.
        ("http_2xx", &web, Some("status")),
        ("http_body", &web, Some("regex")),
        ("http_slow", &web, Some("timeout")),
        ("tcp_connect", &gone, Some("connect")),
    ] {
        let (status, body) = get(api, &format!("/probe?target={target}&module={module}"), &bearer(OP)).await;
        assert_eq!(status, 200, "{module}: {body}");
        let found = causes(&body);
        match want {
            None => assert!(found.is_empty(), "{module}: {found:?}"),
            Some(cause) => {
                let line = format!("sonde_probe_failure_cause{{cause=\"{cause}\"}} 1");
                assert_eq!(found, [line.as_str()], "{module}: {body}");
            }
        }
    }

    // /metrics: one sample per failing probe, none for the one passing.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = get(api, "/metrics", &bearer(OP)).await;
        let found = causes(&metrics);
        let has = |probe: &str, cause: &str| {
            found.iter().any(|l| {
                l.contains(&format!("probe=\"{probe}\""))
                    && l.contains(&format!("cause=\"{cause}\""))
                    && l.ends_with(" 1")
            })
        };
        if has("sick", "status") && has("refused", "connect") {
            assert_eq!(found.len(), 2, "{found:?}");
            assert!(!found.iter().any(|l| l.contains("probe=\"fine\"")), "{found:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cause for the failing probes in:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
