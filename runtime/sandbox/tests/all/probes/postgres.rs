//! The postgres plugin against a real PostgreSQL (Debian's package), with
//! SCRAM-SHA-256, md5 and trust authentication.

use crate::support::{builtin, check, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{PgAuth, PostgresServer};
use std::time::Duration;

/// Headroom for a loaded CI machine: a SCRAM login and `SELECT 1` take
/// about 7 ms and 45 million fuel here (PBKDF2 with 4096 rounds in wasm).
const TIMEOUT: Duration = Duration::from_secs(5);

async fn postgres(server: &PostgresServer, config: serde_json::Value) -> RunResult {
    check("postgres", &server.addr.to_string(), &config.to_string(), TIMEOUT).await
}

fn password() -> serde_json::Value {
    serde_json::json!({ "user": "postgres", "password": PostgresServer::PASSWORD })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_right_password_succeeds_wrong_fails_with_the_reason_stopped_fails() {
    let mut server = PostgresServer::start(PgAuth::Scram);
    let r = postgres(&server, password()).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.starts_with("\"SELECT 1\" → 1; PostgreSQL "), "{}", r.message);
    assert!(r.message.contains("scram-sha-256 auth as postgres"), "{}", r.message);
    assert!(r.metrics.iter().any(|m| m.name == "query_seconds"), "{r:?}");

    let r = postgres(&server, serde_json::json!({ "user": "postgres", "password": "wrong" })).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message
            .contains("authentication refused: FATAL 28P01: password authentication failed for user \"postgres\""),
        "{}",
        r.message
    );

    // No password configured while the server wants one: the check cannot be made.
    let r = postgres(&server, serde_json::json!({ "user": "postgres" })).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    assert!(r.message.contains("SCRAM-SHA-256"), "{}", r.message);

    server.stop();
    let r = postgres(&server, password()).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connection refused"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_databases_and_roles_are_checked() {
    let server = PostgresServer::start(PgAuth::Scram);
    // CREATE DATABASE cannot share psql's transaction with anything else.
    server.psql("CREATE DATABASE app");
    server.psql("CREATE ROLE probe LOGIN PASSWORD 'probe-pw'");
    let with = |extra: serde_json::Value| {
        let mut c = password();
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };

    let r = postgres(
        &server,
        with(serde_json::json!({"query": "SELECT current_database()", "database": "app"})),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.message.starts_with("\"SELECT current_database()\" → app;"),
        "{}",
        r.message
    );

    let r = postgres(
        &server,
        serde_json::json!({"user": "probe", "password": "probe-pw", "database": "app"}),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");

    let r = postgres(&server, with(serde_json::json!({"query": "SELECT * FROM missing"}))).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("ERROR 42P01"), "{}", r.message);

    let r = postgres(&server, with(serde_json::json!({"database": "nope"}))).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message.contains("3D000") && r.message.contains("\"nope\""),
        "{}",
        r.message
    );

    let r = postgres(
        &server,
        with(serde_json::json!({"role": "primary", "max_replica_lag": "10s"})),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains(", primary,"), "{}", r.message);
    let r = postgres(&server, with(serde_json::json!({"role": "standby"}))).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(r.message, "role is primary, expected standby");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_can_come_from_a_granted_file() {
    let server = PostgresServer::start(PgAuth::Scram);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgpass");
    std::fs::write(&file, format!("{}\n", PostgresServer::PASSWORD)).unwrap();
    let config = serde_json::json!({ "user": "postgres", "password_file": file }).to_string();
    let plugin = builtin("postgres").await;
    let target = server.addr.to_string();

    let granted = Grants {
        files: vec![dir.path().to_path_buf()],
        ..Grants::default()
    };
    let r = run(&plugin, &target, &config, &granted, TIMEOUT).await;
    assert_eq!(r.status, Status::Success, "{r:?}");

    let r = run(&plugin, &target, &config, &Grants::default(), TIMEOUT).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_and_trust_authentication() {
    let md5 = PostgresServer::start(PgAuth::Md5);
    let r = postgres(&md5, password()).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("md5 auth"), "{}", r.message);
    let r = postgres(&md5, serde_json::json!({ "user": "postgres", "password": "wrong" })).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("28P01"), "{}", r.message);
    drop(md5);

    let trust = PostgresServer::start(PgAuth::Trust);
    let r = postgres(&trust, serde_json::json!({})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("trust auth as postgres"), "{}", r.message);
}

