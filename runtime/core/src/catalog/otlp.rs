//! The `otlp:` block, checked: the endpoint and protocol, the headers
//! (with the owner's secrets they name), the TLS files read, the interval
//! and timeout. What `sonde run` would refuse, `sonde validate` refuses
//! here with the key that is wrong.
//!
//! The operator's block (top level) exports everything; a tenant's (in
//! its `tenants:` entry) exports its own probes' data only, to an endpoint
//! its `ceiling.net` covers: the export connects on the tenant's behalf,
//! so [`OtlpSettings::grants`] are the tenant's ceiling and reach, checked
//! here and again on every connection (sonde-otel's transport).

use super::problem::{ConfigProblem, Located, OtlpHeaderError};
use crate::config::{self, Spanned};
use crate::tenants::Tenant;
use sonde_policy::grants::{CallGrants, Grants, Use};
use sonde_policy::secrets::template::Template;
use sonde_policy::secrets::{SecretCell, SecretError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// `otlp.interval` when unset: the OpenTelemetry SDKs' own default.
pub const DEFAULT_OTLP_INTERVAL: Duration = Duration::from_secs(60);
/// `otlp.timeout` when unset.
pub const DEFAULT_OTLP_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest `otlp.interval`.
pub const MIN_OTLP_INTERVAL: Duration = Duration::from_secs(1);
/// `otlp.traces.success_ratio` when unset.
pub const DEFAULT_SUCCESS_RATIO: f64 = 0.01;

/// Which runs become spans.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceSettings {
    /// The share of passing runs traced (every failed one is).
    pub success_ratio: f64,
}

/// How the agent talks to the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (`grpc`).
    Grpc,
    /// OTLP over HTTP, protobuf bodies (`http/protobuf`).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// As `OTEL_EXPORTER_OTLP_PROTOCOL` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

/// A header sent with every export, whose value may hold handles of the
/// operator's secrets.
#[derive(Clone, Debug)]
pub struct OtlpHeader {
    /// Its name, lower case.
    pub name: String,
    value: HeaderValue,
}

#[derive(Clone, Debug)]
enum HeaderValue {
    Text(String),
    Secrets(Template, Vec<Arc<SecretCell>>),
}

impl OtlpHeader {
    /// A header of plain text (no handle in it).
    pub fn text(name: &str, value: &str) -> Self {
        Self {
            name: name.to_ascii_lowercase(),
            value: HeaderValue::Text(value.to_string()),
        }
    }

    /// The value as sent: handles replaced by their secrets' bytes as they
    /// are now.
    pub fn value(&self) -> Result<zeroize::Zeroizing<Vec<u8>>, SecretError> {
        match &self.value {
            HeaderValue::Text(t) => Ok(zeroize::Zeroizing::new(t.clone().into_bytes())),
            HeaderValue::Secrets(template, cells) => {
                let expanded = template.expand(|name| {
                    cells
                        .iter()
                        .find(|c| c.name() == name)
                        .ok_or_else(|| SecretError::Unavailable(format!("no secret {name:?}")))?
                        .current()
                })?;
                Ok(expanded.bytes)
            }
        }
    }
}

/// `otlp:`, checked, defaults filled in.
#[derive(Clone, Debug)]
pub struct OtlpSettings {
    /// The collector's address (gRPC) or base URL (HTTP).
    pub endpoint: String,
    /// gRPC or HTTP/protobuf.
    pub protocol: OtlpProtocol,
    /// Sent with every export.
    pub headers: Vec<OtlpHeader>,
    /// PEM CA certificates trusted besides the system roots.
    pub ca: Option<Vec<u8>>,
    /// A PEM client certificate chain and its key.
    pub identity: Option<Identity>,
    /// How often the metrics go.
    pub interval: Duration,
    /// The longest one export may take.
    pub timeout: Duration,
    /// Resource attributes given in the file.
    pub resource: BTreeMap<String, String>,
    /// A span per run, unless `traces: {enabled: false}`.
    pub traces: Option<TraceSettings>,
    /// The tenant whose export this is (its `tenants:` entry's `otlp:`):
    /// only its probes' series and spans go. `None`: the operator's,
    /// which carries every tenant's.
    pub tenant: Option<Arc<Tenant>>,
}

impl OtlpSettings {
    /// The endpoint's host (as written, IPv6 in brackets) and port (the
    /// scheme's default filled in).
    pub fn authority(&self) -> (String, u16) {
        let uri: http::Uri = self.endpoint.parse().expect("checked by the config");
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        (uri.host().unwrap_or_default().to_string(), port)
    }

