//! The `tenants:` block: owners of probes, their quotas and ceilings.

use super::*;

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
    /// `secrets: {db-password: {file: ...}}` — the tenant's own secrets,
    /// which only its probes may use. Default: none.
    #[serde(default)]
    pub secrets: BTreeMap<String, Spanned<SecretSpec>>,
    /// `otlp: {endpoint: https://otel.acme.example:4317, headers: ...}` —
    /// the tenant's own collector (docs/opentelemetry.md): its probes'
    /// series and spans, and nothing of another tenant's, as the top-level
    /// `otlp:` block says; header handles name the tenant's `secrets:`,
    /// and the endpoint must be inside its `ceiling.net`. Default: none
    /// (the operator's export still carries the tenant's data).
    #[serde(default)]
    pub otlp: Option<Spanned<OtlpSpec>>,
}

/// Where one secret's value comes from: exactly one of `file` and `env`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// `file: /run/secrets/db-password` — read at load and again whenever
    /// it changes (a trailing newline is not part of the value); refused
    /// when every user may read it. Relative to the config file's
    /// directory.
    #[serde(default)]
    pub file: Option<Spanned<PathBuf>>,
    /// `env: DB_PASSWORD` — read once at start; the variable is then
    /// removed from sonde's environment.
    #[serde(default)]
    pub env: Option<Spanned<String>>,
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
    /// `signers: [acme]` — the `trust` keys (by signer name: a PEM key
    /// file's name without `.pub`) whose signature makes its plugins
    /// runnable; unset: any trusted signer, as `require_signed` says.
    #[serde(default)]
    pub signers: Option<Vec<Spanned<String>>>,
    /// `names_may_reach: [public]` (default) — where a name its probes are
    /// granted may lead: `public` addresses, `private` ones (10.0.0.0/8,
    /// 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7), both, or
    /// none (`[]`: only address grants reach anything). Loopback,
    /// link-local, unspecified, multicast and broadcast addresses, and the
    /// agent's own listeners, are never reached through a name.
    #[serde(default)]
    pub names_may_reach: Option<Vec<AddressKind>>,
}
