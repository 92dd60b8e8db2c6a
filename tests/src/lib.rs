//! sonde's integration harness: the hostile test guests, built from
//! `tests/guests/` by the build script, small real servers to probe, and
//! the helpers that name no sonde crate, shared by every crate's tests
//! (`raw_http`, `dns`, `processes`, `manifests`, `tools`, `seeded`,
//! `blackbox`, `promql`). It
//! depends on no sonde crate: as a dev-dependency of one, it would build a
//! second copy of the crate under test.
//!
//! Each guest is named by what it does wrong (`spin_forever`,
//! `connect_elsewhere`…); [`guests`] holds the path of each component.

#![deny(missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod blackbox;
pub mod dns;
pub mod journald;
pub mod manifests;
pub mod processes;
pub mod promql;
pub mod raw_http;
pub mod reflect;
pub mod secrets;
pub mod seeded;
pub mod tools;

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
    /// Starts listening on an ephemeral loopback port; each connection is
    /// closed as soon as it is accepted.
    pub async fn start() -> Self {
        Self::listen(false).await
    }

    /// Starts listening on an ephemeral loopback port and never answers:
    /// each connection is held open until the listener is dropped (a
    /// server that hangs).
    pub async fn start_silent() -> Self {
        Self::listen(true).await
    }

    async fn listen(hold: bool) -> Self {
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
                if hold {
                    held.push(stream);
                }
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
    /// Its working directory: a replica writes the master's snapshot here.
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts `redis-server` and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (`.ci/run` installs it) or does
    /// not come up within ten seconds.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts `redis-server` with extra arguments (`["--requirepass", "pw"]`,
    /// `["--replicaof", "127.0.0.1", "6379"]`) and waits until it accepts
    /// connections.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(extra: &[&str]) -> Self {
        let addr = closed_port();
        let dir = tempfile::tempdir().expect("temp dir");
        let child = std::process::Command::new("redis-server")
            .args([
                "--dir",
                &dir.path().display().to_string(),
                "--port",
                &addr.port().to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server");
        let server = Self { addr, child, _dir: dir };
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

/// How a [`PostgresServer`] authenticates TCP connections from 127.0.0.1
/// (its `pg_hba.conf` method; passwords are stored to suit it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgAuth {
    /// No password asked.
    Trust,
    /// md5 challenge, passwords stored as md5.
    Md5,
    /// SCRAM-SHA-256, passwords stored as SCRAM verifiers.
    Scram,
    /// The password in cleartext (`password`), checked against a SCRAM
    /// verifier.
    Password,
}

impl PgAuth {
    fn hba(self) -> &'static str {
        match self {
            Self::Trust => "trust",
            Self::Md5 => "md5",
            Self::Scram => "scram-sha-256",
            Self::Password => "password",
        }
    }
}

/// A real PostgreSQL server (Debian's `postgresql` package) in a temporary
/// data directory, on a free loopback port; stopped and removed when
/// dropped.
///
/// PostgreSQL refuses to run as root, so `initdb`, `postgres` and `psql` run
/// as the `postgres` system user (the child process's uid and gid are set
/// directly, as `runuser -u postgres` would). The superuser `postgres` has
/// the password [`PostgresServer::PASSWORD`].
pub struct PostgresServer {
    /// Where it listens.
    pub addr: SocketAddr,
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    auth: PgAuth,
    ids: (u32, u32),
    child: Option<std::process::Child>,
}

impl PostgresServer {
    /// The superuser's password.
    pub const PASSWORD: &'static str = "sonde-test-secret";

    /// Creates a cluster whose TCP connections use `auth`, starts it and
    /// waits until it accepts queries.
    ///
    /// # Panics
    ///
    /// When PostgreSQL is not installed (`.ci/run` installs `postgresql`),
    /// or does not come up within thirty seconds.
    pub fn start(auth: PgAuth) -> Self {
        let (bin, ids, dir) = Self::prepare();
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, Self::PASSWORD).expect("write pwfile");
        std::os::unix::fs::chown(&pwfile, Some(ids.0), Some(ids.1)).expect("chown pwfile");
        let encryption = if auth == PgAuth::Md5 { "md5" } else { "scram-sha-256" };
        let mut server = Self {
            addr: closed_port(),
            bin,
            dir,
            auth,
            ids,
            child: None,
        };
        let data = server.data_dir();
        let out = server
            .as_postgres("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-E", "UTF8", "--no-sync", "--auth-local=trust"])
            .arg(format!("--auth-host={}", auth.hba()))
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let hba = format!(
            "local all all trust\nlocal replication all trust\nhost all all 127.0.0.1/32 {0}\nhost replication all 127.0.0.1/32 {0}\n",
            auth.hba()
        );
        std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        let conf = format!(
            "listen_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\npassword_encryption = {encryption}\nfsync = off\nshared_buffers = 16MB\nmax_connections = 20\nlog_min_messages = warning\n",
            server.dir.path().display()
        );
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        std::io::Write::write_all(&mut file, conf.as_bytes()).expect("write postgresql.conf");
        // initdb stored the pwfile password with initdb's default encryption; store it again.
        server.restart();
        server.psql(&format!(
            "SET password_encryption = '{encryption}'; ALTER USER postgres PASSWORD '{}'",
            Self::PASSWORD
        ));
        server
    }

    /// Finds PostgreSQL's programs and makes a temporary directory the
    /// `postgres` user owns.
    fn prepare() -> (std::path::PathBuf, (u32, u32), tempfile::TempDir) {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is not installed: apt-get install postgresql")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("postgres").exists())
            .max_by_key(|b| {
                b.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("no /usr/lib/postgresql/*/bin/postgres");
        let ids = postgres_ids();
        let dir = tempfile::tempdir().expect("temp dir");
        std::os::unix::fs::chown(dir.path(), Some(ids.0), Some(ids.1)).expect("chown the data dir to postgres");
        (bin, ids, dir)
    }

    /// Starts a hot standby of `primary`: a base backup taken with
    /// `pg_basebackup -R`, streaming from the primary over its Unix socket,
    /// on a port of its own. Waits until it accepts queries.
    ///
    /// # Panics
    ///
    /// When the backup fails or the standby does not come up.
    pub fn start_standby(primary: &PostgresServer) -> Self {
        let (bin, ids, dir) = Self::prepare();
        let mut standby = Self {
            addr: closed_port(),
            bin,
            dir,
            auth: primary.auth,
            ids,
            child: None,
        };
        let data = standby.data_dir();
        let out = standby
            .as_postgres("pg_basebackup")
            .arg("-D")
            .arg(&data)
            .args(["-R", "-X", "stream", "--no-sync", "-U", "postgres", "-h"])
            .arg(primary.dir.path())
            .args(["-p", &primary.addr.port().to_string()])
            .output()
            .expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = format!("unix_socket_directories = '{}'\n", standby.dir.path().display());
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        std::io::Write::write_all(&mut file, conf.as_bytes()).expect("write postgresql.conf");
        standby.restart();
        standby
    }

    fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// A command for one of PostgreSQL's programs, run as `postgres`.
    fn as_postgres(&self, program: &str) -> std::process::Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(self.bin.join(program));
        cmd.uid(self.ids.0).gid(self.ids.1).current_dir(self.dir.path());
        cmd.env("HOME", self.dir.path()).env("PGHOST", self.dir.path());
        cmd
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port,
    /// and waits until it accepts queries.
    pub fn restart(&mut self) {
        self.stop();
        let child = self
            .as_postgres("postgres")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.addr.port().to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("postgres.log")).expect("create postgres.log"))
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let ready = self
                .as_postgres("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &self.addr.port().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "postgres did not start on {}: {}",
                self.addr,
                std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown) and waits for it to exit; the data
    /// directory stays for [`restart`](Self::restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
            }
            let _ = child.wait();
        }
    }

    /// Runs `sql` as the superuser over the Unix socket and returns psql's
    /// unaligned output.
    ///
    /// # Panics
    ///
    /// When the statement fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = self
            .as_postgres("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-p", &self.addr.port().to_string(), "-c", sql])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// How TCP connections authenticate.
    pub fn auth(&self) -> PgAuth {
        self.auth
    }

    /// The temporary directory (owned by `postgres`) the cluster lives in.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: the postmaster ends its backends too.
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::QUIT);
            }
            let _ = child.wait();
        }
    }
}

