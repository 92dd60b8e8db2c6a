//! The registry: a parsed config file resolved into what the scheduler
//! runs — each probe with its plugin loaded, its config checked against the
//! plugin's JSON Schema, its grants parsed and its defaults filled in.
//! Every problem is reported with the file, line and column it comes from,
//! all of them at once, and nothing is half-loaded: [`Registry::load`]
//! returns a whole registry or the list of errors.

use crate::config::{self, ConfigError, ConfigErrors, Kind, Place, Spanned};
use crate::engine::{Engine, Limits, Plugin, limits};
use crate::host::{Grants, NetPattern};
use crate::tenants::{self, CeilingError, Quotas, Tenant, TenantId, Tenants};
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The shortest period a probe may have.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);
/// Default period.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// Default timeout of one run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default failure threshold.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// Default timeout of an `on_failure` action.
pub const DEFAULT_ACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// A command run after a liveness or startup failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionSpec {
    /// Program (absolute path) and arguments.
    pub argv: Vec<String>,
    /// Past it, the program's whole process group is killed.
    pub timeout: Duration,
    /// Its environment.
    pub env: Vec<(String, String)>,
}

/// A target: a service and the names of its probes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// Its name.
    pub name: Arc<str>,
    /// Its address.
    pub address: String,
    /// The tenant that owns it and its probes.
    pub tenant: TenantId,
    /// What to run when a liveness or startup probe fails.
    pub on_failure: Option<ActionSpec>,
}

/// One probe, resolved and ready to run.
#[derive(Clone)]
pub struct ProbeSpec {
    /// Unique name.
    pub name: Arc<str>,
    /// Its target's name.
    pub target: Arc<str>,
    /// Its target's tenant.
    pub tenant: TenantId,
    /// Its kind.
    pub kind: Kind,
    /// The plugin as written in the config (`http`, `./check.wasm`).
    pub plugin_ref: String,
    /// The loaded plugin.
    pub plugin: Arc<Plugin>,
    /// What the plugin probes (`host:port` or URL).
    pub address: String,
    /// The plugin config, as JSON text.
    pub config: String,
    /// Time between runs.
    pub period: Duration,
    /// No run before this much time after the target (re)started.
    pub initial_delay: Duration,
    /// Passes in a row that make the state `success`.
    pub success_threshold: u32,
    /// Failures in a row that make the state `failure`.
    pub failure_threshold: u32,
    /// Deadline, fuel and memory of one run.
    pub limits: Limits,
    /// What it may reach besides its target.
    pub grants: Arc<Grants>,
    /// Aggregation groups.
    pub groups: Arc<[String]>,
}

impl fmt::Debug for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProbeSpec")
            .field("name", &self.name)
            .field("tenant", &self.tenant)
            .field("kind", &self.kind)
            .field("plugin", &self.plugin_ref)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl PartialEq for ProbeSpec {
    /// Same probe, same behaviour: a reload keeps its state and schedule.
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
            && self.target == o.target
            && self.tenant == o.tenant
            && self.kind == o.kind
            && self.plugin.digest() == o.plugin.digest()
            && self.address == o.address
            && self.config == o.config
            && self.period == o.period
            && self.initial_delay == o.initial_delay
            && self.success_threshold == o.success_threshold
            && self.failure_threshold == o.failure_threshold
            && self.limits == o.limits
            && self.grants == o.grants
            && self.groups == o.groups
    }
}

/// A whole resolved config.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// The file it came from (none for the embedded default).
    pub source: Option<PathBuf>,
    /// `api:` from the file.
    pub api: Option<std::net::SocketAddr>,
    /// `state_dir:` from the file.
    pub state_dir: Option<PathBuf>,
    /// `health_timeout:` from the file, if set.
    pub health_timeout: Option<Duration>,
    /// `require_signed:` from the file.
    pub require_signed: bool,
    /// `tenants:` from the file, the operator's `default` first, with the
    /// API tokens.
    pub tenants: Arc<Tenants>,
    /// Targets, in file order.
    pub targets: Vec<Arc<TargetSpec>>,
    /// Probes, in file order.
    pub probes: Vec<Arc<ProbeSpec>>,
    /// What deserves attention but does not stop the load: a probe whose
    /// grants do not cover what its plugin says it needs.
    pub warnings: Vec<ConfigError>,
}

