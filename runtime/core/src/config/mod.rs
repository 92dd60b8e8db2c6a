//! The agent's config file: YAML, parsed into typed structs that refuse
//! unknown keys, with every error naming the file, line, column and key.
//!
//! This module only reads and checks the *shape* of the file. Whether a
//! plugin exists, whether its config fits its schema and whether grants
//! parse is the [`registry`](crate::registry)'s job; it reports against the
//! locations kept here ([`Spanned`]).
//!
//! ```yaml
//! api: 127.0.0.1:9464          # where `sonde run` serves /v1 (optional)
//! state_dir: /var/lib/sonde    # keep probe state across restarts (optional)
//! targets:
//!   - name: web
//!     address: 127.0.0.1:8080
//!     on_failure: { command: [/usr/bin/systemctl, restart, web], timeout: 30s }
//!     probes:
//!       - kind: readiness
//!         plugin: http
//!         config: { path: /healthz }
//! ```

use serde::Deserialize;
use serde::de::{self, Deserializer};
pub use serde_saphyr::Spanned;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where something is in a config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, 0 when unknown.
    pub line: u64,
    /// 1-based column, 0 when unknown.
    pub column: u64,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
        }
    }
}

/// One problem in a config file, with its place.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct ConfigError {
    /// Where.
    pub place: Place,
    /// What is wrong, naming the key.
    pub message: String,
}

/// Every problem found in a config file (at least one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

/// A duration written with its unit: `500ms`, `10s`, `1m30s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration with its unit, such as 500ms, 10s or 1m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                humantime::parse_duration(s.trim())
                    .map(Dur)
                    .map_err(|e| E::custom(format!("{s:?} is not a duration such as 500ms, 10s or 1m: {e}")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Dur, E> {
                Err(E::custom(format!("{n} has no unit: write it as {n}s or {n}ms")))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Dur, E> {
                self.visit_u64(n.unsigned_abs())
            }
        }
        d.deserialize_any(V)
    }
}

/// A size written with its unit: `64MiB`, `512KiB`, `4096B`. A bare
/// number (`1048576`, `"1048576"`) is refused, as a duration without its
/// unit is: bytes or mebibytes is the reader's guess otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Size(pub u64);