/// The uid and gid of the `postgres` system user.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.first() != Some(&"postgres") {
                return None;
            }
            Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
        })
        .expect("no postgres user: apt-get install postgresql")
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
/// | `/liveness` | 200 `live`, or 503 `not live` after [`HttpServer::set_healthy`]`(false)` (calico-felix's health port answers so) |
/// | `/authority` | 200 with the version and the authority the request named (`HTTP/2.0 localhost:1234`): HTTP/2's `:authority`, HTTP/1.1's `Host` |
/// | anything else | 404 |
///
/// [`HttpServer::start_tls`] serves the same routes over TLS, and
/// [`HttpServer::start_h2_tls`] over TLS in HTTP/2 too.
pub struct HttpServer {
    /// Where it listens.
    pub addr: SocketAddr,
    requests: Arc<Log>,
    accepted: Arc<AtomicUsize>,
    healthy: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Starts the server on the current tokio runtime, on a free port of
    /// the loopback.
    pub async fn start() -> Self {
        Self::serve(None).await
    }

    /// [`HttpServer::start`] on `addr` (a real node's address and the port
    /// a shipped example names).
    pub async fn start_on(addr: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve_on(listener, None)
    }

    /// Starts the server over TLS, presenting `cert`.
    pub async fn start_tls(cert: &TestCert) -> Self {
        Self::serve(Some(tokio_rustls::TlsAcceptor::from(cert.server_config()))).await
    }

