//! A hostile registry: an in-process server on loopback that answers the
//! distribution API the way an attacker would (silence, endless bodies,
//! wrong sizes and digests, redirects and token realms pointing at places
//! the agent must not go, a trickle), counting the bytes it sent. The
//! tests of the sonde crate and of sonde-kubernetes include this file too
//! (`#[path]`), for the agent, its readiness gates and `sonde check` under
//! the same registries.

use sonde_oci::Reference;
use sonde_policy::identity::Digest;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
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
pub(crate) fn layer() -> Vec<u8> {
    vec![b'x'; 1000]
}

pub(crate) fn digest(bytes: &[u8]) -> String {
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

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
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
