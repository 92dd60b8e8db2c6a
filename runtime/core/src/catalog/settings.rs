//! The settings step: the file's agent-wide keys (`api`, `state_dir`,
//! `health_timeout`, `trust`, `require_signed`), its `tenants:` with
//! their tokens, quotas and ceilings, and the namespace templates
//! (`kubernetes.namespace_templates`) that make tenants for labelled
//! Kubernetes namespaces ([`generate`]). Everything else in the file is
//! targets, which [`super::probe`] takes one at a time.

use super::problem::{ConfigProblem, Located, Owner};
use super::resolve::Trust;
use crate::config;
use crate::tenants::{self, DEFAULT_TENANT, Quotas, Tenant, Tenants};
use serde_saphyr::Location;
use sonde_sandbox::engine::limits;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The agent-wide part of a config.
#[derive(Debug, Default)]
pub struct AgentSettings {
    /// `api:` (or `api: {listen: ...}`).
    pub api: Option<std::net::SocketAddr>,
    /// The limits of `api: {...}`, defaults filled in.
    pub api_limits: config::ApiLimits,
    /// `api: {auth: ...}`, when set.
    pub api_auth: Option<crate::auth::ApiAuth>,
    /// `state_dir:`, relative to the file's directory.
    pub state_dir: Option<PathBuf>,
    /// `health_timeout:`.
    pub health_timeout: Option<Duration>,
    /// `trust:` and `require_signed:`.
    pub trust: Trust,
    /// `tenants:`, the operator's `default` first, with the API tokens.
    pub tenants: Tenants,
    /// `oci:`: how `oci://` plugins are pulled and where they are cached.
    pub oci: Option<sonde_oci::ClientSettings>,
    /// `sandbox:`, defaults filled in.
    pub host_limits: sonde_sandbox::host::bounds::HostLimits,
    /// `kubernetes.namespace_templates` and what decides which namespaces
    /// they apply to.
    pub namespace_templates: NamespaceTemplates,
    /// The `otlp:` blocks (the top level's, the tenants'), checked.
    pub otlp: super::otlp::Exports,
}

/// The bounds `spec` sets, the defaults elsewhere, checked: the error
/// names the key out of range.
pub fn host_limits(
    spec: &config::SandboxSpec,
) -> Result<sonde_sandbox::host::bounds::HostLimits, sonde_sandbox::host::bounds::LimitError> {
    let d = sonde_sandbox::host::bounds::HostLimits::default();
    let n = |v: Option<u32>, default: usize| v.map_or(default, |v| v as usize);
    let limits = sonde_sandbox::host::bounds::HostLimits {
        table_entries_per_call: n(spec.table_entries_per_call, d.table_entries_per_call),
        fields_bytes: spec
            .fields_bytes
            .map_or(d.fields_bytes, |s| usize::try_from(s.0).unwrap_or(usize::MAX)),
        argument_bytes: spec
            .argument_bytes
            .map_or(d.argument_bytes, |s| usize::try_from(s.0).unwrap_or(usize::MAX)),
        sockets_per_call: n(spec.sockets_per_call, d.sockets_per_call),
        lookups_per_call: n(spec.lookups_per_call, d.lookups_per_call),
        lookups_in_flight: n(spec.lookups_in_flight, d.lookups_in_flight),
        blocking_threads: n(spec.blocking_threads, d.blocking_threads),
        exec_pids: spec.exec_pids.unwrap_or(d.exec_pids),
        keepalive_idle_per_host: n(spec.keepalive_idle_per_host, d.keepalive_idle_per_host),
        keepalive_idle_per_tenant: n(spec.keepalive_idle_per_tenant, d.keepalive_idle_per_tenant),
        keepalive_idle: n(spec.keepalive_idle, d.keepalive_idle),
    };
    limits.validate()?;
    Ok(limits)
}

