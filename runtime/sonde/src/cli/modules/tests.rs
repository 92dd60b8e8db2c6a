//! The mapping, key by key, on small files written here; the real command
//! and `sonde validate` on its output are in the integration tests
//! (`tests/all/import_blackbox.rs`).

use super::blackbox::{Imported, import};
use super::walk::{Problem, Severity};
use serde_json::json;

fn modules(text: &str) -> (Vec<Imported>, Vec<Problem>) {
    let (modules, ctx) = import(text).unwrap_or_else(|e| panic!("{e:?}"));
    (modules, ctx.problems)
}

/// The one module of `text`, which must import without a problem.
fn only(text: &str) -> Imported {
    let (mut m, problems) = modules(text);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(m.len(), 1);
    m.remove(0)
}

fn paths(problems: &[Problem]) -> Vec<(&str, Severity)> {
    problems.iter().map(|p| (p.path.as_str(), p.severity)).collect()
}

#[test]
fn http_options_map_to_the_http_plugin() {
    let m = only(
        r#"modules:
  web:
    prober: http
    timeout: 5s
    http:
      valid_status_codes: [200, 204]
      method: POST
      headers: {Host: vhost.example.com, Content-Type: application/json}
      body: '{}'
      fail_if_body_matches_regexp: ["Could not connect", "error"]
      fail_if_body_not_matches_regexp: ["ok"]
      fail_if_header_not_matches:
        - header: Access-Control-Allow-Origin
          regexp: '(\*|example\.com)'
      tls_config: {server_name: web.example.com, ca: "PEM"}
      no_follow_redirects: false
      follow_redirects: true
      fail_if_ssl: false
      fail_if_not_ssl: false
      enable_http2: false
      ip_protocol_fallback: true
      bearer_token: s3cret
"#,
    );
    assert_eq!(
        (m.name.as_str(), m.plugin, m.timeout.as_deref()),
        ("web", "http", Some("5s"))
    );
    assert_eq!(
        serde_json::Value::Object(m.config),
        json!({
            "expected_status": [200, 204],
            "method": "POST",
            "headers": {"Host": "vhost.example.com", "Content-Type": "application/json", "Authorization": "Bearer s3cret"},
            "body": "{}",
            "body_not_regex": "(?:Could not connect)|(?:error)",
            "body_regex": "ok",
            "header_regex": {"Access-Control-Allow-Origin": "(\\*|example\\.com)"},
            "server_name": "web.example.com",
            "ca_pem": "PEM",
            "enable_http2": false,
        })
    );
}

#[test]
fn http_defaults_are_blackbox_exporters() {
    let m = only("modules:\n  http_2xx:\n    prober: http\n");
    // 2xx, not sonde's own 200-399; no timeout: the scrape's governs.
    assert_eq!(
        serde_json::Value::Object(m.config),
        json!({"expected_status": ["200-299"]})
    );
    assert_eq!(m.timeout, None);
    // HTTP/2 is offered by default in both: only `false` is written.
    let m = only("modules:\n  a:\n    prober: http\n    http: {enable_http2: true}\n");
    assert_eq!(m.config.get("enable_http2"), None);
}

#[test]
fn basic_auth_becomes_an_authorization_header() {
    let m = only("modules:\n  a:\n    prober: http\n    http:\n      basic_auth: {username: user, password: pass}\n");
    assert_eq!(m.config["headers"]["Authorization"], "Basic dXNlcjpwYXNz");
    let m = only("modules:\n  a:\n    prober: http\n    http:\n      authorization: {type: Token, credentials: abc}\n");
    assert_eq!(m.config["headers"]["Authorization"], "Token abc");
    // Two credentials: blackbox_exporter refuses them; one beside an
    // Authorization header: sonde cannot say which blackbox_exporter sends.
    let (_, problems) = modules(
        "modules:\n  a:\n    prober: http\n    http:\n      bearer_token: a\n      basic_auth: {username: u}\n",
    );
    assert_eq!(paths(&problems), [("modules.a.http.basic_auth", Severity::Invalid)]);
    let (_, problems) = modules(
        "modules:\n  a:\n    prober: http\n    http:\n      bearer_token: a\n      headers: {authorization: b}\n",
    );
    assert_eq!(
        paths(&problems),
        [("modules.a.http.bearer_token", Severity::Unsupported)]
    );
}

