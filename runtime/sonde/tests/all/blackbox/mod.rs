//! `/probe` beside blackbox_exporter, each release of it: the same cases
//! (modules of the same meaning, the same real targets on loopback) asked
//! of both, and the answers compared series by series — which series there
//! are (name, label names, and the values of the labels with a fixed
//! vocabulary), the values alert rules read, and that a phase blackbox
//! timed is timed by sonde too. sonde's own `sonde_*` series are left out
//! of the comparison, and so is what only later releases answer when an
//! older one is asked. The releases, how each is found, and the comparison
//! are the harness's (`sonde_tests::blackbox`).
//! `SONDE_BB_DUMP=1` prints both answers of every case (with
//! `--nocapture`).

mod edges;
mod servers;
mod starttls;

pub(crate) use sonde_tests::blackbox::{Blackbox, differences, get};

use crate::support::{secret, start_agent};
use servers::{raw_http, smtp_like, tls12_multisan, via_intermediate};
use sonde_tests::{GrpcHealthServer, HttpServer, ServingStatus, TestCert, closed_port};
use std::net::SocketAddr;

/// The operator token sonde is asked with, in `compare`.
pub(crate) const OP: &str = "operator-secret";
/// A JSON string literal, which YAML reads too.
fn json(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The cases: (name, blackbox module, sonde module, target).
pub(crate) type Case = (&'static str, &'static str, &'static str, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_answers_the_series_blackbox_exporter_answers() {
    let dir = tempfile::tempdir().unwrap();
    let valid = TestCert::new(2030, 1, 1);
    let expired = TestCert::new(2021, 1, 1);
    let self_signed = TestCert::self_signed_ca();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &valid.ca_pem).unwrap();
    let expired_ca = dir.path().join("expired-ca.pem");
    std::fs::write(&expired_ca, &expired.ca_pem).unwrap();
    let (multisan, multisan_pem) = tls12_multisan();
    let multisan_ca = dir.path().join("multisan-ca.pem");
    std::fs::write(&multisan_ca, &multisan_pem).unwrap();
    let (chained, chain_pem) = via_intermediate();
    let chain_ca = dir.path().join("chain-ca.pem");
    std::fs::write(&chain_ca, &chain_pem).unwrap();
    let chain_ca = chain_ca.display();
    let (ca, expired_ca, multisan_ca) = (ca.display(), expired_ca.display(), multisan_ca.display());

    let bb_config = format!(
        r#"modules:
  http_2xx: {{ prober: http, timeout: 5s }}
  http_short: {{ prober: http, timeout: 1s }}
  http_body_match: {{ prober: http, timeout: 5s, http: {{ fail_if_body_not_matches_regexp: ["ok"] }} }}
  http_body_nomatch: {{ prober: http, timeout: 5s, http: {{ fail_if_body_not_matches_regexp: ["goodbye"] }} }}
  http_ca: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{ca}" }} }} }}
  http_expired_ca: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{expired_ca}" }} }} }}
  http_wrong_host: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{ca}", server_name: wrong.sonde.test }} }} }}
  http_insecure: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ insecure_skip_verify: true }} }} }}
  http_multisan: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{multisan_ca}" }} }} }}
  http_chain: {{ prober: http, timeout: 5s, http: {{ tls_config: {{ ca_file: "{chain_ca}" }} }} }}
  http_header:
    prober: http
    timeout: 5s
    http: {{ fail_if_header_not_matches: [{{ header: X-Check, regexp: "^yes$" }}] }}
  tcp_connect: {{ prober: tcp, timeout: 5s }}
  tcp_multisan: {{ prober: tcp, timeout: 5s, tcp: {{ tls: true, tls_config: {{ ca_file: "{multisan_ca}" }} }} }}
  tcp_smtp:
    prober: tcp
    timeout: 5s
    tcp: {{ query_response: [{{ expect: "^220 " }}, {{ send: "QUIT" }}, {{ expect: "^221" }}] }}
  tcp_smtp_eof:
    prober: tcp
    timeout: 5s
    tcp: {{ query_response: [{{ expect: "^220 " }}, {{ send: "QUIT" }}, {{ expect: "^250 " }}] }}
  tcp_tls: {{ prober: tcp, timeout: 5s, tcp: {{ tls: true, tls_config: {{ ca_file: "{ca}" }} }} }}
  grpc_plain: {{ prober: grpc, timeout: 5s, grpc: {{ tls: false, preferred_ip_protocol: ip4 }} }}
  grpc_serving: {{ prober: grpc, timeout: 5s, grpc: {{ service: sonde.Serving, preferred_ip_protocol: ip4 }} }}
  grpc_not_serving: {{ prober: grpc, timeout: 5s, grpc: {{ service: sonde.NotServing, preferred_ip_protocol: ip4 }} }}
  grpc_unknown: {{ prober: grpc, timeout: 5s, grpc: {{ service: sonde.Unknown, preferred_ip_protocol: ip4 }} }}
  grpc_missing: {{ prober: grpc, timeout: 5s, grpc: {{ service: sonde.Missing, preferred_ip_protocol: ip4 }} }}
  grpc_tls: {{ prober: grpc, timeout: 5s, grpc: {{ tls: true, preferred_ip_protocol: ip4, tls_config: {{ ca_file: "{ca}" }} }} }}
  grpc_tls_noca: {{ prober: grpc, timeout: 5s, grpc: {{ tls: true, preferred_ip_protocol: ip4 }} }}
  http_500_ok: {{ prober: http, timeout: 5s, http: {{ valid_status_codes: [500] }} }}
  http_post: {{ prober: http, timeout: 5s, http: {{ method: POST, body: "hello" }} }}
  http_head: {{ prober: http, timeout: 5s, http: {{ method: HEAD }} }}
