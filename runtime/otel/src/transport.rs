//! One export on the wire: OTLP over gRPC (a unary call on HTTP/2, the
//! message in gRPC's length-prefixed frame, the status in the trailers) or
//! over HTTP (a POST of the protobuf body to `/v1/metrics`), with the
//! configured headers, TLS and timeout. The answer is read up to
//! [`MAX_ANSWER_BYTES`]; what the collector says about refused points is
//! logged.
//!
//! **A tenant's export connects under the tenant's grants** ([`Guard`]):
//! before each export the endpoint's host and port go through the one
//! grant check (`CallGrants::authorize`) with the tenant's ceiling, and
//! every address a connection is about to use, whether the endpoint wrote
//! it or a lookup found it, through `CallGrants::authorize_peer`: what its
//! name may lead to, never the agent's own listeners. What is checked is
//! what is reached: the connector dials only the addresses the check
//! returned.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sonde_core::catalog::otlp::{OtlpProtocol, OtlpSettings};
use sonde_policy::grants::{CallGrants, Denied, Grants, Use, host_address};
use sonde_policy::reach::OwnListeners;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The most of a collector's answer read: a partial-success message, an
/// error's text. More is cut.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// gRPC's codes that say "try again later" (RESOURCE_EXHAUSTED,
/// ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS), as OTLP lists them.
const GRPC_RETRYABLE: [u32; 5] = [8, 10, 11, 14, 15];

/// Why an export did not land.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// No connection, or it broke.
    #[error("the collector could not be reached: {0}")]
    Unreachable(#[source] hyper_util::client::legacy::Error),
    /// No answer within the timeout.
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// The answer's body broke off or was too long.
    #[error("the collector's answer could not be read")]
    Answer,
    /// An HTTP status other than 200.
    #[error("the collector answered HTTP {status}")]
    Http {
        /// The status.
        status: u16,
        /// What `Retry-After` asked for, if anything.
        retry_after: Option<Duration>,
    },
    /// A gRPC status other than OK.
    #[error("the collector answered gRPC status {code}")]
    Grpc {
        /// The status code.
        code: u32,
    },
    /// A tenant's export: the endpoint, or every address it resolved to,
    /// is outside the tenant's grants.
    #[error("{0}")]
    Denied(String),
}

impl ExportError {
    /// Whether the same export may succeed later (the collector is down,
    /// slow, overloaded), as opposed to refused for good (400, 401, …).
    pub fn retryable(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Timeout(_) | Self::Answer => true,
            Self::Http { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            Self::Grpc { code } => GRPC_RETRYABLE.contains(code),
            Self::Denied(_) => false,
        }
    }

    /// How long the collector asked to be left alone, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A word for the failure counter's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Timeout(_) => "timeout",
            Self::Answer => "answer",
            Self::Denied(_) => "denied",
            Self::Http { .. } | Self::Grpc { .. } if self.retryable() => "busy",
            Self::Http { .. } | Self::Grpc { .. } => "refused",
        }
    }
}

/// Why the transport could not be set up from the settings.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `ca_file` holds no certificate, or one rustls refuses.
    #[error("otlp.ca_file: no usable CA certificate in it")]
    Ca,
    /// `cert_file`/`key_file` are not a certificate chain and its key.
    #[error("otlp.cert_file, key_file: not a PEM certificate chain and its private key: {0}")]
    Identity(#[source] rustls::Error),
    /// A header's secret could not be read, or its value is not header text.
    #[error("otlp.headers.{0}: its value could not be made (is its secret readable?)")]
    Header(String),
}

/// What an export carries: where it goes on the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `MetricsService/Export`, `/v1/metrics`.
    Metrics,
    /// `TraceService/Export`, `/v1/traces`.
    Traces,
}

impl Signal {
    /// `metrics` or `traces`, the counters' `signal` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Metrics => "metrics",
            Self::Traces => "traces",
        }
    }

    fn grpc_method(self) -> &'static str {
        match self {
            Self::Metrics => "opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            Self::Traces => "opentelemetry.proto.collector.trace.v1.TraceService/Export",
        }
    }
}

