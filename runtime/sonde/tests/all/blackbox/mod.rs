//! `/probe` beside Debian's blackbox_exporter: the same cases (modules of
//! the same meaning, the same real targets on loopback) asked of both, and
//! the answers compared series by series — which series there are (name,
//! label names, and the values of the labels with a fixed vocabulary), the
//! values alert rules read, and that a phase blackbox timed is timed by
//! sonde too. sonde's own `sonde_*` series are left out of the comparison.
//!
//! The exporter is `/usr/bin/prometheus-blackbox-exporter` (Debian's
//! `prometheus-blackbox-exporter`); without it the test is skipped, unless
//! `SONDE_REQUIRE_TOOLS` is set. `SONDE_BB_DUMP=1` prints both answers of
//! every case (with `--nocapture`).

use crate::support::{parse_response, secret, start_agent, tool};
use sonde_tests::{GrpcHealthServer, HttpServer, ServingStatus, TestCert, closed_port};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const OP: &str = "operator-secret";

/// Labels whose values come from a fixed vocabulary: part of a series'
/// identity. The others (a certificate's subject…) are compared as values.
const VOCABULARY: [&str; 3] = ["phase", "serving_status", "version"];

/// Series whose values alert rules read: they must be equal.
const EQUAL: [&str; 23] = [
    "probe_success",
    "probe_icmp_reply_hop_limit",
    "probe_dns_query_succeeded",
    "probe_dns_answer_rrs",
    "probe_dns_authority_rrs",
    "probe_dns_additional_rrs",
    "probe_dns_serial",
    "probe_http_status_code",
    "probe_http_ssl",
    "probe_http_version",
    "probe_http_redirects",
    "probe_http_content_length",
    "probe_http_uncompressed_body_length",
    "probe_failed_due_to_regex",
    "probe_ssl_earliest_cert_expiry",
    "probe_ssl_last_chain_expiry_timestamp_seconds",
    "probe_ssl_last_chain_info",
    "probe_tls_version_info",
    "probe_grpc_status_code",
    "probe_grpc_healthcheck_response",
    "probe_grpc_ssl",
    "probe_ip_protocol",
    "probe_ip_addr_hash",
];

/// Series that are times: sonde's is above 0 where blackbox's is, and
/// only there (a phase not reached is 0).
const TIMES: [&str; 5] = [
    "probe_http_duration_seconds",
    "probe_icmp_duration_seconds",
    "probe_dns_duration_seconds",
    "probe_grpc_duration_seconds",
    "probe_dns_lookup_time_seconds",
];

/// One sample: its name, labels and value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses an answer in the text format (the subset both answer with).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => (name.to_string(), labels(rest.strip_suffix('}').expect("}"))),
        };
        out.push((name, labels, value));
    }
    out
}

/// `k="v",k2="v2"` with the text format's escapes.
fn labels(mut text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    while let Some((key, rest)) = text.split_once("=\"") {
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(key.trim_start_matches(',').to_string(), value);
        text = &rest[end..];
    }
    out
}

/// A series' identity: its name, label names and vocabulary values.
fn identity((name, labels, _): &Sample) -> String {
    let labels: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            if VOCABULARY.contains(&k.as_str()) {
                format!("{k}={v:?}")
            } else {
                k.clone()
            }
        })
        .collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// A series with every label: the key its values are compared under.
fn full((name, labels, _): &Sample) -> String {
    format!("{name}{labels:?}")
}

