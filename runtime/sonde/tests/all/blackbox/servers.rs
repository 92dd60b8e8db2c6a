//! The targets of the comparison that the shared test servers do not
//! give: an SMTP-like line server, an HTTP server written by hand (also on
//! the IPv6 loopback), an HTTPS server that speaks HTTP/2, and TLS
//! configurations of unusual chains and names.

use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// A line server as an SMTP server greets: `220` first, `221` and a close
/// after `QUIT`.
pub(super) async fn smtp_like() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let _ = write.write_all(b"220 sonde.test ESMTP ready\r\n").await;
                let mut lines = tokio::io::BufReader::new(read).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim().eq_ignore_ascii_case("QUIT") {
                        let _ = write.write_all(b"221 bye\r\n").await;
                        return;
                    }
                    let _ = write.write_all(b"250 ok\r\n").await;
                }
            });
        }
    });
    (addr, task)
}

/// The answer a [`RawHttp`] server gives for `path`, byte for byte.
fn raw_answer(path: &str) -> String {
    let ok =
        |extra: &str| format!("HTTP/1.1 200 OK\r\nContent-Length: 11\r\n{extra}Connection: close\r\n\r\nhello world");
    let redirect = |code: &str, to: &str| {
        format!("HTTP/1.1 {code}\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    match path {
        "/ok" => ok(""),
        "/204" => "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".into(),
        "/lastmod" => ok("Last-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n"),
        "/chunked" => "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                       5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            .into(),
        "/r3" => redirect("301 Moved Permanently", "/r2"),
        "/r2" => redirect("302 Found", "/r1"),
        "/r1" => redirect("302 Found", "/ok"),
        "/loop" => redirect("302 Found", "/loop"),
        "/http10" => "HTTP/1.0 200 OK\r\nContent-Length: 11\r\n\r\nhello world".into(),
        "/check-yes" => ok("X-Check: yes\r\n"),
        "/check-no" => ok("X-Check: no\r\n"),
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found".into(),
    }
}

/// Reads one request's head from `stream` and writes [`raw_answer`] for
/// its path, then closes.
async fn raw_serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S) {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
        if head.len() > 16 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let _ = stream.write_all(raw_answer(&path).as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// An HTTP server written by hand, for the answers hyper does not give
/// (HTTP/1.0, chunked, chains of redirects…); over TLS with `tls`.
pub(super) async fn raw_http(tls: Option<tokio_rustls::TlsAcceptor>) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    None => raw_serve(stream).await,
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            raw_serve(stream).await;
                        }
                    }
                }
            });
        }
    });
    (addr, task)
}

/// A TLS 1.2-only server configuration whose leaf has a full subject and
/// DNS, IP and e-mail names, and whose chain carries an unrelated expired
/// certificate after the leaf; with the PEM of the CA that signed the leaf.
pub(super) fn tls12_multisan() -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::OrganizationName, "sonde test");
    ca.distinguished_name.push(DnType::CommonName, "sonde multi-SAN CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec![
        "localhost".to_string(),
        "alt.sonde.test".to_string(),
        "127.0.0.1".to_string(),
    ])
    .unwrap();
    leaf.subject_alt_names
        .push(SanType::Rfc822Name("ops@sonde.test".try_into().unwrap()));
    leaf.distinguished_name.push(DnType::CountryName, "ZZ");
    leaf.distinguished_name.push(DnType::OrganizationName, "sonde test");
    leaf.distinguished_name.push(DnType::OrganizationalUnitName, "probes");
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    // emailAddress: an attribute Go has no short name for.
    leaf.distinguished_name.push(
        DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
        "ops@sonde.test",
    );
    leaf.not_after = rcgen::date_time_ymd(2031, 6, 1);
    let leaf_cert = leaf.signed_by(&key, &issuer).unwrap();
    let old_key = KeyPair::generate().unwrap();
    let mut old = CertificateParams::new(vec!["old.sonde.test".to_string()]).unwrap();
    old.distinguished_name.push(DnType::CommonName, "old.sonde.test");
    old.not_before = rcgen::date_time_ymd(2020, 1, 1);
    old.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let old_cert = old.self_signed(&old_key).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone(), old_cert.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    (
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
        ca_cert.pem(),
    )
}