#[test]
fn tcp_query_response_becomes_steps_with_blackbox_exporters_newlines_and_lines() {
    let m = only(
        r#"modules:
  pop3s_banner:
    prober: tcp
    tcp:
      query_response:
      - expect: "^+OK"
      - send: "QUIT"
      - expect: "^220"
        send: "EHLO prober\r"
      tls: true
      tls_config:
        insecure_skip_verify: true
"#,
    );
    assert_eq!(m.plugin, "tcp");
    assert_eq!(
        serde_json::Value::Object(m.config),
        json!({
            "tls": true,
            "insecure_skip_verify": true,
            "steps": [
                {"expect": "(?mR)^+OK"},
                {"send": "QUIT\n"},
                {"expect": "(?mR)^220"},
                {"send": "EHLO prober\r\n"},
            ],
        })
    );
}

#[test]
fn grpc_maps_service_and_tls() {
    let m = only(
        "modules:\n  g:\n    prober: grpc\n    grpc:\n      service: svc\n      tls: true\n      tls_config: {server_name: x.example}\n",
    );
    assert_eq!(
        serde_json::Value::Object(m.config),
        json!({"service": "svc", "tls": true, "server_name": "x.example"})
    );
    // tls_config without tls: blackbox_exporter ignores it, and so does the import.
    let m = only("modules:\n  g:\n    prober: grpc\n    grpc:\n      tls_config: {insecure_skip_verify: true}\n");
    assert!(m.config.is_empty(), "{:?}", m.config);
}

#[test]
fn a_ca_file_needs_its_directory_granted() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let text = format!(
        "modules:\n  a:\n    prober: http\n    http:\n      tls_config: {{ca_file: {}}}\n",
        ca.display()
    );
    let m = only(&text);
    assert_eq!(m.config["ca_file"], ca.display().to_string());
    assert_eq!(m.files.iter().collect::<Vec<_>>(), [dir.path()]);
    let (m, problems) = modules(
        "modules:\n  a:\n    prober: http\n    http:\n      tls_config: {ca_file: /nonexistent-sonde/ca.pem}\n",
    );
    assert!(m.is_empty());
    assert_eq!(
        paths(&problems),
        [("modules.a.http.tls_config.ca_file", Severity::UnsupportedModule)]
    );
}

#[test]
fn what_sonde_cannot_honour_is_named_by_its_key_path() {
    let (m, problems) = modules(
        r#"modules:
  dns:
    prober: dns
    dns: {query_name: x, dns_over_tls: true}
  http_post_2xx:
    prober: http
    http:
      method: POST
      oauth2: {client_id: a, token_url: "https://t"}
      ip_protocol_fallback: false
      preferred_ip_protocol: ip4
      fail_if_body_not_matches_regexp: [a, b]
      fail_if_body_json_matches_cel: "body.x == 1"
  sock:
    prober: unix
    unix: {query_response: [{send: PING}]}
"#,
    );
    assert_eq!(
        paths(&problems),
        [
            ("modules.dns.dns.dns_over_tls", Severity::Unsupported),
            ("modules.http_post_2xx.http.oauth2", Severity::UnsupportedModule),
            (
                "modules.http_post_2xx.http.fail_if_body_not_matches_regexp[1]",
                Severity::Unsupported
            ),
            (
                "modules.http_post_2xx.http.fail_if_body_json_matches_cel",
                Severity::UnsupportedModule
            ),
            ("modules.sock.prober", Severity::UnsupportedModule),
        ]
    );
    assert_eq!(
        problems[0].message.as_str(),
        "true is not supported: the dns plugin asks over UDP or TCP, not TLS"
    );
    assert_eq!((problems[1].line, problems[1].column), (9, 15));
    // What --skip-unsupported keeps: the module without the options.
    let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["dns"]);
}