/// Where exports go and how.
pub struct Transport {
    protocol: OtlpProtocol,
    uri: Uri,
    headers: HeaderMap,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector<Resolver>>, Full<Bytes>>,
    timeout: Duration,
    guard: Option<Arc<Guard>>,
}

/// A tenant's export's grants, and the endpoint they are checked against
/// (see the module's documentation).
#[derive(Debug)]
pub struct Guard {
    grants: Arc<Grants>,
    listeners: Arc<OwnListeners>,
    host: String,
    port: u16,
}

impl Guard {
    fn call(&self) -> CallGrants {
        CallGrants::new(None, self.grants.clone(), self.listeners.clone())
    }

    fn what(&self) -> Use<'_> {
        Use::Http {
            host: &self.host,
            port: self.port,
        }
    }

    /// The check before each export: the endpoint is granted, and an
    /// address it writes may be reached.
    fn check(&self) -> Result<(), Denied> {
        let call = self.call();
        call.authorize(self.what())?;
        if let Some(ip) = host_address(&self.host) {
            call.authorize_peer(self.what(), None, &[SocketAddr::new(ip, self.port)])?;
        }
        Ok(())
    }

    /// Of the addresses `name` resolved to, those the tenant may reach.
    fn admit(&self, name: &str, found: &[SocketAddr]) -> Result<Vec<SocketAddr>, Denied> {
        self.call().authorize_peer(self.what(), Some(name), found)
    }
}

/// Why the connector's lookup gave no address to dial.
#[derive(Debug, thiserror::Error)]
enum LookupError {
    /// The resolver failed.
    #[error(transparent)]
    Resolve(#[from] std::io::Error),
    /// Every address found is outside the tenant's grants.
    #[error("{0}")]
    Denied(String),
}

/// The connector's name lookup: an address in any spelling is taken as
/// written (so what is checked is what is dialled), a name asks the
/// system's resolver; a tenant's export keeps only what [`Guard::admit`]
/// allows.
#[derive(Clone, Debug)]
struct Resolver {
    port: u16,
    guard: Option<Arc<Guard>>,
}

impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = LookupError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let (port, guard) = (self.port, self.guard.clone());
        Box::pin(async move {
            let name = name.as_str();
            let found: Vec<SocketAddr> = match host_address(name) {
                Some(ip) => vec![SocketAddr::new(ip, port)],
                None => tokio::net::lookup_host((name, port)).await?.collect(),
            };
            let allowed = match &guard {
                None => found,
                Some(g) => g.admit(name, &found).map_err(|d| LookupError::Denied(d.0))?,
            };
            Ok(allowed.into_iter())
        })
    }
}

impl Transport {
    /// The transport for metrics of `settings` (what `sonde validate`
    /// tries, so a file `sonde run` would refuse is refused by both).
    pub fn metrics(settings: &OtlpSettings) -> Result<Self, TransportError> {
        Self::new(settings, Signal::Metrics, &Arc::default())
    }

    /// The transport of `signal` to the collector of `settings`; a
    /// tenant's never reaches `listeners`, the agent's own.
    pub fn new(settings: &OtlpSettings, signal: Signal, listeners: &Arc<OwnListeners>) -> Result<Self, TransportError> {
        let base = settings.endpoint.trim_end_matches('/');
        let path = match settings.protocol {
            OtlpProtocol::Grpc => {
                // gRPC names the method on the server's root.
                let uri: Uri = base.parse().expect("checked by the config");
                let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
                format!(
                    "{}://{authority}/{}",
                    uri.scheme_str().unwrap_or("http"),
                    signal.grpc_method()
                )
            }
            OtlpProtocol::HttpProtobuf => format!("{base}/v1/{}", signal.as_str()),
        };
        let mut headers = HeaderMap::new();
        for h in &settings.headers {
            let value = h.value().map_err(|_| TransportError::Header(h.name.clone()))?;
            let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| TransportError::Header(h.name.clone()))?;
            let mut value = HeaderValue::from_bytes(&value).map_err(|_| TransportError::Header(h.name.clone()))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let tls = tls_config(settings)?;
        let (host, port) = settings.authority();
        let guard = settings.grants().map(|grants| {
            Arc::new(Guard {
                grants,
                listeners: listeners.clone(),
                host,
                port,
            })
        });
        let mut http = HttpConnector::new_with_resolver(Resolver {
            port,
            guard: guard.clone(),
        });
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let mut builder = Client::builder(TokioExecutor::new());
        // gRPC is HTTP/2 only, over plain TCP too (prior knowledge).
        builder.http2_only(settings.protocol == OtlpProtocol::Grpc);
        Ok(Self {
            protocol: settings.protocol,
            uri: path.parse().expect("made from a checked URL"),
            headers,
            client: builder.build(connector),
            timeout: settings.timeout,
            guard,
        })
    }