impl Size {
    /// The refusal of a bare number `n`, suggesting the spellings that
    /// say what it means.
    fn no_unit(n: u64) -> String {
        let mut hint = format!("{n}B");
        if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
            hint = format!("{}MiB (or {hint})", n >> 20);
        } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
            hint = format!("{}KiB (or {hint})", n >> 10);
        }
        format!("{n} has no unit: write the size with one, such as {hint}")
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size with its unit, such as 64MiB")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                let t = s.trim();
                if let Ok(n) = t.parse::<u64>() {
                    return Err(E::custom(Size::no_unit(n)));
                }
                t.parse::<bytesize::ByteSize>()
                    .map(|b| Size(b.as_u64()))
                    .map_err(|e| E::custom(format!("{s:?} is not a size such as 64MiB: {e}")))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                Err(E::custom(Size::no_unit(n)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::custom(format!(
                        "{n} is not a size: write one with its unit, such as 64MiB"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `api:` — the address alone (`api: 127.0.0.1:9464`) or a block with the
/// limits that keep the API answering while clients misbehave:
///
/// ```yaml
/// api:
///   listen: 127.0.0.1:9464      # where to serve (--api overrides it)
///   header_read_timeout: 10s    # a request's head must arrive within it
///   body_read_timeout: 30s      # an upload's body must arrive within it
///   max_connections: 1024       # open connections, agent-wide
///   max_header_bytes: 16KiB     # a request's head (at least 8KiB)
///   max_watch_streams: 64       # open GET /v1/watch streams per token
///   max_probe_runs: 8           # GET /probe runs at once, agent-wide
///   max_probe_queue: 64         # GET /probe requests waiting for a run; more: 429
///   auth: kubernetes            # auto (default), token, none or kubernetes (--api-auth overrides it)
/// ```
///
/// Each key is optional; the defaults are [`ApiLimits::default`]'s.
#[derive(Debug, Default, PartialEq)]
pub struct ApiSpec {
    /// `listen: 127.0.0.1:9464` — the address, as written.
    pub listen: Option<String>,
    /// `header_read_timeout: 10s`.
    pub header_read_timeout: Option<Dur>,
    /// `body_read_timeout: 30s`.
    pub body_read_timeout: Option<Dur>,
    /// `max_connections: 1024`.
    pub max_connections: Option<u32>,
    /// `max_header_bytes: 16KiB`.
    pub max_header_bytes: Option<Size>,
    /// `max_watch_streams: 64`.
    pub max_watch_streams: Option<u32>,
    /// `max_probe_runs: 8`.
    pub max_probe_runs: Option<u32>,
    /// `max_probe_queue: 64`.
    pub max_probe_queue: Option<u32>,
    /// `auth: kubernetes` — who may call ([`crate::auth::ApiAuth`]).
    pub auth: Option<crate::auth::ApiAuth>,
}

/// The block form of [`ApiSpec`], as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiBlock {
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    header_read_timeout: Option<Dur>,
    #[serde(default)]
    body_read_timeout: Option<Dur>,
    #[serde(default)]
    max_connections: Option<u32>,
    #[serde(default)]
    max_header_bytes: Option<Size>,
    #[serde(default)]
    max_watch_streams: Option<u32>,
    #[serde(default)]
    max_probe_runs: Option<u32>,
    #[serde(default)]
    max_probe_queue: Option<u32>,
    #[serde(default)]
    auth: Option<crate::auth::ApiAuth>,
}

impl<'de> Deserialize<'de> for ApiSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = ApiSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address such as 127.0.0.1:9464, or a mapping with listen: and the API's limits")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ApiSpec, E> {
                Ok(ApiSpec {
                    listen: Some(s.to_string()),
                    ..ApiSpec::default()
                })
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ApiSpec, A::Error> {
                let b = ApiBlock::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ApiSpec {
                    listen: b.listen,
                    header_read_timeout: b.header_read_timeout,
                    body_read_timeout: b.body_read_timeout,
                    max_connections: b.max_connections,
                    max_header_bytes: b.max_header_bytes,
                    max_watch_streams: b.max_watch_streams,
                    max_probe_runs: b.max_probe_runs,
                    max_probe_queue: b.max_probe_queue,
                    auth: b.auth,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The API's limits in force ([`ApiSpec`] with the defaults filled in).
/// What each bounds is in `docs/security.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiLimits {
    /// A request's head (request line and headers) must arrive within this
    /// after the connection opens or the previous response ends; else the
    /// connection is closed. Bounds slow ("slowloris") and idle clients.
    /// Default 10s.
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this once its head has; else
    /// 408. Bounds slow uploads. Default 30s.
    pub body_read_timeout: Duration,
    /// Open connections, agent-wide. At the limit a new connection closes
    /// the oldest one that is between requests; when none is, the new one
    /// is closed. Default 1024.
    pub max_connections: usize,
    /// The largest request head; a larger one is answered 431. At least
    /// 8 KiB. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Open `GET /v1/watch` streams per caller (token); one more is
    /// answered 429. Default 64.
    pub max_watch_streams: usize,
    /// `GET /probe` runs at once, agent-wide: the share of the executor a
    /// scraper can take, so a flood of `/probe` requests cannot starve the
    /// scheduled probes. Default 8.
    pub max_probe_runs: usize,
    /// `GET /probe` requests waiting for one of those runs; one more is
    /// answered 429 at once. Default 64.
    pub max_probe_queue: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_header_bytes: 16 * 1024,
            max_watch_streams: 64,
            max_probe_runs: 8,
            max_probe_queue: 64,
        }
    }
}

/// An `api:` limit out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiLimitError {
    /// A count that must be positive is 0.
    #[error("api: {key}: must be at least 1")]
    Zero {
        /// The key.
        key: &'static str,
    },
    /// A read timeout under 100 ms.
    #[error("api: {key}: must be at least 100ms")]
    TimeoutTooShort {
        /// The key.
        key: &'static str,
    },
    /// `max_header_bytes` under [`ApiLimits::MIN_HEADER_BYTES`].
    #[error("api: max_header_bytes: must be at least 8KiB (got {got} bytes)")]
    HeaderBytesTooFew {
        /// The bytes it gives.
        got: u64,
    },
}

impl ApiLimits {
    /// The smallest `max_header_bytes`: below it, ordinary requests (long
    /// cookies, tokens) would be refused.
    pub const MIN_HEADER_BYTES: usize = 8 * 1024;

    /// The limits `spec` sets, the defaults elsewhere; what is out of range
    /// is named in the error.
    pub fn from_spec(spec: &ApiSpec) -> Result<Self, ApiLimitError> {
        let d = Self::default();
        let positive = |key: &'static str, v: Option<u32>, default: usize| match v {
            Some(0) => Err(ApiLimitError::Zero { key }),
            Some(n) => Ok(n as usize),
            None => Ok(default),
        };
        let timeout = |key: &'static str, v: Option<Dur>, default: Duration| match v {
            Some(Dur(t)) if t < Duration::from_millis(100) => Err(ApiLimitError::TimeoutTooShort { key }),
            Some(Dur(t)) => Ok(t),
            None => Ok(default),
        };
        let max_header_bytes = match spec.max_header_bytes {
            Some(Size(n)) if n < Self::MIN_HEADER_BYTES as u64 => {
                return Err(ApiLimitError::HeaderBytesTooFew { got: n });
            }
            Some(Size(n)) => usize::try_from(n).unwrap_or(usize::MAX).min(1 << 30),
            None => d.max_header_bytes,
        };
        Ok(Self {
            header_read_timeout: timeout("header_read_timeout", spec.header_read_timeout, d.header_read_timeout)?,
            body_read_timeout: timeout("body_read_timeout", spec.body_read_timeout, d.body_read_timeout)?,
            max_connections: positive("max_connections", spec.max_connections, d.max_connections)?,
            max_header_bytes,
            max_watch_streams: positive("max_watch_streams", spec.max_watch_streams, d.max_watch_streams)?,
            max_probe_runs: positive("max_probe_runs", spec.max_probe_runs, d.max_probe_runs)?,
            max_probe_queue: match spec.max_probe_queue {
                Some(n) => n as usize,
                None => d.max_probe_queue,
            },
        })
    }
}

