//! More cases beside each release of blackbox_exporter, compared as
//! [`super::compare`] compares: an HTTPS server that speaks HTTP/2 (with
//! and without `enable_http2`), certificates whose names carry attributes
//! Go has no short name for, a name that does not resolve, and targets on
//! the IPv6 loopback.

use super::servers::{h2_tls, ipv6, raw_http, uid_and_email};
use super::{Blackbox, Case, OP, compare, json};
use crate::support::{secret, start_agent};
use sonde_tests::TestCert;

/// A name that never resolves (`.invalid`, RFC 6761).
const NOWHERE: &str = "nowhere.sonde.invalid";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_names_resolution_and_ipv6_answer_as_blackbox_exporter_does() {
    let dir = tempfile::tempdir().unwrap();
    let valid = TestCert::new(2030, 1, 1);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &valid.ca_pem).unwrap();
    let (uid_acceptor, uid_pem) = uid_and_email();
    let uid_ca = dir.path().join("uid-ca.pem");
    std::fs::write(&uid_ca, &uid_pem).unwrap();
    let (ca, uid_ca) = (ca.display(), uid_ca.display());

    let bb_config = format!(
        r#"modules:
  http_2xx: {{ prober: http, timeout: 5s }}
  http_ca: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{ca}" }} }} }}
  http_ca_h1: {{ prober: http, timeout: 5s, http: {{ enable_http2: false, tls_config: {{ ca_file: "{ca}" }} }} }}
  http_uid: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{uid_ca}" }} }} }}
  tcp_connect: {{ prober: tcp, timeout: 5s }}
  tcp_uid: {{ prober: tcp, timeout: 5s, tcp: {{ tls: true, tls_config: {{ ca_file: "{uid_ca}" }} }} }}
"#
    );
    let exporters = Blackbox::start_each(dir.path(), &bb_config).await;
    if exporters.is_empty() {
        return;
    }
    let (ca_pem, uid_json) = (json(&valid.ca_pem), json(&uid_pem));
    let grants = format!(r#"grants: {{ net: ["127.0.0.1:*", "[::1]:*", "{NOWHERE}:*"] }}"#);
    secret(dir.path(), "op.token", OP);
    let sonde_config = format!(
        r#"operator_token_file: op.token
modules:
  http_2xx: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"] }}, {grants} }}
  http_ca: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {ca_pem} }}, {grants} }}
  http_ca_h1: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], enable_http2: false, ca_pem: {ca_pem} }}, {grants} }}
  http_uid: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {uid_json} }}, {grants} }}
  tcp_connect: {{ plugin: tcp, timeout: 5s, {grants} }}
  tcp_uid: {{ plugin: tcp, timeout: 5s, config: {{ tls: true, ca_pem: {uid_json} }}, {grants} }}
"#
    );
    let config = dir.path().join("sonde.yaml");
    std::fs::write(&config, sonde_config).unwrap();
    let (_agent, api) = start_agent(&config).await;

    let (h2, _h2) = h2_tls(&valid).await;
    let (uid, _uid) = raw_http(Some(uid_acceptor)).await;
    let (v6, v6_closed, _v6) = ipv6().await;

    let cases: Vec<Case> = vec![
        (
            "https, HTTP/2 offered",
            "http_ca",
            "http_ca",
            format!("https://{h2}/ok"),
        ),
        (
            "https, HTTP/2 turned off",
            "http_ca_h1",
            "http_ca_h1",
            format!("https://{h2}/ok"),
        ),
        (
            "https HTTP/2, 404",
            "http_ca",
            "http_ca",
            format!("https://{h2}/nothing"),
        ),
        (
            "https, UID and emailAddress in subject and issuer",
            "http_uid",
            "http_uid",
            format!("https://{uid}/ok"),
        ),
        (
            "tcp tls, UID and emailAddress in subject and issuer",
            "tcp_uid",
            "tcp_uid",
            uid.to_string(),
        ),
        (
            "http, a name that does not resolve",
            "http_2xx",
            "http_2xx",
            format!("http://{NOWHERE}/"),
        ),
        (
            "tcp, a name that does not resolve",
            "tcp_connect",
            "tcp_connect",
            format!("{NOWHERE}:80"),
        ),
        ("http IPv6", "http_2xx", "http_2xx", format!("http://{v6}/ok")),
        (
            "http IPv6 refused",
            "http_2xx",
            "http_2xx",
            format!("http://{v6_closed}/"),
        ),
        ("tcp IPv6", "tcp_connect", "tcp_connect", v6.to_string()),
        ("tcp IPv6 refused", "tcp_connect", "tcp_connect", v6_closed.to_string()),
    ];
    compare(&exporters, api, &cases).await;
}
