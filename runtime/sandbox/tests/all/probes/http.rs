//! The built-in http plugin against a real hyper server.

use crate::support::{check, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{HttpServer, closed_port, guests};
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

async fn http(server: &HttpServer, config: serde_json::Value, timeout: Duration) -> RunResult {
    check("http", &server.addr.to_string(), &config.to_string(), timeout).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_semantics() {
    let server = HttpServer::start().await;
    let r = http(&server, serde_json::json!({"path": "/ok"}), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    for name in [
        "status_code",
        "dns_seconds",
        "connect_seconds",
        "tls_seconds",
        "first_byte_seconds",
        "total_seconds",
    ] {
        assert!(
            r.metrics.iter().any(|m| m.name == name),
            "{name} missing: {:?}",
            r.metrics
        );
    }

    let r = http(&server, serde_json::json!({"path": "/fail"}), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(r.message, "GET /fail: 500 Internal Server Error");
    assert!(
        !r.message.contains("secret"),
        "the body leaked into the message: {}",
        r.message
    );
    assert_eq!(r.detail, None);

    let r = http(&server, serde_json::json!({"path": "/redirect"}), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(server.requests(), ["/ok", "/fail", "/redirect", "/ok"]);

    let r = http(&server, serde_json::json!({"path": "/echo", "show_body": true}), SECOND).await;
    assert!(
        r.detail
            .unwrap()
            .starts_with(&format!("GET sonde/{}", env!("CARGO_PKG_VERSION")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_is_a_warning_and_never_followed() {
    let server = HttpServer::start().await;
    let other = HttpServer::start().await;
    let r = http(
        &server,
        serde_json::json!({"path": format!("/away?to={}", other.addr)}),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Warning, "{r:?}");
    assert!(r.message.contains("another host"), "{}", r.message);
    assert!(other.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_is_a_timeout() {
    let server = HttpServer::start().await;
    let started = Instant::now();
    let r = http(
        &server,
        serde_json::json!({"path": "/hang"}),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    assert!(started.elapsed() < 5 * SECOND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackbox_checks() {
    let server = HttpServer::start().await;
    let check = |config: serde_json::Value| http(&server, config, SECOND);
    assert_eq!(
        check(serde_json::json!({"path": "/fail", "expected_status": ["500-599"]}))
            .await
            .status,
        Status::Success
    );
    assert_eq!(
        check(serde_json::json!({"path": "/ok", "expected_status": [204]}))
            .await
            .status,
        Status::Failure
    );
    assert_eq!(
        check(serde_json::json!({"path": "/ok", "body_regex": "^ok$"}))
            .await
            .status,
        Status::Success
    );
    let r = check(serde_json::json!({"path": "/ok", "body_regex": "^nope"})).await;
    assert_eq!(r.status, Status::Failure);
    assert!(r.message.contains("does not match /^nope/"), "{}", r.message);
    assert_eq!(
        check(serde_json::json!({"path": "/ok", "body_not_regex": "ok"}))
            .await
            .status,
        Status::Failure
    );
    assert_eq!(
        check(serde_json::json!({"path": "/json", "json": {"status.db": "ok", "version": 3}}))
            .await
            .status,
        Status::Success
    );
    let r = check(serde_json::json!({"path": "/json", "json": {"status.db": "down"}})).await;
    assert_eq!(r.status, Status::Failure);
    assert!(r.message.contains("status.db"), "{}", r.message);
    let r = check(serde_json::json!({"path": "/echo", "method": "POST", "body": "hello", "show_body": true})).await;
    assert!(r.detail.unwrap().starts_with("POST sonde/") && r.status == Status::Success);
    assert_eq!(
        check(serde_json::json!({"path": "/slow", "warn_after": "50ms"}))
            .await
            .status,
        Status::Warning
    );
    assert_eq!(
        check(serde_json::json!({"path": "/ok", "header_regex": {"content-length": "^2$"}}))
            .await
            .status,
        Status::Success
    );
    assert_eq!(
        check(serde_json::json!({"path": "/ok", "header_regex": {"x-missing": "."}}))
            .await
            .status,
        Status::Failure
    );
    // Only the first 10 KiB are read, unless max_body says more.
    assert_eq!(
        check(serde_json::json!({"path": "/big", "body_regex": "END$"}))
            .await
            .status,
        Status::Failure
    );
    let more = serde_json::json!({"path": "/big", "body_regex": "END$", "max_body": 30_000});
    assert_eq!(check(more).await.status, Status::Success);
    let r = check(serde_json::json!({"path": "/ok", "body_regex": "("})).await;
    assert_eq!(r.reason, Some(Reason::InvalidConfig), "{r:?}");
    // header_regex names the headers the host returns, with `location`:
    // 63 fit in what `send-keeping` takes, 64 are a config error.
    let headers = |n: usize| -> serde_json::Map<String, serde_json::Value> {
        (0..n)
            .map(|i| (format!("x-{i}"), serde_json::json!(".")))
            .chain([("content-length".to_string(), serde_json::json!("^2$"))])
            .collect()
    };
    let r = check(serde_json::json!({"path": "/ok", "header_regex": headers(62)})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("x-"), "{}", r.message);
    let r = check(serde_json::json!({"path": "/ok", "header_regex": headers(63)})).await;
    assert_eq!(r.reason, Some(Reason::InvalidConfig), "{r:?}");
    assert!(
        r.message
            .contains("header_regex and header_not_regex: 64 headers, at most 63"),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_a_failure() {
    let r = check("http", &closed_port().to_string(), "{}", SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connect"), "{}", r.message);
}

/// `send-keeping` returns only the headers asked for, whatever their case,
/// and refuses more names than the host takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_keeping_returns_only_the_headers_named() {
    let server = HttpServer::start().await;
    let plugin = guest(guests::HTTP_ELSEWHERE).await;
    let url = format!("http://{}/ok", server.addr);
    let target = server.addr.to_string();
    let grants = Grants::default();
    let message = |keep: serde_json::Value| {
        let config = serde_json::json!({"url": url, "keep": keep}).to_string();
        let (plugin, target, grants) = (&plugin, &target, &grants);
        async move {
            let r = run(plugin, target, &config, grants, SECOND).await;
            assert_eq!(r.status, Status::Success, "{r:?}");
            r.message
        }
    };
    // hyper's server sends content-length and date.
    assert!(
        message(serde_json::json!(["Content-Length", "x-absent"]))
            .await
            .ends_with(r#"Ok((200, ["content-length"]))"#)
    );
    assert!(message(serde_json::json!([])).await.ends_with("Ok((200, []))"));
    let names: Vec<String> = (0..65).map(|i| format!("x-{i}")).collect();
    let too_many = message(serde_json::json!(names)).await;
    assert!(
        too_many.contains("InvalidConfig(\"65 response headers to keep, at most 64\")"),
        "{too_many}"
    );
}

/// A failed status reads as docs/kubernetes.md shows a Pod's condition
/// (the message is the probe's): the request and the status with its
/// phrase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_status_reads_as_the_kubernetes_docs_show_it() {
    let documented = sonde_tests::doc_documents("docs/kubernetes.md", "## What the agent writes", "yaml kubernetes");
    let condition: serde_json::Value = serde_saphyr::from_str(&documented[0]).unwrap();
    let shown = condition[0]["message"]
        .as_str()
        .expect("the documented condition's message");
    assert_eq!(
        shown, "GET /ready: 503 Service Unavailable",
        "the docs changed: change this test with them"
    );
    let server = sonde_tests::raw_http::fixed(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        true,
    )
    .await;
    let r = check("http", &server.to_string(), r#"{"path": "/ready"}"#, SECOND).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert_eq!(r.message, shown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackbox_header_rules_read_every_value_and_may_allow_a_missing_header() {
    let server = HttpServer::start().await;
    let run = |config: serde_json::Value| http(&server, config, SECOND);
    // fail_if_header_matches: any value matching fails.
    let r = run(serde_json::json!({"path": "/cookies", "header_not_regex": {"Set-Cookie": "^session="}})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message.contains("header set-cookie matches /^session=/"),
        "{}",
        r.message
    );
    assert!(r.metrics.iter().any(|m| m.name == "failed_due_to_regex"), "{r:?}");
    let r = run(serde_json::json!({"path": "/cookies", "header_not_regex": {"Set-Cookie": "^admin="}})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    // fail_if_header_not_matches: one value matching (the second) passes.
    let r = run(serde_json::json!({"path": "/cookies", "header_regex": {"Set-Cookie": "^session="}})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    // A missing header fails, unless allowed.
    let missing = serde_json::json!({"path": "/ok", "header_not_regex": {"Set-Cookie": ".*"}});
    let r = run(missing.clone()).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("header set-cookie is missing"), "{}", r.message);
    let mut allowed = missing;
    allowed["header_allow_missing"] = serde_json::json!(["set-cookie"]);
    assert_eq!(run(allowed).await.status, Status::Success);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_redirects_false_judges_the_redirect_and_body_size_limit_fails_a_longer_body() {
    let server = HttpServer::start().await;
    let r = http(
        &server,
        serde_json::json!({"path": "/redirect", "follow_redirects": false}),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.metrics.iter().any(|m| m.name == "status_code" && m.value == 302.0),
        "{r:?}"
    );
    assert_eq!(server.requests(), ["/redirect"]);
    let r = http(
        &server,
        serde_json::json!({"path": "/redirect", "follow_redirects": false, "expected_status": ["200-299"]}),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");

    // /big is 20003 bytes.
    let r = http(
        &server,
        serde_json::json!({"path": "/big", "body_size_limit": 20_002}),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(
        r.message.contains("longer than body_size_limit (20002 bytes)"),
        "{}",
        r.message
    );
    let r = http(
        &server,
        serde_json::json!({"path": "/big", "body_size_limit": 20_003, "body_regex": "END$"}),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

/// A scheduled run (`observe: false`) keeps what its cause and its span
/// read of a response (that one came, its phases) and not what only
/// `GET /probe`'s answer reads (its status, version, length); a `/probe`
/// run (`observe: true`) keeps all of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_run_that_observes_all_keeps_the_response_head() {
    use sonde_sandbox::engine::{Call, Limits};
    let server = HttpServer::start().await;
    let plugin = crate::support::builtin("http").await;
    let target = server.addr.to_string();
    let grants = std::sync::Arc::new(Grants::default());
    let seen = |observe: bool| {
        let (plugin, target, grants) = (plugin.clone(), target.clone(), grants.clone());
        async move {
            let call = Call {
                probe: "web",
                target: &target,
                config: r#"{"path": "/ok"}"#,
                limits: Limits::default(),
                grants: &grants,
                attempt: 1,
                observe,
            };
            let r = crate::support::engine().run(&plugin, &call).await;
            assert_eq!(r.status, Status::Success, "{r:?}");
            r.observed.expect("observed").http.expect("a response")
        }
    };
    let scheduled = seen(false).await;
    assert_eq!(scheduled.responses, 1);
    assert!(scheduled.processing > Duration::ZERO);
    assert_eq!(
        (scheduled.status, scheduled.version, scheduled.content_length),
        (0, (0, 0), 0)
    );
    let probe = seen(true).await;
    assert_eq!(probe.responses, 1);
    assert_eq!((probe.status, probe.version), (200, (1, 1)));
    assert!(probe.content_length > 0, "{probe:?}");
}
