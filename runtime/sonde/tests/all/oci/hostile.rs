//! Hostile registries: an in-process server on loopback that answers the
//! distribution API the way an attacker would (silence, endless bodies,
//! wrong sizes and digests, redirects and token realms pointing at places
//! the agent must not go, a trickle), and what sonde does about each: a
//! typed error within a bound of time and bytes, and no effect on anything
//! that does not need that registry.

use crate::support;
use sonde_oci::{Client, ClientSettings, Limits, OciError, Reference, RegistryAccess};
use sonde_policy::identity::Digest;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the hostile registry does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Hostile {
    /// Accepts connections and never answers.
    Silent,
    /// `200` on the manifest, and a body that never ends.
    EndlessManifest,
    /// `200` on the manifest with `Content-Length: 10 GB`.
    HugeManifest,
    /// A good manifest whose layer declares 1,000 bytes; a blob that never ends.
    EndlessBlob,
    /// The blob ends after 500 of its 1,000 bytes.
    ShortBlob,
    /// The blob announces 2,000 bytes.
    LongAnnouncedBlob,
    /// 1,000 bytes, but not the ones the digest names.
    WrongDigest,
    /// The blob redirects to this URL.
    Redirect(&'static str),
    /// The blob redirects to itself, forever.
    RedirectLoop,
    /// The manifest comes one byte every 300 ms, forever.
    Trickle,
    /// Every manifest and blob comes in 5 pieces 400 ms apart: each
    /// answer within any per-answer timeout of 3 s, the whole pull not.
    SlowAnswers,
    /// A `401` whose token realm is on this server and answers forever.
    EndlessToken,
    /// A `401` whose token realm is this URL.
    Realm(&'static str),
    /// A response head that never ends.
    EndlessHeaders,
    /// `404` to everything.
    NotFound,
    /// An honest registry of the built-in `tcp` component, which answers
    /// each manifest and blob after this many milliseconds.
    Honest(u64),
    /// A good artifact whose referrer list never ends.
    EndlessReferrers,
    /// An honest artifact of the built-in `tcp` component whose cosign
    /// `.sig` tag holds 200 simple-signing layers, none by a trusted key.
    SignatureFlood,
}

/// The simple-signing payload naming the honest `tcp` artifact.
fn flood_payload() -> Vec<u8> {
    let subject = digest(&manifest_of(sonde_builtins::get("tcp").unwrap()));
    sonde_oci::signing::simple_signing_payload("127.0.0.1/acme/check", &subject)
}

/// A cosign `.sig` manifest with 200 layers of [`flood_payload`].
fn flood_manifest() -> Vec<u8> {
    let payload = flood_payload();
    let layers: Vec<_> = (0..200)
        .map(|i| {
            serde_json::json!({
                "mediaType": sonde_oci::signing::SIMPLE_SIGNING_MEDIA_TYPE,
                "digest": digest(&payload),
                "size": payload.len(),
                "annotations": {(sonde_oci::signing::SIGNATURE_ANNOTATION): format!("c2lnbmF0dXJl{i:04}")},
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(b"{}"), "size": 2},
        "layers": layers,
    }))
    .unwrap()
}

/// The layer the hostile manifests declare: 1,000 bytes of `x`.
fn layer() -> Vec<u8> {
    vec![b'x'; 1000]
}

fn digest(bytes: &[u8]) -> String {
    Digest::of(bytes).to_string()
}

fn manifest() -> Vec<u8> {
    manifest_of(&layer())
}

/// A CNCF wasm manifest whose one layer is `layer`.
fn manifest_of(layer: &[u8]) -> Vec<u8> {
    let config = b"{}";
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.wasm.config.v0+json", "digest": digest(config), "size": 2},
        "layers": [{"mediaType": "application/wasm", "digest": digest(layer), "size": layer.len()}],
    }))
    .unwrap()
}

/// A hostile registry on a free loopback port, counting what it sent.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub(crate) async fn start(how: Hostile) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let counter = counter.clone();
                held.push(tokio::spawn(serve(stream, how, addr, counter)));
            }
        });
        Self { addr, sent, task }
    }

    /// Bytes written to clients so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub(crate) fn reference(&self) -> Reference {
        Reference::parse(&format!("oci://{}/acme/check:1", self.addr)).unwrap()
    }
}