    /// What a tenant's export may connect to: its ceiling's `net`
    /// patterns, under its reach (what its names may lead to; never the
    /// agent's own listeners). `None` for the operator's export.
    pub fn grants(&self) -> Option<Arc<Grants>> {
        let tenant = self.tenant.as_ref()?;
        Some(Arc::new(Grants {
            net: tenant.ceiling.as_ref().map(|c| c.net.clone()).unwrap_or_default(),
            reach: tenant.reach(),
            ..Grants::default()
        }))
    }
}

/// Every `otlp:` block of a file, checked.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    /// The top-level block: the operator's export, of everything.
    pub operator: Option<OtlpSettings>,
    /// The tenants' own blocks, in the file's order.
    pub tenants: Vec<OtlpSettings>,
}

impl Exports {
    /// The operator's export first, then the tenants'.
    pub fn all(&self) -> impl Iterator<Item = &OtlpSettings> {
        self.operator.iter().chain(&self.tenants)
    }

    /// `tenant`'s own export, if it has one.
    pub fn of_tenant(&self, tenant: &str) -> Option<&OtlpSettings> {
        self.tenants
            .iter()
            .find(|o| o.tenant.as_ref().is_some_and(|t| &*t.id == tenant))
    }
}

/// The `otlp:` blocks of `file` (the top level's, the operator's, and
/// each tenant's of `tenants`; a tenant left out for a bad id was
/// reported), checked.
pub(crate) fn exports(
    base: &Path,
    file: &config::File,
    tenants: &crate::tenants::Tenants,
    problems: &mut Vec<Located>,
) -> Exports {
    let operator = file
        .otlp
        .as_ref()
        .and_then(|o| otlp(base, o, tenants.operator(), problems));
    let mut out = Exports {
        operator,
        tenants: Vec::new(),
    };
    for t in &file.tenants {
        if let (Some(o), Some(tenant)) = (&t.otlp, tenants.get(t.id.value.trim()))
            && let Some(settings) = otlp(base, o, tenant, problems)
        {
            out.tenants.push(settings);
        }
    }
    out
}

/// `spec`, the export of `owner` (the operator's tenant for the top-level
/// block), checked; `None` (with the problems) when it cannot be used.
fn otlp(
    base: &Path,
    spec: &Spanned<config::OtlpSpec>,
    owner: &Arc<Tenant>,
    problems: &mut Vec<Located>,
) -> Option<OtlpSettings> {
    let before = problems.len();
    let mut at = |s: serde_saphyr::Location, problem| problems.push(Located { at: s, problem });
    let o = &spec.value;
    let protocol = match o.protocol.as_ref().map(|p| (p.value.as_str(), p.referenced)) {
        None | Some(("grpc", _)) => OtlpProtocol::Grpc,
        Some(("http/protobuf", _)) => OtlpProtocol::HttpProtobuf,
        Some((other, loc)) => {
            at(loc, ConfigProblem::OtlpProtocol(other.to_string()));
            OtlpProtocol::Grpc
        }
    };
    let endpoint = o.endpoint.value.trim().to_string();
    if let Err(why) = check_endpoint(&endpoint) {
        at(
            o.endpoint.referenced,
            ConfigProblem::OtlpEndpoint {
                endpoint: endpoint.clone(),
                why,
            },
        );
    }
    let mut headers = Vec::new();
    for (name, value) in &o.headers {
        match header(name, &value.value, owner) {
            Ok(h) => headers.push(h),
            Err(source) => at(
                value.referenced,
                ConfigProblem::OtlpHeader {
                    name: name.clone(),
                    source,
                },
            ),
        }
    }
    let (ca, identity) = tls_files(base, spec, problems);
    let mut at = |s: serde_saphyr::Location, problem| problems.push(Located { at: s, problem });
    let interval = o.interval.as_ref().map_or(DEFAULT_OTLP_INTERVAL, |i| i.value.0);
    if let Some(i) = &o.interval
        && i.value.0 < MIN_OTLP_INTERVAL
    {
        at(i.referenced, ConfigProblem::OtlpInterval(i.value.0));
    }
    let timeout = o
        .timeout
        .as_ref()
        .map_or(DEFAULT_OTLP_TIMEOUT.min(interval), |t| t.value.0);
    if let Some(t) = &o.timeout
        && (t.value.0.is_zero() || t.value.0 > interval)
    {
        at(
            t.referenced,
            ConfigProblem::OtlpTimeout {
                timeout: t.value.0,
                interval,
            },
        );
    }
    let traces = traces(o.traces.as_ref(), &mut at);
    if problems.len() != before {
        return None;
    }
    let settings = OtlpSettings {
        endpoint,
        protocol,
        headers,
        ca,
        identity,
        interval,
        timeout,
        resource: o.resource.clone(),
        traces,
        tenant: owner.ceiling.is_some().then(|| owner.clone()),
    };
    if let Some(grants) = settings.grants() {
        let (host, port) = settings.authority();
        let call = CallGrants::new(None, grants, Arc::default());
        if let Err(denied) = call.authorize(Use::Http { host: &host, port }) {
            problems.push(Located {
                at: o.endpoint.referenced,
                problem: ConfigProblem::OtlpOutsideCeiling {
                    tenant: owner.id.clone(),
                    endpoint: settings.endpoint,
                    source: denied,
                },
            });
            return None;
        }
    }
    Some(settings)
}

