//! The `modules:` block: the checks `GET /probe` runs for a scraper.

use super::*;

/// One `modules:` entry: a probe template without a target, which
/// `GET /probe?target=T&module=NAME` runs against the `T` a scraper asks
/// for, when `T` is inside the module's `net` grant.
///
/// ```yaml
/// modules:
///   http_2xx:
///     plugin: http
///     config: {path: /healthz}
///     timeout: 5s                        # caps the scrape's own deadline
///     grants: {net: ["10.0.0.0/8:*"]}    # the targets it may be asked to probe
///     tenant: acme                       # optional: reachable with acme's token only
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Module {
    /// `plugin: http` — as a probe's `plugin`.
    pub plugin: Spanned<String>,
    /// `config: {path: /healthz}` — as a probe's `config`. Default: `{}`.
    #[serde(default)]
    pub config: Option<Spanned<serde_json::Value>>,
    /// `tenant: acme` — the tenant that owns the module: its ceiling and
    /// quotas bound it, and only its token (or the operator's) may use it.
    /// Default: the operator's `default` tenant.
    #[serde(default)]
    pub tenant: Option<Spanned<String>>,
    /// `timeout: 5s` — the longest one `/probe` run may take; a scrape's
    /// `X-Prometheus-Scrape-Timeout-Seconds` (less a margin) shortens it.
    /// Default: the tenant's default timeout (1s for the operator).
    #[serde(default)]
    pub timeout: Option<Spanned<Dur>>,
    /// `grants: {net: [...], ...}` — as a probe's; `net` also bounds the
    /// targets `/probe` may be asked to probe with this module (at least
    /// one entry).
    #[serde(default)]
    pub grants: GrantsSpec,
    /// `limits: {fuel: ..., memory: ...}` — as a probe's.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// `propagate: true` — as a probe's: each `/probe` run's HTTP and gRPC
    /// requests carry its trace context (`traceparent`), and with `otlp:`
    /// the run's span is sent. Default false.
    #[serde(default)]
    pub propagate: bool,
}

/// What a probe's plugin may reach besides its target.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsSpec {
    /// `net: ["db.internal:5432", "10.0.0.0/8:*"]`.
    #[serde(default)]
    pub net: Vec<Spanned<String>>,
    /// `exec: [/usr/lib/nagios/plugins/check_disk]` — absolute paths.
    #[serde(default)]
    pub exec: Vec<Spanned<PathBuf>>,
    /// `files: [/etc/app]` — directories, read-only.
    #[serde(default)]
    pub files: Vec<Spanned<PathBuf>>,
    /// `env: {NAME: value}` — environment of granted programs.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `secrets: [db-password]` — the secrets of the probe's tenant its
    /// plugin may have the host use (by handle, `$(secret:NAME)`), toward
    /// its target and `net` grants only.
    #[serde(default)]
    pub secrets: Vec<Spanned<String>>,
    /// `ip_protocol: ip4` — the IP version the probe's connections try
    /// first (blackbox_exporter's `preferred_ip_protocol`); default: the
    /// resolver's order.
    #[serde(default)]
    pub ip_protocol: Option<Spanned<String>>,
    /// `ip_protocol_fallback: false` — with `ip_protocol`, whether the
    /// other version may answer when the preferred one has no address
    /// (default `true`, as blackbox_exporter).
    #[serde(default)]
    pub ip_protocol_fallback: Option<bool>,
}

/// Per-run limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// `fuel: 1000000000` (default) — about one unit per wasm instruction.
    #[serde(default)]
    pub fuel: Option<Spanned<u64>>,
    /// `memory: 64MiB` (default, at most 1GiB).
    #[serde(default)]
    pub memory: Option<Spanned<Size>>,
}
