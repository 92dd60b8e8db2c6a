//! TLS and keep-alive in the host's transports, against real rustls servers
//! presenting certificates rcgen makes for each test.

use crate::support::{builtin, check, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{HttpServer, TestCert, closed_port, guests};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Generous: TLS tests share two cores with the rest of the suite.
const TIMEOUT: Duration = Duration::from_secs(5);

fn metric(r: &RunResult, name: &str) -> Option<f64> {
    r.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A certificate valid until 2030-01-01.
fn cert() -> TestCert {
    TestCert::new(2030, 1, 1)
}

async fn https(server: &HttpServer, config: serde_json::Value) -> RunResult {
    let target = format!("https://{}", server.addr);
    check("http", &target, &config.to_string(), TIMEOUT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_custom_ca() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let r = https(&server, serde_json::json!({"path": "/ok", "ca_pem": cert.ca_pem})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(metric(&r, "tls_seconds").unwrap() > 0.0, "{:?}", r.metrics);
    let expiry = metric(&r, "cert_expiry_seconds").expect("cert_expiry_seconds");
    let expected = (cert.not_after - now()) as f64;
    assert!((expiry - expected).abs() < 120.0, "{expiry} vs {expected}");
    assert_eq!(server.requests(), ["/ok"]);

    // A host:port target with `scheme: https`, verified by name.
    let r = check(
        "http",
        &format!("localhost:{}", server.addr.port()),
        &serde_json::json!({"scheme": "https", "path": "/json", "ca_pem": cert.ca_pem}).to_string(),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_fails_and_says_why() {
    let server = HttpServer::start_tls(&cert()).await;
    // The system's roots do not know the test CA.
    let r = https(&server, serde_json::json!({"path": "/ok"})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("not trusted"), "{}", r.message);
    // Nor does another CA.
    let r = https(&server, serde_json::json!({"path": "/ok", "ca_pem": cert().ca_pem})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("not trusted"), "{}", r.message);
    assert!(server.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_skip_verify_accepts_any_certificate() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let r = https(
        &server,
        serde_json::json!({"path": "/ok", "insecure_skip_verify": true}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(metric(&r, "cert_expiry_seconds").unwrap() > 0.0);

    // An expired certificate is refused, and accepted without checks, with
    // its (negative) expiry still reported.
    let expired = TestCert::new(2020, 1, 1);
    let server = HttpServer::start_tls(&expired).await;
    let r = https(&server, serde_json::json!({"path": "/ok", "ca_pem": expired.ca_pem})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("expired"), "{}", r.message);
    let r = https(
        &server,
        serde_json::json!({"path": "/ok", "insecure_skip_verify": true}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(metric(&r, "cert_expiry_seconds").unwrap() < 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_certificate_presented_as_the_servers_own_is_refused_and_says_so() {
    let cert = TestCert::self_signed_ca();
    let server = HttpServer::start_tls(&cert).await;
    let r = https(&server, serde_json::json!({"path": "/ok", "ca_pem": cert.ca_pem})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("presents a CA certificate"), "{}", r.message);
    let r = https(
        &server,
        serde_json::json!({"path": "/ok", "insecure_skip_verify": true}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_name_overrides_what_is_verified() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let config = |name: &str| serde_json::json!({"path": "/ok", "ca_pem": cert.ca_pem, "server_name": name});
    let r = https(&server, config("localhost")).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = https(&server, config("db.example")).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("not valid for \"db.example\""), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_config_is_invalid() {
    let server = HttpServer::start_tls(&cert()).await;
    for config in [
        serde_json::json!({"ca_pem": "not a certificate"}),
        serde_json::json!({"ca_pem": cert().ca_pem, "insecure_skip_verify": true}),
        serde_json::json!({"ca_pem": cert().ca_pem, "ca_file": "/etc/hostname"}),
        serde_json::json!({"scheme": "ftp"}),
    ] {
        let r = https(&server, config.clone()).await;
        assert_eq!(r.reason, Some(Reason::InvalidConfig), "{config}: {r:?}");
    }
    assert_eq!(server.accepted(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_file_is_read_through_a_files_grant() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.pem");
    std::fs::write(&path, &cert.ca_pem).unwrap();
    let config = serde_json::json!({"path": "/ok", "ca_file": path}).to_string();
    let target = format!("https://{}", server.addr);
    let http = builtin("http").await;
    let granted = Grants {
        files: vec![dir.path().to_path_buf()],
        ..Grants::default()
    };
    let r = run(&http, &target, &config, &granted, TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = run(&http, &target, &config, &Grants::default(), TIMEOUT).await;
    assert_eq!(r.reason, Some(Reason::Denied), "{r:?}");
    // Under a grant of another directory the file does not exist for the
    // plugin (as std's wasi-libc has it): the config names a missing file.
    let elsewhere = tempfile::tempdir().unwrap();
    let other = Grants {
        files: vec![elsewhere.path().to_path_buf()],
        ..Grants::default()
    };
    let r = run(&http, &target, &config, &other, TIMEOUT).await;
    assert_eq!(r.reason, Some(Reason::InvalidConfig), "{r:?}");
    assert!(r.message.contains("No such file"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_redirect_to_another_host_is_not_followed() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let other = HttpServer::start_tls(&cert).await;
    let r = https(
        &server,
        serde_json::json!({"path": format!("/away_https?to={}", other.addr), "ca_pem": cert.ca_pem}),
    )
    .await;
    assert_eq!(r.status, Status::Warning, "{r:?}");
    assert!(r.message.contains("another host"), "{}", r.message);
    assert_eq!(other.accepted(), 0);
    // A redirect on the same host is followed over the same TLS options.
    let r = https(&server, serde_json::json!({"path": "/redirect", "ca_pem": cert.ca_pem})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_reuses_one_connection_and_the_default_does_not() {
    const N: usize = 5;
    let plain = HttpServer::start().await;
    let target = plain.addr.to_string();
    for _ in 0..N {
        let r = check("http", &target, r#"{"path": "/ok", "keepalive": true}"#, TIMEOUT).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
    }
    assert_eq!(plain.accepted(), 1);
    for _ in 0..N {
        let r = check("http", &target, r#"{"path": "/ok"}"#, TIMEOUT).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
    }
    assert_eq!(plain.accepted(), 1 + N);

    let cert = cert();
    let tls = HttpServer::start_tls(&cert).await;
    let keepalive = serde_json::json!({"path": "/ok", "ca_pem": cert.ca_pem, "keepalive": true});
    let mut expiry = Vec::new();
    for _ in 0..N {
        let r = https(&tls, keepalive.clone()).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        expiry.push(metric(&r, "cert_expiry_seconds").expect("reported on reuse too"));
    }
    assert_eq!(tls.accepted(), 1);
    assert!(expiry.iter().all(|e| *e > 0.0));
    // Other TLS options do not share the verified connection.
    let r = https(
        &tls,
        serde_json::json!({"path": "/ok", "insecure_skip_verify": true, "keepalive": true}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(tls.accepted(), 2);
    // A body read only in part leaves nothing reusable behind: the first
    // such probe takes the pooled connection, the second a new one, and the
    // next probe finds none to reuse.
    let big = serde_json::json!({"path": "/big", "ca_pem": cert.ca_pem, "keepalive": true, "max_body": 100});
    for _ in 0..2 {
        assert_eq!(https(&tls, big.clone()).await.status, Status::Success);
    }
    assert_eq!(tls.accepted(), 3);
    assert_eq!(https(&tls, keepalive).await.status, Status::Success);
    assert_eq!(tls.accepted(), 4);
}

/// The version of the last response a run's host saw.
fn version(r: &RunResult) -> Option<(u8, u8)> {
    r.observed.as_ref().and_then(|o| o.http.as_ref()).map(|h| h.version)
}

/// An https server that speaks HTTP/2: the http plugin offers it by
/// default and speaks it (a `Host` header is the `:authority`, redirects
/// are followed), `enable_http2: false` keeps to HTTP/1.1, and keep-alive
/// reuses an HTTP/2 connection only for requests that offer HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_offered_over_tls_and_spoken_when_chosen() {
    let cert = cert();
    let server = HttpServer::start_h2_tls(&cert).await;
    let config = |extra: serde_json::Value| {
        let mut c = serde_json::json!({"path": "/authority", "ca_pem": cert.ca_pem, "show_body": true});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let port = server.addr.port();
    let r = https(&server, config(serde_json::json!({}))).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(version(&r), Some((2, 0)));
    assert_eq!(r.detail.as_deref(), Some(format!("HTTP/2.0 127.0.0.1:{port}").as_str()));
    let r = https(
        &server,
        config(serde_json::json!({"headers": {"Host": "vhost.sonde.test"}})),
    )
    .await;
    assert_eq!(r.detail.as_deref(), Some("HTTP/2.0 vhost.sonde.test"), "{r:?}");
    let r = https(&server, config(serde_json::json!({"enable_http2": false}))).await;
    assert_eq!(version(&r), Some((1, 1)));
    assert_eq!(r.detail.as_deref(), Some(format!("HTTP/1.1 127.0.0.1:{port}").as_str()));
    let r = https(&server, config(serde_json::json!({"path": "/redirect"}))).await;
    assert_eq!((r.status, version(&r)), (Status::Success, Some((2, 0))), "{r:?}");
    assert_eq!(server.accepted(), 5, "a new connection per request");

    for _ in 0..3 {
        let r = https(&server, config(serde_json::json!({"keepalive": true}))).await;
        assert_eq!((r.status, version(&r)), (Status::Success, Some((2, 0))), "{r:?}");
    }
    assert_eq!(server.accepted(), 6, "one connection, reused");
    let r = https(
        &server,
        config(serde_json::json!({"keepalive": true, "enable_http2": false})),
    )
    .await;
    assert_eq!((r.status, version(&r)), (Status::Success, Some((1, 1))), "{r:?}");
    assert_eq!(server.accepted(), 7, "the HTTP/2 connection serves no HTTP/1.1 request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_never_bypasses_the_grants() {
    let server = HttpServer::start_tls(&cert()).await;
    let url = format!("https://{}/ok", server.addr);
    // Warm the pool with a connection the hostile guest's request would fit.
    let r = check(
        "http",
        &url,
        r#"{"insecure_skip_verify": true, "keepalive": true}"#,
        TIMEOUT,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!((server.accepted(), server.requests().len()), (1, 1));

    let config = serde_json::json!({"host": "127.0.0.1", "port": server.addr.port(), "url": url});
    let r = run(
        &guest(guests::TLS_ELSEWHERE).await,
        &closed_port().to_string(),
        &config.to_string(),
        &Grants::default(),
        TIMEOUT,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("TLS handshake with 127.0.0.1"), "{}", r.message);
    assert!(r.message.contains("(and 2 more)"), "{}", r.message);
    assert_eq!((server.accepted(), server.requests().len()), (1, 1));
}

async fn tcp(server_addr: &str, config: serde_json::Value) -> RunResult {
    check("tcp", server_addr, &config.to_string(), TIMEOUT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_tls_handshake() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let addr = server.addr.to_string();
    let r = tcp(&addr, serde_json::json!({"tls": true, "ca_pem": cert.ca_pem})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.starts_with("TLSv1.3"), "{}", r.message);
    assert!(metric(&r, "tls_seconds").unwrap() > 0.0);
    let expiry = metric(&r, "cert_expiry_seconds").unwrap();
    assert!((expiry - (cert.not_after - now()) as f64).abs() < 120.0, "{expiry}");

    let r = tcp(&addr, serde_json::json!({"tls": true})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("not trusted"), "{}", r.message);
    let r = tcp(&addr, serde_json::json!({"tls": true, "insecure_skip_verify": true})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(server.accepted(), 3);

    // A server that does not speak TLS, and one that is not there.
    let plain = HttpServer::start().await;
    let r = tcp(&plain.addr.to_string(), serde_json::json!({"tls": true})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("tls:"), "{}", r.message);
    let r = tcp(&closed_port().to_string(), serde_json::json!({"tls": true})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connect"), "{}", r.message);

    let r = tcp(
        &addr,
        serde_json::json!({"tls": true, "insecure_skip_verify": true, "send": "x"}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = tcp(&addr, serde_json::json!({"insecure_skip_verify": true})).await;
    assert_eq!(r.reason, Some(Reason::InvalidConfig), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_send_expect_over_tls() {
    let cert = cert();
    let server = HttpServer::start_tls(&cert).await;
    let request = "GET /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let r = tcp(
        &server.addr.to_string(),
        serde_json::json!({"tls": true, "ca_pem": cert.ca_pem, "send": request, "expect": "\"db\": \"ok\""}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.ends_with("and completed 2 step(s)"), "{}", r.message);
    assert!(metric(&r, "cert_expiry_seconds").unwrap() > 0.0);
    assert_eq!(server.requests(), ["/json"]);

    let r = tcp(
        &server.addr.to_string(),
        serde_json::json!({"tls": true, "ca_pem": cert.ca_pem, "steps": [{"send": request}, {"expect": "^HTTP/1.1 500"}]}),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message.starts_with("step 2: expected /^HTTP/1.1 500/"),
        "{}",
        r.message
    );
    assert!(r.detail.unwrap().starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_holds_at_most_four_tls_sessions() {
    let server = HttpServer::start_tls(&cert()).await;
    let r = run(
        &guest(guests::HOARD_TLS_SESSIONS).await,
        &server.addr.to_string(),
        "{}",
        &Grants::default(),
        TIMEOUT,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.starts_with("opened 4; then"), "{}", r.message);
    assert!(r.message.contains("at most 4 sessions"), "{}", r.message);
    assert_eq!(server.accepted(), 4);
}