/// `sandbox:` — the agent-wide bounds on what plugins can make the host
/// hold (`docs/security.md`, "Bounds"). Each key is optional:
///
/// ```yaml
/// sandbox:
///   table_entries_per_call: 256     # resource-table entries per call (64..65536)
///   fields_bytes: 16KiB             # one wasi:http fields (1KiB..1MiB); entries × this
///                                   # is the host memory a call may pin (≤ 256MiB)
///   argument_bytes: 4MiB            # what one host call copies out of the guest (64KiB..64MiB)
///   sockets_per_call: 64            # sockets the host opens for one call
///   lookups_per_call: 4             # wasi:sockets name lookups in flight per call
///   lookups_in_flight: 32           # name lookups for plugins, agent-wide
///   blocking_threads: 64            # blocking threads plugin work may hold (≤ 384)
///   exec_pids: 64                   # pids.max of an exec'd program's cgroup
///   keepalive_idle_per_host: 32     # idle pooled connections per tenant + address
///   keepalive_idle_per_tenant: 64   # per tenant
///   keepalive_idle: 1024            # agent-wide
/// ```
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// `table_entries_per_call: 256`.
    #[serde(default)]
    pub table_entries_per_call: Option<u32>,
    /// `fields_bytes: 16KiB`.
    #[serde(default)]
    pub fields_bytes: Option<Size>,
    /// `argument_bytes: 4MiB`.
    #[serde(default)]
    pub argument_bytes: Option<Size>,
    /// `sockets_per_call: 64`.
    #[serde(default)]
    pub sockets_per_call: Option<u32>,
    /// `lookups_per_call: 4`.
    #[serde(default)]
    pub lookups_per_call: Option<u32>,
    /// `lookups_in_flight: 32`.
    #[serde(default)]
    pub lookups_in_flight: Option<u32>,
    /// `blocking_threads: 64`.
    #[serde(default)]
    pub blocking_threads: Option<u32>,
    /// `exec_pids: 64`.
    #[serde(default)]
    pub exec_pids: Option<u32>,
    /// `keepalive_idle_per_host: 32`.
    #[serde(default)]
    pub keepalive_idle_per_host: Option<u32>,
    /// `keepalive_idle_per_tenant: 64`.
    #[serde(default)]
    pub keepalive_idle_per_tenant: Option<u32>,
    /// `keepalive_idle: 1024`.
    #[serde(default)]
    pub keepalive_idle: Option<u32>,
}