/// A server configuration whose leaf is signed by an intermediate CA that
/// expires before it (both sent), under a root of their own; with the
/// root's PEM.
pub(super) fn via_intermediate() -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca = |name: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p
    };
    let root_key = KeyPair::generate().unwrap();
    let root_params = ca("sonde chain root");
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(root_params, root_key);
    let mid_key = KeyPair::generate().unwrap();
    let mut mid_params = ca("sonde chain intermediate");
    mid_params.not_after = rcgen::date_time_ymd(2030, 6, 1);
    let mid = mid_params.signed_by(&mid_key, &root_issuer).unwrap();
    let mid_issuer = Issuer::new(mid_params, mid_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    leaf.not_after = rcgen::date_time_ymd(2031, 1, 1);
    let leaf = leaf.signed_by(&key, &mid_issuer).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone(), mid.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)), root.pem())
}

/// An HTTPS server (hyper) that offers `h2` and `http/1.1` by ALPN and
/// speaks what the client chose, presenting `cert`: `/ok` answers 200 `ok`,
/// anything else 404.
pub(super) async fn h2_tls(cert: &sonde_tests::TestCert) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use http_body_util::Full;
    let mut config = (*cert.server_config()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                let service = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let (status, body) = match req.uri().path() {
                        "/ok" => (200, "ok"),
                        _ => (404, "not found"),
                    };
                    let response = hyper::Response::builder()
                        .status(status)
                        .body(Full::new(bytes::Bytes::from_static(body.as_bytes())));
                    Ok::<_, std::convert::Infallible>(response.unwrap())
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if h2 {
                    let builder = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let _ = builder.serve_connection(io, service).await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                }
            });
        }
    });
    (addr, task)
}

/// A server configuration whose leaf's subject and whose issuer (a CA of
/// its own) carry attributes Go has no short name for, `emailAddress` and
/// `UID`, among named ones and in that order; with the CA's PEM.
pub(super) fn uid_and_email() -> (tokio_rustls::TlsAcceptor, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    const EMAIL: [u64; 7] = [1, 2, 840, 113_549, 1, 9, 1];
    const UID: [u64; 7] = [0, 9, 2342, 19_200_300, 100, 1, 1];
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CustomDnType(EMAIL.to_vec()), "ca@sonde.test");
    ca.distinguished_name.push(DnType::OrganizationName, "sonde test");
    ca.distinguished_name.push(DnType::CustomDnType(UID.to_vec()), "ca-1");
    ca.distinguished_name.push(DnType::CommonName, "sonde UID CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    leaf.distinguished_name.push(DnType::CountryName, "ZZ");
    leaf.distinguished_name
        .push(DnType::CustomDnType(EMAIL.to_vec()), "ops@sonde.test");
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    leaf.distinguished_name
        .push(DnType::CustomDnType(UID.to_vec()), "probe 42");
    leaf.not_after = rcgen::date_time_ymd(2031, 3, 1);
    let leaf_cert = leaf.signed_by(&key, &issuer).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone()],
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
        )
        .unwrap();
    (
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
        ca_cert.pem(),
    )
}

/// An HTTP/1.1 server (hyper) on the IPv6 loopback, `[::1]`: `/ok`
/// answers 200 `ok`, anything else 404; and a port there nothing listens on.
pub(super) async fn ipv6() -> (SocketAddr, SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("[::1]:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed = std::net::TcpListener::bind("[::1]:0").unwrap().local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(raw_serve(stream));
        }
    });
    (addr, closed, task)
}
