//! The catalog: a parsed config resolved into what the scheduler runs —
//! each probe with its plugin loaded, its config checked against the
//! plugin's JSON Schema, its grants parsed, its defaults filled in, its
//! tenant's quotas and ceiling respected.
//!
//! It is a pipeline of small steps, each testable on its own:
//!
//! 1. **parse** — [`config::parse`] checks the file's shape;
//! 2. **settings** — [`settings`] reads the agent-wide keys and the tenants;
//! 3. **normalise** — [`probe`] fills in one target's and its probes'
//!    defaults and checks each key on its own;
//! 4. **check** — [`admit`] checks what depends on the rest of the
//!    registry: unique names, probe quotas, ceilings;
//! 5. **resolve** — [`resolve`] loads the plugin (signature first when
//!    required) and checks the config against its schema;
//! 6. **build** — the [`ProbeSpec`]s, committed by [`Catalog::commit`].
//!
//! A whole file goes through the pipeline as one [`Change`] on an empty
//! catalog ([`Catalog::load`]); a probe added, replaced or removed at run
//! time (an API upload, a stored probe, a Kubernetes Pod) goes through the
//! same steps as a [`Change`] on the current registry, so the refusal rules
//! are the same and the cost is that of the change, not of the catalog.
//! Every problem is reported with the file, line and column it comes from,
//! all of them at once; nothing is half-applied: a change is prepared
//! (checked) whole, then committed, or refused with the list of errors.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sonde_sandbox::engine::{Engine, EngineConfig};
//! use sonde_core::catalog::{Change, Catalog};
//! use std::path::Path;
//!
//! let engine = Engine::new(EngineConfig::default())?;
//! let mut catalog = Catalog::load_text(&engine, Path::new("sonde.yaml"), "targets: []").await?;
//! let file = sonde_core::config::parse(
//!     Path::new("PUT /v1/probes/db"),
//!     "targets:\n  - name: db\n    address: 127.0.0.1:5432\n    probes: [{plugin: tcp}]\n",
//! )?;
//! let prepared = catalog.prepare(&engine, Change::add(file.targets)).await?;
//! let delta = catalog.commit(prepared);
//! assert_eq!(delta.probes.len(), 1);
//! # Ok(())
//! # }
//! ```

mod admit;
mod change;
pub mod modules;
pub mod mounts;
pub mod npd;
pub mod otlp;
mod outcome;
pub mod probe;
pub mod problem;
pub mod pulls;
pub mod resolve;
mod secrets;
pub mod settings;
mod signers;
mod tokens;

use crate::config::{self, ConfigError, ConfigErrors, Kind, Place};
use crate::tenants::{TenantId, Tenants};
use indexmap::IndexMap;
use sonde_sandbox::engine::{Engine, Limits, Plugin};
use sonde_sandbox::host::Grants;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use change::{Change, Delta, Prepared, Pull, TargetUpdate, Unavailable, Waiting};
pub use outcome::{PullCost, ResolveError};
pub use problem::{ConfigProblem, Located, Owner};
pub use resolve::Trust;

/// The shortest period a probe may have.
pub const MIN_PERIOD: Duration = Duration::from_millis(100);
/// Default period.
pub(crate) const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// Default timeout of one run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default failure threshold.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// Default timeout of an `on_failure` action.
pub(crate) const DEFAULT_ACTION_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// Whether its HTTP and gRPC requests carry the run's trace context.
    pub propagate: bool,
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
    /// Extra labels on its series and its API entry, sorted by name.
    pub labels: Arc<[(String, String)]>,
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
            && self.propagate == o.propagate
            && self.success_threshold == o.success_threshold
            && self.failure_threshold == o.failure_threshold
            && self.limits == o.limits
            && self.grants == o.grants
            && self.groups == o.groups
            && self.labels == o.labels
    }
}

/// The most extra labels a probe may carry.
pub(crate) const MAX_LABELS: usize = 8;
/// The labels sonde's own per-probe series carry, which a probe's extra
/// labels may not shadow.
pub(crate) const RESERVED_LABELS: &[&str] = &[
    "probe", "target", "kind", "tenant", "state", "status", "reason", "metric", "unit", "plugin", "le", "quantile",
];

/// What is wrong with label `name` = `value`, if anything.
pub(crate) fn label_problem(name: &str, value: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    let well_formed = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Some("is not a label name (`[a-zA-Z_][a-zA-Z0-9_]*`)");
    }
    if name.starts_with("__") {
        return Some("starts with `__`, which Prometheus keeps for itself");
    }
    if RESERVED_LABELS.contains(&name) {
        return Some(
            "is one of sonde's own labels (probe, target, kind, tenant, state, status, reason, metric, unit, plugin)",
        );
    }
    if value.is_empty() || value.len() > 256 {
        return Some("needs a value of 1-256 bytes");
    }
    None
}