async fn write(stream: &mut TcpStream, counter: &AtomicU64, bytes: &[u8]) -> bool {
    let ok = stream.write_all(bytes).await.is_ok();
    if ok {
        counter.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
    ok
}

async fn answer(stream: &mut TcpStream, counter: &AtomicU64, status: &str, headers: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if write(stream, counter, head.as_bytes()).await {
        write(stream, counter, body).await;
    }
}

/// A chunked `200` whose chunks never end (until the client goes).
async fn endless(stream: &mut TcpStream, counter: &AtomicU64, content_type: &str) {
    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n");
    if !write(stream, counter, head.as_bytes()).await {
        return;
    }
    let chunk = format!("10000\r\n{}\r\n", "a".repeat(0x10000));
    while write(stream, counter, chunk.as_bytes()).await {}
}

async fn serve(mut stream: TcpStream, how: Hostile, addr: SocketAddr, counter: Arc<AtomicU64>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head).to_string();
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let authorized = text.to_ascii_lowercase().contains("\nauthorization:");
    let counter = &*counter;
    let manifest_type = "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n";
    let is_manifest = path.contains("/manifests/");
    let is_blob = path.contains("/blobs/");
    match how {
        Hostile::Honest(delay) if is_manifest || is_blob => {
            let tcp = sonde_builtins::get("tcp").unwrap();
            tokio::time::sleep(Duration::from_millis(delay)).await;
            if is_manifest {
                answer(&mut stream, counter, "200 OK", manifest_type, &manifest_of(tcp)).await
            } else {
                answer(&mut stream, counter, "200 OK", "", tcp).await
            }
        }
        Hostile::SignatureFlood if is_manifest => {
            let tcp = sonde_builtins::get("tcp").unwrap();
            if path.ends_with(".sig") {
                answer(&mut stream, counter, "200 OK", manifest_type, &flood_manifest()).await
            } else if path.contains("sha256-") {
                answer(&mut stream, counter, "404 Not Found", "", b"{}").await
            } else {
                answer(&mut stream, counter, "200 OK", manifest_type, &manifest_of(tcp)).await
            }
        }
        Hostile::SignatureFlood if is_blob => {
            let tcp = sonde_builtins::get("tcp").unwrap();
            if path.ends_with(&digest(tcp)) {
                answer(&mut stream, counter, "200 OK", "", tcp).await
            } else {
                answer(&mut stream, counter, "200 OK", "", &flood_payload()).await
            }
        }
        Hostile::NotFound => answer(&mut stream, counter, "404 Not Found", "", b"{}").await,
        Hostile::Silent => {
            // Holds the connection, says nothing.
            let _ = stream.read(&mut buf).await;
            std::future::pending::<()>().await;
        }
        Hostile::EndlessManifest if is_manifest => {
            endless(&mut stream, counter, "application/vnd.oci.image.manifest.v1+json").await
        }
        Hostile::HugeManifest if is_manifest => {
            let head = format!("HTTP/1.1 200 OK\r\n{manifest_type}Content-Length: 10000000000\r\n\r\n");
            if write(&mut stream, counter, head.as_bytes()).await {
                let chunk = vec![b'a'; 0x10000];
                while write(&mut stream, counter, &chunk).await {}
            }
        }
        Hostile::Trickle if is_manifest => {
            let head = format!("HTTP/1.1 200 OK\r\n{manifest_type}Transfer-Encoding: chunked\r\n\r\n");
            if !write(&mut stream, counter, head.as_bytes()).await {
                return;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if !write(&mut stream, counter, b"1\r\na\r\n").await {
                    return;
                }
            }
        }
        Hostile::EndlessToken if path.starts_with("/token") => endless(&mut stream, counter, "application/json").await,
        Hostile::EndlessToken | Hostile::Realm(_) if !authorized => {
            let realm = match how {
                Hostile::Realm(url) => url.to_string(),
                _ => format!("http://{addr}/token"),
            };
            let challenge = format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"hostile\"\r\n");
            answer(&mut stream, counter, "401 Unauthorized", &challenge, b"{}").await
        }
        Hostile::EndlessHeaders => {
            if write(&mut stream, counter, b"HTTP/1.1 200 OK\r\n").await {
                let line = format!("X-Pad: {}\r\n", "a".repeat(1000));
                while write(&mut stream, counter, line.as_bytes()).await {}
            }
        }
        Hostile::SlowAnswers if is_manifest || is_blob => {
            let body = if is_manifest { manifest() } else { layer() };
            let ct = if is_manifest { manifest_type } else { "" };
            let head = format!(
                "HTTP/1.1 200 OK\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if !write(&mut stream, counter, head.as_bytes()).await {
                return;
            }
            for piece in body.chunks(body.len().div_ceil(5)) {
                tokio::time::sleep(Duration::from_millis(400)).await;
                if !write(&mut stream, counter, piece).await {
                    return;
                }
            }
        }
        _ if is_manifest => answer(&mut stream, counter, "200 OK", manifest_type, &manifest()).await,
        Hostile::EndlessBlob if is_blob => endless(&mut stream, counter, "application/octet-stream").await,
        Hostile::ShortBlob if is_blob => {
            let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
            if write(&mut stream, counter, head.as_bytes()).await {
                let body = format!("1f4\r\n{}\r\n0\r\n\r\n", "x".repeat(500));
                write(&mut stream, counter, body.as_bytes()).await;
            }
        }
        Hostile::LongAnnouncedBlob if is_blob => answer(&mut stream, counter, "200 OK", "", &[b'x'; 2000]).await,
        Hostile::WrongDigest if is_blob => answer(&mut stream, counter, "200 OK", "", &[b'y'; 1000]).await,
        Hostile::Redirect(to) if is_blob => {
            let location = format!("Location: {to}\r\n");
            answer(&mut stream, counter, "307 Temporary Redirect", &location, b"").await
        }
        Hostile::RedirectLoop if is_blob => {
            let location = format!("Location: http://{addr}{path}\r\n");
            answer(&mut stream, counter, "307 Temporary Redirect", &location, b"").await
        }
        Hostile::EndlessReferrers if path.contains("/referrers/") => {
            endless(&mut stream, counter, "application/vnd.oci.image.index.v1+json").await
        }
        _ if is_blob => answer(&mut stream, counter, "200 OK", "", &layer()).await,
        _ => answer(&mut stream, counter, "404 Not Found", "", b"{}").await,
    }
}