/// How plugin files must be signed.
#[derive(Default)]
struct Trust {
    keys: Vec<crate::signing::PublicKey>,
    required: bool,
}

struct Errors {
    file: PathBuf,
    list: Vec<ConfigError>,
}

impl Errors {
    fn at<T>(&mut self, s: &Spanned<T>, message: impl Into<String>) {
        self.at_loc(&s.referenced, message);
    }

    fn at_loc(&mut self, loc: &serde_saphyr::Location, message: impl Into<String>) {
        self.list.push(ConfigError {
            place: config::place(&self.file, loc),
            message: message.into(),
        });
    }

    fn place<T>(&self, s: &Spanned<T>) -> Place {
        config::place(&self.file, &s.referenced)
    }
}

/// A name of a target, probe or group: 1-128 letters, digits, `-`, `_`, `.`.
pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl Registry {
    /// Reads, parses and resolves the config file at `path`.
    pub async fn load_file(engine: &Engine, path: &Path) -> Result<Self, ConfigErrors> {
        let (file, _) = config::read(path)?;
        Self::load(engine, path, file).await
    }

    /// Parses and resolves config `text`, reported as coming from `path`.
    pub async fn load_text(engine: &Engine, path: &Path, text: &str) -> Result<Self, ConfigErrors> {
        let file = config::parse(path, text)?;
        Self::load(engine, path, file).await
    }

    /// Resolves a parsed file: loads plugins (relative paths from the
    /// file's directory), checks configs against their schemas, parses
    /// grants, fills in defaults. Returns every error found.
    pub async fn load(engine: &Engine, path: &Path, file: config::File) -> Result<Self, ConfigErrors> {
        let mut errs = Errors {
            file: path.to_path_buf(),
            list: Vec::new(),
        };
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut reg = Registry {
            source: Some(path.to_path_buf()),
            state_dir: file.state_dir.as_ref().map(|d| base.join(d)),
            ..Registry::default()
        };
        if let Some(api) = &file.api {
            match api.value.parse() {
                Ok(a) => reg.api = Some(a),
                Err(_) => errs.at(
                    api,
                    format!("api: {:?} is not an address such as 127.0.0.1:9464", api.value),
                ),
            }
        }
        if let Some(t) = &file.health_timeout {
            if t.value.0 < Duration::from_secs(1) {
                errs.at(t, "health_timeout: must be at least 1s".to_string());
            }
            reg.health_timeout = Some(t.value.0);
        }
        let mut trust = Trust {
            keys: Vec::new(),
            required: file.require_signed.as_ref().is_some_and(|r| r.value),
        };
        reg.require_signed = trust.required;
        for k in &file.trust {
            let path = base.join(&k.value);
            match crate::signing::PublicKey::read(&path) {
                Ok(key) => trust.keys.push(key),
                Err(e) => errs.at(k, format!("trust: {e}")),
            }
        }
        if let Some(r) = &file.require_signed
            && r.value
            && file.trust.is_empty()
        {
            errs.at(
                r,
                "require_signed: no `trust` keys are listed, so no plugin file could be accepted",
            );
        }
        let tenants = load_tenants(&mut errs, &base, &file);
        let mut probe_counts: HashMap<TenantId, usize> = HashMap::new();
        let mut plugins: HashMap<String, Result<Arc<Plugin>, String>> = HashMap::new();
        let mut schemas: HashMap<String, Option<Arc<jsonschema::Validator>>> = HashMap::new();
        let mut target_names: HashMap<String, Place> = HashMap::new();
        let mut probe_names: HashMap<String, Place> = HashMap::new();

        for t in &file.targets {
            errs.file = t.source.clone().unwrap_or_else(|| path.to_path_buf());
            let name = t.name.value.trim();
            if !valid_name(name) {
                errs.at(
                    &t.name,
                    format!("name: {name:?} must be 1-128 letters, digits, `-`, `_` or `.`"),
                );
            } else if let Some(first) = target_names.get(name) {
                errs.at(&t.name, format!("name: target {name:?} is already defined at {first}"));
            } else {
                target_names.insert(name.to_string(), errs.place(&t.name));
            }
            if let Err(e) = NetPattern::for_target(&t.address.value) {
                errs.at(&t.address, format!("address: {e}"));
            }
            // `None` for a tenant not defined (an error already): its
            // probes are not checked against any ceiling.
            let tenant: Option<Arc<Tenant>> = match &t.tenant {
                None => Some(tenants.operator().clone()),
                Some(id) => {
                    let found = tenants.get(id.value.trim()).cloned();
                    if found.is_none() {
                        let known: Vec<&str> = tenants.iter().skip(1).map(|t| &*t.id).collect();
                        errs.at(
                            id,
                            format!(
                                "tenant: no tenant {:?} is defined (tenants: {})",
                                id.value.trim(),
                                if known.is_empty() {
                                    "none".to_string()
                                } else {
                                    known.join(", ")
                                }
                            ),
                        );
                    }
                    found
                }
            };
            let tenant_id: TenantId = match (&tenant, &t.tenant) {
                (Some(t), _) => t.id.clone(),
                (None, Some(id)) => id.value.trim().into(),
                (None, None) => tenants::DEFAULT_TENANT.into(),
            };
            let quotas = tenant.as_ref().map_or(Quotas::UNLIMITED, |t| t.quotas);
            let defaults = quotas.default_limits();
            let on_failure = t.on_failure.as_ref().and_then(|a| {
                let argv = &a.command.value;
                match argv.first() {
                    None => {
                        errs.at(
                            &a.command,
                            "on_failure.command: empty; give the program's absolute path first",
                        );
                        None
                    }
                    Some(p) if !Path::new(p).is_absolute() || !Path::new(p).is_file() => {
                        errs.at(
                            &a.command,
                            format!("on_failure.command: {p:?} must be the absolute path of an existing program"),
                        );
                        None
                    }
                    Some(_) => Some(ActionSpec {
                        argv: argv.clone(),
                        timeout: a.timeout.map_or(DEFAULT_ACTION_TIMEOUT, |d| d.0),
                        env: a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    }),
                }
            });
            let target: Arc<str> = name.into();
            reg.targets.push(Arc::new(TargetSpec {
                name: target.clone(),
                address: t.address.value.trim().to_string(),
                tenant: tenant_id.clone(),
                on_failure,
            }));

            let mut startup_seen = false;
            for p in &t.probes {
                let kind = p.kind.as_ref().map_or(Kind::Readiness, |k| k.value);
                if kind == Kind::Startup {
                    if startup_seen && let Some(k) = &p.kind {
                        errs.at(
                            k,
                            format!("kind: target {name:?} already has a startup probe; it may have one"),
                        );
                    }
                    startup_seen = true;
                }
                let (pname, pplace) = match &p.name {
                    Some(n) => (n.value.trim().to_string(), errs.place(n)),
                    None => (format!("{name}-{kind}"), errs.place(&p.plugin)),
                };
                if !valid_name(&pname) {
                    errs.list.push(ConfigError {
                        place: pplace.clone(),
                        message: format!("name: {pname:?} must be 1-128 letters, digits, `-`, `_` or `.`"),
                    });
                } else if let Some(first) = probe_names.get(&pname) {
                    let hint = if p.name.is_none() {
                        " (the default `<target>-<kind>`; give each a `name`)"
                    } else {
                        ""
                    };
                    errs.list.push(ConfigError {
                        place: pplace.clone(),
                        message: format!("name: probe {pname:?}{hint} is already defined at {first}"),
                    });
                } else {
                    probe_names.insert(pname.clone(), pplace.clone());
                }
                let count = probe_counts.entry(tenant_id.clone()).or_default();
                *count += 1;
                if *count == quotas.max_probes.saturating_add(1) {
                    errs.list.push(ConfigError {
                        place: pplace.clone(),
                        message: format!(
                            "quotas.max_probes: tenant {tenant_id:?}: probe {pname:?} is over the tenant's quota of {} probes",
                            quotas.max_probes
                        ),
                    });
                }

                let success_threshold = p.success_threshold.as_ref().map_or(1, |s| s.value);
                if let Some(s) = &p.success_threshold {
                    if s.value == 0 {
                        errs.at(s, "success_threshold: must be at least 1");
                    } else if s.value != 1 && kind != Kind::Readiness {
                        errs.at(
                            s,
                            format!("success_threshold: must be 1 for a {kind} probe (it is {})", s.value),
                        );
                    }
                }
                let failure_threshold = p
                    .failure_threshold
                    .as_ref()
                    .map_or(DEFAULT_FAILURE_THRESHOLD, |s| s.value);
                if let Some(f) = &p.failure_threshold
                    && f.value == 0
                {
                    errs.at(f, "failure_threshold: must be at least 1");
                }
                let period = p.period.as_ref().map_or(DEFAULT_PERIOD, |d| d.value.0);
                if let Some(d) = &p.period
                    && d.value.0 < MIN_PERIOD
                {
                    errs.at(
                        d,
                        format!(
                            "period: {} is below the 100ms minimum",
                            humantime::format_duration(d.value.0)
                        ),
                    );
                }
                let timeout = p.timeout.as_ref().map_or(defaults.timeout, |d| d.value.0);
                if let Some(d) = &p.timeout
                    && d.value.0.is_zero()
                {
                    errs.at(d, "timeout: must be more than zero");
                }
                let memory = p.limits.memory.as_ref().map_or(defaults.memory, |m| m.value.0);
                if let Some(m) = &p.limits.memory
                    && m.value.0 > limits::MAX_MEMORY
                {
                    errs.at(
                        m,
                        format!(
                            "limits.memory: {} is more than the 1GiB ceiling",
                            bytesize::ByteSize(m.value.0)
                        ),
                    );
                }

                let address = match &p.target {
                    Some(t) => {
                        if let Err(e) = NetPattern::for_target(&t.value) {
                            errs.at(t, format!("target: {e}"));
                        }
                        t.value.trim().to_string()
                    }
                    None => t.address.value.trim().to_string(),
                };

                let mut grants = Grants::default();
                // Where each parsed `net` grant is written.
                let mut net_at = Vec::new();
                for n in &p.grants.net {
                    match n.value.parse() {
                        Ok(g) => {
                            grants.net.push(g);
                            net_at.push(n);
                        }
                        Err(e) => errs.at(n, format!("grants.net: {e}")),
                    }
                }
                for x in &p.grants.exec {
                    if !x.value.is_absolute() || !x.value.is_file() {
                        errs.at(
                            x,
                            format!(
                                "grants.exec: {} must be the absolute path of an existing program",
                                x.value.display()
                            ),
                        );
                    }
                    grants.exec.push(x.value.clone());
                }
                for f in &p.grants.files {
                    if !f.value.is_absolute() || !f.value.is_dir() {
                        errs.at(
                            f,
                            format!(
                                "grants.files: {} must be the absolute path of a directory",
                                f.value.display()
                            ),
                        );
                    }
                    grants.files.push(f.value.clone());
                }
                grants.env = p.grants.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                let limits = Limits {
                    timeout,
                    fuel: p.limits.fuel.as_ref().map_or(defaults.fuel, |f| f.value),
                    memory,
                };
                if let Some(tenant) = &tenant {
                    for e in tenant.check(&pname, &address, &grants, &limits) {
                        let (key, loc) = match &e {
                            CeilingError::Target { .. } => match &p.target {
                                Some(t) => ("target", t.referenced),
                                None => ("address", t.address.referenced),
                            },
                            CeilingError::Net { index, .. } => ("grants.net", net_at[*index].referenced),
                            CeilingError::Exec { index, .. } => ("grants.exec", p.grants.exec[*index].referenced),
                            CeilingError::Files { index, .. } => ("grants.files", p.grants.files[*index].referenced),
                            CeilingError::Limit { limit, .. } => (
                                *limit,
                                match *limit {
                                    "timeout" => p.timeout.as_ref().map(|s| s.referenced),
                                    "limits.fuel" => p.limits.fuel.as_ref().map(|s| s.referenced),
                                    _ => p.limits.memory.as_ref().map(|s| s.referenced),
                                }
                                .unwrap_or(p.plugin.referenced),
                            ),
                        };
                        errs.at_loc(&loc, format!("{key}: {e}"));
                    }
                }
                for g in &p.groups {
                    if !valid_name(g) {
                        errs.at(
                            &p.plugin,
                            format!("groups: {g:?} must be 1-128 letters, digits, `-`, `_` or `.`"),
                        );
                    }
                }

                let plugin = match plugins.get(&p.plugin.value) {
                    Some(r) => r.clone(),
                    None => {
                        let r = resolve_plugin(engine, &base, &p.plugin.value, &trust).await;
                        plugins.insert(p.plugin.value.clone(), r.clone());
                        r
                    }
                };
                let plugin = match plugin {
                    Ok(pl) => pl,
                    Err(e) => {
                        errs.at(&p.plugin, format!("plugin: {e}"));
                        continue;
                    }
                };
                let config = p
                    .config
                    .as_ref()
                    .map_or_else(|| serde_json::json!({}), |c| c.value.clone());
                let validator = schemas
                    .entry(plugin.digest().to_string())
                    .or_insert_with(|| {
                        let schema = plugin.info().config_schema.as_deref()?;
                        let schema: serde_json::Value = serde_json::from_str(schema).ok()?;
                        jsonschema::validator_for(&schema).ok().map(Arc::new)
                    })
                    .clone();
                if let Some(v) = validator {
                    for e in v.iter_errors(&config).take(5) {
                        let path = e.instance_path().to_string();
                        let at = if path.is_empty() {
                            String::new()
                        } else {
                            format!(" at {path}")
                        };
                        let loc = p.config.as_ref().map_or(p.plugin.referenced, |c| c.referenced);
                        errs.at_loc(&loc, format!("config{at}: {e} (plugin {})", p.plugin.value));
                    }
                }
                for missing in ungranted(plugin.info(), &grants, &address) {
                    reg.warnings.push(ConfigError {
                        place: errs.place(&p.plugin),
                        message: format!(
                            "probe {pname:?}: plugin {} asks for {missing}, which its grants do not cover",
                            p.plugin.value
                        ),
                    });
                }
                reg.probes.push(Arc::new(ProbeSpec {
                    name: pname.into(),
                    target: target.clone(),
                    tenant: tenant_id.clone(),
                    kind,
                    plugin_ref: p.plugin.value.clone(),
                    plugin,
                    address,
                    config: config.to_string(),
                    period,
                    initial_delay: p.initial_delay.map_or(Duration::ZERO, |d| d.0),
                    success_threshold,
                    failure_threshold,
                    limits,
                    grants: Arc::new(grants),
                    groups: p.groups.clone().into(),
                }));
            }
        }
        reg.tenants = Arc::new(tenants);
        if errs.list.is_empty() {
            Ok(reg)
        } else {
            Err(ConfigErrors(errs.list))
        }
    }

    /// The probes `tenant` owns.
    pub fn probes_of_tenant<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Arc<ProbeSpec>> + 'a {
        self.probes.iter().filter(move |p| &*p.tenant == tenant)
    }

    /// The probes of `target`.
    pub fn probes_of<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a Arc<ProbeSpec>> + 'a {
        self.probes.iter().filter(move |p| &*p.target == target)
    }
}

