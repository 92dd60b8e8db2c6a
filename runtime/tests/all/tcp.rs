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