"#
    );
    let exporters = Blackbox::start_each(dir.path(), &bb_config).await;
    if exporters.is_empty() {
        return;
    }

    // The same modules, for sonde: 2xx expected, as blackbox's default.
    let (ca_pem, expired_pem, multisan_json) = (json(&valid.ca_pem), json(&expired.ca_pem), json(&multisan_pem));
    let chain_json = json(&chain_pem);
    let grants = r#"grants: { net: ["127.0.0.1:*"] }"#;
    secret(dir.path(), "op.token", OP);
    let sonde_config = format!(
        r#"operator_token_file: op.token
modules:
  http_2xx: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"] }}, {grants} }}
  http_short: {{ plugin: http, timeout: 1s, config: {{ expected_status: ["200-299"] }}, {grants} }}
  http_body_match: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], body_regex: "ok" }}, {grants} }}
  http_body_nomatch: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], body_regex: "goodbye" }}, {grants} }}
  http_ca: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {ca_pem} }}, {grants} }}
  http_expired_ca: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {expired_pem} }}, {grants} }}
  http_wrong_host: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {ca_pem}, server_name: wrong.sonde.test }}, {grants} }}
  http_insecure: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], insecure_skip_verify: true }}, {grants} }}
  http_multisan: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {multisan_json} }}, {grants} }}
  http_header: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], header_regex: {{ X-Check: "^yes$" }} }}, {grants} }}
  http_chain: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], ca_pem: {chain_json} }}, {grants} }}
  tcp_connect: {{ plugin: tcp, timeout: 5s, {grants} }}
  tcp_multisan: {{ plugin: tcp, timeout: 5s, config: {{ tls: true, ca_pem: {multisan_json} }}, {grants} }}
  tcp_smtp: {{ plugin: tcp, timeout: 5s, config: {{ steps: [{{ expect: "^220 " }}, {{ send: "QUIT\r\n" }}, {{ expect: "^221" }}] }}, {grants} }}
  tcp_smtp_eof: {{ plugin: tcp, timeout: 5s, config: {{ steps: [{{ expect: "^220 " }}, {{ send: "QUIT\r\n" }}, {{ expect: "^250 " }}] }}, {grants} }}
  tcp_tls: {{ plugin: tcp, timeout: 5s, config: {{ tls: true, ca_pem: {ca_pem} }}, {grants} }}
  grpc_plain: {{ plugin: grpc, timeout: 5s, {grants} }}
  grpc_serving: {{ plugin: grpc, timeout: 5s, config: {{ service: sonde.Serving }}, {grants} }}
  grpc_not_serving: {{ plugin: grpc, timeout: 5s, config: {{ service: sonde.NotServing }}, {grants} }}
  grpc_unknown: {{ plugin: grpc, timeout: 5s, config: {{ service: sonde.Unknown }}, {grants} }}
  grpc_missing: {{ plugin: grpc, timeout: 5s, config: {{ service: sonde.Missing }}, {grants} }}
  grpc_tls: {{ plugin: grpc, timeout: 5s, config: {{ tls: true, ca_pem: {ca_pem} }}, {grants} }}
  grpc_tls_noca: {{ plugin: grpc, timeout: 5s, config: {{ tls: true }}, {grants} }}
  http_500_ok: {{ plugin: http, timeout: 5s, config: {{ expected_status: [500] }}, {grants} }}
  http_post: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], method: POST, body: "hello" }}, {grants} }}
  http_head: {{ plugin: http, timeout: 5s, config: {{ expected_status: ["200-299"], method: HEAD }}, {grants} }}
  http_keepalive: {{ plugin: http, timeout: 5s, config: {{ keepalive: true }}, {grants} }}
  https_keepalive: {{ plugin: http, timeout: 5s, config: {{ keepalive: true, ca_pem: {ca_pem} }}, {grants} }}
