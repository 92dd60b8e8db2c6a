//! The built-in http and grpc plugins with credentials from secrets: a
//! bearer token, basic auth, a header, a client certificate, gRPC
//! metadata. Each passes with the secret and fails with a wrong one, and
//! what the server received holds the secret only where the host put it.

use super::{PASSWORD, TOKEN, grants, holds};
use crate::support::{builtin, run};
use sonde_policy::secrets::scrub::WITHHELD;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::TestCert;
use sonde_tests::secrets::{AuthServer, ClientCert, Expected};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(5);

fn expected() -> Expected {
    Expected {
        user: "alice".into(),
        password: PASSWORD.into(),
        token: TOKEN.into(),
    }
}

async fn http(server: &AuthServer, config: serde_json::Value, secrets: &[(&str, &str)]) -> RunResult {
    let target = server.addr.to_string();
    run(
        &builtin("http").await,
        &target,
        &config.to_string(),
        &grants(secrets, &[]),
        TIMEOUT,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_and_basic_auth_pass_with_the_secret_and_fail_with_a_wrong_one() {
    let server = AuthServer::start(expected()).await;
    let bearer = serde_json::json!({"path": "/bearer", "bearer_token": "$(secret:token)"});
    let r = http(&server, bearer.clone(), &[("token", TOKEN)]).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = http(&server, bearer, &[("token", "tok-wrong-wrong-wrong")]).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("401"), "{}", r.message);

    let basic = serde_json::json!({"path": "/basic", "basic_auth": {"username": "alice", "password": "$(secret:pw)"}});
    let r = http(&server, basic.clone(), &[("pw", PASSWORD)]).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = http(&server, basic, &[("pw", "not-the-password")]).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");

    // The secret went only into the Authorization header.
    for received in server.received() {
        let (head, rest) = received.headers.split_once("authorization: ").unwrap_or(("", ""));
        assert!(!holds(&received.target, TOKEN) && !holds(head, TOKEN), "{received:?}");
        assert!(received.body.is_empty(), "{received:?}");
        assert!(
            rest.starts_with("Basic ") || rest.starts_with("Bearer "),
            "{received:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_header_is_withheld_with_the_whole_body() {
    let server = AuthServer::start(expected()).await;
    let config = serde_json::json!({
        "path": "/echo",
        "headers": {"x-api-key": "$(secret:token)", "authorization": "Basic $(base64:alice:$(secret:pw))"},
        "show_body": true,
        "header_regex": {"sonde-withheld": "reflected a secret"},
    });
    let r = http(&server, config, &[("token", TOKEN), ("pw", PASSWORD)]).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let seen = format!("{r:?}");
    assert!(!holds(&seen, TOKEN) && !holds(&seen, PASSWORD), "{seen}");
    // The echoed header field and the body that echoes the request are
    // withheld whole: nothing of either depends on the secrets.
    assert_eq!(r.detail.as_deref(), Some(WITHHELD), "{r:?}");
    let received = server.received();
    assert!(
        received[0].headers.contains(&format!("x-api-key: {TOKEN}")),
        "{received:?}"
    );
}

/// Over HTTP/2 (an https server that chooses it by ALPN), the header that
/// carries a secret reaches the server and the echo is withheld, as over
/// HTTP/1.1: the response goes through the same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_over_http2_is_withheld_as_over_http1() {
    let cert = TestCert::new(2030, 1, 1);
    let server = AuthServer::start_h2(expected(), &cert).await;
    let config = |http2: bool| {
        serde_json::json!({
            "path": "/echo",
            "scheme": "https",
            "ca_pem": cert.ca_pem,
            "enable_http2": http2,
            "headers": {"x-api-key": "$(secret:token)"},
            "show_body": true,
            "header_regex": {"sonde-withheld": "reflected a secret"},
        })
    };
    for (http2, version) in [(true, (2, 0)), (false, (1, 1))] {
        let r = http(&server, config(http2), &[("token", TOKEN)]).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        let seen = r.observed.as_ref().and_then(|o| o.http.as_ref()).map(|h| h.version);
        assert_eq!(seen, Some(version), "enable_http2: {http2}");
        let text = format!("{r:?}");
        assert!(!holds(&text, TOKEN), "{text}");
        assert_eq!(r.detail.as_deref(), Some(WITHHELD), "{r:?}");
    }
    let received = server.received();
    assert_eq!(received.len(), 2, "{received:?}");
    for r in &received {
        assert!(r.headers.contains(&format!("x-api-key: {TOKEN}")), "{received:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_the_grants_do_not_name_is_denied_by_its_name() {
    let server = AuthServer::start(expected()).await;
    let config = serde_json::json!({"path": "/bearer", "bearer_token": "$(secret:token)"});
    let r = http(&server, config.clone(), &[]).await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(
        r.message.contains("use secret \"token\"") && r.message.contains("grants.secrets is empty"),
        "{}",
        r.message
    );
    let r = http(&server, config, &[("other", TOKEN)]).await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(r.message.contains("grants.secrets (other)"), "{}", r.message);
    assert!(!holds(&format!("{r:?}"), TOKEN));
    assert!(server.received().is_empty(), "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_passes_with_the_client_certificate_from_secrets_and_fails_without() {
    let client = ClientCert::new();
    let server_cert = TestCert::new(2030, 1, 1);
    let server = AuthServer::start_mtls(expected(), &server_cert, &client.ca_pem).await;
    let target = format!("localhost:{}", server.addr.port());
    let with = serde_json::json!({
        "path": "/mtls",
        "scheme": "https",
        "ca_pem": server_cert.ca_pem,
        "client_cert": {"cert": "$(secret:client-cert)", "key": "$(secret:client-key)"},
    });
    let secrets = [
        ("client-cert", client.cert_pem.as_str()),
        ("client-key", client.key_pem.as_str()),
    ];
    let plugin = builtin("http").await;
    let net = [format!("127.0.0.1:{}", server.addr.port())];
    let net: Vec<&str> = net.iter().map(String::as_str).collect();
    let r = run(&plugin, &target, &with.to_string(), &grants(&secrets, &net), TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        server.received().iter().all(|r| r.client_cert),
        "{:?}",
        server.received()
    );

    let without = serde_json::json!({"path": "/mtls", "scheme": "https", "ca_pem": server_cert.ca_pem});
    let r = run(&plugin, &target, &without.to_string(), &grants(&secrets, &net), TIMEOUT).await;
    assert_ne!(r.status, Status::Success, "the server wants a certificate: {r:?}");

    // Another CA's certificate is refused by the server.
    let stranger = ClientCert::new();
    let other = [
        ("client-cert", stranger.cert_pem.as_str()),
        ("client-key", stranger.key_pem.as_str()),
    ];
    let r = run(&plugin, &target, &with.to_string(), &grants(&other, &net), TIMEOUT).await;
    assert_ne!(r.status, Status::Success, "{r:?}");
    let seen = format!("{r:?}");
    assert!(!seen.contains("PRIVATE KEY"), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_metadata_carries_the_secret_to_the_server_only() {
    let server = sonde_tests::GrpcHealthServer::start().await;
    let config = serde_json::json!({"metadata": {"authorization": "Bearer $(secret:token)", "x-team": "infra"}});
    let plugin = builtin("grpc").await;
    let r = run(
        &plugin,
        &server.addr.to_string(),
        &config.to_string(),
        &grants(&[("token", TOKEN)], &[]),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let calls = server.metadata();
    let auth: Vec<&str> = calls[0]
        .iter()
        .filter(|(n, _)| n == "authorization")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(auth, [format!("Bearer {TOKEN}").as_str()]);
    // Not granted: denied by name, nothing sent.
    let before = server.accepted();
    let r = run(
        &plugin,
        &server.addr.to_string(),
        &config.to_string(),
        &grants(&[], &[]),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(r.message.contains("use secret \"token\""), "{}", r.message);
    assert_eq!(server.accepted(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_http_headers_take_handles_and_answers_come_back_scrubbed() {
    let server = AuthServer::start(expected()).await;
    let plugin = crate::support::guest(sonde_tests::guests::WASI_HTTP_ELSEWHERE).await;
    let ask = |path: &str, value: &str| {
        serde_json::json!({
            "authority": server.addr.to_string(),
            "path": path,
            "headers": [["authorization", value]],
        })
        .to_string()
    };
    let target = server.addr.to_string();
    let granted = grants(&[("token", TOKEN)], &[]);
    let r = run(
        &plugin,
        &target,
        &ask("/bearer", "Bearer $(secret:token)"),
        &granted,
        TIMEOUT,
    )
    .await;
    assert!(r.message.contains(": 200 "), "{r:?}");
    let r = run(
        &plugin,
        &target,
        &ask("/echo", "Bearer $(secret:token)"),
        &granted,
        TIMEOUT,
    )
    .await;
    assert!(
        r.message
            .contains("sonde-withheld=[withheld: the peer reflected a secret]"),
        "{r:?}"
    );
    assert!(!r.message.contains("x-echo-authorization"), "{r:?}");
    assert!(
        r.message.ends_with(" [withheld: the peer reflected a secret]"),
        "the body too: {r:?}"
    );
    assert!(!holds(&format!("{r:?}"), TOKEN), "{r:?}");
    let r = run(
        &plugin,
        &target,
        &ask("/bearer", "Bearer $(secret:token)"),
        &grants(&[], &[]),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_mtls_passes_with_the_client_certificate_from_secrets_and_fails_without() {
    let client = ClientCert::new();
    let server_cert = TestCert::new(2030, 1, 1);
    let server = sonde_tests::GrpcHealthServer::start_mtls(&server_cert, &client.ca_pem).await;
    let target = format!("localhost:{}", server.addr.port());
    let net = [format!("127.0.0.1:{}", server.addr.port())];
    let net: Vec<&str> = net.iter().map(String::as_str).collect();
    let secrets = [
        ("client-cert", client.cert_pem.as_str()),
        ("client-key", client.key_pem.as_str()),
    ];
    let plugin = builtin("grpc").await;
    let with = serde_json::json!({
        "tls": true,
        "ca_pem": server_cert.ca_pem,
        "client_cert": {"cert": "$(secret:client-cert)", "key": "$(secret:client-key)"},
    });
    let r = run(&plugin, &target, &with.to_string(), &grants(&secrets, &net), TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let without = serde_json::json!({"tls": true, "ca_pem": server_cert.ca_pem});
    let r = run(&plugin, &target, &without.to_string(), &grants(&secrets, &net), TIMEOUT).await;
    assert_ne!(r.status, Status::Success, "the server wants a certificate: {r:?}");
    // A key given by handle but not granted: denied by name.
    let r = run(&plugin, &target, &with.to_string(), &grants(&[], &net), TIMEOUT).await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    assert!(r.message.contains("use secret \"client-cert\""), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_session_presents_the_client_certificate_from_secrets() {
    let client = ClientCert::new();
    let server_cert = TestCert::new(2030, 1, 1);
    let server = AuthServer::start_mtls(expected(), &server_cert, &client.ca_pem).await;
    let target = format!("localhost:{}", server.addr.port());
    let net = [format!("127.0.0.1:{}", server.addr.port())];
    let net: Vec<&str> = net.iter().map(String::as_str).collect();
    let secrets = [
        ("client-cert", client.cert_pem.as_str()),
        ("client-key", client.key_pem.as_str()),
    ];
    let plugin = builtin("tcp").await;
    let ask = |client_cert: bool| {
        let mut config = serde_json::json!({
            "tls": true,
            "ca_pem": server_cert.ca_pem,
            "send": "GET /mtls HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            "expect": "HTTP/1.1 200",
        });
        if client_cert {
            config["client_cert"] = serde_json::json!({"cert": "$(secret:client-cert)", "key": "$(secret:client-key)"});
        }
        config.to_string()
    };
    let r = run(&plugin, &target, &ask(true), &grants(&secrets, &net), TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = run(&plugin, &target, &ask(false), &grants(&secrets, &net), TIMEOUT).await;
    assert_ne!(r.status, Status::Success, "the server wants a certificate: {r:?}");
}