/// The kind of a probe, with kubelet's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Gates the target's other probes until it succeeds once; then stops.
    /// Starts `unknown`.
    Startup,
    /// Whether the target should receive traffic. Starts `failure`.
    Readiness,
    /// Whether the target should be restarted. Starts `success`.
    Liveness,
}

impl Kind {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Startup => "startup",
            Self::Readiness => "readiness",
            Self::Liveness => "liveness",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// `api: 127.0.0.1:9464` — where `sonde run` serves its API; the
    /// `--api` flag overrides it. Default: no API. The long form sets the
    /// API's limits too ([`ApiSpec`]):
    /// `api: {listen: 127.0.0.1:9464, max_connections: 1024, ...}`.
    #[serde(default)]
    pub api: Option<Spanned<ApiSpec>>,
    /// `state_dir: /var/lib/sonde` — where probe state is kept across
    /// restarts; `--state-dir` overrides it. Default: none (state is lost
    /// on restart).
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// `trust: [/etc/sonde/keys/acme.pub]` — public keys (files written by
    /// `sonde plugin keygen`) whose signatures plugin files may carry.
    #[serde(default)]
    pub trust: Vec<Spanned<PathBuf>>,
    /// `require_signed: true` — refuse every `.wasm` plugin file that is not
    /// signed by a `trust` key (`FILE.wasm.sig`); built-ins are trusted by
    /// being embedded. Default: false.
    #[serde(default)]
    pub require_signed: Option<Spanned<bool>>,
    /// `health_timeout: 10s` — `/livez` and `/healthz` answer 503 once a
    /// due probe run has waited this long to start (the scheduler is
    /// stalled). Default 10s.
    #[serde(default)]
    pub health_timeout: Option<Spanned<Dur>>,
    /// `operator_token_file: /etc/sonde/tokens/operator` — the API token
    /// that sees and acts on every tenant's probes. Default: none.
    #[serde(default)]
    pub operator_token_file: Option<Spanned<PathBuf>>,
    /// `operator_token_env: SONDE_OPERATOR_TOKEN` — the same, from an
    /// environment variable. Default: none.
    #[serde(default)]
    pub operator_token_env: Option<Spanned<String>>,
    /// `oci: {registries: {...}, cache_max: 1GiB, timeout: 60s}` — how
    /// plugins named `oci://…` are pulled. Default: anonymous HTTPS with
    /// the system roots, cached in `state_dir/oci` (else the user cache).
    #[serde(default)]
    pub oci: Option<OciSpec>,
    /// `sandbox: {sockets_per_call: 64, ...}` — what a plugin's call may
    /// make the host hold ([`SandboxSpec`]); put in force at start and at
    /// every reload. Default:
    /// every bound at its default.
    #[serde(default)]
    pub sandbox: Option<Spanned<SandboxSpec>>,
    /// `tenants: [...]` — who else owns probes on this agent. Targets
    /// without `tenant:` belong to the operator's `default` tenant.
    #[serde(default)]
    pub tenants: Vec<TenantSpec>,
    /// `targets: [...]` — the services this agent probes.
    #[serde(default)]
    pub targets: Vec<Target>,
    /// `modules: {http_2xx: {plugin: http, grants: {net: [...]}}}` — the
    /// checks `GET /probe?target=T&module=M` runs for a scraper such as
    /// Prometheus (docs/prometheus.md). Default: none (`/probe` answers
    /// 400 for every module).
    #[serde(default)]
    pub modules: BTreeMap<String, Module>,
    /// `kubernetes:` — run readiness-gate checks of this node's Pods
    /// (docs/kubernetes.md). Absent: off, unless `sonde run --kubernetes`.
    #[serde(default)]
    pub kubernetes: Option<KubernetesSpec>,
}