/// Reads `tenants:` and the operator's token: ids unique and not
/// `default`, tokens readable, private and different, quotas sane, ceilings
/// parsed. Token paths are relative to `base`.
fn load_tenants(errs: &mut Errors, base: &Path, file: &config::File) -> Tenants {
    let mut list: Vec<Tenant> = Vec::new();
    let mut places: Vec<Place> = Vec::new();
    let read = |errs: &mut Errors,
                who: &str,
                f: &Option<Spanned<PathBuf>>,
                env: &Option<Spanned<String>>,
                fallback: &serde_saphyr::Location| {
        let path = f.as_ref().map(|f| base.join(&f.value));
        let loc = f
            .as_ref()
            .map(|f| f.referenced)
            .or(env.as_ref().map(|e| e.referenced))
            .unwrap_or(*fallback);
        match tenants::read_token(path.as_deref(), env.as_ref().map(|e| e.value.trim())) {
            Ok(t) => t,
            Err(e) => {
                errs.at_loc(&loc, format!("{who}: {e}"));
                None
            }
        }
    };
    for t in &file.tenants {
        let id = t.id.value.trim();
        // A tenant with a bad id is reported and left out.
        let mut keep = true;
        if !valid_name(id) {
            errs.at(
                &t.id,
                format!("id: {id:?} must be 1-128 letters, digits, `-`, `_` or `.`"),
            );
            keep = false;
        } else if id == tenants::DEFAULT_TENANT {
            errs.at(
                &t.id,
                "id: \"default\" is the operator's tenant (targets without `tenant:`); choose another id",
            );
            keep = false;
        } else if let Some(i) = list.iter().position(|o| &*o.id == id) {
            errs.at(&t.id, format!("id: tenant {id:?} is already defined at {}", places[i]));
            keep = false;
        }
        let token = read(
            errs,
            &format!("tenant {id:?}"),
            &t.token_file,
            &t.token_env,
            &t.id.referenced,
        );
        let q = &t.quotas;
        let d = Quotas::default();
        let quotas = Quotas {
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
        };
        if let Some(m) = &q.max_concurrent_runs
            && m.value == 0
        {
            errs.at(
                m,
                format!("quotas.max_concurrent_runs: tenant {id:?}: must be at least 1"),
            );
        }
        if let Some(m) = &q.timeout
            && m.value.0.is_zero()
        {
            errs.at(m, format!("quotas.timeout: tenant {id:?}: must be more than zero"));
        }
        if let Some(m) = &q.fuel
            && m.value == 0
        {
            errs.at(m, format!("quotas.fuel: tenant {id:?}: must be more than zero"));
        }
        if let Some(m) = &q.memory
            && (m.value.0 == 0 || m.value.0 > limits::MAX_MEMORY)
        {
            errs.at(
                m,
                format!("quotas.memory: tenant {id:?}: must be more than zero and at most 1GiB"),
            );
        }
        let mut ceiling = tenants::Ceiling::default();
        for n in &t.ceiling.net {
            match n.value.parse() {
                Ok(p) => ceiling.net.push(p),
                Err(e) => errs.at(n, format!("ceiling.net: tenant {id:?}: {e}")),
            }
        }
        for (key, paths, out) in [
            ("ceiling.exec", &t.ceiling.exec, &mut ceiling.exec),
            ("ceiling.files", &t.ceiling.files, &mut ceiling.files),
        ] {
            for p in paths {
                if !p.value.is_absolute() {
                    errs.at(
                        p,
                        format!("{key}: tenant {id:?}: {} must be an absolute path", p.value.display()),
                    );
                }
                out.push(p.value.clone());
            }
        }
        if !keep {
            continue;
        }
        places.push(errs.place(&t.id));
        list.push(Tenant {
            id: id.into(),
            quotas,
            ceiling: Some(ceiling),
            token,
        });
    }
    let start = serde_saphyr::Location::UNKNOWN;
    let operator = read(
        errs,
        "operator token",
        &file.operator_token_file,
        &file.operator_token_env,
        &start,
    );
    // One token, one principal: a token shared by two would let one act as
    // the other.
    for (i, t) in list.iter().enumerate() {
        let Some(token) = &t.token else { continue };
        let clash = if operator.as_ref() == Some(token) {
            Some("the operator".to_string())
        } else {
            list[..i]
                .iter()
                .find(|o| o.token.as_ref() == Some(token))
                .map(|o| format!("tenant {:?}", o.id))
        };
        if let Some(other) = clash {
            errs.list.push(ConfigError {
                place: places[i].clone(),
                message: format!(
                    "token: tenant {:?} has the same token as {other}; each needs its own",
                    t.id
                ),
            });
        }
    }
    Tenants::new(list, operator)
}