/// Polls `done` every 50 ms for up to 20 s (waiting on replication, a
/// separate process), and fails the test with `what` if it never holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_checked_for_role_and_replay_lag() {
    let primary = PostgresServer::start(PgAuth::Scram);
    primary.psql("CREATE TABLE beat (at timestamptz)");
    let standby = PostgresServer::start_standby(&primary);
    primary.psql("INSERT INTO beat VALUES (now())");
    wait_until("the standby to replay the insert", || {
        standby.psql("SELECT count(*) FROM beat") == "1"
    });
    let config = |extra: serde_json::Value| {
        let mut c = password();
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };

    let r = postgres(
        &standby,
        config(serde_json::json!({"role": "standby", "max_replica_lag": "30s"})),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains(", standby,"), "{}", r.message);
    let lag = r
        .metrics
        .iter()
        .find(|m| m.name == "replica_lag_seconds")
        .expect("lag metric")
        .value;
    assert!((0.0..30.0).contains(&lag), "{lag}");

    let r = postgres(&standby, config(serde_json::json!({"role": "primary"}))).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(r.message, "role is standby, expected primary");

    // Pause replay and write on the primary: the standby receives WAL it
    // does not replay, and its last replayed transaction ages.
    standby.psql("SELECT pg_wal_replay_pause()");
    primary.psql("INSERT INTO beat VALUES (now())");
    wait_until("the standby to receive WAL it has not replayed", || {
        standby.psql("SELECT pg_last_wal_receive_lsn() > pg_last_wal_replay_lsn()") == "t"
    });
    let r = postgres(&standby, config(serde_json::json!({"max_replica_lag": "1ms"}))).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.starts_with("standby replay lag "), "{}", r.message);
    assert!(r.message.ends_with("more than 1ms"), "{}", r.message);
    let r = postgres(&standby, config(serde_json::json!({"max_replica_lag": "1h"}))).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let lag = r
        .metrics
        .iter()
        .find(|m| m.name == "replica_lag_seconds")
        .expect("lag metric")
        .value;
    assert!(lag > 0.0, "{lag}");
}

/// Grants holding one secret, `pg-password`, whose value is `value`.
fn secret_grants(value: &str) -> Grants {
    use sonde_policy::secrets::{SecretCell, SecretGrants, SecretValue};
    use std::sync::Arc;
    let cell = SecretCell::given(
        "pg-password",
        Arc::from(""),
        "env PG",
        SecretValue::new(value.as_bytes().to_vec()),
    );
    Grants {
        secrets: SecretGrants::new(vec![Arc::new(cell)]),
        ..Grants::default()
    }
}

/// Runs the postgres plugin against `target` with `config` and `grants`.
async fn postgres_granted(target: &str, config: serde_json::Value, grants: &Grants) -> RunResult {
    run(&builtin("postgres").await, target, &config.to_string(), grants, TIMEOUT).await
}

fn handle_config(handle: &str) -> serde_json::Value {
    serde_json::json!({ "user": "postgres", "password": handle })
}

/// Whether any part of the run's result (message, detail, metrics) shows
/// `secret`.
fn shows(r: &RunResult, secret: &str) -> bool {
    format!("{r:?}").contains(secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_password_logs_in_by_the_host_with_scram_md5_and_cleartext() {
    const WRONG: &str = "not-the-password-42";
    for (auth, method) in [
        (PgAuth::Scram, "scram-sha-256"),
        (PgAuth::Md5, "md5"),
        (PgAuth::Password, "password"),
    ] {
        let server = PostgresServer::start(auth);
        let target = server.addr.to_string();
        let r = postgres_granted(
            &target,
            handle_config("$(secret:pg-password)"),
            &secret_grants(PostgresServer::PASSWORD),
        )
        .await;
        assert_eq!((r.status, r.reason), (Status::Success, None), "{method}: {r:?}");
        assert!(r.message.starts_with("\"SELECT 1\" → 1; PostgreSQL "), "{}", r.message);
        assert!(
            r.message.contains(&format!("{method} auth as postgres")),
            "{method}: {}",
            r.message
        );
        assert!(!shows(&r, PostgresServer::PASSWORD), "{r:?}");

        let r = postgres_granted(&target, handle_config("$(secret:pg-password)"), &secret_grants(WRONG)).await;
        assert_eq!((r.status, r.reason), (Status::Failure, None), "{method}: {r:?}");
        assert!(
            r.message
                .contains("authentication refused: FATAL 28P01: password authentication failed for user \"postgres\""),
            "{method}: {}",
            r.message
        );
        assert!(!shows(&r, WRONG), "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_granted_secrets_still_logs_in_with_its_own_password_and_names_ungranted_secrets() {
    let server = PostgresServer::start(PgAuth::Scram);
    let target = server.addr.to_string();
    let grants = secret_grants(PostgresServer::PASSWORD);
    // Its own password, through the host's session: a probe granted
    // secrets has no socket of its own.
    let r = postgres_granted(&target, password(), &grants).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.contains("scram-sha-256 auth as postgres"), "{}", r.message);
    // ...and the other queries of the check run over that session too.
    let config = serde_json::json!({
        "user": "postgres", "password": "$(secret:pg-password)", "role": "primary", "query": "SELECT 'x'"
    });
    let r = postgres_granted(&target, config, &grants).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.contains(", primary,"), "{}", r.message);

    let r = postgres_granted(&target, handle_config("$(secret:other)"), &grants).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("secret \"other\""), "{}", r.message);
    assert!(!shows(&r, PostgresServer::PASSWORD), "{r:?}");

    let r = postgres_granted(&target, handle_config("$(secret:pg-password)"), &Grants::default()).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("secret \"pg-password\""), "{}", r.message);

    let r = postgres_granted(&target, handle_config("$(secret:pg-password"), &grants).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
}