/// The `kubernetes:` block: how the agent serves Pod readiness gates.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSpec {
    /// `node_name: worker-1` — the node whose Pods are checked; default
    /// `$NODE_NAME` (the downward API's `spec.nodeName`).
    #[serde(default)]
    pub node_name: Option<String>,
    /// `plugins: [http, tcp, "oci://ghcr.io/acme/*"]` — the plugins a
    /// SondeCheck may name: built-in names, absolute paths of plugin files
    /// or of directories (ending in `/`) on the agent's disk, registry
    /// scopes (`oci://HOST/REPOSITORY`, `oci://HOST/PREFIX/*`,
    /// `oci://HOST/*`, as a tenant ceiling's `registries`) and manifest
    /// digests `sha256:…`. Default `[http, tcp, grpc]`.
    #[serde(default)]
    pub plugins: Option<Vec<String>>,
    /// `namespaces: {default: shop}` — namespace to tenant; a namespace not
    /// listed uses the tenant of its own name.
    #[serde(default)]
    pub namespaces: BTreeMap<String, String>,
    /// `qps: 5` — writes to the API server per second, agent-wide. Default 5.
    #[serde(default)]
    pub qps: Option<f64>,
    /// `burst: 10` — writes allowed at once above `qps`. Default 10.
    #[serde(default)]
    pub burst: Option<u32>,
    /// `message_refresh: 1m` (default) — while a gate's status holds, how
    /// often its message is brought up to date with its probe's latest
    /// run: at most one such write per Pod per period, and none while the
    /// message is the same. At least `1s`.
    #[serde(default)]
    pub message_refresh: Option<Dur>,
    /// `namespace_templates: {team: {quotas: {...}, ceiling: {...}}}` —
    /// tenants for namespaces the cluster admin opts in with the label
    /// `sonde.dev/tenant-template: <name>`: each such namespace gets a
    /// tenant of its own name with the template's quotas and ceiling,
    /// unless `tenants:` defines that id or `namespaces` maps the
    /// namespace. A name is a label value (1-63 characters). Default: none
    /// (no Namespace is watched).
    #[serde(default)]
    pub namespace_templates: BTreeMap<String, Spanned<TenantTemplateSpec>>,
    /// `max_templated_namespaces: 1000` (default) — the most tenants the
    /// templates make; namespaces past it (in name order) get none.
    #[serde(default)]
    pub max_templated_namespaces: Option<Spanned<u32>>,
}

/// A `kubernetes.namespace_templates` entry: what a `tenants:` entry sets
/// of quotas and ceiling, without an id (the namespace's name is the
/// tenant's) or a token (its probes come only from SondeChecks).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTemplateSpec {
    /// As a tenant's `quotas`.
    #[serde(default)]
    pub quotas: QuotasSpec,
    /// As a tenant's `ceiling`.
    #[serde(default)]
    pub ceiling: CeilingSpec,
}

/// A tenant: an owner of probes with its own API token, quotas and
/// capability ceiling.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSpec {
    /// `id: acme` — unique; `default` is the operator's.
    pub id: Spanned<String>,
    /// `token_file: /etc/sonde/tokens/acme` — its API token (trimmed); the
    /// file must not be readable by every user. Default: no token.
    #[serde(default)]
    pub token_file: Option<Spanned<PathBuf>>,
    /// `token_env: ACME_TOKEN` — its API token from an environment variable.
    #[serde(default)]
    pub token_env: Option<Spanned<String>>,
    /// `quotas: {max_probes: 100, max_concurrent_runs: 4, timeout: 10s,
    /// fuel: 1000000000, memory: 64MiB}` (those are the defaults).
    #[serde(default)]
    pub quotas: QuotasSpec,
    /// `ceiling: {net: ["10.0.0.0/8:*"], exec: [...], files: [...]}` — the
    /// widest grants its probes may have, their targets included. Default:
    /// nothing.
    #[serde(default)]
    pub ceiling: CeilingSpec,
}

/// How plugins are pulled from OCI registries.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OciSpec {
    /// `registries: {registry.acme.io: {username: acme, password_file:
    /// /etc/sonde/acme.pass}}` — per registry (`HOST` or `HOST:PORT`, as
    /// in references). A registry not listed is reached anonymously over
    /// HTTPS with the system roots.
    #[serde(default)]
    pub registries: BTreeMap<String, RegistrySpec>,
    /// `cache_max: 1GiB` (default) — unused blobs past it are evicted.
    #[serde(default)]
    pub cache_max: Option<Spanned<Size>>,
    /// `timeout: 60s` (default) — the longest one whole pull may take
    /// (tag, manifest, component and signature together).
    #[serde(default)]
    pub timeout: Option<Spanned<Dur>>,
    /// `idle_timeout: 10s` (default) — the longest a registry may stay
    /// silent: before the first byte of an answer, and between two reads.
    #[serde(default)]
    pub idle_timeout: Option<Spanned<Dur>>,
}

