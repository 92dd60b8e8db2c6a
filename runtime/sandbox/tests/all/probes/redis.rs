//! The redis plugin against real `redis-server`s: a master, a replica whose
//! master is up, one whose master is gone, and one that wants a password.

use crate::support::{builtin, check, run};
use sonde_sandbox::host::Grants;
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

/// Grants holding one secret, `redis-password`, whose value is `value`.
fn secret_grants(value: &str) -> Grants {
    use sonde_policy::secrets::{SecretCell, SecretGrants, SecretValue};
    use std::sync::Arc;
    let cell = SecretCell::given(
        "redis-password",
        Arc::from(""),
        "env REDIS",
        SecretValue::new(value.as_bytes().to_vec()),
    );
    Grants {
        secrets: SecretGrants::new(vec![Arc::new(cell)]),
        ..Grants::default()
    }
}

async fn redis_granted(target: &str, config: &str, grants: &Grants) -> RunResult {
    run(&builtin("redis").await, target, config, grants, SECOND).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_password_is_sent_by_the_host_for_the_default_and_an_acl_user() {
    const PASSWORD: &str = "redis-secret-pw-1";
    const PROBE_PASSWORD: &str = "probe-secret-pw-2";
    const WRONG: &str = "not-the-password-42";
    let server = RedisServer::start_with(&[
        "--requirepass",
        PASSWORD,
        "--user",
        "probe",
        "on",
        &format!(">{PROBE_PASSWORD}"),
        "~*",
        "+@all",
    ]);
    let target = server.addr.to_string();
    let handle = r#"{"password": "$(secret:redis-password)"}"#;
    let r = redis_granted(&target, handle, &secret_grants(PASSWORD)).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.contains("role master"), "{}", r.message);
    assert!(!format!("{r:?}").contains(PASSWORD), "{r:?}");

    let as_probe = r#"{"username": "probe", "password": "$(secret:redis-password)"}"#;
    let r = redis_granted(&target, as_probe, &secret_grants(PROBE_PASSWORD)).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");

    for config in [handle, as_probe] {
        let r = redis_granted(&target, config, &secret_grants(WRONG)).await;
        assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
        assert!(r.message.starts_with("AUTH refused: WRONGPASS"), "{}", r.message);
        assert!(!format!("{r:?}").contains(WRONG), "{r:?}");
    }

    // A probe granted secrets still sends its own password (over the
    // host's session: it has no socket of its own).
    let own = format!(r#"{{"password": "{PASSWORD}"}}"#);
    let r = redis_granted(&target, &own, &secret_grants(PROBE_PASSWORD)).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");

    let r = redis_granted(&target, r#"{"password": "$(secret:other)"}"#, &secret_grants(PASSWORD)).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("secret \"other\""), "{}", r.message);
    assert!(!format!("{r:?}").contains(PASSWORD), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_quoting_the_password_it_received_shows_only_secret() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SECRET: &str = "hunter2-but-longer";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 256];
        // *2 $4 AUTH $N password: five CRLF-ended lines.
        while got.windows(2).filter(|w| w == b"\r\n").count() < 5 {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed early");
            got.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        let password = text.split("\r\n").nth(4).unwrap().to_string();
        let reply = format!("-ERR bad password {password}\r\n");
        stream.write_all(reply.as_bytes()).await.unwrap();
        let _ = stream.read(&mut chunk).await;
    });
    let r = redis_granted(
        &target,
        r#"{"password": "$(secret:redis-password)"}"#,
        &secret_grants(SECRET),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(
        r.message,
        "AUTH: the server's answer reflected the password: [withheld: the peer reflected a secret]"
    );
    assert!(!format!("{r:?}").contains(SECRET), "{r:?}");
}
