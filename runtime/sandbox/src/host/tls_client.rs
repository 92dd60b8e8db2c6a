//! The host's TLS client, shared by every capability that speaks TLS (the
//! `http` transport, the `tls` handshake, gRPC).
//!
//! [`TlsClient`] is built once per engine. The system's trust roots are read
//! from the platform store (`/etc/ssl/certs`) the first time a call needs
//! them, and kept; a host without any falls back to the Mozilla roots
//! compiled into the binary. Client configurations are cached by their
//! options (CA digest, skip-verify, ALPN), so a probe run builds no root
//! store and parses no CA it has seen before.
//!
//! Session resumption is off: every probe makes a full handshake and sees
//! the certificate the server presents now.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The largest CA PEM text a plugin may pass.
pub(crate) const MAX_CA_PEM_BYTES: usize = 256 * 1024;

/// How many client configurations are kept; the cache starts over when full.
const MAX_CONFIGS: usize = 64;

/// How to verify one server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    /// PEM text of the CAs to trust instead of the system's roots.
    pub(crate) ca_pem: Option<String>,
    /// Accept any certificate (handshake signatures are still checked).
    pub(crate) insecure_skip_verify: bool,
    /// SNI and verification name instead of the connection's host.
    pub(crate) server_name: Option<String>,
    /// The client certificate to present (`credentials.client-certificate`).
    pub(crate) client: Option<Arc<ClientCert>>,
}

/// A client certificate chain and its private key, presented in
/// handshakes (mTLS). Built from secrets: never printed, and told apart by
/// the digest of its PEM texts.
pub(crate) struct ClientCert {
    digest: [u8; 32],
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// What is wrong with a client certificate or its key: named, never
/// quoted (they may hold a secret's bytes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientCertError {
    /// The chain is not PEM.
    #[error("the certificate is not valid PEM")]
    NotPem,
    /// The PEM holds no certificate.
    #[error("the certificate has no CERTIFICATE block")]
    NoCertificate,
    /// The key is not a PEM private key.
    #[error("the key is not a PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NotAKey,
}

impl ClientCert {
    /// Parses a PEM chain and a PEM private key.
    pub(crate) fn parse(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, ClientCertError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ClientCertError::NotPem)?;
        if chain.is_empty() {
            return Err(ClientCertError::NoCertificate);
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| ClientCertError::NotAKey)?;
        let mut digest = Sha256::new();
        digest.update(cert_pem);
        digest.update([0]);
        digest.update(key_pem);
        Ok(Self {
            digest: digest.finalize().into(),
            chain,
            key,
        })
    }

    /// What tells this certificate and key from others.
    pub(crate) fn digest(&self) -> [u8; 32] {
        self.digest
    }
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientCert(<secret>)")
    }
}

impl PartialEq for ClientCert {
    fn eq(&self, o: &Self) -> bool {
        self.digest == o.digest
    }
}

impl Eq for ClientCert {}

impl TlsOptions {
    /// The SHA-256 of the CA PEM text, which identifies the trust it sets up.
    pub(crate) fn ca_digest(&self) -> Option<[u8; 32]> {
        self.ca_pem.as_ref().map(|pem| Sha256::digest(pem.as_bytes()).into())
    }
}

/// What a handshake established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TlsInfo {
    /// `TLSv1.2` or `TLSv1.3`.
    pub(crate) version: String,
    /// The protocol the server chose by ALPN.
    pub(crate) alpn: Option<String>,
    /// The server certificate's notBefore, Unix seconds.
    pub(crate) not_before: i64,
    /// The server certificate's notAfter, Unix seconds.
    pub(crate) not_after: i64,
    /// The server certificate's subject.
    pub(crate) subject: String,
    /// The server certificate's issuer.
    pub(crate) issuer: String,
    /// What a run's observations keep of the session ([`seen`]), for a
    /// connection kept alive: set by the capability that keeps it.
    pub(crate) seen: Option<Arc<crate::verdict::observed::TlsSeen>>,
}

