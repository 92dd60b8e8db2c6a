//! The `otlp:` block: what the agent sends to an OpenTelemetry collector
//! (docs/opentelemetry.md). Off when absent.

use super::*;

/// Where and how the agent exports over OTLP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpSpec {
    /// `endpoint: http://collector:4317` — the collector. With gRPC, its
    /// address; with HTTP/protobuf, its base URL, to which `/v1/metrics`
    /// is added. `https://` checks the collector's certificate against the
    /// system roots (and `ca_file`).
    pub endpoint: Spanned<String>,
    /// `protocol: grpc` (the default, port 4317 by convention) or
    /// `http/protobuf` (4318), as `OTEL_EXPORTER_OTLP_PROTOCOL` spells them.
    #[serde(default)]
    pub protocol: Option<Spanned<String>>,
    /// `headers: {authorization: "Bearer $(secret:otlp-token)"}` — sent with
    /// every export; a value may be, or hold, a handle of the operator's
    /// `secrets:`, read when the agent starts and never logged.
    #[serde(default)]
    pub headers: BTreeMap<String, Spanned<String>>,
    /// `ca_file: /etc/sonde/collector-ca.pem` — CA certificates trusted for
    /// the collector besides the system roots.
    #[serde(default)]
    pub ca_file: Option<Spanned<PathBuf>>,
    /// `cert_file:` and `key_file:` — a client certificate (PEM) and its
    /// key, for a collector that asks for one (mutual TLS). Both or none.
    #[serde(default)]
    pub cert_file: Option<Spanned<PathBuf>>,
    /// See `cert_file`.
    #[serde(default)]
    pub key_file: Option<Spanned<PathBuf>>,
    /// `interval: 60s` (default) — how often the metrics are sent; at
    /// least 1s.
    #[serde(default)]
    pub interval: Option<Spanned<Dur>>,
    /// `timeout: 10s` (default) — the longest one export may take; more
    /// than zero, and not past `interval`.
    #[serde(default)]
    pub timeout: Option<Spanned<Dur>>,
    /// `resource: {deployment.environment.name: prod}` — resource
    /// attributes added to those the agent sets itself (`service.name`,
    /// `service.version`, `host.name`, and in a cluster `k8s.node.name`,
    /// `k8s.pod.name`, `k8s.namespace.name`); a key given here wins.
    #[serde(default)]
    pub resource: BTreeMap<String, String>,
    /// `traces: {success_ratio: 0.01}` — a span per scheduled probe run
    /// (docs/opentelemetry.md): every failed run, and this share of the
    /// runs that pass. `traces: {enabled: false}` sends none. Default: on,
    /// 0.01.
    #[serde(default)]
    pub traces: Option<Spanned<TracesSpec>>,
}

/// Which runs are traced.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracesSpec {
    /// `enabled: false` — no spans. Default true.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// `success_ratio: 0.01` (default) — the share of passing runs traced,
    /// from 0 (failures only) to 1 (every run).
    #[serde(default)]
    pub success_ratio: Option<f64>,
}