"#
    );
    let config = dir.path().join("sonde.yaml");
    std::fs::write(&config, sonde_config).unwrap();
    let (_agent, api) = start_agent(&config).await;

    let web = HttpServer::start().await;
    let https = HttpServer::start_tls(&valid).await;
    let https_expired = HttpServer::start_tls(&expired).await;
    let https_self_signed = HttpServer::start_tls(&self_signed).await;
    let (smtp, _smtp) = smtp_like().await;
    let grpc = GrpcHealthServer::start().await;
    grpc.set("sonde.Serving", ServingStatus::Serving).await;
    grpc.set("sonde.NotServing", ServingStatus::NotServing).await;
    grpc.set("sonde.Unknown", ServingStatus::Unknown).await;
    let grpc_tls = GrpcHealthServer::start_tls(&valid).await;
    let (raw, _raw) = raw_http(None).await;
    let (raw_tls, _raw_tls) = raw_http(Some(multisan)).await;
    let (raw_chain, _raw_chain) = raw_http(Some(chained)).await;
    let closed = closed_port();

    let cases: Vec<Case> = vec![
        ("http 200", "http_2xx", "http_2xx", format!("http://{}/ok", web.addr)),
        (
            "http 404",
            "http_2xx",
            "http_2xx",
            format!("http://{}/nothing", web.addr),
        ),
        ("http 500", "http_2xx", "http_2xx", format!("http://{}/fail", web.addr)),
        (
            "http 302 followed",
            "http_2xx",
            "http_2xx",
            format!("http://{}/redirect", web.addr),
        ),
        (
            "http body regex passes",
            "http_body_match",
            "http_body_match",
            format!("http://{}/ok", web.addr),
        ),
        (
            "http body regex fails",
            "http_body_nomatch",
            "http_body_nomatch",
            format!("http://{}/ok", web.addr),
        ),
        ("http 204", "http_2xx", "http_2xx", format!("http://{raw}/204")),
        (
            "http Last-Modified",
            "http_2xx",
            "http_2xx",
            format!("http://{raw}/lastmod"),
        ),
        ("http chunked", "http_2xx", "http_2xx", format!("http://{raw}/chunked")),
        ("http HTTP/1.0", "http_2xx", "http_2xx", format!("http://{raw}/http10")),
        ("http 3 redirects", "http_2xx", "http_2xx", format!("http://{raw}/r3")),
        (
            "http redirect loop",
            "http_2xx",
            "http_2xx",
            format!("http://{raw}/loop"),
        ),
        (
            "http header regex passes",
            "http_header",
            "http_header",
            format!("http://{raw}/check-yes"),
        ),
        (
            "http header regex fails",
            "http_header",
            "http_header",
            format!("http://{raw}/check-no"),
        ),
        ("http refused", "http_2xx", "http_2xx", format!("http://{closed}/")),
        (
            "http timeout",
            "http_short",
            "http_short",
            format!("http://{}/hang", web.addr),
        ),
        (
            "https valid",
            "http_ca",
            "http_ca",
            format!("https://{}/ok", https.addr),
        ),
        (
            "https self-signed",
            "http_ca",
            "http_ca",
            format!("https://{}/ok", https_self_signed.addr),
        ),
        (
            "https expired",
            "http_expired_ca",
            "http_expired_ca",
            format!("https://{}/ok", https_expired.addr),
        ),
        (
            "https wrong host",
            "http_wrong_host",
            "http_wrong_host",
            format!("https://{}/ok", https.addr),
        ),
        (
            "https expired, verification skipped",
            "http_insecure",
            "http_insecure",
            format!("https://{}/ok", https_expired.addr),
        ),
        (
            "https TLS 1.2, multi-SAN leaf, expired extra certificate",
            "http_multisan",
            "http_multisan",
            format!("https://{raw_tls}/ok"),
        ),
        (
            "https via an intermediate that expires first",
            "http_chain",
            "http_chain",
            format!("https://{raw_chain}/ok"),
        ),
        ("tcp open", "tcp_connect", "tcp_connect", web.addr.to_string()),
        (
            "tcp tls 1.2, multi-SAN leaf",
            "tcp_multisan",
            "tcp_multisan",
            raw_tls.to_string(),
        ),
        ("tcp refused", "tcp_connect", "tcp_connect", closed.to_string()),
        ("tcp query-response passes", "tcp_smtp", "tcp_smtp", smtp.to_string()),
        (
            "tcp query-response hits EOF",
            "tcp_smtp_eof",
            "tcp_smtp_eof",
            smtp.to_string(),
        ),
        ("tcp tls valid", "tcp_tls", "tcp_tls", https.addr.to_string()),
        ("tcp tls expired", "tcp_tls", "tcp_tls", https_expired.addr.to_string()),
        ("grpc serving", "grpc_plain", "grpc_plain", grpc.addr.to_string()),
        (
            "grpc service serving",
            "grpc_serving",
            "grpc_serving",
            grpc.addr.to_string(),
        ),
        (
            "grpc service not serving",
            "grpc_not_serving",
            "grpc_not_serving",
            grpc.addr.to_string(),
        ),
        (
            "grpc service unknown",
            "grpc_unknown",
            "grpc_unknown",
            grpc.addr.to_string(),
        ),
        (
            "grpc service missing",
            "grpc_missing",
            "grpc_missing",
            grpc.addr.to_string(),
        ),
        ("grpc refused", "grpc_plain", "grpc_plain", closed.to_string()),
        ("grpc tls", "grpc_tls", "grpc_tls", grpc_tls.addr.to_string()),
        (
            "grpc tls, CA not given",
            "grpc_tls_noca",
            "grpc_tls_noca",
            grpc_tls.addr.to_string(),
        ),
        (
            "http 500 expected",
            "http_500_ok",
            "http_500_ok",
            format!("http://{}/fail", web.addr),
        ),
        (
            "http 200 not expected",
            "http_500_ok",
            "http_500_ok",
            format!("http://{}/ok", web.addr),
        ),
        ("http POST", "http_post", "http_post", format!("http://{}/ok", web.addr)),
        ("http HEAD", "http_head", "http_head", format!("http://{}/ok", web.addr)),
        (
            "http HEAD, chunked",
            "http_head",
            "http_head",
            format!("http://{raw}/chunked"),
        ),
        (
            "https on a plain port",
            "http_ca",
            "http_ca",
            format!("https://{}/ok", web.addr),
        ),
        (
            "tcp tls self-signed",
            "tcp_tls",
            "tcp_tls",
            https_self_signed.addr.to_string(),
        ),
    ];

    keepalive(api, web.addr, https.addr, valid.not_after).await;
    compare(&exporters, api, &cases).await;
}

