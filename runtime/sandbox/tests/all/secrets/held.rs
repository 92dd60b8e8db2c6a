//! Class 4 of the secrets issue, "held and must keep holding": what the
//! old design already kept, checked against the new one. Redirects carry
//! no credential off the origin it was meant for; a secret with CR or LF
//! in it is refused in a header and injects nothing; a client
//! certificate's errors name no byte of the secret (the same error
//! whatever the secret). gRPC metadata values and messages are withheld
//! in `differential::class3_...`; a login refusal quoting the password in
//! `probes::redis` and `probes::postgres` and `differential::class3_...`.

use super::differential::{Harness, Kind, Pair, Prog, Via, What, holds_run, items};
use crate::support::{builtin, run};
use sonde_policy::secrets::{SecretCell, SecretGrants, SecretValue};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;
use sonde_tests::reflect::{self, Encoding, Field, Program, Source};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);
const TOKEN: &[u8] = b"tok-R3dir3ct-7c1e55a0";

/// An HTTP server on `ip` that records the head of every request and
/// answers 200.
struct Recorder {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn start(ip: &str) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let log = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                        match s.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    log.lock().unwrap().push(String::from_utf8_lossy(&head).into_owned());
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                        .await;
                });
            }
        });
        Self { addr, heads, task }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn grants(secret: &[u8], net: &[SocketAddr]) -> Grants {
    Grants {
        secrets: SecretGrants::new(vec![Arc::new(SecretCell::given(
            "t",
            Arc::from("default"),
            "env T",
            SecretValue::new(secret.to_vec()),
        ))]),
        net: net.iter().map(|a| a.to_string().parse().unwrap()).collect(),
        ..Grants::default()
    }
}

/// The built-in `http` plugin with a bearer token from a secret, sent to
/// a server that redirects elsewhere — another host, another port, a
/// scheme-relative `//host`, a userinfo that dresses another port as the
/// origin, https to http — follows none of them: nothing reaches the
/// places it points to, which are granted (so a leak would be possible)
/// and seen to record an `Authorization` sent to them. A redirect to the
/// origin is followed, with the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class4_redirects_carry_no_credential_off_the_origin() {
    let h = Harness::new().await;
    let r = &h.r;
    let elsewhere = Recorder::start("127.0.0.1").await;
    let other_host = Recorder::start("127.0.0.2").await;
    let auth = || Program::new(Source::Header("authorization".into()), Encoding::Raw, Field::Nothing);
    let redirect = |location: String| {
        let mut p = auth();
        p.status = 302;
        p.location = Some(location);
        r.add(p)
    };
    let net = [r.http, r.https, elsewhere.addr, other_host.addr];
    let plugin = builtin("http").await;
    let check = |scheme: &str, target: SocketAddr, path: String| {
        let config = serde_json::json!({
            "scheme": scheme,
            "path": path,
            "ca_pem": (scheme == "https").then(|| r.ca_pem.clone()),
            "bearer_token": "$(secret:t)",
        });
        let plugin = plugin.clone();
        async move {
            run(
                &plugin,
                &target.to_string(),
                &config.to_string(),
                &grants(TOKEN, &net),
                TIMEOUT,
            )
            .await
        }
    };
    let away = [
        ("another host", "http", r.http, format!("http://{}/x", other_host.addr)),
        ("another port", "http", r.http, format!("http://{}/x", elsewhere.addr)),
        ("//host", "http", r.http, format!("//{}/y", elsewhere.addr)),
        (
            "userinfo",
            "http",
            r.http,
            format!("http://{}@{}/z", r.http, elsewhere.addr),
        ),
        (
            "https to http",
            "https",
            r.https,
            format!("http://{}/w", elsewhere.addr),
        ),
    ];
    let bearer = format!("Bearer {}", String::from_utf8_lossy(TOKEN)).into_bytes();
    for (what, scheme, target, location) in away {
        let id = redirect(location.clone());
        let result = check(scheme, target, reflect::http_path(id)).await;
        assert_eq!(result.status, Status::Warning, "{what}: {result:?}");
        assert!(result.message.contains("not followed"), "{what}: {result:?}");
        assert!(
            !holds_run(format!("{result:?}").as_bytes(), TOKEN),
            "{what}: {result:?}"
        );
        // The origin had the token: the credential was in play.
        assert_eq!(r.received(id), std::slice::from_ref(&bearer), "{what}");
    }
    assert!(elsewhere.heads().is_empty(), "{:?}", elsewhere.heads());
    assert!(other_host.heads().is_empty(), "{:?}", other_host.heads());

    // A redirect to the origin is followed, and carries the token.
    let end = r.add(auth());
    let id = redirect(reflect::http_path(end));
    let result = check("http", r.http, reflect::http_path(id)).await;
    assert_eq!(result.status, Status::Success, "{result:?}");
    assert_eq!(r.received(end), std::slice::from_ref(&bearer));

    // The places redirected to are granted, and record a token sent to
    // them: had one been followed, the assertions above would see it.
    for recorder in [&elsewhere, &other_host] {
        let result = check("http", recorder.addr, "/direct".into()).await;
        assert_eq!(result.status, Status::Success, "{result:?}");
        let heads = recorder.heads();
        assert!(
            heads.len() == 1 && heads[0].contains(&format!("authorization: {}", String::from_utf8_lossy(&bearer))),
            "{heads:?}"
        );
    }
}