/// How to reach one OCI registry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySpec {
    /// `username: acme` — for basic auth and the token flow.
    #[serde(default)]
    pub username: Option<String>,
    /// `password_file: /etc/sonde/acme.pass` — its first line is the
    /// password; never logged or shown.
    #[serde(default)]
    pub password_file: Option<Spanned<PathBuf>>,
    /// `ca_file: /etc/sonde/registry-ca.pem` — CA certificates trusted for
    /// this registry besides the system roots.
    #[serde(default)]
    pub ca_file: Option<Spanned<PathBuf>>,
    /// `insecure: true` — plain HTTP, for a loopback or development
    /// registry only. Default false.
    #[serde(default)]
    pub insecure: bool,
}

/// A tenant's quotas.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotasSpec {
    /// `max_probes: 100` (default).
    #[serde(default)]
    pub max_probes: Option<Spanned<u64>>,
    /// `max_concurrent_runs: 4` (default, at least 1).
    #[serde(default)]
    pub max_concurrent_runs: Option<Spanned<u32>>,
    /// `timeout: 10s` (default) — the longest `timeout` of its probes.
    #[serde(default)]
    pub timeout: Option<Spanned<Dur>>,
    /// `fuel: 1000000000` (default) — the largest `limits.fuel`.
    #[serde(default)]
    pub fuel: Option<Spanned<u64>>,
    /// `memory: 64MiB` (default, at most 1GiB) — the largest `limits.memory`.
    #[serde(default)]
    pub memory: Option<Spanned<Size>>,
}

/// A tenant's capability ceiling.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CeilingSpec {
    /// `net: ["10.0.0.0/8:*", "*.acme.internal:443"]` — `net` patterns.
    #[serde(default)]
    pub net: Vec<Spanned<String>>,
    /// `exec: [/usr/lib/nagios/plugins]` — programs, or directories of them.
    #[serde(default)]
    pub exec: Vec<Spanned<PathBuf>>,
    /// `files: [/srv/acme]` — directories that may be granted, or whose
    /// subdirectories may be.
    #[serde(default)]
    pub files: Vec<Spanned<PathBuf>>,
    /// `registries: ["registry.acme.io/acme/*"]` — where its probes' `oci://`
    /// plugins may come from: a registry, a repository, or a repository
    /// prefix ending in `/*`. Default: nowhere.
    #[serde(default)]
    pub registries: Vec<Spanned<String>>,
    /// `names_may_reach: [public]` (default) — where a name its probes are
    /// granted may lead: `public` addresses, `private` ones (10.0.0.0/8,
    /// 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7), both, or
    /// none (`[]`: only address grants reach anything). Loopback,
    /// link-local, unspecified, multicast and broadcast addresses, and the
    /// agent's own listeners, are never reached through a name.
    #[serde(default)]
    pub names_may_reach: Option<Vec<AddressKind>>,
}

/// A kind of address a name may lead to (`ceiling.names_may_reach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AddressKind {
    /// Addresses outside every private and special range.
    Public,
    /// RFC 1918, shared address space and unique-local IPv6 addresses.
    Private,
}