/// Why a TLS session could not be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// The name to verify is not a DNS name or an IP address.
    #[error("server name {name:?} is not a DNS name or an IP address")]
    ServerName {
        /// The name as given.
        name: String,
    },
    /// The CA the plugin passed is unusable.
    #[error("CA certificates: {0}")]
    Ca(String),
    /// The handshake failed.
    #[error("{0}")]
    Handshake(String),
    /// The server's certificate could not be read.
    #[error("server certificate: {0}")]
    Certificate(String),
    /// The client certificate and key do not go together.
    #[error("client certificate: {0}")]
    ClientCert(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ConfigKey {
    ca: Option<[u8; 32]>,
    insecure: bool,
    alpn: Vec<Vec<u8>>,
    client: Option<[u8; 32]>,
}

/// The TLS client of one engine: the crypto provider, the system roots (read
/// once) and the client configurations built so far.
pub(crate) struct TlsClient {
    provider: Arc<CryptoProvider>,
    system_roots: OnceLock<Arc<RootCertStore>>,
    configs: Mutex<HashMap<ConfigKey, Arc<ClientConfig>>>,
}

impl Default for TlsClient {
    fn default() -> Self {
        Self::new()
    }
}

impl TlsClient {
    /// A client that has not read any roots yet (the once-per-engine phase).
    pub(crate) fn new() -> Self {
        Self {
            provider: Arc::new(go_ordered(rustls::crypto::ring::default_provider())),
            system_roots: OnceLock::new(),
            configs: Mutex::new(HashMap::new()),
        }
    }

    /// The system's trust roots, read on first use.
    fn system_roots(&self) -> Arc<RootCertStore> {
        self.system_roots
            .get_or_init(|| {
                let found = rustls_native_certs::load_native_certs();
                let mut roots = RootCertStore::empty();
                let (added, ignored) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    tracing::warn!(
                        errors = found.errors.len(),
                        "no system trust roots found; using the Mozilla roots built into sonde"
                    );
                    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                } else {
                    tracing::debug!(added, ignored, "loaded the system trust roots");
                }
                Arc::new(roots)
            })
            .clone()
    }

    /// The client configuration for `options` and `alpn`, built once.
    fn config(&self, options: &TlsOptions, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
        let key = ConfigKey {
            ca: options.ca_digest(),
            insecure: options.insecure_skip_verify,
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            client: options.client.as_ref().map(|c| c.digest()),
        };
        if let Some(config) = self.configs.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(config.clone());
        }
        let builder = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Handshake(e.to_string()))?;
        let builder = if options.insecure_skip_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(
                    self.provider.signature_verification_algorithms,
                )))
        } else {
            let roots = match &options.ca_pem {
                Some(pem) => Arc::new(parse_ca(pem)?),
                None => self.system_roots(),
            };
            builder.with_root_certificates(roots)
        };
        let mut config = match &options.client {
            None => builder.with_no_client_auth(),
            Some(client) => builder
                .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
                .map_err(|e| TlsError::ClientCert(e.to_string()))?,
        };
        config.alpn_protocols = key.alpn.clone();
        config.resumption = rustls::client::Resumption::disabled();
        let config = Arc::new(config);
        let mut configs = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if configs.len() >= MAX_CONFIGS {
            configs.clear();
        }
        configs.insert(key, config.clone());
        Ok(config)
    }

    /// Checks `options` for a connection to `host` offering `alpn` (and
    /// builds their client configuration, which [`TlsClient::connect`] then
    /// finds cached): call it before connecting, so options that cannot
    /// work open no connection.
    pub(crate) fn validate(&self, host: &str, options: &TlsOptions, alpn: &[&[u8]]) -> Result<(), TlsError> {
        server_name(host, options)?;
        self.config(options, alpn).map(drop)
    }

    /// Runs a TLS handshake over `stream` as a client of `host` (or of
    /// `options.server_name`), offering the `alpn` protocols, and returns
    /// the session and what it established.
    ///
    /// The caller owns the connection (it has checked the grants and
    /// connected) and bounds the time this takes.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
        host: &str,
        options: &TlsOptions,
        alpn: &[&[u8]],
    ) -> Result<(TlsStream<TcpStream>, TlsInfo), TlsError> {
        let server_name = server_name(host, options)?;
        let config = self.config(options, alpn)?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name.clone(), stream)
            .await
            .map_err(|e| TlsError::Handshake(describe_handshake_error(&e, &server_name.to_str())))?;
        let info = session_info(stream.get_ref().1)?;
        Ok((stream, info))
    }
}

/// The name to send and verify: `options.server_name`, else `host`.
fn server_name(host: &str, options: &TlsOptions) -> Result<ServerName<'static>, TlsError> {
    let name = options
        .server_name
        .as_deref()
        .unwrap_or(host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    // The error quotes at most 256 characters of a name that may be huge.
    ServerName::try_from(name.to_string()).map_err(|_| TlsError::ServerName {
        name: name.chars().take(256).collect(),
    })
}

/// Parses the CA certificates a plugin passed into a root store.
fn parse_ca(pem: &str) -> Result<RootCertStore, TlsError> {
    if pem.len() > MAX_CA_PEM_BYTES {
        return Err(TlsError::Ca(format!(
            "{} bytes of PEM, more than the {MAX_CA_PEM_BYTES} allowed",
            pem.len()
        )));
    }
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Ca(format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::Ca("no CERTIFICATE block in the PEM text".into()));
    }
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots
            .add(cert)
            .map_err(|e| TlsError::Ca(format!("certificate {}: {e}", i + 1)))?;
    }
    Ok(roots)
}

