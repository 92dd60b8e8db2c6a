//! sonde's integration harness: the hostile test guests, built from
//! `tests/guests/` by the build script, and small real servers to probe.
//!
//! Each guest is named by what it does wrong (`spin_forever`,
//! `connect_elsewhere`…); [`guests`] holds the path of each component.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Paths of the test guests' components.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// A TCP listener on loopback that accepts and counts connections, for
/// proving that a plugin did or did not reach it.
pub struct CountingListener {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingListener {
    /// Starts listening on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Self { addr, accepted, task }
    }

    /// How many connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for CountingListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A loopback port with nothing listening on it (bound, then released).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = l.local_addr().expect("local addr");
    drop(l);
    addr
}

/// This process's peak resident set size (VmHWM), in bytes.
pub fn peak_rss() -> u64 {
    status_field("VmHWM:")
}

/// This process's resident set size (VmRSS), in bytes.
pub fn rss() -> u64 {
    status_field("VmRSS:")
}

fn status_field(name: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The processes of process group `pgid` that are still alive (zombies,
/// already dead and waiting for a parent to reap them, do not count).
pub fn live_processes_in_group(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return live;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state, ppid, pgrp, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) && fields.first() != Some(&"Z") {
            live.push(pid);
        }
    }
    live
}

/// A real `redis-server` (Debian's package) on a free loopback port, with
/// persistence off; killed when dropped.
pub struct RedisServer {
    /// Where it listens.
    pub addr: SocketAddr,
    child: std::process::Child,
}

impl RedisServer {
    /// Starts `redis-server` and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (`.ci/run` installs it) or does
    /// not come up within ten seconds.
    pub fn start() -> Self {
        let addr = closed_port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &addr.port().to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server");
        let server = Self { addr, child };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start on {addr}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real HTTP/1.1 server (hyper) on a free loopback port with fixed routes,
/// recording every request path it serves:
///
/// | path | answer |
/// | --- | --- |
/// | `/ok` | 200 `ok` |
/// | `/fail` | 500 `internal secret` |
/// | `/redirect` | 302 to `/ok` |
/// | `/away?to=HOST:PORT` | 302 to `http://HOST:PORT/ok` |
/// | `/away_https?to=HOST:PORT` | 302 to `https://HOST:PORT/ok` |
/// | `/hang` | 200 after 60 s |
/// | `/slow` | 200 after 200 ms |
/// | `/big` | 200, 20,000 `a` then `END` |
/// | `/json` | 200 `{"status": {"db": "ok"}, "version": 3}` |
/// | `/echo` | 200 with the request's method, `user-agent` and body |
/// | `/health` | 200 `healthy`, or 500 `sick` after [`HttpServer::set_healthy`]`(false)` |
/// | anything else | 404 |
///
/// [`HttpServer::start_tls`] serves the same routes over TLS.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    requests: Arc<std::sync::Mutex<Vec<String>>>,
    accepted: Arc<AtomicUsize>,
    healthy: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Starts the server on the current tokio runtime.
    pub async fn start() -> Self {
        Self::serve(None).await
    }

    /// Starts the server over TLS, presenting `cert`.
    pub async fn start_tls(cert: &TestCert) -> Self {
        Self::serve(Some(tokio_rustls::TlsAcceptor::from(cert.server_config()))).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (log, count, health) = (requests.clone(), accepted.clone(), healthy.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (log, tls, health) = (log.clone(), tls.clone(), health.clone());
                tokio::spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| answer(req, log.clone(), health.load(Ordering::SeqCst)));
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            // A client that rejects the certificate ends here.
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            addr,
            requests,
            accepted,
            healthy,
            task,
        }
    }

    /// Makes `/health` answer 200 (`true`) or 500 (`false`).
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// The paths (with query) served so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many TCP connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A server certificate for `localhost` and `127.0.0.1`, signed by a
/// throwaway CA of its own, both made by rcgen for one test.
pub struct TestCert {
    /// The CA's certificate, as PEM: what a client must trust.
    pub ca_pem: String,
    /// The server certificate's notAfter, in Unix seconds.
    pub not_after: i64,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl TestCert {
    /// A new CA and a server certificate valid until the start of the day
    /// `year-month-day` (UTC); a past date makes an expired certificate.
    pub fn new(year: i32, month: u8, day: u8) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own, as two real CAs have.
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        ca.distinguished_name
            .push(DnType::CommonName, format!("sonde test CA {serial}"));
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("server params");
        params.distinguished_name.push(DnType::CommonName, "sonde test server");
        let not_after = rcgen::date_time_ymd(year, month, day);
        params.not_after = not_after;
        let cert = params.signed_by(&key, &issuer).expect("server certificate");
        Self {
            ca_pem: ca_cert.pem(),
            not_after: not_after.unix_timestamp(),
            chain: vec![cert.der().clone(), ca_cert.der().clone()],
            key: rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        }
    }

    /// A self-signed certificate for `localhost` and `127.0.0.1` that is
    /// also a CA (`basicConstraints CA:TRUE`), as `openssl req -x509` makes:
    /// the server presents it as its own, and `ca_pem` is the same
    /// certificate.
    pub fn self_signed_ca() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let cert = params.self_signed(&key).expect("certificate");
        Self {
            ca_pem: cert.pem(),
            not_after: params.not_after.unix_timestamp(),
            chain: vec![cert.der().clone()],
            key: rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        }
    }