/// A service on the node and its probes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// `name: web` — unique in the file.
    pub name: Spanned<String>,
    /// `tenant: acme` — the tenant that owns this target and all its
    /// probes. Default: the operator's `default` tenant.
    #[serde(default)]
    pub tenant: Option<Spanned<String>>,
    /// `address: 127.0.0.1:8080` — `host:port` or a URL; what every probe
    /// of the target receives as its target unless it sets its own.
    pub address: Spanned<String>,
    /// `on_failure: {command: [...], timeout: 30s}` — run after a liveness
    /// or startup probe of this target turns to failure. Default: none.
    #[serde(default)]
    pub on_failure: Option<Action>,
    /// `probes: [...]`.
    #[serde(default)]
    pub probes: Vec<Probe>,
    /// Where this target was written, when not in the config file itself
    /// (a probe added through the API): errors about it name this.
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// A command the host runs after a liveness or startup failure.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// `command: [/usr/bin/systemctl, restart, web]` — an absolute program
    /// path, then its arguments; no shell unless you name one.
    pub command: Spanned<Vec<String>>,
    /// `timeout: 30s` (default 30s) — then its whole process group is killed.
    #[serde(default)]
    pub timeout: Option<Dur>,
    /// `env: {NAME: value}` — its environment (empty by default).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One probe.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// `name: web-ready` — unique in the agent. Default: `<target>-<kind>`.
    #[serde(default)]
    pub name: Option<Spanned<String>>,
    /// `kind: readiness` (default) | `liveness` | `startup`.
    #[serde(default)]
    pub kind: Option<Spanned<Kind>>,
    /// `plugin: http` — a built-in name, the path of a `.wasm` component
    /// (relative to the config file's directory), or an OCI reference
    /// (`oci://registry.example.com/acme/pg-check@sha256:…`, or `:TAG`,
    /// resolved to its digest at load).
    pub plugin: Spanned<String>,
    /// `config: {path: /healthz}` — the plugin's config, checked against
    /// the JSON Schema the plugin publishes. Default: `{}`.
    #[serde(default)]
    pub config: Option<Spanned<serde_json::Value>>,
    /// `target: 127.0.0.1:9000` — probe this instead of the target's address.
    #[serde(default)]
    pub target: Option<Spanned<String>>,
    /// `period: 10s` (default 10s, at least 100ms).
    #[serde(default)]
    pub period: Option<Spanned<Dur>>,
    /// `initial_delay: 0s` (default) — no run before it.
    #[serde(default)]
    pub initial_delay: Option<Dur>,
    /// `timeout: 1s` (default) — the deadline of one run.
    #[serde(default)]
    pub timeout: Option<Spanned<Dur>>,
    /// `success_threshold: 1` (default; must be 1 for liveness and startup).
    #[serde(default)]
    pub success_threshold: Option<Spanned<u32>>,
    /// `failure_threshold: 3` (default).
    #[serde(default)]
    pub failure_threshold: Option<Spanned<u32>>,
    /// `grants: {net: [...], exec: [...], files: [...], env: {...}}` —
    /// what the plugin may reach besides its target. Default: nothing.
    #[serde(default)]
    pub grants: GrantsSpec,
    /// `limits: {fuel: 1000000000, memory: 64MiB}`.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// `groups: [frontend]` — names for aggregated readiness.
    #[serde(default)]
    pub groups: Vec<Spanned<String>>,
    /// `labels: {team: payments}` — extra labels on the probe's series in
    /// `/metrics` and on its entry in `/v1/probes`: at most
    /// [`crate::registry::MAX_LABELS`], each name
    /// `[a-zA-Z_][a-zA-Z0-9_]*` and none of the series' own labels, each
    /// value 1-256 bytes (a Pod name fits). Default: none.
    #[serde(default)]
    pub labels: Option<Spanned<BTreeMap<String, String>>>,
}

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

/// Turns a serde-saphyr location into a [`Place`] in `file`.
pub fn place(file: &Path, loc: &serde_saphyr::Location) -> Place {
    Place {
        file: file.to_path_buf(),
        line: loc.line(),
        column: loc.column(),
    }
}

/// Parser limits: an agent may hold a million probes (about 15 YAML nodes
/// each), far past serde-saphyr's defaults; the alias and depth limits
/// that stop YAML bombs stay as they are.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = 32_000_000;
    budget.max_events = 64_000_000;
    budget.max_total_scalar_bytes = 512 * 1024 * 1024;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Parses config text that came from `file`.
pub fn parse(file: &Path, text: &str) -> Result<File, ConfigErrors> {
    serde_saphyr::from_str_with_options::<File>(text, options()).map_err(|e| {
        let place = e.location().map_or_else(
            || Place {
                file: file.to_path_buf(),
                line: 0,
                column: 0,
            },
            |l| place(file, &l),
        );
        let mut message = first_line(&e);
        // A value's error names its key, as the registry's do.
        if let Some(key) = key_before(text, place.line, place.column)
            && !message.starts_with(&format!("{key}:"))
            && !message.contains(&format!("`{key}`"))
        {
            message = format!("{key}: {message}");
        }
        ConfigError { place, message }.into()
    })
}

/// The key a value at `line`:`column` (1-based) is the value of, when the
/// text before it on its line ends with `key:` (`memory: 8388608`,
/// `limits: {memory: 8388608}`).
fn key_before(text: &str, line: u64, column: u64) -> Option<String> {
    let line = text.lines().nth(usize::try_from(line).ok()?.checked_sub(1)?)?;
    let before: String = line
        .chars()
        .take(usize::try_from(column).ok()?.checked_sub(1)?)
        .collect();
    let before = before.trim_end().strip_suffix(':')?;
    let key: String = before
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    (!key.is_empty()).then_some(key)
}

