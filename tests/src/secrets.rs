//! Servers that require credentials, for the secrets tests: an HTTP(S)
//! server that wants basic auth or a bearer token (optionally a client
//! certificate), records every request whole, and has an endpoint that
//! echoes a request back as a careless debugging endpoint does; and the
//! client certificates to present to it.

use crate::TestCert;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// One request as the server received it: everything a peer could see.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request line's target (path and query).
    pub target: String,
    /// Every header, as `name: value` lines.
    pub headers: String,
    /// The body.
    pub body: Vec<u8>,
    /// Whether the TLS client presented a certificate.
    pub client_cert: bool,
}

impl Received {
    /// The whole request as text.
    pub fn text(&self) -> String {
        format!(
            "{}\n{}\n{}",
            self.target,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// An HTTP server on a free loopback port:
///
/// | path | answer |
/// | --- | --- |
/// | `/basic` | 200 when `Authorization` is basic auth of `user` and `password`, else 401 |
/// | `/bearer` | 200 when `Authorization` is `Bearer <token>`, else 401 |
/// | `/echo` | 200 echoing the request: each header in the body and as `x-echo-<name>` |
/// | `/mtls` | 200 when the TLS client presented a certificate the server trusts |
pub struct AuthServer {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

/// What [`AuthServer`] accepts.
#[derive(Clone)]
pub struct Expected {
    /// The basic-auth user.
    pub user: String,
    /// The basic-auth password.
    pub password: String,
    /// The bearer token.
    pub token: String,
}

impl AuthServer {
    /// Starts it over plain HTTP.
    pub async fn start(expected: Expected) -> Self {
        Self::serve(expected, None).await
    }

    /// Starts it over TLS presenting `cert`, requiring a client
    /// certificate issued by `client_ca` (PEM).
    pub async fn start_mtls(expected: Expected, cert: &TestCert, client_ca: &str) -> Self {
        Self::serve(expected, Some(cert.mtls_server_config(client_ca))).await
    }

    /// Starts it over TLS presenting `cert`, offering HTTP/2 (`h2`) and
    /// HTTP/1.1 by ALPN and speaking what the client chose.
    pub async fn start_h2(expected: Expected, cert: &TestCert) -> Self {
        let mut config = (*cert.server_config()).clone();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self::serve(expected, Some(Arc::new(config))).await
    }

    async fn serve(expected: Expected, tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let log = received.clone();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (log, expected, acceptor) = (log.clone(), expected.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        None => {
                            let service = hyper::service::service_fn(move |req| {
                                answer(req, log.clone(), expected.clone(), false)
                            });
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let presented = stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                            let service = hyper::service::service_fn(move |req| {
                                answer(req, log.clone(), expected.clone(), presented)
                            });
                            // HTTP/1.1, or HTTP/2 when the client chose it.
                            let auto =
                                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                            let _ = auto
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Self { addr, received, task }
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

async fn answer(
    req: hyper::Request<hyper::body::Incoming>,
    log: Arc<Mutex<Vec<Received>>>,
    expected: Expected,
    client_cert: bool,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use base64::Engine as _;
    use http_body_util::BodyExt;
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    log.lock().unwrap_or_else(|e| e.into_inner()).push(Received {
        target: target.clone(),
        headers: headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        body: body.clone(),
        client_cert,
    });
    let authorization = headers
        .iter()
        .find(|(n, _)| n == "authorization")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", expected.user, expected.password))
    );
    let bearer = format!("Bearer {}", expected.token);
    let status = |ok: bool| if ok { 200 } else { 401 };
    let mut response = hyper::Response::builder();
    let (code, text) = match target.split('?').next().unwrap_or("") {
        "/basic" => (status(authorization == basic), "basic".to_string()),
        "/bearer" => (status(authorization == bearer), "bearer".to_string()),
        "/mtls" => (status(client_cert), "mtls".to_string()),
        "/echo" => {
            for (n, v) in &headers {
                response = response.header(format!("x-echo-{n}"), v.as_str());
            }
            let lines: Vec<String> = headers.iter().map(|(n, v)| format!("{n}: {v}")).collect();
            (200, format!("{}\n{}", lines.join("\n"), String::from_utf8_lossy(&body)))
        }
        _ => (404, "not found".into()),
    };
    Ok(response
        .status(code)
        .body(Body::new(bytes::Bytes::from(text)))
        .expect("response"))
}

/// A client certificate and its key, issued by a CA of its own.
pub struct ClientCert {
    /// The CA's certificate (PEM): what the server trusts.
    pub ca_pem: String,
    /// The client certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl ClientCert {
    /// A new CA and a client certificate it issued.
    pub fn new() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "sonde test client CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, "sonde probe");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).expect("client certificate");
        Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Default for ClientCert {
    fn default() -> Self {
        Self::new()
    }
}
