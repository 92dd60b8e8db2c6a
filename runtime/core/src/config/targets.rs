//! The `targets:` block: services, their probes and actions.

use super::*;

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
    /// A stand-in that probes nothing (a `node_problem_detector:` rule
    /// runs its program only): its `address` is empty, and no plugin of
    /// it is granted a target. Never set by the file.
    #[serde(skip)]
    pub targetless: bool,
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
    /// `propagate: true` — the run's HTTP and gRPC requests carry its
    /// trace context (`traceparent`), so the target's own tracing shows the
    /// check as the root of what it did; with `otlp:`, the run is then
    /// always traced. Default false.
    #[serde(default)]
    pub propagate: bool,
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
    /// [`crate::catalog::MAX_LABELS`], each name
    /// `[a-zA-Z_][a-zA-Z0-9_]*` and none of the series' own labels, each
    /// value 1-256 bytes (a Pod name fits). Default: none.
    #[serde(default)]
    pub labels: Option<Spanned<BTreeMap<String, String>>>,
}