/// Reads and parses `file`.
pub fn read(file: &Path) -> Result<(File, String), ConfigErrors> {
    let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
        place: Place {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
        },
        message: format!("cannot read: {e}"),
    })?;
    Ok((parse(file, &text)?, text))
}

/// The message of a serde-saphyr error without its rendered snippet.
fn first_line(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("invalid YAML");
    // The rendering may lead with "error: " and end with " at line L column C".
    let line = line.strip_prefix("error: ").unwrap_or(line);
    let line = match line.find(" at line ") {
        Some(i) => &line[..i],
        None => line,
    };
    // ... or lead with "line L column C: ", which the place already says.
    match line.split_once(": ") {
        Some((at, rest))
            if at.starts_with("line ") && at.split(' ').filter(|w| w.parse::<u64>().is_ok()).count() == 2 =>
        {
            rest.to_string()
        }
        _ => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(Path::new("sonde.yaml"), text).unwrap_err().to_string()
    }

    #[test]
    fn a_minimal_file() {
        let f = parse(
            Path::new("x.yaml"),
            "targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - plugin: http\n        config: {path: /healthz}\n        period: 500ms\n",
        )
        .unwrap();
        let p = &f.targets[0].probes[0];
        assert_eq!(p.plugin.value, "http");
        assert_eq!(p.period.as_ref().unwrap().value, Dur(Duration::from_millis(500)));
        assert_eq!(p.config.as_ref().unwrap().value["path"], "/healthz");
        assert_eq!(p.plugin.referenced.line(), 5);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_place() {
        let e = err("targets:\n  - name: web\n    adress: 127.0.0.1:80\n");
        assert!(e.starts_with("sonde.yaml:3:5: "), "{e}");
        assert!(e.contains("adress"), "{e}");
    }

    #[test]
    fn a_duration_needs_a_unit() {
        let e =
            err("targets:\n  - name: web\n    address: a:1\n    probes:\n      - plugin: tcp\n        period: 10\n");
        assert!(e.starts_with("sonde.yaml:6:"), "{e}");
        assert!(e.contains("10s"), "{e}");
        let e =
            err("targets:\n  - name: web\n    address: a:1\n    probes:\n      - plugin: tcp\n        timeout: 10x\n");
        assert!(e.contains("\"10x\" is not a duration"), "{e}");
    }

    #[test]
    fn a_size_needs_a_unit() {
        let probe = |memory: &str| {
            format!(
                "targets:\n  - name: web\n    address: a:1\n    probes:\n      - plugin: tcp\n        limits: {{memory: {memory}}}\n"
            )
        };
        for bare in ["8388608", "\"8388608\""] {
            let e = err(&probe(bare));
            assert!(e.starts_with("sonde.yaml:6:"), "{e}");
            assert!(e.contains("memory"), "the field is named: {e}");
            assert!(
                e.contains("8388608 has no unit") && e.contains("8MiB (or 8388608B)"),
                "{e}"
            );
        }
        let e = err("sandbox: {fields_bytes: 1000}\n");
        assert!(e.contains("fields_bytes") && e.contains("1000B"), "{e}");
        let f = parse(Path::new("sonde.yaml"), &probe("8388608B")).unwrap();
        let memory = f.targets[0].probes[0].limits.memory.as_ref().map(|m| m.value.0);
        assert_eq!(memory, Some(8 << 20));
    }

    #[test]
    fn the_documented_examples_parse() {
        for (name, text) in [
            (
                "web-behind-nginx.yaml",
                include_str!("../../../docs/examples/web-behind-nginx.yaml"),
            ),
            ("postgres.yaml", include_str!("../../../docs/examples/postgres.yaml")),
            (
                "calico-node-style.yaml",
                include_str!("../../../docs/examples/calico-node-style.yaml"),
            ),
            (
                "multi-tenant.yaml",
                include_str!("../../../docs/examples/multi-tenant.yaml"),
            ),
            ("default.yaml", include_str!("default.yaml")),
        ] {
            let f = parse(Path::new(name), text).unwrap_or_else(|e| panic!("{e}"));
            assert!(!f.targets.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_bad_kind_is_named() {
        let e =
            err("targets:\n  - name: web\n    address: a:1\n    probes:\n      - plugin: tcp\n        kind: lively\n");
        assert!(e.starts_with("sonde.yaml:6:"), "{e}");
        assert!(e.contains("lively"), "{e}");
    }
}
