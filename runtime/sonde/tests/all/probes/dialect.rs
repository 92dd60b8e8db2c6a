//! One regex dialect (Go's syntax, as blackbox_exporter users write it)
//! for every regex-taking option of the http, tcp and dns plugins: a
//! case-insensitive pattern passes a real run, Go-only syntax is taken,
//! and `sonde validate` refuses a bad pattern in each option, naming it,
//! exactly where a run would refuse it.

use crate::support::{check, sonde};
use sonde_sandbox::verdict::{RunResult, Status};
use sonde_tests::dns::dnsmasq_with;
use sonde_tests::raw_http::fixed;
use std::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

const PAGE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: Application/JSON\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"Status\":\"UP\"}";

fn passed(r: &RunResult, what: &str) {
    assert_eq!(r.status, Status::Success, "{what}: {r:?}");
}

fn failed(r: &RunResult, what: &str) {
    assert_eq!(r.status, Status::Failure, "{what}: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_insensitive_pattern_passes_a_real_run_in_every_option() {
    let web = fixed(PAGE, true).await.to_string();
    let http = |config: serde_json::Value| {
        let web = web.clone();
        async move { check("http", &web, &config.to_string(), SECOND).await }
    };
    passed(
        &http(serde_json::json!({"body_regex": "(?i)\"status\":\"up\""})).await,
        "body_regex",
    );
    passed(
        &http(serde_json::json!({"body_not_regex": "(?i)DOWN|PANIC"})).await,
        "body_not_regex",
    );
    passed(
        &http(serde_json::json!({"header_regex": {"content-type": "(?i)^application/json$"}})).await,
        "header_regex",
    );
    passed(
        &http(serde_json::json!({"header_not_regex": {"content-type": "(?i)^TEXT/HTML"}})).await,
        "header_not_regex",
    );
    failed(
        &http(serde_json::json!({"header_not_regex": {"content-type": "(?i)^APPLICATION/"}})).await,
        "header_not_regex, folded",
    );
    passed(
        &http(serde_json::json!({"body_regex": "^{\"Status\":"})).await,
        "a literal { as Go reads it",
    );
    // The same patterns without (?i) fail: the flag is what passes them.
    failed(
        &http(serde_json::json!({"body_regex": "\"status\":\"up\""})).await,
        "body_regex, case kept",
    );
    failed(
        &http(serde_json::json!({"body_not_regex": "(?i)\"STATUS\""})).await,
        "body_not_regex, folded",
    );

    let banner = fixed(b"+OK Sonde Ready\r\n", false).await.to_string();
    let tcp = |config: &'static str| {
        let banner = banner.clone();
        async move { check("tcp", &banner, config, SECOND).await }
    };
    passed(&tcp(r#"{"expect": "(?i)^\\+ok sonde"}"#).await, "expect");
    passed(
        &tcp(r#"{"steps": [{"expect": "(?i)READY\\s*$"}]}"#).await,
        "steps[].expect",
    );
    failed(&tcp(r#"{"expect": "^\\+ok sonde"}"#).await, "expect, case kept");

    let Some(dns) = dnsmasq_with(sonde_tests::dns::RECORDS) else {
        return;
    };
    let server = dns.addr.to_string();
    let rrs = |section: serde_json::Value| {
        let config =
            serde_json::json!({"query_name": "t.example.test", "query_type": "TXT", "validate_answer_rrs": section});
        let server = server.clone();
        async move { check("dns", &server, &config.to_string(), SECOND).await }
    };
    for (option, pattern, passes) in [
        ("fail_if_matches_regexp", "(?i)GOODBYE", true),
        ("fail_if_matches_regexp", "(?i)HELLO", false),
        ("fail_if_not_matches_regexp", "(?i)HELLO WORLD", true),
        // As blackbox_exporter does it: fails unless every record matches.
        ("fail_if_all_match_regexp", "(?i)HELLO", true),
        ("fail_if_all_match_regexp", "HELLO", false),
        ("fail_if_none_matches_regexp", "(?i)HELLO WORLD", true),
        ("fail_if_none_matches_regexp", "HELLO WORLD", false),
    ] {
        let r = rrs(serde_json::json!({ option: [pattern] })).await;
        let what = format!("{option} [{pattern:?}]");
        if passes { passed(&r, &what) } else { failed(&r, &what) }
    }
}

/// Every regex-taking option, each holding `pattern`, in one config.
fn every_option(pattern: &str) -> String {
    let p = serde_json::to_string(pattern).unwrap();
    format!(
        "targets:
  - name: t
    address: 127.0.0.1:9
    probes:
      - {{name: body, plugin: http, config: {{body_regex: {p}}}}}
      - {{name: not_body, plugin: http, config: {{body_not_regex: {p}}}}}
      - {{name: header, plugin: http, config: {{header_regex: {{Server: {p}}}}}}}
      - {{name: not_header, plugin: http, config: {{header_not_regex: {{Server: {p}}}}}}}
      - {{name: expect, plugin: tcp, config: {{expect: {p}}}}}
      - {{name: step, plugin: tcp, config: {{steps: [{{expect: {p}}}]}}}}
      - {{name: matches, plugin: dns, config: {{query_name: x.test, validate_answer_rrs: {{fail_if_matches_regexp: [{p}]}}}}}}
      - {{name: not_matches, plugin: dns, config: {{query_name: x.test, validate_authority_rrs: {{fail_if_not_matches_regexp: [{p}]}}}}}}
      - {{name: all, plugin: dns, config: {{query_name: x.test, validate_additional_rrs: {{fail_if_all_match_regexp: [{p}]}}}}}}
      - {{name: none, plugin: dns, config: {{query_name: x.test, validate_answer_rrs: {{fail_if_none_matches_regexp: [{p}]}}}}}}
"
    )
}

#[test]
fn validate_refuses_a_bad_pattern_in_every_option_and_takes_go_syntax() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(&config, every_option("(?i)(unclosed")).unwrap();
    let out = sonde(&["validate", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for pointer in [
        "/body_regex",
        "/body_not_regex",
        "/header_regex/Server",
        "/header_not_regex/Server",
        "/expect",
        "/steps/0/expect",
        "/validate_answer_rrs/fail_if_matches_regexp/0",
        "/validate_authority_rrs/fail_if_not_matches_regexp/0",
        "/validate_additional_rrs/fail_if_all_match_regexp/0",
        "/validate_answer_rrs/fail_if_none_matches_regexp/0",
    ] {
        let line = err.lines().find(|l| l.contains(&format!("config at {pointer}:")));
        let line = line.unwrap_or_else(|| panic!("no error at {pointer} in:\n{err}"));
        assert!(
            line.contains("\"(?i)(unclosed\" is not a regex: unclosed group"),
            "{line}"
        );
    }
    // `sonde run` refuses the same file, before any run.
    let out = sonde(&["run", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a regex: unclosed group"));

    // Go's syntax that the regex crate alone would refuse.
    for go in ["{\"status\": ?\"UP\"}", "\\p{^Greek}", "\\Qa.b*\\E", "(?i)é\\b"] {
        std::fs::write(&config, every_option(go)).unwrap();
        let out = sonde(&["validate", config.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{go}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
