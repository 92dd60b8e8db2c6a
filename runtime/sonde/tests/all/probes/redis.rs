//! The redis plugin against real `redis-server`s: a master, a replica whose
//! master is up, one whose master is gone, and one that wants a password.

use crate::support::check;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{RedisServer, closed_port};
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

async fn redis(target: &RedisServer, config: &str) -> RunResult {
    check("redis", &target.addr.to_string(), config, SECOND).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_answers_ping_and_its_role_is_checked() {
    let master = RedisServer::start();
    let r = redis(&master, "{}").await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("role master"), "{}", r.message);
    assert!(r.metrics.iter().any(|m| m.name == "ping_seconds"), "{r:?}");

    let r = redis(&master, r#"{"role": "master"}"#).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = redis(&master, r#"{"role": "replica"}"#).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(r.message, "role is master, expected replica");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_master_is_gone_is_a_failure() {
    let gone = closed_port();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &gone.port().to_string()]);
    let r = redis(&replica, r#"{"role": "replica"}"#).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message
            .contains(&format!("link to master 127.0.0.1:{} is down", gone.port())),
        "{}",
        r.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_linked_to_its_master_is_a_success() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.addr.port().to_string()]);
    // The link comes up once the first sync is done; wait for it (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = redis(&replica, r#"{"role": "slave"}"#).await;
        if r.status == Status::Success || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("link to master"), "{}", r.message);
    assert!(r.metrics.iter().any(|m| m.name == "master_last_io_seconds"), "{r:?}");
    let r = redis(&master, "{}").await;
    assert!(r.message.contains("1 connected replica"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_are_sent_and_refusals_are_failures_with_the_reason() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let r = redis(&server, "{}").await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("NOAUTH"), "{}", r.message);
    let r = redis(&server, r#"{"password": "wrong"}"#).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.starts_with("AUTH refused: WRONGPASS"), "{}", r.message);
    let r = redis(&server, r#"{"password": "s3cret"}"#).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let r = redis(&server, r#"{"username": "default", "password": "s3cret"}"#).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_fails_and_a_bad_config_is_invalid_config() {
    let r = check("redis", &closed_port().to_string(), "{}", SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connection refused"), "{}", r.message);
    let r = check("redis", &closed_port().to_string(), r#"{"role": "primary"}"#, SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
}