/// `starttls: true` is the tcp plugin's step of that name, after the
/// entry's send, and the module's `tls_config` (which blackbox_exporter
/// verifies the upgrade with) becomes the plugin's TLS keys, without `tls`.
#[test]
fn starttls_is_a_step_verified_with_the_tls_config() {
    let (m, problems) = modules(
        r#"modules:
  smtp:
    prober: tcp
    tcp:
      tls_config: {insecure_skip_verify: true, server_name: mail.example}
      query_response:
        - expect: "^220"
        - send: "STARTTLS\r"
          starttls: true
        - send: "QUIT\r"
"#,
    );
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(
        serde_json::Value::Object(m[0].config.clone()),
        serde_json::json!({
            "insecure_skip_verify": true,
            "server_name": "mail.example",
            "steps": [
                {"expect": "(?mR)^220"},
                {"send": "STARTTLS\r\n"},
                {"starttls": true},
                {"send": "QUIT\r\n"},
            ],
        })
    );
}

/// blackbox_exporter's icmp options are the icmp plugin's, under the same
/// names; a source address, a TTL past 255 or a payload past 16 KiB is not.
#[test]
fn an_icmp_module_keeps_its_options() {
    let (m, problems) = modules(
        "modules:\n  ping:\n    prober: icmp\n    timeout: 5s\n    icmp:\n      preferred_ip_protocol: ip4\n      ip_protocol_fallback: false\n      payload_size: 56\n      dont_fragment: true\n      ttl: 5\n",
    );
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(m[0].plugin, "icmp");
    assert_eq!(
        serde_json::Value::Object(m[0].config.clone()),
        serde_json::json!({"preferred_ip_protocol": "ip4", "ip_protocol_fallback": false, "payload_size": 56, "dont_fragment": true, "ttl": 5})
    );
    let (m, problems) = modules(
        "modules:\n  ping:\n    prober: icmp\n    icmp:\n      source_ip_address: 10.0.0.1\n      ttl: 300\n      payload_size: 70000\n      count: 3\n",
    );
    assert!(m.is_empty());
    assert_eq!(
        paths(&problems),
        [
            ("modules.ping.icmp.source_ip_address", Severity::Unsupported),
            ("modules.ping.icmp.ttl", Severity::Unsupported),
            ("modules.ping.icmp.payload_size", Severity::Unsupported),
            ("modules.ping.icmp.count", Severity::Invalid),
        ]
    );
}

#[test]
fn what_blackbox_exporter_would_refuse_is_an_error_with_its_place() {
    let (_, problems) = modules(
        "modules:\n  a:\n    prober: http\n    http:\n      metod: GET\n      method: GET\n  b:\n    prober: carrier-pigeon\n  c:\n    timeout: 5s\n",
    );
    assert_eq!(
        paths(&problems),
        [
            ("modules.a.http.metod", Severity::Invalid),
            ("modules.b.prober", Severity::Invalid),
            ("modules.c.prober", Severity::Invalid),
        ]
    );
    let metod = &problems[0];
    assert_eq!((metod.line, metod.column), (5, 7), "{metod:?}");
    assert!(
        metod
            .render("bb.yml")
            .starts_with("bb.yml:5:7: modules.a.http.metod: unknown key")
    );
    // A key given twice: the parser's own error, with its place.
    let twice = import("modules:\n  a:\n    prober: http\n    prober: tcp\n").unwrap_err();
    assert_eq!(twice, ("duplicate mapping key: prober".to_string(), 4, 5));
    // Another prober's block is not used, but its keys are still checked.
    let (m, problems) = modules("modules:\n  a:\n    prober: tcp\n    http: {method: GET, metod: GET, proxy_url: x}\n");
    assert_eq!(paths(&problems), [("modules.a.http.metod", Severity::Invalid)]);
    assert_eq!(m.len(), 0);
    let (m, problems) = modules("modules:\n  a:\n    prober: tcp\n    http: {method: GET, proxy_url: x}\n");
    assert!(problems.is_empty() && m[0].config.is_empty(), "{problems:?} {m:?}");
    let (_, problems) = modules("modulez: {}\n");
    assert_eq!(paths(&problems), [("modulez", Severity::Invalid)]);
    let (_, problems) = modules("modules:\n  a:\n    prober: http\n    http:\n      valid_status_codes: 200\n");
    assert_eq!(
        paths(&problems),
        [("modules.a.http.valid_status_codes", Severity::Invalid)]
    );
}