/// A client of `server` with its own cache, plain HTTP, a 1 s idle timeout
/// and a whole-pull deadline of `deadline`.
fn client(server: &Server, cache: &std::path::Path, deadline: Duration) -> Client {
    let mut settings = ClientSettings::new(cache.to_path_buf());
    settings.timeout = deadline;
    settings.limits = Limits {
        connect: Duration::from_secs(1),
        idle: Duration::from_secs(1),
    };
    settings.registries.insert(
        server.addr.to_string(),
        RegistryAccess {
            insecure: true,
            ..RegistryAccess::default()
        },
    );
    Client::new(settings).unwrap()
}

/// Resolves `server`'s reference; the error, how long it took, and the
/// bytes the server had sent by then.
async fn pull(how: Hostile) -> (OciError, Duration, u64) {
    let server = Server::start(how).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&server, cache.path(), Duration::from_secs(30));
    let started = Instant::now();
    let e = client
        .resolve(&server.reference())
        .await
        .expect_err("a hostile registry's artifact is refused");
    let (took, sent) = (started.elapsed(), server.sent());
    eprintln!("{how:?}: {e} ({} ms, {sent} bytes sent)", took.as_millis());
    (e, took, sent)
}

/// What the client may have read, at most, besides a cap: the kernel's
/// socket buffers on loopback and one chunk.
const SLACK: u64 = 16 << 20;

/// A pull from `how` is refused as a `what` over `cap`, within 5 s and
/// having been sent no more than the cap and [`SLACK`].
async fn refused_at_cap(how: Hostile, what: &str, cap: u64) {
    let (e, took, sent) = pull(how).await;
    assert!(
        matches!(e, OciError::TooLarge { what: w, limit, .. } if w == what && limit == cap),
        "{e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(sent < cap + SLACK, "{sent} bytes sent");
}

#[tokio::test]
async fn a_silent_registry_is_given_up_on_after_the_idle_timeout_not_the_pull_deadline() {
    let (e, took, _) = pull(Hostile::Silent).await;
    assert!(
        matches!(e, OciError::NotCached { ref source, .. } if matches!(**source, OciError::Stalled { .. })),
        "{e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}: the idle timeout is 1 s");
}

#[tokio::test]
async fn an_endless_manifest_is_refused_at_its_cap() {
    for how in [Hostile::EndlessManifest, Hostile::HugeManifest] {
        refused_at_cap(how, "manifest", sonde_oci::MAX_MANIFEST_BYTES).await;
    }
}

#[tokio::test]
async fn a_blob_is_read_at_its_declared_size_and_no_further() {
    let (e, took, sent) = pull(Hostile::EndlessBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                early: true,
                ..
            }
        ),
        "an endless blob stops at its declared size: {e}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(sent < SLACK, "{sent} bytes sent for a 1,000-byte blob");
    let (e, ..) = pull(Hostile::LongAnnouncedBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                got: 2000,
                early: true,
                ..
            }
        ),
        "a blob that announces more than declared is refused before it is read: {e}"
    );
    let (e, ..) = pull(Hostile::ShortBlob).await;
    assert!(
        matches!(
            e,
            OciError::SizeMismatch {
                declared: 1000,
                got: 500,
                early: false,
                ..
            }
        ),
        "a short blob: {e}"
    );
    assert!(e.to_string().contains("ended after 500"), "{e}");
}