/// What a plugin's `describe` asks for that `grants` (and the target) do
/// not give, as `kind value (why)` texts. A `files` value of `*` means "some
/// path the config names": any `files` grant covers it.
fn ungranted(info: &crate::engine::PluginInfo, grants: &Grants, address: &str) -> Vec<String> {
    use crate::engine::CapabilityKind;
    let target = NetPattern::for_target(address).ok();
    info.capabilities
        .iter()
        .filter(|c| match c.kind {
            CapabilityKind::Net => {
                let text = c.value.trim();
                let covered = |p: &NetPattern| p.to_string() == text;
                !(grants.net.iter().any(covered) || target.as_ref().is_some_and(covered))
            }
            CapabilityKind::Exec => !grants.exec.iter().any(|p| p.as_os_str() == c.value.as_str()),
            CapabilityKind::Files => {
                if c.value.trim() == "*" {
                    grants.files.is_empty()
                } else {
                    !grants.files.iter().any(|d| Path::new(&c.value).starts_with(d))
                }
            }
        })
        .map(|c| format!("{} {} ({})", c.kind.as_str(), c.value, c.why))
        .collect()
}

/// Loads a built-in by name, or a `.wasm` file by path (relative to `base`),
/// checking its signature first when `trust.required`. The bytes checked
/// are the bytes loaded.
async fn resolve_plugin(engine: &Engine, base: &Path, name: &str, trust: &Trust) -> Result<Arc<Plugin>, String> {
    if name.contains('/') || name.ends_with(".wasm") {
        let path = base.join(name);
        if !trust.required {
            return engine.load_file(&path).await.map_err(|e| e.to_string());
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let sig = crate::signing::read_signature(&path).map_err(|e| e.to_string())?;
        let label = path.display().to_string();
        let sig_name = crate::signing::signature_path(&path).display().to_string();
        let signer = crate::signing::verify(&label, &bytes, &sig_name, sig.as_deref(), &trust.keys)
            .map_err(|e| format!("refused (require_signed): {e}"))?;
        tracing::info!(plugin = %label, signer = %signer.name, key = %signer.key_id, "plugin signature verified");
        return engine.load(&label, &bytes).await.map_err(|e| e.to_string());
    }
    match crate::builtins::get(name) {
        Some(bytes) => engine.load(name, bytes).await.map_err(|e| e.to_string()),
        None => Err(format!(
            "unknown built-in {name:?} (built-ins: {}); a file needs a path such as ./{name}.wasm",
            crate::builtins::names().collect::<Vec<_>>().join(", ")
        )),
    }
}
