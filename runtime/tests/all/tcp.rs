//! The built-in tcp plugin against real sockets.

use crate::support::{builtin, run};
use sonde_runtime::host::Grants;
use sonde_runtime::verdict::{Reason, Status};
use sonde_tests::{CountingListener, closed_port};
use std::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_port_is_success_with_connect_time() {
    let listener = CountingListener::start().await;
    let r = run(
        &builtin("tcp").await,
        &listener.addr.to_string(),
        "{}",
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.metrics.iter().any(|m| m.name == "connect_seconds" && m.value >= 0.0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(listener.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_port_is_failure_with_the_reason() {
    let r = run(
        &builtin("tcp").await,
        &closed_port().to_string(),
        "{}",
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connection refused"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_target_resolves_through_the_grant() {
    let listener = CountingListener::start().await;
    let target = format!("localhost:{}", listener.addr.port());
    let r = run(&builtin("tcp").await, &target, "{}", &Grants::default(), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_config_keys_are_invalid_config() {
    let r = run(
        &builtin("tcp").await,
        &closed_port().to_string(),
        r#"{"prot": 1}"#,
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    assert!(r.message.contains("prot"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_does_not_parse_is_invalid_config() {
    let r = run(&builtin("tcp").await, "host:notaport", "{}", &Grants::default(), SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_expect_against_a_real_redis() {
    let redis = sonde_tests::RedisServer::start();
    let tcp = builtin("tcp").await;
    let target = redis.addr.to_string();
    let r = run(
        &tcp,
        &target,
        r#"{"send": "PING\r\n", "expect": "\\+PONG"}"#,
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("completed 2 step(s)"), "{}", r.message);

    // Several steps: set a key, read it back.
    let steps = r#"{"steps": [{"send": "SET sonde up\r\n"}, {"expect": "^\\+OK"}, {"send": "GET sonde\r\n"}, {"expect": "up"}]}"#;
    let r = run(&tcp, &target, steps, &Grants::default(), SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");

    // A reply that does not match is a failure, with what arrived as detail.
    let r = run(
        &tcp,
        &target,
        r#"{"send": "PING\r\n", "expect": "^\\+PANG"}"#,
        &Grants::default(),
        SECOND,
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("expected /^\\+PANG/"), "{}", r.message);
    assert_eq!(r.detail.as_deref(), Some("+PONG\\r\\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expect_that_never_matches_stops_at_the_deadline() {
    let listener = CountingListener::start().await;
    let r = run(
        &builtin("tcp").await,
        &listener.addr.to_string(),
        r#"{"expect": "^220"}"#,
        &Grants::default(),
        Duration::from_millis(300),
    )
    .await;
    // The listener closes at once: the plugin sees end of stream, no match.
    assert_eq!(r.status, Status::Failure, "{r:?}");
}
