//! The built-in grpc plugin and the host's `grpc` interface against a real
//! gRPC health service (tonic-health).

use crate::support::{accepted_before_now, check, guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use sonde_tests::{CountingListener, GrpcHealthServer, HttpServer, ServingStatus, TestCert, closed_port, guests};
use std::time::{Duration, Instant};

const SECOND: Duration = Duration::from_secs(1);

async fn grpc(target: &str, config: serde_json::Value) -> RunResult {
    check("grpc", target, &config.to_string(), SECOND).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_is_success_and_not_serving_is_failure() {
    let server = GrpcHealthServer::start().await;
    let target = server.addr.to_string();
    let r = grpc(&target, serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    assert!(r.message.ends_with("SERVING"), "{}", r.message);
    for name in [
        "grpc_status_code",
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

    server.set("", ServingStatus::NotServing).await;
    let r = grpc(&target, serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("NOT_SERVING"), "{}", r.message);

    // A named service has its own status, whatever the server's.
    server.set("shop.Cart", ServingStatus::Serving).await;
    let r = grpc(&target, serde_json::json!({"service": "shop.Cart"})).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("\"shop.Cart\""), "{}", r.message);
    server.set("shop.Cart", ServingStatus::NotServing).await;
    let r = grpc(&target, serde_json::json!({"service": "shop.Cart"})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    server.set("shop.Cart", ServingStatus::Unknown).await;
    let r = grpc(&target, serde_json::json!({"service": "shop.Cart"})).await;
    assert_eq!(r.status, Status::Failure, "{r:?}");
    assert!(r.message.ends_with("UNKNOWN"), "{}", r.message);
    assert_eq!(server.accepted(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_is_a_failure_naming_service_unknown() {
    let server = GrpcHealthServer::start().await;
    let r = grpc(&server.addr.to_string(), serde_json::json!({"service": "nope"})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("SERVICE_UNKNOWN"), "{}", r.message);
    assert!(r.message.contains("NOT_FOUND"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_health_service_is_an_io_error() {
    let server = GrpcHealthServer::without_health().await;
    let r = grpc(&server.addr.to_string(), serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Io)), "{r:?}");
    assert!(r.message.contains("UNIMPLEMENTED"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_or_a_server_without_http2_is_a_failure() {
    let r = grpc(&closed_port().to_string(), serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("connect"), "{}", r.message);

    // An HTTP/1.1-only server does not speak gRPC.
    let http1 = HttpServer::start().await;
    let r = grpc(&http1.addr.to_string(), serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("protocol"), "{}", r.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_reaches_the_server() {
    let server = GrpcHealthServer::start().await;
    let config = serde_json::json!({"metadata": {"x-probe-team": "infra", "authorization": "Bearer t0ken"}});
    let r = grpc(&server.addr.to_string(), config).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let calls = server.metadata();
    assert_eq!(calls.len(), 1);
    let has = |k: &str, v: &str| calls[0].iter().any(|(n, val)| n == k && val == v);
    assert!(has("x-probe-team", "infra"), "{calls:?}");
    assert!(has("authorization", "Bearer t0ken"), "{calls:?}");
    assert!(
        calls[0]
            .iter()
            .any(|(n, v)| n == "user-agent" && v.starts_with("sonde/")),
        "{calls:?}"
    );

    // gRPC's own headers are the host's, not the plugin's: refused before
    // any connection.
    let r = grpc(
        &server.addr.to_string(),
        serde_json::json!({"metadata": {"grpc-timeout": "1H"}}),
    )
    .await;
    assert_eq!(
        (r.status, r.reason),
        (Status::Unknown, Some(Reason::InvalidConfig)),
        "{r:?}"
    );
    assert!(r.message.contains("reserved"), "{}", r.message);
    assert_eq!(server.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_a_timeout_at_the_deadline() {
    let silent = CountingListener::start_silent().await;
    let started = Instant::now();
    let r = check("grpc", &silent.addr.to_string(), "{}", Duration::from_millis(300)).await;
    assert_eq!((r.status, r.reason), (Status::Failure, Some(Reason::Timeout)), "{r:?}");
    assert!(started.elapsed() < 5 * SECOND);
    assert_eq!(silent.accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_leaves_no_connection_open() {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().to_string();
    let run = tokio::spawn(async move { check("grpc", &target, "{}", Duration::from_millis(200)).await });
    let (mut stream, _) = listener.accept().await.unwrap();
    let r = run.await.unwrap();
    assert_eq!(r.reason, Some(Reason::Timeout), "{r:?}");
    // Past the client's preface and request, the connection ends: closed or
    // reset by the host, not left to linger with the call gone.
    let mut buf = [0u8; 4096];
    let end = tokio::time::timeout(5 * SECOND, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the host kept the connection open after the call ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_an_ungranted_authority_is_denied_and_never_connects() {
    let elsewhere = GrpcHealthServer::start().await;
    let plugin = guest(guests::GRPC_ELSEWHERE).await;
    let config = serde_json::json!({"authority": elsewhere.addr.to_string()}).to_string();
    let target = closed_port().to_string();
    let r = run(&plugin, &target, &config, &Grants::default(), SECOND).await;
    assert_eq!((r.status, r.reason), (Status::Unknown, Some(Reason::Denied)), "{r:?}");
    assert!(r.message.contains(&elsewhere.addr.to_string()), "{}", r.message);
    assert_eq!(accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await, 0);

    // The same authority, granted, is reached.
    let grants = Grants {
        net: vec![elsewhere.addr.to_string().parse().unwrap()],
        ..Grants::default()
    };
    let r = run(&plugin, &target, &config, &grants, SECOND).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.message.contains("Ok(Code(0))"), "{}", r.message);
    assert_eq!(accepted_before_now(elsewhere.addr, || elsewhere.accepted()).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_is_invalid_config() {
    let server = GrpcHealthServer::start().await;
    let target = server.addr.to_string();
    for (target, config, expected) in [
        (
            target.as_str(),
            serde_json::json!({"servce": "x"}),
            "unknown field `servce`",
        ),
        ("http://127.0.0.1:1", serde_json::json!({}), "expected HOST:PORT"),
        (
            target.as_str(),
            serde_json::json!({"insecure_skip_verify": true}),
            "need \"tls\": true",
        ),
        (
            target.as_str(),
            serde_json::json!({"tls": true, "ca_pem": "junk"}),
            "CA certificates",
        ),
    ] {
        let r = grpc(target, config).await;
        assert_eq!(
            (r.status, r.reason),
            (Status::Unknown, Some(Reason::InvalidConfig)),
            "{r:?}"
        );
        assert!(r.message.contains(expected), "{}", r.message);
    }
    assert_eq!(server.accepted(), 0);
}

/// A bare HTTP/2 server that answers every request with `body` as gRPC and,
/// when given, `grpc-status` in the trailers: for what a real gRPC server
/// never sends.
async fn raw_grpc_server(body: Vec<u8>, status: Option<&'static str>) -> (String, tokio::task::JoinHandle<()>) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = bytes::Bytes::from(body.clone());
            let service = hyper::service::service_fn(move |_req| {
                let body = body.clone();
                async move {
                    let mut trailers = http::HeaderMap::new();
                    if let Some(status) = status {
                        trailers.insert("grpc-status", status.parse().unwrap());
                    }
                    let body = http_body_util::Full::new(body).with_trailers(async move { Some(Ok(trailers)) });
                    hyper::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_breaking_grpc_is_a_failure_and_its_answer_is_capped() {
    let framed = |len: u32, payload: &[u8]| {
        let mut m = vec![0];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(payload);
        m
    };
    let serving = framed(2, b"\x08\x01");
    let cases: [(Vec<u8>, Option<&str>, &str); 5] = [
        // Says 2 GiB are coming: refused at the prefix, nothing buffered.
        (framed(2 << 30, b"\x08\x01"), Some("0"), "more than the host's cap"),
        (
            [serving.clone(), serving.clone()].concat(),
            Some("0"),
            "more than one response message",
        ),
        (serving.clone(), None, "no grpc-status"),
        (framed(10, b"\x08\x01"), Some("0"), "truncated response message"),
        ([&[1u8][..], &serving[1..]].concat(), Some("0"), "compressed"),
    ];
    for (body, status, expected) in cases {
        let (addr, task) = raw_grpc_server(body, status).await;
        let r = grpc(&addr, serde_json::json!({})).await;
        task.abort();
        assert_eq!((r.status, r.reason), (Status::Failure, None), "{expected}: {r:?}");
        assert!(r.message.contains(expected), "{expected}: {}", r.message);
    }
    // The same server, well-behaved, is believed.
    let (addr, task) = raw_grpc_server(serving, Some("0")).await;
    let r = grpc(&addr, serde_json::json!({})).await;
    task.abort();
    assert_eq!(r.status, Status::Success, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_certificate_is_verified_and_reported() {
    let cert = TestCert::new(2031, 1, 1);
    let server = GrpcHealthServer::start_tls(&cert).await;
    let target = server.addr.to_string();
    let r = grpc(&target, serde_json::json!({"tls": true, "ca_pem": cert.ca_pem})).await;
    assert_eq!((r.status, r.reason), (Status::Success, None), "{r:?}");
    let expiry = r
        .metrics
        .iter()
        .find(|m| m.name == "cert_expiry_seconds")
        .expect("cert expiry");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (expiry.value - (cert.not_after as f64 - now)).abs() < 60.0,
        "{expiry:?}"
    );
    server.set("", ServingStatus::NotServing).await;
    let r = grpc(&target, serde_json::json!({"tls": true, "insecure_skip_verify": true})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("NOT_SERVING"), "{}", r.message);

    // The system roots do not know the test CA: the handshake fails, and so
    // does plaintext against a TLS server.
    let r = grpc(&target, serde_json::json!({"tls": true})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert!(r.message.contains("tls"), "{}", r.message);
    let r = grpc(&target, serde_json::json!({})).await;
    assert_eq!((r.status, r.reason), (Status::Failure, None), "{r:?}");
    assert_eq!(server.accepted(), 4);
}
