//! A tenant's secrets are its own: through the API a tenant adds probes
//! that use its secrets, and one that names another tenant's is refused
//! without learning whose it is or what it holds.

use super::TOKEN;
use crate::support::{call, secret, start_agent};
use std::time::{Duration, Instant};

const A: &str = "tenant-a-api-token";
const B: &str = "tenant-b-api-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_uses_its_own_secrets_and_never_another_s() {
    let server = super::token_server().await;
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "a.token", A);
    secret(dir.path(), "b.token", B);
    secret(dir.path(), "a.secret", TOKEN);
    secret(dir.path(), "b.secret", "b-secret-value-0000");
    let config = dir.path().join("sonde.yaml");
    std::fs::write(
        &config,
        r#"state_dir: state
tenants:
  - id: a
    token_file: a.token
    ceiling: { net: ["127.0.0.1:*"] }
    secrets: { a-key: { file: a.secret } }
  - id: b
    token_file: b.token
    ceiling: { net: ["127.0.0.1:*"] }
    secrets: { b-key: { file: b.secret } }
targets: []
"#,
    )
    .unwrap();
    let (_agent, api) = start_agent(&config).await;
    let probe = |key: &str| {
        format!(
            "address: {}\nplugin: http\nperiod: 100ms\nconfig: {{path: /bearer, bearer_token: \"$(secret:{key})\"}}\ngrants: {{secrets: [{key}]}}\n",
            server.addr
        )
    };
    let (status, body) = call(api, "PUT", "/v1/probes/a-check", Some(A), probe("a-key").as_bytes()).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(api, "PUT", "/v1/probes/b-check", Some(B), probe("a-key").as_bytes()).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains(
            "\\\"a-key\\\" is not a secret of tenant \\\"b\\\"; a probe may use only its own tenant's secrets"
        ),
        "{body}"
    );
    assert!(!body.contains("tenant \\\"a\\\"") && !body.contains(TOKEN), "{body}");
    // Its own secret passes the server's check.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = call(api, "GET", "/v1/probes/a-check", Some(A), b"").await;
        if body.contains("\"state\": \"success\"") {
            assert!(!body.contains(TOKEN));
            break;
        }
        assert!(Instant::now() < deadline, "a-check never passed: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