    /// Sends one encoded request; `Ok` once the collector took it.
    pub async fn send(&self, message: Vec<u8>) -> Result<(), ExportError> {
        tokio::time::timeout(self.timeout, self.exchange(message))
            .await
            .map_err(|_| ExportError::Timeout(self.timeout))?
    }

    async fn exchange(&self, message: Vec<u8>) -> Result<(), ExportError> {
        if let Some(g) = &self.guard {
            g.check().map_err(|d| ExportError::Denied(d.0))?;
        }
        let (content_type, body) = match self.protocol {
            OtlpProtocol::Grpc => {
                let mut framed = BytesMut::with_capacity(message.len() + 5);
                framed.put_u8(0);
                framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
                framed.put_slice(&message);
                ("application/grpc", framed.freeze())
            }
            OtlpProtocol::HttpProtobuf => ("application/x-protobuf", Bytes::from(message)),
        };
        let mut request = Request::post(self.uri.clone())
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::USER_AGENT, concat!("sonde/", env!("CARGO_PKG_VERSION")))
            .body(Full::new(body))
            .expect("a valid request");
        if self.protocol == OtlpProtocol::Grpc {
            request
                .headers_mut()
                .insert(http::header::TE, HeaderValue::from_static("trailers"));
        }
        request.headers_mut().extend(self.headers.clone());
        let response = self.client.request(request).await.map_err(|e| match denial(&e) {
            Some(why) => ExportError::Denied(why),
            None => ExportError::Unreachable(e),
        })?;
        let (parts, body) = response.into_parts();
        let collected = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| ExportError::Answer)?;
        let trailers = collected.trailers().cloned();
        match self.protocol {
            OtlpProtocol::HttpProtobuf if parts.status == StatusCode::OK => Ok(()),
            OtlpProtocol::HttpProtobuf => Err(ExportError::Http {
                status: parts.status.as_u16(),
                retry_after: retry_after(&parts.headers),
            }),
            OtlpProtocol::Grpc if parts.status != StatusCode::OK => Err(ExportError::Http {
                status: parts.status.as_u16(),
                retry_after: retry_after(&parts.headers),
            }),
            OtlpProtocol::Grpc => {
                // In the trailers, or in the headers of a trailers-only answer.
                let code = trailers
                    .as_ref()
                    .and_then(grpc_status)
                    .or_else(|| grpc_status(&parts.headers))
                    .ok_or(ExportError::Answer)?;
                match code {
                    0 => Ok(()),
                    code => Err(ExportError::Grpc { code }),
                }
            }
        }
    }
}

/// The refusal of [`Resolver`] that stopped a connection, if one did.
fn denial(e: &hyper_util::client::legacy::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(LookupError::Denied(why)) = s.downcast_ref::<LookupError>() {
            return Some(why.clone());
        }
        source = s.source();
    }
    None
}

fn grpc_status(headers: &HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}

/// `Retry-After` in seconds (a date is not honoured: a collector sends
/// seconds).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// The system's roots and `ca_file`'s, and the client identity if given.
fn tls_config(settings: &OtlpSettings) -> Result<rustls::ClientConfig, TransportError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(pem) = &settings.ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|_| TransportError::Ca)?;
        if certs.is_empty() {
            return Err(TransportError::Ca);
        }
        for cert in certs {
            roots.add(cert).map_err(|_| TransportError::Ca)?;
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots);
    match &settings.identity {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|_| TransportError::Identity(rustls::Error::NoCertificatesPresented))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|_| TransportError::Identity(rustls::Error::General("no private key".into())))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TransportError::Identity)
        }
    }
}