/// A PEM client certificate chain and its key.
type Identity = (Vec<u8>, Vec<u8>);

/// `ca_file`, and `cert_file` with `key_file`, read.
fn tls_files(
    base: &Path,
    spec: &Spanned<config::OtlpSpec>,
    problems: &mut Vec<Located>,
) -> (Option<Vec<u8>>, Option<Identity>) {
    let o = &spec.value;
    let mut at = |s: serde_saphyr::Location, problem| problems.push(Located { at: s, problem });
    let mut read = |file: &Option<Spanned<std::path::PathBuf>>, key: &'static str| {
        let file = file.as_ref()?;
        let path = base.join(&file.value);
        match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(source) => {
                at(file.referenced, ConfigProblem::OtlpFile { key, path, source });
                None
            }
        }
    };
    let ca = read(&o.ca_file, "ca_file");
    let identity = match (read(&o.cert_file, "cert_file"), read(&o.key_file, "key_file")) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            let given = o
                .cert_file
                .as_ref()
                .or(o.key_file.as_ref())
                .map_or(spec.referenced, |f| f.referenced);
            at(given, ConfigProblem::OtlpIdentityHalf);
            None
        }
    };
    (ca, identity)
}

/// `traces:`: which runs become spans; `None` when they are off.
fn traces(
    spec: Option<&Spanned<config::TracesSpec>>,
    at: &mut impl FnMut(serde_saphyr::Location, ConfigProblem),
) -> Option<TraceSettings> {
    match spec {
        Some(t) if t.value.enabled == Some(false) => None,
        Some(t) => {
            let ratio = t.value.success_ratio.unwrap_or(DEFAULT_SUCCESS_RATIO);
            if !(0.0..=1.0).contains(&ratio) {
                at(t.referenced, ConfigProblem::OtlpSuccessRatio(ratio));
            }
            Some(TraceSettings { success_ratio: ratio })
        }
        None => Some(TraceSettings {
            success_ratio: DEFAULT_SUCCESS_RATIO,
        }),
    }
}

/// Why `endpoint` is not a collector's URL: `http://` or `https://`, a
/// host, no query or fragment.
fn check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    let uri: http::Uri = endpoint.parse().map_err(|_| "not a URL")?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("the scheme must be http:// or https://"),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("no host");
    }
    if uri.query().is_some() {
        return Err("a query has no place in it");
    }
    Ok(())
}

/// A header as given: a valid name, a value that is valid header text once
/// its handles are replaced, each handle naming a secret of `owner`.
fn header(name: &str, value: &str, owner: &Tenant) -> Result<OtlpHeader, OtlpHeaderError> {
    let lower = name.to_ascii_lowercase();
    http::HeaderName::from_bytes(lower.as_bytes()).map_err(|_| OtlpHeaderError::Name)?;
    let value = match Template::parse(value)? {
        None => {
            http::HeaderValue::from_str(value).map_err(|_| OtlpHeaderError::Value)?;
            HeaderValue::Text(value.to_string())
        }
        Some(template) => {
            let mut cells = Vec::new();
            for secret in template.names() {
                let cell = owner.secrets.iter().find(|c| c.name() == secret).ok_or_else(|| {
                    OtlpHeaderError::UnknownSecret {
                        name: secret.to_string(),
                        owner: match owner.ceiling {
                            None => "the operator's".to_string(),
                            Some(_) => format!("tenant {:?}'s", &*owner.id),
                        },
                    }
                })?;
                cells.push(cell.clone());
            }
            HeaderValue::Secrets(template, cells)
        }
    };
    Ok(OtlpHeader { name: lower, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_urls_of_a_collector() {
        assert_eq!(check_endpoint("http://collector:4317"), Ok(()));
        assert_eq!(check_endpoint("https://otel.example.com/otlp"), Ok(()));
        assert_eq!(check_endpoint("http://[::1]:4318"), Ok(()));
        assert!(check_endpoint("collector:4317").is_err());
        assert!(check_endpoint("ftp://collector").is_err());
        assert!(check_endpoint("http://collector:4318/?x=1").is_err());
        assert!(check_endpoint("not a url").is_err());
    }
}
