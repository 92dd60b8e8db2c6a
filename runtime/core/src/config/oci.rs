//! The `oci:` block: how `oci://` plugins are pulled.

use super::*;

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