/// A name of a target, probe, group or tenant: 1-128 letters, digits, `-`,
/// `_`, `.`.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A target in the registry: its spec, where it was defined, and its
/// probes with theirs.
#[derive(Clone, Debug)]
struct TargetEntry {
    spec: Arc<TargetSpec>,
    place: Place,
    probes: Vec<(Arc<str>, Place)>,
}

/// The agent-wide keys of a config file, which no probe change touches:
/// a reload replaces them whole.
#[derive(Clone, Debug, Default)]
pub struct AgentWide {
    /// `api:` from the file.
    pub api: Option<std::net::SocketAddr>,
    /// The API's limits (`api: {...}`), defaults filled in.
    pub api_limits: config::ApiLimits,
    /// `api: {auth: ...}` from the file, if set (`--api-auth` overrides it).
    pub api_auth: Option<crate::auth::ApiAuth>,
    /// What plugins' calls may make the host hold (`sandbox: {...}`),
    /// defaults filled in; the agent puts them in force in its engine at
    /// start and at every reload.
    pub host_limits: sonde_sandbox::host::bounds::HostLimits,
    /// `kubernetes:` from the file, as written (`sonde run` checks it
    /// with `sonde::agent::start_problems`).
    pub kubernetes: Option<config::KubernetesSpec>,
    /// `state_dir:` from the file.
    pub state_dir: Option<PathBuf>,
    /// `health_timeout:` from the file, if set.
    pub health_timeout: Option<Duration>,
    /// `require_signed:` from the file.
    pub require_signed: bool,
    /// The `otlp:` blocks, checked (the agent reads them once, at start).
    pub otlp: otlp::Exports,
}

/// A whole resolved config.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// The file it came from (none for the embedded default).
    pub source: Option<PathBuf>,
    /// What the file sets for the agent as a whole, apart from its
    /// probes: where the API listens and its limits, the host's bounds,
    /// the state directory, the `kubernetes:` block.
    pub agent: AgentWide,
    /// `tenants:` from the file, the operator's `default` first, with the
    /// API tokens.
    pub tenants: Arc<Tenants>,
    /// What deserves attention but does not stop the load: a probe whose
    /// grants do not cover what its plugin says it needs, a probe left out.
    pub warnings: Vec<ConfigError>,
    /// Probes of the file left out because their `oci://` plugin could not
    /// be pulled and was not cached (the registry down at start).
    pub unavailable: Vec<Unavailable>,
    /// Probes of the file left out until their `oci://` plugin, being
    /// pulled in the background, lands (in the agent).
    pub waiting: Vec<Waiting>,
    /// What the last whole load's `oci://` plugins cost to resolve, by
    /// tenant; for the agent to account and clear.
    pub pulls: Vec<Pull>,
    /// `modules:` from the file, each resolved as a probe of no target
    /// (`GET /probe`, [`modules`]).
    pub modules: Arc<modules::Modules>,
    /// `node_problem_detector:` from the file, each monitor's rules
    /// resolved as probes of no schedule ([`npd`]).
    pub npd: Arc<npd::Monitors>,
    /// `node_problem_detector:` entries whose file is a system-log monitor
    /// ([`npd::LogMonitor`]).
    pub npd_logs: Arc<npd::LogMonitors>,
    /// `kubernetes.namespace_templates`, parsed: the agent adds the tenants
    /// they make for labelled namespaces ([`settings::generate`]) after the
    /// file's targets and the stored probes are loaded, so that only
    /// SondeChecks' probes can be theirs.
    pub namespace_templates: Arc<settings::NamespaceTemplates>,
    /// The config file's path, which errors name, and its directory, which
    /// relative plugin paths start from.
    path: PathBuf,
    base: PathBuf,
    trust: Arc<Trust>,
    /// How `oci://` plugins are pulled.
    oci: Option<Arc<sonde_oci::ClientSettings>>,
    cache: resolve::Cache,
    targets: IndexMap<Arc<str>, TargetEntry>,
    probes: IndexMap<Arc<str>, Arc<ProbeSpec>>,
    /// Probes per tenant.
    counts: HashMap<TenantId, usize>,
    /// Bumped by every commit: a change prepared against another
    /// generation is refused.
    generation: u64,
}

impl Catalog {
    /// How `oci://` plugins are pulled (`oci:`, defaults filled in).
    pub fn oci_settings(&self) -> Option<&sonde_oci::ClientSettings> {
        self.oci.as_deref()
    }

    /// The `trust:` and `require_signed:` in force.
    pub fn trust(&self) -> &Arc<Trust> {
        &self.trust
    }