/// Reads the agent-wide keys of `file`; paths are relative to `base`.
/// Problems are reported against `path`.
pub fn settings(path: &Path, base: &Path, file: &config::File, problems: &mut Vec<Located>) -> AgentSettings {
    let mut at = |s: Location, problem| problems.push(Located { at: s, problem });
    let mut out = AgentSettings {
        state_dir: file.state_dir.as_ref().map(|d| base.join(d)),
        ..AgentSettings::default()
    };
    if let Some(api) = &file.api {
        if let Some(listen) = &api.value.listen {
            match listen.parse() {
                Ok(a) => out.api = Some(a),
                Err(_) => at(api.referenced, ConfigProblem::Api(listen.clone())),
            }
        }
        out.api_auth = api.value.auth;
        match config::ApiLimits::from_spec(&api.value) {
            Ok(l) => out.api_limits = l,
            Err(e) => at(api.referenced, ConfigProblem::ApiLimit(e)),
        }
    }
    if let Some(sandbox) = &file.sandbox {
        match host_limits(&sandbox.value) {
            Ok(l) => out.host_limits = l,
            Err(e) => at(sandbox.referenced, ConfigProblem::SandboxLimit(e)),
        }
    }
    if let Some(t) = &file.health_timeout {
        if t.value.0 < Duration::from_secs(1) {
            at(t.referenced, ConfigProblem::HealthTimeoutTooShort);
        }
        out.health_timeout = Some(t.value.0);
    }
    if let Some(k) = &file.trust_keyless {
        at(k.referenced, ConfigProblem::KeylessReserved);
    }
    out.trust.required = file.require_signed.as_ref().is_some_and(|r| r.value);
    for k in &file.trust {
        match sonde_oci::signing::PublicKey::read(&base.join(&k.value)) {
            Ok(key) => out.trust.keys.push(key),
            Err(e) => at(k.referenced, ConfigProblem::TrustKey(e)),
        }
    }
    if let Some(r) = &file.require_signed
        && r.value
        && file.trust.is_empty()
    {
        at(r.referenced, ConfigProblem::RequireSignedWithoutTrust);
    }
    super::signers::check_trust_names(&out.trust, file, problems);

    out.tenants = tenants(path, base, file, problems);
    if let Some(k) = &file.kubernetes {
        out.namespace_templates = namespace_templates(k, problems);
    }
    out.oci = Some(oci(base, out.state_dir.as_deref(), file.oci.as_ref(), problems));
    out.otlp = super::otlp::exports(base, file, &out.tenants, problems);
    out
}

/// The `oci:` block: registries, cache size and pull timeout; the cache
/// lives in `state_dir/oci`, else the user's cache.
fn oci(
    base: &Path,
    state_dir: Option<&Path>,
    spec: Option<&config::OciSpec>,
    problems: &mut Vec<Located>,
) -> sonde_oci::ClientSettings {
    let mut out = sonde_oci::ClientSettings::new(oci_cache_dir(state_dir));
    let Some(spec) = spec else { return out };
    if let Some(m) = &spec.cache_max {
        out.cache_max_bytes = m.value.0;
    }
    if let Some(t) = &spec.timeout {
        if t.value.0.is_zero() {
            problems.push(Located {
                at: t.referenced,
                problem: ConfigProblem::OciTimeoutZero { key: "timeout" },
            });
        }
        out.timeout = t.value.0;
    }
    if let Some(t) = &spec.idle_timeout {
        if t.value.0.is_zero() {
            problems.push(Located {
                at: t.referenced,
                problem: ConfigProblem::OciTimeoutZero { key: "idle_timeout" },
            });
        }
        out.limits.idle = t.value.0;
    }
    for (name, r) in &spec.registries {
        out.registries.insert(
            name.clone(),
            sonde_oci::RegistryAccess {
                username: r.username.clone(),
                password_file: r.password_file.as_ref().map(|p| base.join(&p.value)),
                ca_file: r.ca_file.as_ref().map(|p| base.join(&p.value)),
                insecure: r.insecure,
            },
        );
    }
    out
}