/// A fake "PostgreSQL" server for one connection: reads the
/// StartupMessage, then plays `script` (what to send for each message
/// the client sends, given that message's body).
async fn fake_postgres<F>(script: F) -> String
where
    F: FnOnce(tokio::net::TcpStream) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let len = stream.read_i32().await.unwrap();
        let mut startup = vec![0; len as usize - 4];
        stream.read_exact(&mut startup).await.unwrap();
        script(stream).await;
    });
    addr
}

/// A backend message.
fn backend(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// Reads one frontend message's body.
async fn frontend(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let _tag = stream.read_u8().await.unwrap();
    let len = stream.read_i32().await.unwrap();
    let mut body = vec![0; len as usize - 4];
    stream.read_exact(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_quoting_the_password_it_received_shows_only_secret() {
    use tokio::io::AsyncWriteExt;
    const SECRET: &str = "hunter2-but-longer";
    let target = fake_postgres(|mut stream| {
        Box::pin(async move {
            stream.write_all(&backend(b'R', &3i32.to_be_bytes())).await.unwrap();
            let got = frontend(&mut stream).await;
            let got = String::from_utf8_lossy(&got[..got.len() - 1]).into_owned();
            let hex: String = got.bytes().map(|b| format!("{b:02x}")).collect();
            let body = format!("SFATAL\0VFATAL\0C28P01\0Mpassword {got} is wrong\0Das hex: {hex}\0\0");
            stream.write_all(&backend(b'E', body.as_bytes())).await.unwrap();
        })
    })
    .await;
    let r = postgres_granted(&target, handle_config("$(secret:pg-password)"), &secret_grants(SECRET)).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(
        r.message, "login: the server's answer reflected the password: [withheld: the peer reflected a secret]",
        "the answer is withheld before the host parses it: no word of it depends on the password"
    );
    assert!(!shows(&r, SECRET), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scram_server_that_never_proves_it_knows_the_password_is_refused() {
    use tokio::io::AsyncWriteExt;
    let target = fake_postgres(|mut stream| {
        Box::pin(async move {
            let mut sasl = 10i32.to_be_bytes().to_vec();
            sasl.extend_from_slice(b"SCRAM-SHA-256\0\0");
            stream.write_all(&backend(b'R', &sasl)).await.unwrap();
            let _client_first = frontend(&mut stream).await;
            // AuthenticationOk with no SASLContinue nor SASLFinal.
            stream.write_all(&backend(b'R', &0i32.to_be_bytes())).await.unwrap();
            // Until the client goes away.
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut [0u8; 256]).await;
        })
    })
    .await;
    let r = postgres_granted(
        &target,
        handle_config("$(secret:pg-password)"),
        &secret_grants("correct-horse-battery"),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message
            .contains("SCRAM: the server accepted the login without proving it knows the password"),
        "{}",
        r.message
    );

    let target = fake_postgres(|mut stream| {
        Box::pin(async move {
            let mut sasl = 10i32.to_be_bytes().to_vec();
            sasl.extend_from_slice(b"SCRAM-SHA-256\0\0");
            stream.write_all(&backend(b'R', &sasl)).await.unwrap();
            let first = frontend(&mut stream).await;
            let first = String::from_utf8_lossy(&first);
            let nonce = first.split("r=").nth(1).unwrap().to_string();
            let mut cont = 11i32.to_be_bytes().to_vec();
            cont.extend_from_slice(format!("r={nonce}xyz,s=QUJDRA==,i=16").as_bytes());
            stream.write_all(&backend(b'R', &cont)).await.unwrap();
            // Until the client goes away.
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut [0u8; 256]).await;
        })
    })
    .await;
    let r = postgres_granted(
        &target,
        handle_config("$(secret:pg-password)"),
        &secret_grants("correct-horse-battery"),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("16 SCRAM iterations"), "{}", r.message);

    // SCRAM started, then a request for the cleartext password: refused,
    // and nothing more is sent.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let target = fake_postgres(move |mut stream| {
        Box::pin(async move {
            let mut sasl = 10i32.to_be_bytes().to_vec();
            sasl.extend_from_slice(b"SCRAM-SHA-256\0\0");
            stream.write_all(&backend(b'R', &sasl)).await.unwrap();
            let _client_first = frontend(&mut stream).await;
            stream.write_all(&backend(b'R', &3i32.to_be_bytes())).await.unwrap();
            let mut after = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut after).await;
            let _ = tx.send(after);
        })
    })
    .await;
    let r = postgres_granted(
        &target,
        handle_config("$(secret:pg-password)"),
        &secret_grants("correct-horse-battery"),
    )
    .await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(
        r.message
            .contains("a request for password authentication after one for scram-sha-256"),
        "{}",
        r.message
    );
    let after = rx.await.unwrap();
    assert!(
        !String::from_utf8_lossy(&after).contains("correct-horse-battery"),
        "{after:?}"
    );
}
