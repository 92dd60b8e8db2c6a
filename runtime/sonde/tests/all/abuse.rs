//! The API under abuse (`api:` limits, `docs/security.md`): clients that
//! trickle their headers, floods of idle connections, oversized heads and
//! bodies, slow bodies and too many watch streams. Each is cut off by its
//! limit while `/livez` and another tenant keep being answered.
//!
//! Time bounds here are loose on purpose: each only catches a design where
//! the abuser holds the API (then the other caller waits for the abuser's
//! timeout, tens of seconds, or forever), never a slow machine.

pub(crate) use crate::support::{call, start_agent as start};
use crate::support::{parse_response as parse, secret};
use sonde_tests::HttpServer;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) const OP: &str = "operator-secret";
pub(crate) const ACME: &str = "acme-secret";
pub(crate) const BETA: &str = "beta-secret";

/// What another caller may wait while the API is abused.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A config with tenants acme and beta (one http probe each against
/// `server`), a `state_dir`, and the API block `api`.
pub(crate) fn config(dir: &Path, server: SocketAddr, api: &str) -> std::path::PathBuf {
    secret(dir, "op.token", OP);
    secret(dir, "acme.token", ACME);
    secret(dir, "beta.token", BETA);
    let yaml = format!(
        r#"api: {api}
operator_token_file: op.token
state_dir: state
tenants:
  - id: acme
    token_file: acme.token
    quotas: {{ max_probes: 2000 }}
    ceiling: {{ net: ["127.0.0.1:*"] }}
  - id: beta
    token_file: beta.token
    ceiling: {{ net: ["127.0.0.1:*"] }}
targets:
  - name: shop
    tenant: acme
    address: {server}
    probes:
      - {{name: shop-ready, kind: readiness, plugin: http, config: {{path: /health}}, period: 1s}}
  - name: bank
    tenant: beta
    address: {server}
    probes:
      - {{name: bank-ready, kind: readiness, plugin: http, config: {{path: /health}}, period: 1s}}
"#
    );
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// `call`, which must be answered within [`ANSWER_WITHIN`].
async fn answered(api: SocketAddr, path: &str, token: Option<&str>) -> u16 {
    let start = Instant::now();
    let status = tokio::time::timeout(ANSWER_WITHIN, call(api, "GET", path, token, b""))
        .await
        .unwrap_or_else(|_| panic!("GET {path} was not answered within {ANSWER_WITHIN:?}"))
        .0;
    eprintln!("GET {path}: {status} in {:?}", start.elapsed());
    status
}

/// Whether the server has closed `s` (EOF or reset), without blocking.
fn closed_by_server(s: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match s.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_off_and_others_are_answered() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start(&config(dir.path(), server.addr, "{header_read_timeout: 1s}")).await;
    // Ten slow clients, each sending one byte of a never-ending head every
    // 100 ms: each would hold its connection forever without the timeout.
    let mut slow = Vec::new();
    for _ in 0..10 {
        slow.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(api).await.unwrap();
            let head = b"GET /livez HTTP/1.1\r\nHost: sonde\r\nX-Slow: "
                .iter()
                .chain(std::iter::repeat(&b'a'));
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for byte in head {
                tick.tick().await;
                if s.write_all(&[*byte]).await.is_err() || closed_by_server(&s) {
                    return start.elapsed();
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "a trickling client was never cut off"
                );
            }
            unreachable!()
        }));
    }
    // Meanwhile everyone else is answered.
    assert_eq!(answered(api, "/livez", None).await, 200);
    assert_eq!(answered(api, "/v1/probes", Some(BETA)).await, 200);
    for s in slow {
        let held = s.await.unwrap();
        assert!(
            held >= Duration::from_millis(900),
            "cut off after {held:?}, before its timeout"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_do_not_lock_out_livez_or_a_tenant() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    // A long head timeout: only the connection limit and its eviction of
    // idle connections can make room.
    let (_agent, api) = start(&config(
        dir.path(),
        server.addr,
        "{header_read_timeout: 10m, max_connections: 64}",
    ))
    .await;
    // Each idle connection costs two descriptors in this process (both ends).
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    let idle_count = 2000.min(usize::try_from(soft).unwrap_or(usize::MAX).saturating_sub(512) / 2);
    assert!(
        idle_count >= 500,
        "the fd limit ({soft}) leaves room for too few connections"
    );
    let mut idle = Vec::new();
    for _ in 0..idle_count {
        idle.push(TcpStream::connect(api).await.unwrap());
    }
    assert_eq!(answered(api, "/livez", None).await, 200);
    assert_eq!(answered(api, "/v1/probes", Some(BETA)).await, 200);
    // The agent holds at most its limit: the others were closed, oldest first.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = idle.iter().filter(|s| !closed_by_server(s)).count();
        if open <= 64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle connections still open, limit 64"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed_by_server(&idle[0]), "the oldest idle connection went first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_and_bodies_are_refused_and_nothing_is_stored() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start(&config(dir.path(), server.addr, "{max_header_bytes: 16KiB}")).await;
    // A 20 KiB header: 431, and the agent answers the next caller.
    let mut s = TcpStream::connect(api).await.unwrap();
    let big = "a".repeat(20 * 1024);
    let head = format!("GET /livez HTTP/1.1\r\nHost: sonde\r\nX-Big: {big}\r\n\r\n");
    let _ = s.write_all(head.as_bytes()).await;
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    assert_eq!(parse(&text).0, 431, "{}", String::from_utf8_lossy(&text));
    // Many small headers adding up past the limit: the same.
    let many: String = (0..1500).map(|i| format!("X-H{i}: v\r\n")).collect();
    let mut s = TcpStream::connect(api).await.unwrap();
    let _ = s
        .write_all(format!("GET /livez HTTP/1.1\r\nHost: sonde\r\n{many}\r\n").as_bytes())
        .await;
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    assert_eq!(parse(&text).0, 431, "{}", String::from_utf8_lossy(&text));
    assert_eq!(answered(api, "/livez", None).await, 200);

    // A probe spec past its limit, and a plugin declared larger than its
    // limit: 413, nothing stored.
    let spec = format!("address: 127.0.0.1:1\nplugin: tcp\n# {}\n", "x".repeat(100 * 1024));
    let (status, body) = call(api, "PUT", "/v1/probes/huge", Some(ACME), spec.as_bytes()).await;
    assert_eq!(status, 413, "{body}");
    let mut s = TcpStream::connect(api).await.unwrap();
    let head = format!(
        "PUT /v1/plugins/huge HTTP/1.1\r\nHost: sonde\r\nAuthorization: Bearer {ACME}\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    // Only the head: the declared length alone must be refused, at once.
    s.write_all(head.as_bytes()).await.unwrap();
    let mut text = vec![0u8; 4096];
    let n = tokio::time::timeout(ANSWER_WITHIN, s.read(&mut text))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parse(&text[..n]).0, 413, "{}", String::from_utf8_lossy(&text[..n]));
    assert_eq!(call(api, "GET", "/v1/probes/huge", Some(ACME), b"").await.0, 404);
    assert!(!dir.path().join("state/managed/plugins/acme/huge.wasm").exists());
    assert!(!dir.path().join("state/managed/probes/acme/huge.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_arriving_is_refused_at_its_timeout() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start(&config(dir.path(), server.addr, "{body_read_timeout: 1s}")).await;
    let mut s = TcpStream::connect(api).await.unwrap();
    let head = format!(
        "PUT /v1/probes/stalled HTTP/1.1\r\nHost: sonde\r\nAuthorization: Bearer {ACME}\r\nContent-Length: 100\r\n\r\naddress: 127."
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // The rest never comes; everyone else is answered meanwhile.
    assert_eq!(answered(api, "/livez", None).await, 200);
    let mut text = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut text))
        .await
        .expect("the stalled upload was never answered")
        .unwrap();
    let (status, body) = parse(&text[..n]);
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("body_read_timeout"), "{body}");
    assert_eq!(call(api, "GET", "/v1/probes/stalled", Some(ACME), b"").await.0, 404);
}

/// Opens a watch stream; the connection and its status.
async fn open_watch(api: SocketAddr, token: &str) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(api).await.unwrap();
    s.write_all(format!("GET /v1/watch HTTP/1.1\r\nHost: sonde\r\nAuthorization: Bearer {token}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = vec![0u8; 1024];
    let n = tokio::time::timeout(ANSWER_WITHIN, s.read(&mut head))
        .await
        .expect("the watch was not answered")
        .unwrap();
    let status = parse(&head[..n]).0;
    (s, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_are_bounded_per_token() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start(&config(dir.path(), server.addr, "{max_watch_streams: 3}")).await;
    let mut acme = Vec::new();
    for _ in 0..3 {
        let (s, status) = open_watch(api, ACME).await;
        assert_eq!(status, 200);
        acme.push(s);
    }
    assert_eq!(open_watch(api, ACME).await.1, 429, "a fourth stream of one token");
    // Another tenant has its own streams, and the API answers.
    let (_beta, status) = open_watch(api, BETA).await;
    assert_eq!(status, 200);
    assert_eq!(answered(api, "/livez", None).await, 200);
    // A client that goes frees its place.
    drop(acme.pop());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_s, status) = open_watch(api, ACME).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(Instant::now() < deadline, "a closed watch never freed its place");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