#[tokio::test]
async fn a_blob_that_does_not_hash_to_its_digest_is_refused_and_not_cached() {
    let server = Server::start(Hostile::WrongDigest).await;
    let cache = tempfile::tempdir().unwrap();
    let e = client(&server, cache.path(), Duration::from_secs(30))
        .resolve(&server.reference())
        .await
        .unwrap_err();
    assert!(
        matches!(e, OciError::DigestMismatch { ref expected, .. } if *expected == digest(&layer())),
        "{e}"
    );
    let cached = cache
        .path()
        .join("blobs/sha256")
        .join(&digest(&layer())["sha256:".len()..]);
    assert!(!cached.exists(), "a refused blob is not cached");
}

#[tokio::test]
async fn redirects_to_places_the_agent_does_not_go_are_refused() {
    for to in [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/x",
        "http://[fe80::1]/x",
        "http://0.0.0.0:1/x",
        "http://224.0.0.1/x",
        "file:///etc/passwd",
    ] {
        let (e, took, _) = pull(Hostile::Redirect(to)).await;
        assert!(matches!(e, OciError::Refused { .. }), "{to}: {e}");
        assert!(e.to_string().contains("is refused"), "{to}: {e}");
        assert!(
            took < Duration::from_secs(3),
            "{to}: refused before any connection ({took:?})"
        );
    }
    let (e, ..) = pull(Hostile::RedirectLoop).await;
    assert!(
        matches!(e, OciError::Refused { .. }) && e.to_string().contains("redirects in a row"),
        "{e}"
    );
}