/// A person-readable reason for a failed handshake.
fn describe_handshake_error(e: &std::io::Error, name: &str) -> String {
    use rustls::{CertificateError, Error};
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) else {
        return format!("handshake: {e}");
    };
    match tls {
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "certificate not trusted: its issuer is not a trusted CA (pass the CA, or skip verification)".into()
        }
        Error::InvalidCertificate(CertificateError::BadSignature) => {
            "certificate not trusted: its signature does not verify against the trusted CA of its issuer's name".into()
        }
        Error::InvalidCertificate(CertificateError::NotValidForName)
        | Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            format!("certificate not valid for {name:?}: {tls}")
        }
        // `openssl req -x509` makes such certificates; webpki never accepts
        // one as a server's own, even when it is the CA passed.
        Error::InvalidCertificate(CertificateError::Other(other))
            if format!("{other:?}").contains("CaUsedAsEndEntity") =>
        {
            "certificate rejected: the server presents a CA certificate (basicConstraints CA:TRUE) as its own; \
             use a server certificate signed by the CA, or skip verification"
                .into()
        }
        Error::InvalidCertificate(_) => format!("certificate rejected: {tls}"),
        other => format!("handshake: {other}"),
    }
}

/// The version, ALPN and server certificate of an established session.
fn session_info(conn: &rustls::ClientConnection) -> Result<TlsInfo, TlsError> {
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    };
    let alpn = conn.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned());
    let der = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| TlsError::Certificate("the server sent none".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| TlsError::Certificate(format!("does not parse: {e}")))?;
    let validity = cert.validity();
    Ok(TlsInfo {
        version,
        alpn,
        not_before: validity.not_before.timestamp(),
        not_after: validity.not_after.timestamp(),
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        seen: None,
    })
}

/// Go's crypto/tls order of preference among the suites it shares with
/// rustls (on a CPU with AES instructions), by IANA number: AES-128-GCM
/// before AES-256-GCM before ChaCha20-Poly1305, TLS 1.3 first.
const GO_SUITE_ORDER: [u16; 9] = [
    0x1301, 0x1302, 0x1303, // TLS 1.3
    0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, // TLS 1.2, ECDHE
];

/// `provider` offering its cipher suites in Go's order of preference
/// ([`GO_SUITE_ORDER`], the others after them), so that a server that
/// follows the client's preference picks for sonde the suite it picks for
/// blackbox_exporter (rustls prefers AES-256 to AES-128).
fn go_ordered(mut provider: CryptoProvider) -> CryptoProvider {
    provider.cipher_suites.sort_by_key(|s| {
        let n = u16::from(s.suite());
        GO_SUITE_ORDER
            .iter()
            .position(|&g| g == n)
            .unwrap_or(GO_SUITE_ORDER.len())
    });
    provider
}

/// What a run's observations keep of an established session: its version
/// and the certificates the server sent, as sent (bounded), whether or not
/// they were verified.
pub(crate) fn seen(conn: &rustls::ClientConnection, options: &TlsOptions) -> crate::verdict::observed::TlsSeen {
    use crate::verdict::observed::{MAX_CHAIN_BYTES, MAX_CHAIN_CERTS, TlsSeen};
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLS 1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLS 1.2",
        Some(rustls::ProtocolVersion::TLSv1_1) => "TLS 1.1",
        Some(rustls::ProtocolVersion::TLSv1_0) => "TLS 1.0",
        _ => "unknown",
    };
    let mut bytes = 0;
    let chain = conn
        .peer_certificates()
        .unwrap_or_default()
        .iter()
        .take(MAX_CHAIN_CERTS)
        .take_while(|c| {
            bytes += c.len();
            bytes <= MAX_CHAIN_BYTES
        })
        .map(|c| c.to_vec())
        .collect();
    TlsSeen {
        version,
        chain,
        verified: !options.insecure_skip_verify,
        cipher: conn.negotiated_cipher_suite().map_or(0, |s| u16::from(s.suite())),
    }
}

/// `insecure_skip_verify`: any certificate is accepted, but the server must
/// still prove it holds the certificate's key.
#[derive(Debug)]
struct AcceptAnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ca_pem_says_why() {
        let e = parse_ca("hello").unwrap_err();
        assert!(e.to_string().contains("no CERTIFICATE block"), "{e}");
        let e = parse_ca("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap_err();
        assert!(e.to_string().contains("certificate 1"), "{e}");
        let e = parse_ca(&"x".repeat(MAX_CA_PEM_BYTES + 1)).unwrap_err();
        assert!(e.to_string().contains("more than"), "{e}");
    }

    #[test]
    fn configs_are_built_once_per_options() {
        let client = TlsClient::new();
        let insecure = TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        let a = client.config(&insecure, &[b"h2"]).unwrap();
        let b = client.config(&insecure, &[b"h2"]).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let c = client.config(&insecure, &[]).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(a.alpn_protocols, vec![b"h2".to_vec()]);
    }

    #[test]
    fn suites_are_offered_in_gos_order() {
        let ordered = go_ordered(rustls::crypto::ring::default_provider());
        let suites: Vec<u16> = ordered.cipher_suites.iter().map(|s| u16::from(s.suite())).collect();
        assert_eq!(suites, GO_SUITE_ORDER, "every suite of ring's, in Go's order");
    }
}