#[test]
fn the_output_reads_back_as_sonde_modules_with_the_same_config() {
    let text = r#"modules:
  "odd: name":
    prober: http
  yes:
    prober: tcp
    timeout: 2s
    tcp:
      query_response:
        - send: "a \"quoted\" line: *, #, {}, yes"
  web:
    prober: http
    http:
      headers: {"X-Weird: name": "value # not a comment", on: "off"}
      preferred_ip_protocol: ip4
      ip_protocol_fallback: false
  dns:
    prober: dns
    dns: {query_name: x, ip_protocol_fallback: false}
"#;
    let (modules, ctx) = import(text).unwrap();
    let yaml = super::render("bb.yml", &["10.0.0.0/8:*".into()], &modules, &ctx.problems);
    assert!(
        yaml.starts_with("# sonde modules imported from the blackbox_exporter config bb.yml\n"),
        "{yaml}"
    );
    let file =
        sonde_core::config::parse(std::path::Path::new("out.yaml"), &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(file.modules.len(), 3, "the invalid name is left out:\n{yaml}");
    for m in &modules {
        let read = &file.modules[&m.name];
        assert_eq!(read.plugin.value, m.plugin);
        let config = read.config.as_ref().map(|c| c.value.clone()).unwrap_or_default();
        assert_eq!(config, serde_json::Value::Object(m.config.clone()), "{yaml}");
        assert_eq!(
            read.grants.net.iter().map(|g| g.value.as_str()).collect::<Vec<_>>(),
            ["10.0.0.0/8:*"]
        );
        let ip = (
            read.grants.ip_protocol.as_ref().map(|v| v.value.as_str()),
            read.grants.ip_protocol_fallback,
        );
        let want = match m.name.as_str() {
            "web" => (Some("ip4"), Some(false)),
            // blackbox's default preference, held to without fallback.
            "dns" => (Some("ip6"), Some(false)),
            _ => (None, None),
        };
        assert_eq!(ip, want, "{}:\n{yaml}", m.name);
    }
    assert_eq!(
        paths(&ctx.problems),
        [("modules.odd: name", Severity::UnsupportedModule)]
    );
}

#[test]
fn anchors_aliases_and_merge_keys_read_as_blackbox_exporter_reads_them() {
    let (m, problems) = modules(
        "modules:\n  base: &base\n    prober: http\n    timeout: 5s\n    http: &http {method: POST, headers: {A: b}}\n  post:\n    <<: *base\n    timeout: 7s\n  again:\n    prober: http\n    http: *http\n",
    );
    assert!(problems.is_empty(), "{problems:#?}");
    let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["base", "post", "again"]);
    assert_eq!(m[1].timeout.as_deref(), Some("7s"));
    assert_eq!(m[1].config["method"], "POST");
    assert_eq!(m[2].config["headers"]["A"], "b");
}

#[test]
fn mangled_files_get_an_answer_never_a_panic() {
    let seed = include_str!("tests.rs");
    let start = seed.find("modules:\n  web:").unwrap();
    let end = start + seed[start..].find("\"#").unwrap();
    let lines: Vec<&str> = seed[start..end].lines().collect();
    let mut rng = fastrand::Rng::with_seed(39);
    let tokens = [
        "",
        "- ",
        ": ",
        "{",
        "}",
        "[",
        "]",
        "&a ",
        "*a",
        "<<: ",
        "~",
        "'",
        "\"",
        "\t",
        "9999999999999999999999",
    ];
    for _ in 0..500 {
        let mut text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        for _ in 0..rng.usize(1..4) {
            let i = rng.usize(..text.len());
            match rng.u8(..3) {
                0 => drop(text.remove(i)),
                1 => text.insert(i, text[i].clone()),
                _ => {
                    let at = rng.usize(..=text[i].len());
                    let at = (0..=at).rev().find(|&j| text[i].is_char_boundary(j)).unwrap_or(0);
                    text[i].insert_str(at, tokens[rng.usize(..tokens.len())]);
                }
            }
            if text.is_empty() {
                break;
            }
        }
        let text = text.join("\n");
        if let Ok((modules, ctx)) = import(&text) {
            let _ = super::render("bb.yml", &["*:*".into()], &modules, &ctx.problems);
        }
    }
}
