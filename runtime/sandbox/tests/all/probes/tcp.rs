//! The built-in tcp plugin against real sockets.

use crate::support::{accepted_before_now, check, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, Status};
use sonde_tests::{CountingListener, closed_port, guests};
use std::time::Duration;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_port_is_success_with_connect_time() {
    let listener = CountingListener::start().await;
    let r = check("tcp", &listener.addr.to_string(), "{}", SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.metrics.iter().any(|m| m.name == "connect_seconds" && m.value >= 0.0));
    assert_eq!(accepted_before_now(listener.addr, || listener.accepted()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_port_is_failure_with_the_reason() {
    let r = check("tcp", &closed_port().to_string(), "{}", SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connection refused"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_target_resolves_through_the_grant() {
    let listener = CountingListener::start().await;
    let target = format!("localhost:{}", listener.addr.port());
    let r = check("tcp", &target, "{}", SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_config_keys_are_invalid_config() {
    let r = check("tcp", &closed_port().to_string(), r#"{"prot": 1}"#, SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    assert!(r.message.contains("prot"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_does_not_parse_is_invalid_config() {
    let r = check("tcp", "host:notaport", "{}", SECOND).await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_expect_against_a_real_redis() {
    let redis = sonde_tests::RedisServer::start();
    let target = redis.addr.to_string();
    let r = check("tcp", &target, r#"{"send": "PING\r\n", "expect": "\\+PONG"}"#, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("completed 2 step(s)"), "{}", r.message);

    // Several steps: set a key, read it back.
    let steps = r#"{"steps": [{"send": "SET sonde up\r\n"}, {"expect": "^\\+OK"}, {"send": "GET sonde\r\n"}, {"expect": "up"}]}"#;
    let r = check("tcp", &target, steps, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");

    // A reply that does not match is a failure, with what arrived as detail.
    let r = check("tcp", &target, r#"{"send": "PING\r\n", "expect": "^\\+PANG"}"#, SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("expected /^\\+PANG/"), "{}", r.message);
    assert_eq!(r.detail.as_deref(), Some("+PONG\\r\\n"));

    // The deepest regex the plugin accepts (regex's nesting limit is 250)
    // compiles within the built-ins' 256 KiB stack (.cargo/config.toml):
    // with 64 KiB it trapped.
    let deep = format!("{}\\+PONG{}", "(".repeat(249), ")".repeat(249));
    let config = serde_json::json!({"send": "PING\r\n", "expect": deep}).to_string();
    let r = check("tcp", &target, &config, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_closes_before_the_expected_reply_is_a_failure() {
    let listener = CountingListener::start().await;
    let r = check(
        "tcp",
        &listener.addr.to_string(),
        r#"{"expect": "^220"}"#,
        Duration::from_millis(300),
    )
    .await;
    // The listener closes at once: the plugin sees end of stream, no match.
    assert_eq!(r.status, Status::Failure, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_tcp_connect_reaches_only_the_target_and_grants() {
    let target = CountingListener::start().await;
    let elsewhere = CountingListener::start().await;
    let config = serde_json::json!({"host": "127.0.0.1", "port": elsewhere.addr.port()}).to_string();
    let plugin = guest(guests::TCP_ELSEWHERE).await;
    let r = run(&plugin, &target.addr.to_string(), &config, &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains("TCP connection to 127.0.0.1"), "{}", r.message);
    assert_eq!(
        accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await,
        0,
        "never dialed"
    );
    // Granted, it connects.
    let grants = Grants {
        net: vec![format!("127.0.0.1:{}", elsewhere.addr.port()).parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, &target.addr.to_string(), &config, &grants, SECOND).await;
    assert_eq!((r.status, r.message.as_str()), (Status::Success, "sent: true"), "{r:?}");
}

/// A server that answers one client with `script`: for each pair, it reads
/// a line (or `n` bytes when the expected text is empty) and writes the
/// answer; what it read is returned.
fn scripted(
    greeting: &'static [u8],
    script: Vec<(usize, &'static [u8])>,
) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(SECOND)).unwrap();
        s.write_all(greeting).unwrap();
        let mut read = Vec::new();
        for (n, answer) in script {
            let mut buf = vec![0u8; n];
            if s.read_exact(&mut buf).is_err() {
                break;
            }
            read.extend_from_slice(&buf);
            s.write_all(answer).unwrap();
        }
        read
    });
    (addr, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_expand_answers_with_the_groups_of_the_last_expect() {
    // Debian's irc_banner module, as `sonde modules import` writes it.
    let (addr, server) = scripted(
        b":srv NOTICE hi\r\nPING :abc123\r\n",
        vec![(12, b":srv 001 prober :welcome\r\n")],
    );
    let config = r#"{"steps": [{"expect": "(?mR)PING :([^ ]+)"}, {"send_expand": "PONG ${1}\n"}, {"expect": "(?mR)^:[^ ]+ 001"}]}"#;
    let r = check("tcp", &addr, config, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(server.join().unwrap(), b"PONG abc123\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_send_and_expect_bytes_match_byte_for_byte() {
    // PostgreSQL's SSLRequest, answered `S`.
    let (addr, server) = scripted(b"", vec![(9, b"S")]);
    let config = r#"{"steps": [{"send_base64": "AAAACATSFi8K"}, {"expect_bytes": "S"}]}"#;
    let r = check("tcp", &addr, config, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(!r.metrics.iter().any(|m| m.name == "failed_due_to_bytes"), "{r:?}");
    assert_eq!(server.join().unwrap(), [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f, b'\n']);

    // Answered `N`: a failure blackbox counts in probe_failed_due_to_bytes.
    let (addr, _server) = scripted(b"", vec![(9, b"N")]);
    let r = check("tcp", &addr, config, SECOND).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.contains("expected the bytes S, got N"), "{}", r.message);
    assert!(
        r.metrics
            .iter()
            .any(|m| m.name == "failed_due_to_bytes" && m.value == 1.0),
        "{r:?}"
    );
}

/// `grants.ip_protocol`: the preferred IP version first, the other after
/// it unless `ip_protocol_fallback` is false, when an address of the
/// other version is no address at all (a failed lookup, as
/// blackbox_exporter has it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ip_protocol_holds_a_probe_to_one_version_without_fallback() {
    use sonde_policy::grants::{IpProtocol, IpVersion};
    let v4 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = v4.local_addr().unwrap().port();
    let v6 = tokio::net::TcpListener::bind(("::1", port)).await.unwrap();
    for l in [v4, v6] {
        tokio::spawn(async move { while l.accept().await.is_ok() {} });
    }
    let plugin = crate::support::builtin("tcp").await;
    let with = |prefer, fallback| Grants {
        ip_protocol: Some(IpProtocol { prefer, fallback }),
        ..Grants::default()
    };
    for (target, grants, passes) in [
        (format!("127.0.0.1:{port}"), with(IpVersion::V4, false), true),
        (format!("[::1]:{port}"), with(IpVersion::V6, false), true),
        (format!("127.0.0.1:{port}"), with(IpVersion::V6, true), true),
        (format!("127.0.0.1:{port}"), with(IpVersion::V6, false), false),
        (format!("[::1]:{port}"), with(IpVersion::V4, false), false),
    ] {
        let r = run(&plugin, &target, "{}", &grants, SECOND).await;
        let what = format!("{target} with {:?}", grants.ip_protocol);
        if passes {
            assert_eq!(r.status, Status::Success, "{what}: {r:?}");
        } else {
            assert_eq!((r.status, r.reason), (Status::Failure, None), "{what}: {r:?}");
            assert!(
                r.message.contains("ip_protocol_fallback: false"),
                "{what}: {}",
                r.message
            );
            assert_eq!(r.cause(), Some(sonde_sandbox::verdict::Cause::Resolve), "{what}");
        }
    }
}