/// blackbox_exporter never keeps a connection alive; sonde's `keepalive:
/// true` reuses one, whose address and certificates are still answered.
async fn keepalive(api: SocketAddr, web: SocketAddr, https: SocketAddr, not_after: i64) {
    for round in 0..2 {
        let (_, ours) = get(
            api,
            &format!("/probe?module=http_keepalive&target=http://{web}/ok"),
            Some(OP),
        )
        .await;
        for line in [
            "probe_success 1",
            "probe_ip_protocol 4",
            "probe_ip_addr_hash 3668918509",
        ] {
            assert!(ours.lines().any(|l| l == line), "keepalive: {line} in\n{ours}");
        }
        let (_, ours) = get(
            api,
            &format!("/probe?module=https_keepalive&target=https://{https}/ok"),
            Some(OP),
        )
        .await;
        let expiry = format!("probe_ssl_earliest_cert_expiry {not_after}");
        for line in [
            "probe_success 1",
            "probe_http_ssl 1",
            "probe_ip_protocol 4",
            expiry.as_str(),
        ] {
            assert!(ours.lines().any(|l| l == line), "https keepalive: {line} in\n{ours}");
        }
        // The second run reused the connection: no handshake of its own.
        let handshake = "probe_http_duration_seconds{phase=\"tls\"} 0";
        assert_eq!(
            ours.lines().any(|l| l == handshake),
            round == 1,
            "https keepalive, round {round}:\n{ours}"
        );
    }
}