    /// Starts the server over TLS, presenting `cert`, offering HTTP/2
    /// (`h2`) and HTTP/1.1 by ALPN and speaking what the client chose.
    pub async fn start_h2_tls(cert: &TestCert) -> Self {
        let mut config = (*cert.server_config()).clone();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self::serve(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        Self::serve_on(listener, tls)
    }

    fn serve_on(listener: tokio::net::TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(Log::default());
        let accepted = Arc::new(AtomicUsize::new(0));
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (log, count, health) = (requests.clone(), accepted.clone(), healthy.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                // As real servers do: without it, a response written after
                // TLS 1.3's session tickets waits for the client's delayed
                // ACK (40 ms).
                let _ = stream.set_nodelay(true);
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
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let io = hyper_util::rt::TokioIo::new(stream);
                            if io.inner().get_ref().1.alpn_protocol() == Some(b"h2") {
                                let h2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                                let _ = h2.serve_connection(io, service).await;
                            } else {
                                let _ = http.serve_connection(io, service).await;
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

    /// Makes `/health` answer 200 (`true`) or 500 (`false`), and `/liveness`
    /// 200 or 503.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// The paths (with query) served so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.paths.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The `traceparent` headers received so far, in order.
    pub fn traceparents(&self) -> Vec<String> {
        self.requests
            .traceparents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How many TCP connections it accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// What an [`HttpServer`] was asked.
#[derive(Default)]
struct Log {
    paths: std::sync::Mutex<Vec<String>>,
    traceparents: std::sync::Mutex<Vec<String>>,
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

    /// A rustls server configuration presenting this certificate and
    /// requiring a client certificate issued by `client_ca` (PEM).
    pub fn mtls_server_config(&self, client_ca: &str) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(client_ca.as_bytes()) {
            roots.add(cert.expect("client CA PEM")).expect("client CA");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .expect("client verifier");
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .expect("server certificate and key");
        Arc::new(config)
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
    log: Arc<Log>,
    healthy: bool,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    log.paths.lock().unwrap_or_else(|e| e.into_inner()).push(path.clone());
    if let Some(t) = req.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
        log.traceparents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t.to_string());
    }
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
        "/liveness" if healthy => reply(200, "live".into()),
        "/liveness" => reply(503, "not live".into()),
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
        // Two values of one header, as blackbox's header checks read them.
        "/cookies" => hyper::Response::builder()
            .status(200)
            .header("set-cookie", "theme=dark")
            .header("set-cookie", "session=abc")
            .body(Body::new(bytes::Bytes::from("ok")))
            .expect("response"),
        "/json" => reply(200, r#"{"status": {"db": "ok"}, "version": 3}"#.into()),
        "/authority" => {
            let named = req.uri().authority().map(|a| a.to_string()).or_else(|| {
                req.headers()
                    .get("host")
                    .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
            });
            reply(200, format!("{:?} {}", req.version(), named.unwrap_or_default()))
        }
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

    /// As [`GrpcHealthServer::start_tls`], requiring a client certificate
    /// issued by `client_ca` (PEM): a client without one fails the
    /// handshake.
    pub async fn start_mtls(cert: &TestCert, client_ca: &str) -> Self {
        let mut config = (*cert.mtls_server_config(client_ca)).clone();
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
                        let _ = tcp.set_nodelay(true);
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

/// A backend behind a [`RoundRobin`] balancer, as a Pod behind a Service: a
/// hyper server on its own loopback address (`127.0.0.N`) that answers
/// every request with `Pod-IPv4: <that address>` (unless started without
/// it) and a status that [`PodBackend::set_status`] changes.
pub struct PodBackend {
    /// Where it listens.
    pub addr: SocketAddr,
    status: Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl PodBackend {
    /// Starts a backend on `ip` (a loopback address) and a free port; with
    /// `header` false it answers without `Pod-IPv4`, as an older server.
    pub async fn start(ip: &str, header: bool) -> Self {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let status = Arc::new(std::sync::atomic::AtomicU16::new(200));
        let answer = status.clone();
        let pod_ip = addr.ip().to_string();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (answer, pod_ip) = (answer.clone(), pod_ip.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req: hyper::Request<hyper::body::Incoming>| {
                        let code = answer.load(Ordering::SeqCst);
                        let mut response = hyper::Response::builder().status(code);
                        if header {
                            response = response.header("Pod-IPv4", pod_ip.as_str());
                        }
                        let body = http_body_util::Full::new(bytes::Bytes::from(format!("{code} from {pod_ip}\n")));
                        async move { response.body(body) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Self { addr, status, task }
    }

    /// Answers every later request with `code`.
    pub fn set_status(&self, code: u16) {
        self.status.store(code, Ordering::SeqCst);
    }
}

impl Drop for PodBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An in-process round-robin TCP balancer, as kube-proxy in front of a
/// Service: each new connection is relayed to the next backend of the set
/// in force when it arrives; [`RoundRobin::route_to`] changes the set.
pub struct RoundRobin {
    /// Where it listens (the "Service address").
    pub addr: SocketAddr,
    backends: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RoundRobin {
    /// Starts the balancer on a free loopback port, routing to `backends`.
    pub async fn start(backends: &[SocketAddr]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let set = Arc::new(std::sync::Mutex::new(backends.to_vec()));
        let routes = set.clone();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = {
                    let set = routes.lock().expect("routes");
                    if set.is_empty() {
                        continue;
                    }
                    next = next.wrapping_add(1);
                    set[next % set.len()]
                };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            addr,
            backends: set,
            task,
        }
    }

    /// Routes later connections to `backends`, in turn.
    pub fn route_to(&self, backends: &[SocketAddr]) {
        *self.backends.lock().expect("routes") = backends.to_vec();
    }
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The documents of the first code block fenced as ```` ```<fence> ```` in
/// the section headed `heading` of the repository's markdown file `file`
/// (a path from the repository's root), as shipped: the text of each YAML
/// document, split at `---`. Panics naming what it did not find, so a test
/// of documented objects fails when the docs move them.
pub fn doc_documents(file: &str, heading: &str, fence: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let section = doc
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no section {heading:?} in {file}"));
    let block = section
        .split(&format!("```{fence}\n"))
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no ```{fence} block in {file}'s {heading:?}"));
    block.split("\n---\n").map(str::to_string).collect()
}