/// How sonde's answer differs from blackbox's for one case.
pub(crate) fn differences(case: &str, blackbox: &str, sonde: &str) -> Vec<String> {
    let mut bb = samples(blackbox);
    let ours: Vec<Sample> = samples(sonde)
        .into_iter()
        .filter(|(n, _, _)| !n.starts_with("sonde_"))
        .collect();
    // 0.23's gRPC prober answers `probe_ssl_earliest_cert_expiry 0`
    // without TLS; 0.26 no longer does, nor does sonde (an expiry of 1970
    // fires every expiry alert).
    if !ours.iter().any(|(n, _, _)| n == "probe_tls_version_info") && ours.iter().any(|(n, _, _)| n == "probe_grpc_ssl")
    {
        bb.retain(|(n, _, v)| !(n == "probe_ssl_earliest_cert_expiry" && *v == 0.0));
    }
    let mut out = Vec::new();
    let ids = |s: &[Sample]| s.iter().map(identity).collect::<BTreeSet<_>>();
    let (theirs_ids, ours_ids) = (ids(&bb), ids(&ours));
    for missing in theirs_ids.difference(&ours_ids) {
        out.push(format!("{case}: sonde lacks {missing}"));
    }
    for extra in ours_ids.difference(&theirs_ids) {
        out.push(format!("{case}: sonde adds {extra}"));
    }
    let values = |s: &[Sample]| s.iter().map(|x| (full(x), x.2)).collect::<BTreeMap<_, _>>();
    let ours_values = values(&ours);
    for sample in &bb {
        let (name, _, value) = sample;
        if EQUAL.contains(&name.as_str()) {
            match ours_values.get(&full(sample)) {
                Some(v) if v == value => {}
                Some(v) => out.push(format!("{case}: {} is {v}, blackbox says {value}", full(sample))),
                None if name == "probe_ssl_last_chain_info" => {
                    let ours: Vec<String> = ours.iter().filter(|s| &s.0 == name).map(full).collect();
                    out.push(format!("{case}: blackbox's {} is not sonde's {ours:?}", full(sample)));
                }
                None => {}
            }
        }
        if TIMES.contains(&name.as_str())
            && let Some(v) = ours_values.get(&full(sample))
            && (*value > 0.0) != (*v > 0.0)
        {
            out.push(format!("{case}: {} is {v}, blackbox says {value}", full(sample)));
        }
    }
    out
}

/// `GET path` on a new connection, with an optional bearer token.
pub(crate) async fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!("GET {path} HTTP/1.1\r\nHost: probe\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    let (status, body) = parse_response(&text);
    // blackbox answers chunked; the chunk sizes are not samples.
    let body = if body.starts_with(|c: char| c.is_ascii_hexdigit()) && !body.starts_with("# ") {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

/// The data of a chunked body.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Debian's blackbox_exporter, on a free loopback port, with `config`.
pub(crate) struct Blackbox {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Blackbox {
    pub(crate) async fn start(dir: &Path, config: &str) -> Option<Self> {
        let binary = tool("prometheus-blackbox-exporter", "prometheus-blackbox-exporter")?;
        let file = dir.join("blackbox.yml");
        std::fs::write(&file, config).unwrap();
        let addr = closed_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start blackbox_exporter");
        let bb = Self { child, addr };
        let start = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "blackbox_exporter did not listen"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(bb)
    }
}

impl Drop for Blackbox {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line server as an SMTP server greets: `220` first, `221` and a close
/// after `QUIT`.
async fn smtp_like() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let _ = write.write_all(b"220 sonde.test ESMTP ready\r\n").await;
                let mut lines = tokio::io::BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim().eq_ignore_ascii_case("QUIT") {
                        let _ = write.write_all(b"221 bye\r\n").await;
                        return;
                    }
                    let _ = write.write_all(b"250 ok\r\n").await;
                }
            });
        }
    });
    (addr, task)
}

/// The answer a [`RawHttp`] server gives for `path`, byte for byte.
fn raw_answer(path: &str) -> String {
    let ok =
        |extra: &str| format!("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n{extra}Connection: close\r\n\r\nhello world");
    let redirect = |code: &str, to: &str| {
        format!("HTTP/1.1 {code}\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    match path {
        "/ok" => ok(""),
        "/204" => "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".into(),
        "/lastmod" => ok("Last-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n"),
        "/chunked" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                       5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            .into(),
        "/r3" => redirect("301 Moved Permanently", "/r2"),
        "/r2" => redirect("302 Found", "/r1"),
        "/r1" => redirect("302 Found", "/ok"),
        "/loop" => redirect("302 Found", "/loop"),
        "/http10" => "HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nhello world".into(),
        "/check-yes" => ok("X-Check: yes\r\n"),
        "/check-no" => ok("X-Check: no\r\n"),
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found".into(),
    }
}

/// Reads one request's head from `stream` and writes [`raw_answer`] for
/// its path, then closes.
async fn raw_serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let _ = stream.write_all(raw_answer(&path).as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// An HTTP server written by hand, for the answers hyper does not give
/// (HTTP/1.0, chunked, chains of redirects…); over TLS with `tls`.
async fn raw_http(tls: Option<tokio_rustls::TlsAcceptor>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => raw_serve(stream).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            raw_serve(stream).await;
                        }
                    }
                }
            });
        }
    });
    (addr, task)
}