/// Asks every case of each release in `exporters` and of sonde (at `api`),
/// and compares the answers (see [`differences`]); prints how many cases
/// agree with each release, and fails with every difference.
/// `SONDE_BB_DUMP=1` prints both answers of every case.
pub(crate) async fn compare(exporters: &[Blackbox], api: SocketAddr, cases: &[Case]) {
    let mut all = Vec::new();
    let mut summary = Vec::new();
    for blackbox in exporters {
        let release = blackbox.release.version();
        let mut passed = 0;
        for (case, bb_module, sonde_module, target) in cases {
            let path = format!("/probe?module={bb_module}&target={target}");
            let (status, theirs) = get(blackbox.addr, &path, None).await;
            assert_eq!(status, 200, "{case}: blackbox_exporter {release}: {theirs}");
            let path = format!("/probe?module={sonde_module}&target={target}");
            let (status, ours) = get(api, &path, Some(OP)).await;
            assert_eq!(status, 200, "{case}: sonde: {ours}");
            if std::env::var_os("SONDE_BB_DUMP").is_some() {
                eprintln!("=== {case}\n--- blackbox_exporter {release}\n{theirs}--- sonde\n{ours}");
            }
            let found = differences(blackbox.release, case, &theirs, &ours);
            if found.is_empty() {
                passed += 1;
            } else {
                all.push(format!(
                    "{}\n--- blackbox_exporter {release}\n{theirs}--- sonde\n{ours}",
                    found.join("\n")
                ));
            }
        }
        summary.push(format!(
            "{passed} of {} cases agree with blackbox_exporter {release}",
            cases.len()
        ));
    }
    eprintln!("{}", summary.join("\n"));
    assert!(
        all.is_empty(),
        "{}; the others:\n\n{}",
        summary.join(", "),
        all.join("\n\n")
    );
}