/// A secret whose value holds CR LF and a header line: in a sonde `http`
/// header, a `wasi:http` header and gRPC metadata the host refuses it (the
/// step fails) and nothing reaches the peer, so no header is injected; in
/// a Redis login (length-prefixed) it goes whole as the password. No view
/// holds a run of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class4_a_secret_with_cr_or_lf_is_refused_in_headers_and_injects_nothing() {
    let h = Harness::new().await;
    for secret in [
        &b"tok-5b1e9f\r\nx-injected: 1"[..],
        b"tok-5b1e9f\nx-injected: 1",
        b"tok-5b1e9f\rx-injected: 1",
    ] {
        let pair = Pair {
            kind: Kind::Symbols,
            a: secret.to_vec(),
            b: secret.to_vec(),
        };
        let headers = [
            Prog::new(
                Via::Http { keepalive: false },
                What::Secret,
                Encoding::Raw,
                Field::HeaderValue,
            ),
            Prog::new(Via::WasiHttp, What::Secret, Encoding::Raw, Field::HeaderValue),
            Prog::new(Via::Grpc, What::Secret, Encoding::Raw, Field::HeaderValue),
        ];
        let login = Prog::new(Via::Redis, What::Secret, Encoding::HexLower, Field::LoginError);
        let progs: Vec<Prog> = headers.iter().cloned().chain([login]).collect();
        let ids: Vec<u32> = progs.iter().map(|p| h.r.add(p.peer())).collect();
        let steps: Vec<serde_json::Value> = progs.iter().zip(&ids).map(|(p, &id)| p.step(id, &h.r)).collect();
        let [seen, _] = h.run_pair(&pair, &steps, &[0, 1, 2, 3]).await;
        for (i, p) in progs.iter().enumerate() {
            let transcript = items(seen.transcripts.get(&i).map(Vec::as_slice).unwrap_or_default());
            let all: Vec<u8> = transcript.iter().flat_map(|i| i.data.clone()).collect();
            assert!(!holds_run(&all, secret), "{}: {transcript:?}", p.describe());
            if i < headers.len() {
                assert!(
                    seen.steps[i] & 1 == 1,
                    "{}: the host sent a header with CR or LF: {transcript:?}",
                    p.describe()
                );
                assert!(h.r.received(ids[i]).is_empty(), "{}: it reached the peer", p.describe());
            } else {
                assert_eq!(
                    h.r.received(ids[i]),
                    [secret.to_vec(), secret.to_vec()],
                    "the password went whole"
                );
            }
        }
        for head in h.r.http_heads() {
            assert!(
                !head.windows(10).any(|w| w.eq_ignore_ascii_case(b"x-injected")),
                "{}",
                head.escape_ascii()
            );
        }
    }
}

/// `credentials.client-certificate` with the secret as certificate and key
/// fails (it is no PEM), and its error is the same under two secrets of
/// each kind, and of two that look like PEM: it names no byte of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class4_client_certificate_errors_are_the_same_whatever_the_secret() {
    let h = Harness::new().await;
    let mut rng = fastrand::Rng::new();
    let cert = || Prog::new(Via::Cert, What::Secret, Encoding::Raw, Field::Nothing);
    for kind in [Kind::Alnum, Kind::Symbols, Kind::NonUtf8, Kind::Cased] {
        for len in [8, 64] {
            h.check(&Pair::new(&mut rng, kind, len), &[cert()]).await;
        }
    }
    let pem = |body: &[u8]| {
        [
            &b"-----BEGIN CERTIFICATE-----\n"[..],
            &reflect::encode(Encoding::Base64, body),
            b"\n-----END CERTIFICATE-----\n",
        ]
        .concat()
    };
    let inner = Pair::new(&mut rng, Kind::Alnum, 48);
    let looks_like_pem = Pair {
        kind: Kind::Symbols,
        a: pem(&inner.a),
        b: pem(&inner.b),
    };
    h.check(&looks_like_pem, &[cert()]).await;
}