    /// A rustls server configuration presenting this certificate.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .expect("server certificate and key");
        Arc::new(config)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    log: Arc<std::sync::Mutex<Vec<String>>>,
    healthy: bool,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    log.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
    let reply = |status: u16, body: String| {
        hyper::Response::builder()
            .status(status)
            .body(Body::new(bytes::Bytes::from(body)))
            .expect("response")
    };
    let redirect = |location: String| {
        hyper::Response::builder()
            .status(302)
            .header("location", location)
            .body(Body::default())
            .expect("response")
    };
    Ok(match path.split('?').next().unwrap_or("") {
        "/ok" => reply(200, "ok".into()),
        "/health" if healthy => reply(200, "healthy".into()),
        "/health" => reply(500, "sick".into()),
        "/fail" => reply(500, "internal secret".into()),
        "/redirect" => redirect("/ok".into()),
        "/away" => redirect(format!("http://{}/ok", path.split_once("to=").map_or("", |(_, t)| t))),
        "/away_https" => redirect(format!("https://{}/ok", path.split_once("to=").map_or("", |(_, t)| t))),
        "/hang" => {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
            reply(200, "late".into())
        }
        "/slow" => {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            reply(200, "slow".into())
        }
        "/big" => reply(200, format!("{}END", "a".repeat(20_000))),
        "/json" => reply(200, r#"{"status": {"db": "ok"}, "version": 3}"#.into()),
        "/echo" => {
            let method = req.method().to_string();
            let agent = req
                .headers()
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            reply(200, format!("{method} {agent} {}", String::from_utf8_lossy(&body)))
        }
        _ => reply(404, "not found".into()),
    })
}

/// A TCP listener on loopback that accepts connections and never answers
/// on them, holding them open until it is dropped: a server that hangs.
pub struct SilentListener {
    /// Where it listens.
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SilentListener {
    /// Starts listening on an ephemeral loopback port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(stream);
            }
        });
        Self { addr, accepted, task }
    }

    /// How many connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub use tonic_health::ServingStatus;

/// The ASCII metadata (name, value) of each call a server received.
type CallMetadata = Arc<std::sync::Mutex<Vec<Vec<(String, String)>>>>;

/// A real gRPC server (tonic) on a free loopback port serving tonic-health's
/// `grpc.health.v1.Health`, with a handle to set each service's status, and
/// a record of the connections it accepted and the metadata of each call.
/// The server as a whole (service `""`) starts `SERVING`; other services are
/// unknown until set.
pub struct GrpcHealthServer {
    /// Where it listens.
    pub addr: SocketAddr,
    reporter: tonic_health::server::HealthReporter,
    metadata: CallMetadata,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcHealthServer {
    /// Starts the server with the health service on the current tokio runtime.
    pub async fn start() -> Self {
        Self::serve(true, None).await
    }

    /// Starts the server with the health service over TLS, presenting
    /// `cert` and accepting only `h2` by ALPN.
    pub async fn start_tls(cert: &TestCert) -> Self {
        let mut config = (*cert.server_config()).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Self::serve(true, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    /// Starts a gRPC server that has no service at all: it answers every
    /// call, `Health/Check` included, with `UNIMPLEMENTED`.
    pub async fn without_health() -> Self {
        Self::serve(false, None).await
    }

    async fn serve(with_health: bool, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        use tokio_stream::StreamExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let reporter = tonic_health::server::HealthReporter::new();
        let metadata = Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let mut routes = tonic::service::RoutesBuilder::default();
        if with_health {
            let log = metadata.clone();
            let record = move |req: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
                let pairs = req
                    .metadata()
                    .iter()
                    .filter_map(|entry| match entry {
                        tonic::metadata::KeyAndValueRef::Ascii(k, v) => {
                            Some((k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                        }
                        tonic::metadata::KeyAndValueRef::Binary(..) => None,
                    })
                    .collect();
                log.lock().unwrap_or_else(|e| e.into_inner()).push(pairs);
                Ok(req)
            };
            routes.add_service(tonic_health::pb::health_server::HealthServer::with_interceptor(
                tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
                record,
            ));
        }
        let router = tonic::transport::Server::builder().add_routes(routes.routes());
        let task = match tls {
            None => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |stream| {
                    count.fetch_add(1, Ordering::SeqCst);
                    stream
                });
                tokio::spawn(async move {
                    let _ = router.serve_with_incoming(incoming).await;
                })
            }
            // tonic takes the decrypted side of an in-memory pipe per
            // connection; the TLS session is pumped into it.
            Some(acceptor) => tokio::spawn(async move {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let accept = async move {
                    while let Ok((tcp, _)) = listener.accept().await {
                        count.fetch_add(1, Ordering::SeqCst);
                        let (acceptor, tx) = (acceptor.clone(), tx.clone());
                        tokio::spawn(async move {
                            // A client that rejects the certificate ends here.
                            let Ok(mut tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let (inner, mut outer) = tokio::io::duplex(64 * 1024);
                            if tx.send(Ok::<_, std::io::Error>(inner)).is_ok() {
                                let _ = tokio::io::copy_bidirectional(&mut tls, &mut outer).await;
                            }
                        });
                    }
                };
                let serve = router.serve_with_incoming(tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
                tokio::select! {
                    _ = accept => {}
                    _ = serve => {}
                }
            }),
        };
        Self {
            addr,
            reporter,
            metadata,
            accepted,
            task,
        }
    }

    /// Sets the status `Health/Check` reports for `service` (`""` for the
    /// server as a whole).
    pub async fn set(&self, service: &str, status: ServingStatus) {
        self.reporter.set_service_status(service, status).await;
    }

    /// The ASCII metadata of each call served so far, in order.
    pub fn metadata(&self) -> Vec<Vec<(String, String)>> {
        self.metadata.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for GrpcHealthServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