/// A pull from `hostile` under a whole-pull `deadline`: it must end in a
/// timeout (the cache has nothing to stand in) within `deadline` and 2 s.
async fn ends_at_the_deadline(hostile: Hostile, deadline: Duration) {
    let server = Server::start(hostile).await;
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let e = client(&server, cache.path(), deadline)
        .resolve(&server.reference())
        .await
        .expect_err("the pull takes longer than its deadline");
    let took = started.elapsed();
    eprintln!("{e} ({} ms)", took.as_millis());
    assert!(
        matches!(e, OciError::NotCached { ref source, .. } if matches!(**source, OciError::Timeout { .. })),
        "{e}"
    );
    assert!(
        (deadline..deadline + Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
}

/// A byte every 300 ms never trips the 1 s idle timeout; the deadline does.
#[tokio::test]
async fn a_trickle_is_cut_off_by_the_whole_pulls_deadline() {
    ends_at_the_deadline(Hostile::Trickle, Duration::from_secs(2)).await;
}

/// Answers that each come within any per-answer timeout still end at the
/// whole pull's deadline: 2 s per answer, a 3 s deadline for all of them.
#[tokio::test]
async fn slow_answers_end_at_the_whole_pulls_deadline_not_one_timeout_per_answer() {
    ends_at_the_deadline(Hostile::SlowAnswers, Duration::from_secs(3)).await;
}

#[tokio::test]
async fn token_endpoints_are_bounded_and_checked_like_redirects() {
    refused_at_cap(Hostile::EndlessToken, "token answer", sonde_oci::MAX_TOKEN_BYTES).await;
    let (e, ..) = pull(Hostile::Realm("http://169.254.169.254/token")).await;
    assert!(
        matches!(e, OciError::Refused { .. }) && e.to_string().contains("token realm"),
        "{e}"
    );
}

#[tokio::test]
async fn an_endless_response_head_and_an_endless_referrer_list_are_bounded() {
    let (e, took, sent) = pull(Hostile::EndlessHeaders).await;
    assert!(took < Duration::from_secs(5) && sent < SLACK, "{e}: {took:?} {sent}");
    refused_at_cap(
        Hostile::EndlessReferrers,
        "referrer list",
        sonde_oci::MAX_MANIFEST_BYTES,
    )
    .await;
}

/// A `.sig` tag with 200 signatures: at most [`sonde_oci::signing::MAX_ITEMS`]
/// are read, none verifies, and the plugin is refused as untrusted (its
/// bytes still resolve: the flood is the signature's problem only).
#[tokio::test]
async fn a_flood_of_signatures_is_read_up_to_its_bound_and_refused() {
    let server = Server::start(Hostile::SignatureFlood).await;
    let cache = tempfile::tempdir().unwrap();
    let resolved = client(&server, cache.path(), Duration::from_secs(10))
        .resolve(&server.reference())
        .await
        .unwrap();
    let (doc, _) = resolved.signature.clone().expect("the flood is found");
    let gathered: sonde_oci::signing::Gathered = serde_json::from_slice(&doc).unwrap();
    assert_eq!(gathered.items.len(), sonde_oci::signing::MAX_ITEMS);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("acme.key");
    let trusted = sonde_oci::signing::keygen(&key, "acme").unwrap();
    let e = resolved.verify(&[trusted]).unwrap_err();
    assert!(
        matches!(
            e,
            sonde_oci::signing::SignatureError::NoTrustedSignature { found: 16, .. }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("untrusted: 16 signature(s)"), "{e}");
}

/// Runs `sonde check REFERENCE` and returns its exit, stderr, peak RSS
/// (VmHWM, read from /proc while it runs) and run time.
fn check_peak_rss(reference: &str) -> (std::process::ExitStatus, String, u64, Duration) {
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(support::cache_dir())
        .args(["check", reference, "--insecure-registry", "--oci-cache"])
        .arg(cache.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
            peak = peak.max(hwm * 1024);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "sonde check did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr, peak, started.elapsed())
}

/// The first finding: `sonde check` against an endless manifest
/// held 14 GB after 60 s. Its peak RSS now stays within the manifest cap
/// plus a constant of what the same check takes against a registry that
/// answers 404 at once, and it ends in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sonde_check_under_an_endless_manifest_stays_within_the_cap_in_memory() {
    let missing = Server::start(Hostile::NotFound).await;
    let endless = Server::start(Hostile::EndlessManifest).await;
    let run = |r: Reference| tokio::task::spawn_blocking(move || check_peak_rss(&r.to_string()));
    let (status, stderr, baseline, _) = run(missing.reference()).await.unwrap();
    assert!(!status.success() && stderr.contains("not found"), "{stderr}");
    let (status, stderr, peak, took) = run(endless.reference()).await.unwrap();
    let cap = sonde_oci::MAX_MANIFEST_BYTES;
    eprintln!(
        "sonde check peak RSS: {} KiB against a 404, {} KiB under an endless manifest ({} ms, {} bytes sent)",
        baseline >> 10,
        peak >> 10,
        took.as_millis(),
        endless.sent()
    );
    assert!(!status.success());
    assert!(stderr.contains("manifest") && stderr.contains("limit"), "{stderr}");
    assert!(
        peak < baseline + cap + (32 << 20),
        "peak RSS {peak} under an endless manifest, {baseline} against a 404: more than the {cap}-byte cap + 32 MiB"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// A TCP listener that accepts everything, for a `tcp` probe to pass.
pub(crate) async fn accepting() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });
    (addr, task)
}

/// A pinned reference on `server` that no cache holds.
pub(crate) fn pinned_on(server: &Server) -> String {
    format!("oci://{}/acme/check@{}", server.addr, digest(b"never pulled"))
}

/// The third finding: `sonde run` with one probe on a silent
/// registry served `/livez` after 60.1 s and ran nothing until then. Now
/// the agent starts, serves, and runs its other probes at once; the probe
/// that waits shows it in `/v1/probes`, `/v1/status` and the metrics.
/// A config (written in `dir`) with two probes of one target: `plain`, the
/// built-in tcp, and `pulled`, the plugin `pulled` from the registry at
/// `registry` (plain HTTP); both every 100 ms.
fn plain_and_pulled(
    dir: &std::path::Path,
    registry: SocketAddr,
    target: SocketAddr,
    pulled: &str,
) -> std::path::PathBuf {
    let config = dir.join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\ntargets:\n  - name: svc\n    address: {target}\n    probes:\n      - {{ name: plain, plugin: tcp, period: 100ms }}\n      - {{ name: pulled, plugin: \"{pulled}\", period: 100ms }}\n",
            state = dir.join("state").display(),
            addr = registry,
        ),
    )
    .unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_silent_registry_serves_livez_and_runs_unrelated_probes_within_a_second() {
    let silent = Server::start(Hostile::Silent).await;
    let (target, accepting) = accepting().await;
    // The built-in is compiled before the clock starts (a cold compile
    // cache is not what this measures).
    support::builtin("tcp").await;
    let dir = tempfile::tempdir().unwrap();
    let pulled = pinned_on(&silent);
    let config = plain_and_pulled(dir.path(), silent.addr, target, &pulled);
    let started = Instant::now();
    let (agent, api) = support::start_agent(&config).await;
    eprintln!("Agent::start returned after {} ms", started.elapsed().as_millis());
    let (code, _) = support::call(api, "GET", "/livez", None, b"").await;
    assert_eq!(code, 200);
    let probes = loop {
        let probes: serde_json::Value =
            serde_json::from_str(&support::call(api, "GET", "/v1/probes", None, b"").await.1).unwrap();
        let ran = probes
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "plain" && p["last"]["status"] == "success");
        if ran {
            break probes;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{probes:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    eprintln!(
        "/livez and an unrelated probe's first success {} ms after start",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    let waiting = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .unwrap_or_else(|| panic!("{probes:#}"));
    assert_eq!(waiting["state"], "unknown", "{waiting:#}");
    assert_eq!(waiting["pulling"]["plugin"], pulled.as_str(), "{waiting:#}");
    let status: serde_json::Value =
        serde_json::from_str(&support::call(api, "GET", "/v1/status", None, b"").await.1).unwrap();
    assert_eq!(status["pulling"][0]["probe"], "pulled", "{status:#}");
    let metrics = support::call(api, "GET", "/metrics", None, b"").await.1;
    assert!(
        metrics.contains("sonde_probe_waiting_for_plugin{probe=\"pulled\"")
            && metrics.contains("sonde_oci_pulls_in_flight 1"),
        "{metrics}"
    );
    // `sonde status` says so too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .args(["status", "--api", &format!("http://{api}")])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("pulled") && l.contains("pulling") && l.contains("being pulled")),
        "{table}"
    );
    agent.stop().await;
    accepting.abort();
}

/// A probe whose plugin is being pulled waits, visibly, and runs when the
/// pull lands: `pulling` in `/v1/probes` and the metrics until then, gone
/// after; the unrelated probe ran all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_waits_for_its_pull_visibly_and_runs_when_it_lands() {
    let slow = Server::start(Hostile::Honest(1500)).await;
    let (target, accepting) = accepting().await;
    let dir = tempfile::tempdir().unwrap();
    let pulled = slow.reference().to_string();
    let config = plain_and_pulled(dir.path(), slow.addr, target, &pulled);
    let (agent, api) = support::start_agent(&config).await;
    let get = |path: &'static str| async move { support::call(api, "GET", path, None, b"").await.1 };
    let probes: serde_json::Value = serde_json::from_str(&get("/v1/probes").await).unwrap();
    let waiting = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .cloned();
    assert!(
        waiting
            .as_ref()
            .is_some_and(|p| p["pulling"]["plugin"] == pulled.as_str()),
        "{probes:#}"
    );
    let started = Instant::now();
    let probes = loop {
        let probes: serde_json::Value = serde_json::from_str(&get("/v1/probes").await).unwrap();
        let ran = |n: &str| {
            probes
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == n && p["last"]["status"] == "success")
        };
        if ran("pulled") {
            assert!(ran("plain"), "{probes:#}");
            break probes;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{probes:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let landed = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .unwrap();
    assert!(landed["pulling"].is_null(), "{landed:#}");
    assert!(
        landed["plugin"].as_str().unwrap().contains("@sha256:"),
        "runs the digest: {landed:#}"
    );
    let status: serde_json::Value = serde_json::from_str(&get("/v1/status").await).unwrap();
    assert_eq!(status["pulling"], serde_json::json!([]), "{status:#}");
    let metrics = get("/metrics").await;
    assert!(!metrics.contains("sonde_probe_waiting_for_plugin{"), "{metrics}");
    assert!(metrics.contains("sonde_oci_pulls_in_flight 0"), "{metrics}");
    let charged = agent.executor().tenant_stats("default").unwrap().pull_bytes;
    assert!(
        charged >= sonde_builtins::get("tcp").unwrap().len() as u64,
        "the pull is charged to the tenant once it is taken up: {charged}"
    );
    agent.stop().await;
    accepting.abort();
}