/// A TLS 1.2-only server configuration whose leaf has a full subject and
/// DNS, IP and e-mail names, and whose chain carries an unrelated expired
/// certificate after the leaf; with the PEM of the CA that signed the leaf.
fn tls12_multisan() -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::OrganizationName, "sonde test");
    ca.distinguished_name.push(DnType::CommonName, "sonde multi-SAN CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec![
        "localhost".to_string(),
        "alt.sonde.test".to_string(),
        "127.0.0.1".to_string(),
    ])
    .unwrap();
    leaf.subject_alt_names
        .push(SanType::Rfc822Name("ops@sonde.test".try_into().unwrap()));
    leaf.distinguished_name.push(DnType::CountryName, "ZZ");
    leaf.distinguished_name.push(DnType::OrganizationName, "sonde test");
    leaf.distinguished_name.push(DnType::OrganizationalUnitName, "probes");
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    // emailAddress: an attribute Go has no short name for.
    leaf.distinguished_name.push(
        DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
        "ops@sonde.test",
    );
    leaf.not_after = rcgen::date_time_ymd(2031, 6, 1);
    let leaf_cert = leaf.signed_by(&key, &issuer).unwrap();
    let old_key = KeyPair::generate().unwrap();
    let mut old = CertificateParams::new(vec!["old.sonde.test".to_string()]).unwrap();
    old.distinguished_name.push(DnType::CommonName, "old.sonde.test");
    old.not_before = rcgen::date_time_ymd(2020, 1, 1);
    old.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let old_cert = old.self_signed(&old_key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone(), old_cert.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    (
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
        ca_cert.pem(),
    )
}

/// A server configuration whose leaf is signed by an intermediate CA that
/// expires before it (both sent), under a root of their own; with the
/// root's PEM.
fn via_intermediate() -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca = |name: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p
    };
    let root_key = KeyPair::generate().unwrap();
    let root_params = ca("sonde chain root");
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(root_params, root_key);
    let mid_key = KeyPair::generate().unwrap();
    let mut mid_params = ca("sonde chain intermediate");
    mid_params.not_after = rcgen::date_time_ymd(2030, 6, 1);
    let mid = mid_params.signed_by(&mid_key, &root_issuer).unwrap();
    let mid_issuer = Issuer::new(mid_params, mid_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    leaf.not_after = rcgen::date_time_ymd(2031, 1, 1);
    let leaf = leaf.signed_by(&key, &mid_issuer).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), mid.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)), root.pem())
}

/// A JSON string literal, which YAML reads too.
fn json(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// The cases: (name, blackbox module, sonde module, target).
type Case = (&'static str, &'static str, &'static str, String);

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
"#
    );
    let Some(blackbox) = Blackbox::start(dir.path(), &bb_config).await else {
        return;
    };

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

    let mut all = Vec::new();
    let mut passed = 0;
    for (case, bb_module, sonde_module, target) in &cases {
        let (status, theirs) = get(
            blackbox.addr,
            &format!("/probe?module={bb_module}&target={target}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{case}: blackbox: {theirs}");
        let (status, ours) = get(api, &format!("/probe?module={sonde_module}&target={target}"), Some(OP)).await;
        assert_eq!(status, 200, "{case}: sonde: {ours}");
        let found = differences(case, &theirs, &ours);
        if std::env::var_os("SONDE_BB_DUMP").is_some() {
            eprintln!("=== {case}\n--- blackbox\n{theirs}--- sonde\n{ours}");
        }
        if found.is_empty() {
            passed += 1;
        } else {
            all.push(format!("{}\n--- blackbox\n{theirs}--- sonde\n{ours}", found.join("\n")));
        }
    }
    // blackbox_exporter never keeps a connection alive; sonde's
    // `keepalive: true` reuses one, whose address and certificates are
    // still answered.
    for round in 0..2 {
        let (_, ours) = get(
            api,
            &format!("/probe?module=http_keepalive&target=http://{}/ok", web.addr),
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
            &format!("/probe?module=https_keepalive&target=https://{}/ok", https.addr),
            Some(OP),
        )
        .await;
        let expiry = format!("probe_ssl_earliest_cert_expiry {}", valid.not_after);
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
    eprintln!("{passed} of {} cases agree with blackbox_exporter", cases.len());
    assert!(
        all.is_empty(),
        "{passed} of {} cases agree; the others:\n\n{}",
        cases.len(),
        all.join("\n\n")
    );
}

#[test]
fn the_text_format_parses_with_escapes() {
    let s = samples("# HELP x y\nx{a=\"1\",b=\"q\\\"r\"} 2\ny 3.5e+09\n");
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].1.get("b").map(String::as_str), Some("q\"r"));
    assert_eq!(s[1].2, 3.5e9);
    assert_eq!(identity(&s[0]), "x{a,b}");
}