    /// The key ids of `trust:`, in the file's order.
    pub fn trusted_keys(&self) -> Vec<&str> {
        self.trust.keys.iter().map(|k| k.key_id()).collect()
    }

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

    /// Resolves a parsed file: the agent-wide settings, then every target
    /// as one change on an empty catalog. Returns every error found.
    /// Every `oci://` plugin is resolved before it returns.
    pub async fn load(engine: &Engine, path: &Path, file: config::File) -> Result<Self, ConfigErrors> {
        Self::load_with(engine, path, file, resolve::Cache::default()).await
    }

    /// As [`Catalog::load`], keeping what `cache` resolved before; with a
    /// [`resolve::Cache::background`] (the agent's) no `oci://` plugin is
    /// waited for: the probes that need one not at hand are
    /// [`Catalog::waiting`] while it is pulled.
    pub(crate) async fn load_with(
        engine: &Engine,
        path: &Path,
        mut file: config::File,
        cache: resolve::Cache,
    ) -> Result<Self, ConfigErrors> {
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut located = Vec::new();
        let s = settings::settings(path, &base, &file, &mut located);
        let mut errors: Vec<ConfigError> = located.into_iter().map(|l| l.into_error(path)).collect();
        let mut catalog = Catalog {
            source: Some(path.to_path_buf()),
            agent: AgentWide {
                api: s.api,
                api_limits: s.api_limits,
                api_auth: s.api_auth,
                host_limits: s.host_limits,
                kubernetes: file.kubernetes.take(),
                state_dir: s.state_dir,
                health_timeout: s.health_timeout,
                require_signed: s.trust.required,
                otlp: s.otlp,
            },
            tenants: Arc::new(s.tenants),
            path: path.to_path_buf(),
            base,
            trust: Arc::new(s.trust),
            oci: s.oci.map(Arc::new),
            namespace_templates: Arc::new(s.namespace_templates),
            cache,
            ..Catalog::default()
        };
        let targets = std::mem::take(&mut file.targets);
        let modules = std::mem::take(&mut file.modules);
        let monitors = std::mem::take(&mut file.node_problem_detector);
        let mut prepared = admit::prepare(&catalog, engine, Change::add(targets), &mut errors).await;
        catalog.pulls = std::mem::take(&mut prepared.pulls);
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        catalog.warnings = prepared.warnings.clone();
        catalog.unavailable = std::mem::take(&mut prepared.unavailable);
        catalog.waiting = std::mem::take(&mut prepared.waiting);
        for u in &catalog.unavailable {
            let mut w = u.error.clone();
            w.message = format!("{}; probe {} left out until its plugin can be had", w.message, u.probe);
            catalog.warnings.push(w);
        }
        let _ = catalog.commit(prepared);
        // Through the same steps as a probe, against the catalog loaded.
        let modules = modules::resolve(&catalog, engine, path, modules).await;
        let monitors = npd::resolve(&catalog, engine, path, monitors).await;
        match (modules, monitors) {
            (Ok(modules), Ok((monitors, logs))) => {
                catalog.modules = Arc::new(modules);
                catalog.npd = Arc::new(monitors);
                catalog.npd_logs = Arc::new(logs);
            }
            (modules, monitors) => {
                let mut errors = modules.err().map(|e| e.0).unwrap_or_default();
                errors.extend(monitors.err().map(|e| e.0).unwrap_or_default());
                return Err(ConfigErrors(errors));
            }
        }
        Ok(catalog)
    }

    /// A registry built in code (benchmarks, tests): `targets` and
    /// `probes` as they are, unchecked, owned by the operator's tenant set
    /// `tenants`.
    pub fn from_specs(tenants: Arc<Tenants>, targets: Vec<Arc<TargetSpec>>, probes: Vec<Arc<ProbeSpec>>) -> Self {
        let mut catalog = Catalog {
            tenants,
            ..Catalog::default()
        };
        let unknown = Place {
            file: PathBuf::new(),
            line: 0,
            column: 0,
        };
        for t in targets {
            catalog.targets.insert(
                t.name.clone(),
                TargetEntry {
                    spec: t,
                    place: unknown.clone(),
                    probes: Vec::new(),
                },
            );
        }
        for p in probes {
            if let Some(t) = catalog.targets.get_mut(&p.target) {
                t.probes.push((p.name.clone(), unknown.clone()));
            }
            *catalog.counts.entry(p.tenant.clone()).or_default() += 1;
            catalog.probes.insert(p.name.clone(), p);
        }
        catalog
    }