/// Reads `tenants:` and the operator's token: ids unique and not
/// `default`, tokens readable, private and different, quotas sane, ceilings
/// parsed. Token paths are relative to `base`.
pub fn tenants(path: &Path, base: &Path, file: &config::File, problems: &mut Vec<Located>) -> Tenants {
    let node_ip = node_ip(file.kubernetes.as_ref());
    let mut list: Vec<Tenant> = Vec::new();
    // Where each tenant of `list` is defined.
    let mut id_at: Vec<Location> = Vec::new();
    for t in &file.tenants {
        let id = t.id.value.trim();
        let id_problem = if !super::valid_name(id) {
            Some(ConfigProblem::TenantIdInvalid(id.to_string()))
        } else if id == tenants::DEFAULT_TENANT {
            Some(ConfigProblem::TenantIdDefault)
        } else {
            list.iter()
                .position(|o| &*o.id == id)
                .map(|i| ConfigProblem::TenantIdDuplicate {
                    id: id.to_string(),
                    first: config::place(path, &id_at[i]),
                })
        };
        // A tenant with a bad id is reported and left out.
        let keep = id_problem.is_none();
        if let Some(problem) = id_problem {
            problems.push(Located {
                at: t.id.referenced,
                problem,
            });
        }
        let token = super::tokens::token(
            base,
            problems,
            &format!("tenant {id:?}"),
            &t.token_file,
            &t.token_env,
            t.id.referenced,
        );
        let mut at = |s: Location, problem| problems.push(Located { at: s, problem });
        let owner = Owner::Tenant(id.to_string());
        let quotas = quotas(&owner, &t.quotas, &mut at);
        let ceiling = ceiling(&owner, &t.ceiling, node_ip.as_deref(), &mut at);
        let secrets = super::secrets::cells(base, id, false, &t.secrets, problems);
        if !keep {
            continue;
        }
        id_at.push(t.id.referenced);
        list.push(Tenant {
            id: id.into(),
            quotas,
            ceiling: Some(ceiling),
            token,
            secrets,
        });
    }
    let operator = super::tokens::token(
        base,
        problems,
        "operator token",
        &file.operator_token_file,
        &file.operator_token_env,
        Location::UNKNOWN,
    );
    super::tokens::check_distinct(&list, &id_at, operator.as_ref(), problems);
    Tenants::new(list, operator).with_operator_secrets(super::secrets::cells(
        base,
        DEFAULT_TENANT,
        true,
        &file.secrets,
        problems,
    ))
}

/// A tenant's quotas, defaults filled in; zeros refused.
fn quotas(owner: &Owner, q: &config::QuotasSpec, at: &mut impl FnMut(Location, ConfigProblem)) -> Quotas {
    let d = Quotas::default();
    let mut rule = |loc: Location, key, rule| {
        at(
            loc,
            ConfigProblem::Quota {
                key,
                owner: owner.clone(),
                rule,
            },
        )
    };
    if let Some(m) = &q.max_concurrent_runs
        && m.value == 0
    {
        rule(m.referenced, "max_concurrent_runs", "must be at least 1");
    }
    if let Some(m) = &q.timeout
        && m.value.0.is_zero()
    {
        rule(m.referenced, "timeout", "must be more than zero");
    }
    if let Some(m) = &q.fuel
        && m.value == 0
    {
        rule(m.referenced, "fuel", "must be more than zero");
    }
    if let Some(m) = &q.memory
        && (m.value.0 == 0 || m.value.0 > limits::MAX_MEMORY)
    {
        rule(m.referenced, "memory", "must be more than zero and at most 1GiB");
    }
    Quotas {
        max_probes: q
            .max_probes
            .as_ref()
            .map_or(d.max_probes, |m| usize::try_from(m.value).unwrap_or(usize::MAX)),
        max_concurrent_runs: q
            .max_concurrent_runs
            .as_ref()
            .map_or(d.max_concurrent_runs, |m| m.value),
        timeout: q.timeout.as_ref().map_or(d.timeout, |m| m.value.0),
        fuel: q.fuel.as_ref().map_or(d.fuel, |m| m.value),
        memory: q.memory.as_ref().map_or(d.memory, |m| m.value.0),
    }
}

