//! The agent's config file: YAML, parsed into typed structs that refuse
//! unknown keys, with every error naming the file, line, column and key.
//!
//! This module only reads and checks the *shape* of the file. Whether a
//! plugin exists, whether its config fits its schema and whether grants
//! parse is the [`catalog`](crate::catalog)'s job; it reports against the
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

mod api;
mod kubernetes;
mod modules;
mod npd;
mod oci;
mod otlp;
mod sandbox;
mod targets;
mod tenants;
mod units;

pub use api::*;
pub use kubernetes::*;
pub use modules::*;
pub use npd::*;
pub use oci::*;
pub use otlp::*;
pub use sandbox::*;
pub use targets::*;
pub use tenants::*;
pub use units::*;

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
    /// `trust: [/etc/sonde/keys/acme.pub]` — PEM public keys (cosign's,
    /// or from `sonde plugin keygen`), each named after its file, whose
    /// signatures plugins may carry.
    #[serde(default)]
    pub trust: Vec<Spanned<PathBuf>>,
    /// `trust_keyless: {trusted_root, identities}` — reserved for keyless
    /// signatures (a Fulcio certificate and a Rekor entry, verified offline
    /// against a trusted root and an identity policy); refused in this
    /// release, so that a config written for it fails loudly.
    #[serde(default)]
    pub trust_keyless: Option<Spanned<serde_json::Value>>,
    /// `require_signed: true` — refuse every plugin file, `oci://` plugin
    /// and upload that is not signed by a `trust` key; built-ins are
    /// trusted by being embedded. Default: false.
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
    /// `secrets: {db-password: {file: /run/secrets/db}}` — the operator's
    /// secrets, which the operator's probes may use by handle
    /// (`$(secret:db-password)`) where their `grants.secrets` names them
    /// (docs/secrets.md). Default: none.
    #[serde(default)]
    pub secrets: BTreeMap<String, Spanned<SecretSpec>>,
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
    /// `node_problem_detector: [{config: FILE, exec: [...]}]` —
    /// node-problem-detector custom plugin monitor files, run as NPD runs
    /// them (docs/kubernetes.md). Default: none.
    #[serde(default)]
    pub node_problem_detector: Vec<NpdSpec>,
    /// `otlp: {endpoint: http://collector:4317}` — send every series of
    /// `/metrics` to an OpenTelemetry collector ([`OtlpSpec`],
    /// docs/opentelemetry.md). Read once, when the agent starts. Default:
    /// off.
    #[serde(default)]
    pub otlp: Option<Spanned<OtlpSpec>>,
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
                include_str!("../../../../docs/examples/web-behind-nginx.yaml"),
            ),
            ("postgres.yaml", include_str!("../../../../docs/examples/postgres.yaml")),
            (
                "calico-node-style.yaml",
                include_str!("../../../../docs/examples/calico-node-style.yaml"),
            ),
            (
                "multi-tenant.yaml",
                include_str!("../../../../docs/examples/multi-tenant.yaml"),
            ),
            ("default.yaml", include_str!("../default.yaml")),
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