    /// Checks `change` against this catalog — the same rules as a whole
    /// load: names, quotas, ceilings, plugins, schemas — and returns it
    /// ready to commit, or every error found. Changes nothing.
    pub async fn prepare(&self, engine: &Engine, change: Change) -> Result<Prepared, ConfigErrors> {
        let mut errors = Vec::new();
        let mut prepared = admit::prepare(self, engine, change, &mut errors).await;
        // One probe asked for now: a plugin that cannot be had refuses it.
        // One being pulled is the caller's to tell ([`Prepared::waiting`]).
        errors.extend(prepared.unavailable.drain(..).map(|u| u.error));
        if errors.is_empty() {
            Ok(prepared)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Applies a change prepared against this catalog as it is now and
    /// returns what the scheduler must do.
    ///
    /// # Panics
    ///
    /// If the catalog changed since `prepared` was checked: its checks
    /// would no longer hold. Callers serialise prepare and commit (the
    /// agent's control lock).
    pub fn commit(&mut self, prepared: Prepared) -> Delta {
        assert_eq!(
            prepared.generation, self.generation,
            "a registry change was prepared against another generation"
        );
        self.generation += 1;
        let mut delta = Delta::default();
        let added: HashSet<&Arc<str>> = prepared.targets.iter().map(|t| &t.spec.name).collect();
        let new_probes: HashSet<&Arc<str>> = prepared.probes.iter().map(|p| &p.name).collect();
        // Probes of removed or replaced targets that the change does not
        // bring back.
        let mut gone_probes = Vec::new();
        for name in &prepared.remove {
            let Some(entry) = self.targets.get(name) else { continue };
            for (p, _) in &entry.probes {
                if !new_probes.contains(p) {
                    gone_probes.push(p.clone());
                }
            }
        }
        for name in &prepared.remove {
            if !added.contains(name) && self.targets.shift_remove(name).is_some() {
                delta.removed_targets.push(name.clone());
            }
        }
        gone_probes.sort_unstable();
        gone_probes.dedup();
        for name in gone_probes {
            if let Some(old) = self.probes.shift_remove(&name) {
                self.count(&old.tenant, -1);
                delta.removed_probes.push(name);
            }
        }
        for p in &prepared.probes {
            self.count(&p.tenant, 1);
            if let Some(old) = self.probes.insert(p.name.clone(), p.clone()) {
                self.count(&old.tenant, -1);
            }
        }
        for t in prepared.targets {
            delta.targets.push(self.update_of(&t));
            self.targets.insert(t.spec.name.clone(), t);
        }
        delta.probes = prepared.probes;
        delta
    }

    fn count(&mut self, tenant: &TenantId, by: isize) {
        let n = self.counts.entry(tenant.clone()).or_default();
        *n = n.saturating_add_signed(by);
    }

    fn update_of(&self, t: &TargetEntry) -> TargetUpdate {
        TargetUpdate {
            spec: t.spec.clone(),
            probes: t.probes.iter().map(|(n, _)| n.clone()).collect(),
            has_startup: t
                .probes
                .iter()
                .any(|(n, _)| self.probes.get(n).is_some_and(|p| p.kind == Kind::Startup)),
        }
    }

    /// The whole catalog as a delta: what a scheduler starting from
    /// nothing, or reloading everything, applies.
    pub fn delta(&self) -> Delta {
        Delta {
            full: true,
            targets: self.targets.values().map(|t| self.update_of(t)).collect(),
            probes: self.probes.values().cloned().collect(),
            removed_targets: Vec::new(),
            removed_probes: Vec::new(),
        }
    }

    /// The config file errors name (empty for a registry built in code).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Probes, in the order they were added (file order first).
    pub fn probes(&self) -> impl ExactSizeIterator<Item = &Arc<ProbeSpec>> + '_ {
        self.probes.values()
    }

    /// The probe named `name`.
    pub fn probe(&self, name: &str) -> Option<&Arc<ProbeSpec>> {
        self.probes.get(name)
    }

    /// Targets, in the order they were added.
    pub fn targets(&self) -> impl ExactSizeIterator<Item = &Arc<TargetSpec>> + '_ {
        self.targets.values().map(|t| &t.spec)
    }

    /// The target named `name`.
    pub fn target(&self, name: &str) -> Option<&Arc<TargetSpec>> {
        self.targets.get(name).map(|t| &t.spec)
    }

    /// How many probes `tenant` owns.
    pub fn probe_count(&self, tenant: &str) -> usize {
        self.counts.get(tenant).copied().unwrap_or(0)
    }

    /// The probes `tenant` owns.
    pub fn probes_of_tenant<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a Arc<ProbeSpec>> + 'a {
        self.probes.values().filter(move |p| &*p.tenant == tenant)
    }

    /// The probes of `target`.
    pub fn probes_of<'a>(&'a self, target: &'a str) -> impl Iterator<Item = &'a Arc<ProbeSpec>> + 'a {
        self.targets
            .get(target)
            .into_iter()
            .flat_map(|t| t.probes.iter())
            .filter_map(|(n, _)| self.probes.get(n))
    }
}