/// The node's address, which `$(NODE_IP)` stands for in a ceiling's `net`
/// and in a SondeNodeCheck: `kubernetes.node_ip`, else `$NODE_IP` (the
/// shipped DaemonSet sets it from the downward API's `status.hostIP`).
/// The one place both read it.
pub fn node_ip(kubernetes: Option<&config::KubernetesSpec>) -> Option<String> {
    kubernetes
        .and_then(|k| k.node_ip.clone())
        .or_else(|| std::env::var("NODE_IP").ok())
        .filter(|ip| !ip.is_empty())
}

/// `pattern` with `$(NODE_IP)` replaced by `node_ip` (in brackets when it
/// is IPv6, as in `[2001:db8::7]:*`); `Err` with what the agent has when
/// it cannot be.
fn with_node_ip(pattern: &str, node_ip: Option<&str>) -> Result<String, Option<String>> {
    if !pattern.contains("$(NODE_IP)") {
        return Ok(pattern.to_string());
    }
    let ip: std::net::IpAddr = node_ip
        .ok_or(None)?
        .trim()
        .parse()
        .map_err(|_| node_ip.map(str::to_string))?;
    let text = match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    };
    Ok(pattern.replace("$(NODE_IP)", &text))
}

/// A tenant's capability ceiling, parsed; `$(NODE_IP)` in a `net` pattern
/// is `node_ip`.
fn ceiling(
    owner: &Owner,
    c: &config::CeilingSpec,
    node_ip: Option<&str>,
    at: &mut impl FnMut(Location, ConfigProblem),
) -> tenants::Ceiling {
    let mut ceiling = tenants::Ceiling {
        signers: c
            .signers
            .as_ref()
            .map(|s| s.iter().map(|n| n.value.trim().to_string()).collect()),
        ..tenants::Ceiling::default()
    };
    if let Some(kinds) = &c.names_may_reach {
        ceiling.names_reach_public = kinds.contains(&config::AddressKind::Public);
        ceiling.names_reach_private = kinds.contains(&config::AddressKind::Private);
    }
    for n in &c.net {
        let pattern = match with_node_ip(&n.value, node_ip) {
            Ok(p) => p,
            Err(found) => {
                let (owner, pattern) = (owner.clone(), n.value.clone());
                at(n.referenced, ConfigProblem::CeilingNodeIp { owner, pattern, found });
                continue;
            }
        };
        match pattern.parse() {
            Ok(p) => ceiling.net.push(p),
            Err(error) => at(
                n.referenced,
                ConfigProblem::CeilingNet {
                    owner: owner.clone(),
                    error,
                },
            ),
        }
    }
    for r in &c.registries {
        match sonde_oci::RegistryScope::parse(&r.value) {
            Ok(scope) => ceiling.registries.push(scope),
            Err(error) => at(
                r.referenced,
                ConfigProblem::CeilingRegistry {
                    owner: owner.clone(),
                    error,
                },
            ),
        }
    }
    for (key, paths, out) in [
        ("ceiling.exec", &c.exec, &mut ceiling.exec),
        ("ceiling.files", &c.files, &mut ceiling.files),
    ] {
        for p in paths {
            if !p.value.is_absolute() {
                at(
                    p.referenced,
                    ConfigProblem::CeilingPath {
                        key,
                        owner: owner.clone(),
                        path: p.value.clone(),
                    },
                );
            }
            out.push(p.value.clone());
        }
    }
    ceiling
}

/// Default `kubernetes.max_templated_namespaces`: the most tenants the
/// namespace templates make.
pub const DEFAULT_MAX_TEMPLATED_NAMESPACES: usize = 1000;

/// The Namespace label that opts a namespace into a template; its value
/// names one of `kubernetes.namespace_templates`.
pub const TEMPLATE_LABEL: &str = "sonde.dev/tenant-template";

/// A namespace template, parsed: the quotas and ceiling of each tenant it
/// makes.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// As a tenant's quotas, defaults filled in.
    pub quotas: Quotas,
    /// As a tenant's ceiling.
    pub ceiling: tenants::Ceiling,
}

