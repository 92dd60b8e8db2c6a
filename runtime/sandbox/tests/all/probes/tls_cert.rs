//! The built-in tls-cert plugin against real rustls servers whose
//! certificates expire when each test says.

use crate::support::check;
use sonde_sandbox::verdict::{RunResult, Status};
use sonde_tests::{HttpServer, TestCert};
use std::time::{Duration, SystemTime};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A certificate that expires `days` from today.
fn expiring_in(days: u64) -> TestCert {
    let when = humantime::format_rfc3339(SystemTime::now() + Duration::from_secs(days * 86_400)).to_string();
    let (y, m, d) = (&when[0..4], &when[5..7], &when[8..10]);
    TestCert::new(y.parse().unwrap(), m.parse().unwrap(), d.parse().unwrap())
}

async fn tls_cert(server: &HttpServer, config: serde_json::Value) -> RunResult {
    check("tls-cert", &server.addr.to_string(), &config.to_string(), TIMEOUT).await
}

fn days(r: &RunResult) -> f64 {
    r.metrics
        .iter()
        .find(|m| m.name == "cert_expiry_seconds")
        .map(|m| m.value / 86_400.0)
        .unwrap_or_else(|| panic!("no cert_expiry_seconds: {r:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn days_to_expiry_give_success_warning_and_failure() {
    for (valid_for, status) in [(400, Status::Success), (20, Status::Warning), (3, Status::Failure)] {
        let cert = expiring_in(valid_for);
        let server = HttpServer::start_tls(&cert).await;
        let r = tls_cert(&server, serde_json::json!({"ca_pem": cert.ca_pem})).await;
        assert_eq!((r.status, r.reason), (status, None), "{valid_for} days: {r:?}");
        let d = days(&r);
        assert!((d - valid_for as f64).abs() <= 1.0, "{valid_for} days reported as {d}");
        assert!(r.message.contains("expires in"), "{}", r.message);
        assert!(server.requests().is_empty(), "a handshake, no HTTP request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_are_configurable() {
    let cert = expiring_in(20);
    let server = HttpServer::start_tls(&cert).await;
    let r = tls_cert(
        &server,
        serde_json::json!({"ca_pem": cert.ca_pem, "warn_days": 10, "fail_days": 5}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = tls_cert(
        &server,
        serde_json::json!({"ca_pem": cert.ca_pem, "warn_days": 60, "fail_days": 30}),
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    let r = tls_cert(&server, serde_json::json!({"warn_days": 1, "fail_days": 5})).await;
    assert_eq!(r.reason, Some(sonde_sandbox::verdict::Reason::InvalidConfig), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_or_expired_certificate_is_a_failure_that_says_why() {
    let cert = expiring_in(400);
    let server = HttpServer::start_tls(&cert).await;
    let r = tls_cert(&server, serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("not trusted"), "{}", r.message);

    let expired = TestCert::new(2020, 1, 1);
    let server = HttpServer::start_tls(&expired).await;
    let r = tls_cert(&server, serde_json::json!({"ca_pem": expired.ca_pem})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("expired"), "{}", r.message);
    // Without verification only the dates are judged: still a failure.
    let r = tls_cert(&server, serde_json::json!({"insecure_skip_verify": true})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(days(&r) < -365.0, "{r:?}");
}