/// `kubernetes.namespace_templates`, parsed, with what decides which
/// namespaces they apply to.
#[derive(Clone, Debug, PartialEq)]
pub struct NamespaceTemplates {
    /// The templates by name.
    pub templates: BTreeMap<String, Template>,
    /// `kubernetes.max_templated_namespaces`.
    pub max: usize,
    /// The namespaces `kubernetes.namespaces` maps to a tenant: the
    /// mapping wins over a template.
    pub mapped: std::collections::BTreeSet<String>,
}

impl Default for NamespaceTemplates {
    fn default() -> Self {
        Self {
            templates: BTreeMap::new(),
            max: DEFAULT_MAX_TEMPLATED_NAMESPACES,
            mapped: Default::default(),
        }
    }
}

/// What a namespace labelled `sonde.dev/tenant-template` got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplateOutcome {
    /// A tenant of the namespace's name, with the template's quotas and
    /// ceiling.
    Templated,
    /// `tenants:` defines a tenant of the namespace's name: it wins.
    ExplicitTenant,
    /// `kubernetes.namespaces` maps the namespace to a tenant: it wins.
    Mapped,
    /// The namespace `default`, whose tenant would be the operator's: never
    /// templated.
    Operator,
    /// The label names no template of the agent's config.
    UnknownTemplate,
    /// Past `kubernetes.max_templated_namespaces` (in name order).
    OverLimit,
}

impl fmt::Display for TemplateOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Templated => "its tenant is made from the template",
            Self::ExplicitTenant => "the tenant of the same id in `tenants:` wins over the template",
            Self::Mapped => "its kubernetes.namespaces mapping wins over the template",
            Self::Operator => "the namespace `default` is never templated (its tenant would be the operator's)",
            Self::UnknownTemplate => {
                "the label names no template of kubernetes.namespace_templates, so the namespace has no tenant"
            }
            Self::OverLimit => {
                "past kubernetes.max_templated_namespaces (in name order), so the namespace has no tenant"
            }
        })
    }
}

/// One namespace labelled `sonde.dev/tenant-template`, and what it got.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceTenant {
    /// The namespace.
    pub namespace: String,
    /// The label's value.
    pub template: String,
    /// What it got.
    pub outcome: TemplateOutcome,
}

/// The tenants `templates` make for the namespaces `labelled` (namespace
/// to the value of its `sonde.dev/tenant-template` label), given the
/// config's own tenants `explicit`; and what each labelled namespace got,
/// in name order. Precedence: a `tenants:` entry of the namespace's name
/// and a `kubernetes.namespaces` mapping of it win; `default` is never
/// templated; past `templates.max`, namespaces get none.
pub fn generate(
    templates: &NamespaceTemplates,
    explicit: &Tenants,
    labelled: &BTreeMap<String, String>,
) -> (Vec<Tenant>, Vec<NamespaceTenant>) {
    let mut made = Vec::new();
    let mut outcomes = Vec::with_capacity(labelled.len());
    for (namespace, template) in labelled {
        let outcome = if namespace == tenants::DEFAULT_TENANT {
            TemplateOutcome::Operator
        } else if templates.mapped.contains(namespace) {
            TemplateOutcome::Mapped
        } else if explicit.get(namespace).is_some() {
            TemplateOutcome::ExplicitTenant
        } else {
            match templates.templates.get(template) {
                // A name the API server would not take is no tenant id either.
                Some(_) if !super::valid_name(namespace) => TemplateOutcome::UnknownTemplate,
                Some(_) if made.len() >= templates.max => TemplateOutcome::OverLimit,
                Some(t) => {
                    made.push(Tenant::new(namespace, t.quotas, t.ceiling.clone()));
                    TemplateOutcome::Templated
                }
                None => TemplateOutcome::UnknownTemplate,
            }
        };
        outcomes.push(NamespaceTenant {
            namespace: namespace.clone(),
            template: template.clone(),
            outcome,
        });
    }
    (made, outcomes)
}

/// Whether `s` is a Kubernetes label value that is not empty: at most 63
/// characters, alphanumerics, `-`, `_` and `.`, starting and ending with
/// an alphanumeric.
pub fn label_value(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Reads `kubernetes.namespace_templates` (each checked as a tenant's
/// quotas and ceiling are, its errors named by its key path) and
/// `max_templated_namespaces`.
fn namespace_templates(k: &config::KubernetesSpec, problems: &mut Vec<Located>) -> NamespaceTemplates {
    let node_ip = node_ip(Some(k));
    let node_ip = node_ip.as_deref();
    let mut out = NamespaceTemplates {
        mapped: k.namespaces.keys().cloned().collect(),
        ..NamespaceTemplates::default()
    };
    if let Some(m) = &k.max_templated_namespaces {
        if m.value == 0 {
            problems.push(Located {
                at: m.referenced,
                problem: ConfigProblem::TemplateCapZero,
            });
        }
        out.max = usize::try_from(m.value).unwrap_or(usize::MAX);
    }
    for (name, t) in &k.namespace_templates {
        if !label_value(name) {
            problems.push(Located {
                at: t.referenced,
                problem: ConfigProblem::TemplateName(name.clone()),
            });
            continue;
        }
        let owner = Owner::Template(name.clone());
        let mut at = |s: Location, problem| problems.push(Located { at: s, problem });
        let quotas = quotas(&owner, &t.value.quotas, &mut at);
        let ceiling = ceiling(&owner, &t.value.ceiling, node_ip, &mut at);
        out.templates.insert(name.clone(), Template { quotas, ceiling });
    }
    out
}

/// Where pulled plugins are cached: `state_dir/oci`, else the user's cache
/// (`$SONDE_CACHE_DIR/oci`, `~/.cache/sonde/oci`).
pub fn oci_cache_dir(state_dir: Option<&Path>) -> PathBuf {
    state_dir
        .map(|d| d.join("oci"))
        .or_else(|| sonde_sandbox::engine::cache::default_dir().map(|d| d.join("oci")))
        .unwrap_or_else(|| std::env::temp_dir().join("sonde-oci"))
}

/// The operator's tenant and every configured one, for a registry built in
/// code (tests, benchmarks).
pub fn operator_only() -> Arc<Tenants> {
    Arc::new(Tenants::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str) -> (AgentSettings, Vec<String>) {
        let path = Path::new("t.yaml");
        let file = config::parse(path, yaml).unwrap();
        let mut problems = Vec::new();
        let s = settings(path, Path::new("/nonexistent"), &file, &mut problems);
        (
            s,
            problems.into_iter().map(|p| p.into_error(path).to_string()).collect(),
        )
    }

    #[test]
    fn agent_wide_keys_are_read_and_checked() {
        let (s, p) = run("api: 127.0.0.1:9\nhealth_timeout: 5s\nstate_dir: st\n");
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(s.api, Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(s.health_timeout, Some(Duration::from_secs(5)));
        assert_eq!(s.state_dir.as_deref(), Some(Path::new("/nonexistent/st")));
        let (_, p) = run("api: nowhere\nhealth_timeout: 10ms\nrequire_signed: true\n");
        assert_eq!(
            p,
            [
                "t.yaml:1:6: api: \"nowhere\" is not an address such as 127.0.0.1:9464",
                "t.yaml:2:17: health_timeout: must be at least 1s",
                "t.yaml:3:17: require_signed: no `trust` keys are listed, so no plugin file could be accepted",
            ]
        );
    }

    #[test]
    fn tenants_are_checked_and_bad_ids_left_out() {
        let (s, p) = run(
            "tenants:\n  - id: acme\n    quotas: {max_concurrent_runs: 0, fuel: 0}\n  - id: acme\n  - id: default\n  - id: 'a b'\n  - id: ok\n    ceiling: {net: ['nope'], exec: [rel]}\n",
        );
        let ids: Vec<&str> = s.tenants.iter().map(|t| &*t.id).collect();
        assert_eq!(ids, ["default", "acme", "ok"]);
        assert_eq!(p.len(), 7, "{p:#?}");
        assert!(p[0].contains("quotas.max_concurrent_runs: tenant \"acme\": must be at least 1"));
        assert!(p[1].contains("quotas.fuel: tenant \"acme\": must be more than zero"));
        assert!(p[2].starts_with("t.yaml:4:9: id: tenant \"acme\" is already defined at t.yaml:2:9"));
        assert!(p[3].contains("\"default\" is the operator's tenant"));
        assert!(p[4].contains("id: \"a b\" must be"));
        assert!(p[5].contains("ceiling.net: tenant \"ok\": net grant \"nope\""));
        assert!(p[6].contains("ceiling.exec: tenant \"ok\": rel must be an absolute path"));
    }

    #[test]
    fn a_template_is_checked_as_a_tenant_is_and_its_errors_name_its_key_path() {
        let (s, p) = run(concat!(
            "kubernetes:\n",
            "  max_templated_namespaces: 0\n",
            "  namespace_templates:\n",
            "    small:\n",
            "      quotas: {fuel: 0, max_probes: 3}\n",
            "      ceiling: {net: ['nope'], files: [rel], registries: [ghcr.io]}\n",
            "    'bad name': {}\n",
            "    ok: {ceiling: {net: ['10.0.0.0/8:*'], names_may_reach: []}}\n",
        ));
        assert_eq!(p.len(), 6, "{p:#?}");
        assert_eq!(
            p[0],
            "t.yaml:2:29: kubernetes.max_templated_namespaces: must be at least 1"
        );
        assert!(
            p[1].starts_with("t.yaml:7:17: kubernetes.namespace_templates: \"bad name\" is not a label value"),
            "{}",
            p[1]
        );
        assert_eq!(
            p[2],
            "t.yaml:5:22: kubernetes.namespace_templates.small.quotas.fuel: must be more than zero"
        );
        assert!(
            p[3].starts_with("t.yaml:6:23: kubernetes.namespace_templates.small.ceiling.net: net grant \"nope\""),
            "{}",
            p[3]
        );
        assert!(
            p[4].starts_with("t.yaml:6:59: kubernetes.namespace_templates.small.ceiling.registries: "),
            "{}",
            p[4]
        );
        assert_eq!(
            p[5],
            "t.yaml:6:40: kubernetes.namespace_templates.small.ceiling.files: rel must be an absolute path"
        );
        let t = &s.namespace_templates;
        assert_eq!(
            t.templates.keys().collect::<Vec<_>>(),
            ["ok", "small"],
            "the bad name is left out"
        );
        assert_eq!(t.templates["small"].quotas.max_probes, 3);
        assert_eq!(
            t.templates["small"].quotas.max_concurrent_runs,
            Quotas::default().max_concurrent_runs
        );
        let ok = &t.templates["ok"].ceiling;
        assert!(!ok.names_reach_public && !ok.names_reach_private);
        assert_eq!(ok.net, [net("10.0.0.0/8:*")]);
    }

    fn net(s: &str) -> sonde_sandbox::host::NetPattern {
        s.parse().unwrap()
    }

    #[test]
    fn a_template_takes_no_token_and_no_unknown_key() {
        for key in ["token_file: /t", "id: x", "quota: {}"] {
            let text = format!("kubernetes:\n  namespace_templates:\n    small:\n      {key}\n");
            let e = config::parse(Path::new("t.yaml"), &text).unwrap_err().to_string();
            assert!(e.starts_with("t.yaml:4:7: "), "{key}: {e}");
            assert!(e.contains(key.split(':').next().unwrap()), "{key}: {e}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["a", "standard", "team.a_b-1", &"x".repeat(63)] {
            assert!(label_value(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", ".a", "a b", "a/b", "é", &"x".repeat(64)] {
            assert!(!label_value(bad), "{bad}");
        }
    }

    /// Precedence: an explicit tenant and a mapping win, `default` is
    /// never templated, a label naming no template gives nothing, and past
    /// the limit (in name order) namespaces get nothing.
    #[test]
    fn explicit_tenants_and_mappings_win_over_templates() {
        let (s, p) = run(concat!(
            "tenants:\n",
            "  - id: shop\n",
            "    ceiling: {net: ['127.0.0.0/8:*']}\n",
            "kubernetes:\n",
            "  namespaces: {mapped: shop}\n",
            "  max_templated_namespaces: 2\n",
            "  namespace_templates:\n",
            "    small:\n",
            "      quotas: {max_probes: 3, max_concurrent_runs: 1}\n",
            "      ceiling: {net: ['10.0.0.0/8:*']}\n",
        ));
        assert!(p.is_empty(), "{p:?}");
        let labelled: BTreeMap<String, String> = [
            ("shop", "small"),
            ("mapped", "small"),
            ("default", "small"),
            ("team-a", "small"),
            ("team-b", "large"),
            ("team-c", "small"),
            ("team-d", "small"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let (made, outcomes) = generate(&s.namespace_templates, &s.tenants, &labelled);
        let got: Vec<(&str, TemplateOutcome)> = outcomes.iter().map(|o| (o.namespace.as_str(), o.outcome)).collect();
        assert_eq!(
            got,
            [
                ("default", TemplateOutcome::Operator),
                ("mapped", TemplateOutcome::Mapped),
                ("shop", TemplateOutcome::ExplicitTenant),
                ("team-a", TemplateOutcome::Templated),
                ("team-b", TemplateOutcome::UnknownTemplate),
                ("team-c", TemplateOutcome::Templated),
                ("team-d", TemplateOutcome::OverLimit),
            ]
        );
        let ids: Vec<&str> = made.iter().map(|t| &*t.id).collect();
        assert_eq!(ids, ["team-a", "team-c"]);
        let a = &made[0];
        assert_eq!((a.quotas.max_probes, a.quotas.max_concurrent_runs), (3, 1));
        assert_eq!(a.ceiling.as_ref().unwrap().net, [net("10.0.0.0/8:*")]);
        assert!(a.token.is_none());
        let all = s.tenants.extended(made);
        let shop = all.get("shop").unwrap();
        assert_eq!(
            shop.ceiling.as_ref().unwrap().net,
            [net("127.0.0.0/8:*")],
            "the explicit tenant, not the template"
        );
        assert!(
            all.get("default").unwrap().ceiling.is_none(),
            "the operator's, untouched"
        );
        assert_eq!(all.len(), 4);
    }

    #[test]
    fn node_ip_in_a_ceiling_is_the_node_s_address_or_a_problem() {
        assert_eq!(with_node_ip("$(NODE_IP):*", Some("10.1.2.3")), Ok("10.1.2.3:*".into()));
        assert_eq!(
            with_node_ip("$(NODE_IP):9099", Some("2001:db8::7")),
            Ok("[2001:db8::7]:9099".into())
        );
        assert_eq!(with_node_ip("10.0.0.0/8:*", None), Ok("10.0.0.0/8:*".into()));
        assert_eq!(with_node_ip("$(NODE_IP):*", None), Err(None));
        assert_eq!(with_node_ip("$(NODE_IP):*", Some("node-1")), Err(Some("node-1".into())));
        let text =
            "kubernetes:\n  node_ip: not-an-ip\ntenants:\n  - id: node\n    ceiling: {net: [\"$(NODE_IP):*\"]}\n";
        let (_, p) = run(text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("t.yaml:5:21: ceiling.net: tenant \"node\": \"$(NODE_IP):*\": $(NODE_IP) is the node's address, and \"not-an-ip\""),
            "{}",
            p[0]
        );
        let (s, p) = run(&text.replace("not-an-ip", "192.168.7.9"));
        assert!(p.is_empty(), "{p:?}");
        let node = s.tenants.iter().find(|t| &*t.id == "node").unwrap();
        assert!(
            format!("{:?}", node.ceiling).contains("192.168.7.9"),
            "{:?}",
            node.ceiling
        );
    }
}
