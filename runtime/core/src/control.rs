//! What changes a running agent's config: reloads of the file, and tenants
//! adding or removing plugins and probes through the API. Every change goes
//! through one lock and one path ([`load`]: build the whole new
//! [`Registry`] from the file and the stored probes), is validated, stores
//! what the caller sent, then hands the registry to the scheduler. A
//! refused change leaves nothing stored and nothing running changed.
//!
//! Control speaks domain types: a refusal is a [`ControlError`], a stored
//! probe that no longer loads is a [`LeftOut`]. Turning them into HTTP is
//! the API's business.

use crate::auth::{ApiAuth, Principal};
use crate::config::{self, ConfigError, ConfigErrors};
use crate::executor::Executor;
use crate::managed::{self, SpecError, Store, StoredProbe};
use crate::registry::settings::{NamespaceTenant, TemplateOutcome};
use crate::registry::{Change, Prepared, Registry};
use crate::scheduler::{self, ReloadSummary};
use crate::tenants::{DEFAULT_TENANT, TenantId, Tenants};
use serde::Serialize;
use sonde_policy::identity::Digest;
use sonde_sandbox::engine::{Engine, LoadError};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The config `sonde run` uses without `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");
/// Where the embedded default config serves (and probes) the API.
pub const DEFAULT_API: &str = "127.0.0.1:9464";
/// How the embedded default config is named in messages.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded default>";

/// How `sonde run` was asked to run.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The config file; `None` runs [`DEFAULT_CONFIG`].
    pub config: Option<PathBuf>,
    /// Overrides the file's `api`.
    pub api: Option<SocketAddr>,
    /// Overrides the file's `state_dir`.
    pub state_dir: Option<PathBuf>,
    /// How long runs in flight may take to finish at shutdown.
    pub grace: Duration,
    /// Random first-run offsets.
    pub jitter: bool,
    /// Whether API callers need a token.
    pub api_auth: ApiAuth,
}

/// What the agent tells about its config.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AgentStatus {
    /// The config file, or `<embedded default>`.
    pub config: String,
    /// When the config in force was loaded.
    #[serde(serialize_with = "rfc3339")]
    pub loaded_at: Option<SystemTime>,
    /// Why the last reload was refused, if it was (the old config stays).
    pub reload_error: Option<String>,
    /// Probes that do not load, and why: stored through the API and no
    /// longer fitting, or naming an `oci://` plugin its registry could not
    /// give at load (nothing cached).
    pub left_out: Vec<LeftOut>,
    /// Probes waiting for their `oci://` plugin, being pulled in the
    /// background; each runs when its pull lands.
    pub pulling: Vec<crate::registry::Waiting>,
    /// The number of probes.
    pub probes: usize,
    /// The agent's version.
    pub version: &'static str,
    /// The Kubernetes namespaces labelled `sonde.dev/tenant-template`, with
    /// the template each names and what it got (a tenant made from it, or
    /// why not); absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespace_tenants: Vec<NamespaceTenant>,
}

fn rfc3339<S: serde::Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(&humantime::format_rfc3339_millis(*t)),
        None => s.serialize_none(),
    }
}

/// A probe that does not load and is left out of the registry so that it
/// cannot stop the agent: a stored probe (added through the API) whose
/// ceiling was tightened or whose plugin went, or a probe of the file whose
/// `oci://` plugin its registry could not give (nothing cached). It
/// serializes as its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    /// The probe.
    pub probe: String,
    /// Its tenant.
    pub tenant: TenantId,
    /// Why it does not load.
    pub reason: String,
    /// The `oci://` plugin whose pull failed, when that is why (it is
    /// tried again when the pull's backoff has passed).
    pub plugin: Option<String>,
}

impl fmt::Display for LeftOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "probe {:?} of tenant {:?}: {}",
            self.probe, &*self.tenant, self.reason
        )
    }
}

impl Serialize for LeftOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What a change is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// An uploaded plugin.
    Plugin,
    /// A probe added through the API.
    Probe,
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Plugin => "plugin",
            Self::Probe => "probe",
        })
    }
}

/// Why a change conflicts with the agent's state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Without a `state_dir` nothing added can be kept.
    #[error("this agent has no state_dir, so it cannot keep plugins and probes added through the API")]
    NoStateDir,
    /// The agent requires signed plugins, so it takes no uploads.
    #[error("this agent requires signed plugins (require_signed), so it takes no uploads")]
    RequireSigned,
    /// The name is a built-in plugin's.
    #[error("{name:?} is a built-in plugin's name")]
    BuiltIn {
        /// The name.
        name: String,
    },
    /// The plugin is used by probes of its tenant.
    #[error("plugin {plugin:?} is used by probes {}: delete them first", probes.join(", "))]
    InUse {
        /// The plugin.
        plugin: String,
        /// The probes that use it.
        probes: Vec<String>,
    },
    /// The probe comes from the config file, not the API.
    #[error("probe {probe:?} is defined in the config file; change it there")]
    InConfigFile {
        /// The probe.
        probe: String,
    },
}

/// Why a change was refused. Every refusal leaves nothing stored, except
/// [`ControlError::Unavailable`] with `stored: true`.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The name is not a valid plugin or probe name.
    #[error("{name:?}: a {what} name is 1-128 letters, digits, `-`, `_` or `.`")]
    BadName {
        /// Plugin or probe.
        what: Subject,
        /// The name as sent.
        name: String,
    },
    /// The probe spec cannot be read as one.
    #[error("{source}")]
    BadSpec {
        /// The probe.
        name: String,
        /// Why.
        source: SpecError,
    },
    /// What was sent is over its size limit.
    #[error("larger than the {limit} byte limit")]
    TooLarge {
        /// Plugin or probe.
        what: Subject,
        /// The limit, in bytes.
        limit: usize,
    },
    /// No such plugin or probe of the caller's.
    #[error("no {what} named {name:?}{}", if *taken { " of yours, and the name is not free" } else { "" })]
    NotFound {
        /// Plugin or probe.
        what: Subject,
        /// The name.
        name: String,
        /// Whether another tenant has one of that name.
        taken: bool,
    },
    /// The change conflicts with the agent's state.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The plugin or probe is well-formed but refused: a component that is
    /// not a sonde plugin, a probe over a quota or ceiling.
    #[error("{}", Problems(problems))]
    Invalid {
        /// Plugin or probe.
        what: Subject,
        /// Its name.
        name: String,
        /// Everything wrong with it.
        problems: Vec<Problem>,
    },
    /// The agent's config does not load (with or without the change), so
    /// nothing can be applied now.
    #[error("{}the agent's config does not load: {source}", if *stored { "the change was saved, but " } else { "" })]
    Unavailable {
        /// Whether the change itself was stored (it applies once the
        /// config loads again).
        stored: bool,
        /// The config's errors.
        source: ConfigErrors,
    },
    /// The probe's `oci://` plugin is being pulled in the background;
    /// nothing was stored. The same request succeeds once it has landed.
    #[error("plugin {plugin} is being pulled (since {}); nothing was stored: send the probe again once it has landed", humantime::format_rfc3339_seconds(*.since))]
    Pulling {
        /// The plugin, as written.
        plugin: String,
        /// When the pull started.
        since: SystemTime,
    },
    /// The agent failed on its own side: the state directory, the engine.
    #[error("cannot {action}: {source}")]
    Internal {
        /// What it was doing.
        action: &'static str,
        /// Why it failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why [`Control::apply_change`] did not apply a change.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The change breaks a rule (every error found).
    #[error("{0}")]
    Invalid(ConfigErrors),
    /// A probe's `oci://` plugin is being pulled in the background.
    #[error("{}", pulling_text(.0))]
    Pulling(Vec<crate::registry::Waiting>),
}

fn pulling_text(waiting: &[crate::registry::Waiting]) -> String {
    let mut plugins: Vec<&str> = waiting.iter().map(|w| w.plugin.as_str()).collect();
    plugins.dedup();
    format!(
        "plugin {} is being pulled (since {}); the probe runs when it lands",
        plugins.join(", "),
        waiting
            .first()
            .map(|w| humantime::format_rfc3339_seconds(w.since).to_string())
            .unwrap_or_default()
    )
}

/// One thing wrong with a plugin or probe.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    /// The component does not load as a sonde plugin.
    #[error(transparent)]
    Plugin(LoadError),
    /// The probe's config does not hold (a key, a quota, a ceiling).
    #[error("{}", .0.message)]
    Config(ConfigError),
}

struct Problems<'a>(&'a [Problem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

fn internal(action: &'static str) -> impl FnOnce(std::io::Error) -> ControlError {
    move |e| ControlError::Internal {
        action,
        source: Box::new(e),
    }
}

/// Reads the config file, or the embedded default (serving the API on
/// `options.api` when given).
fn read_config(options: &AgentOptions) -> Result<(PathBuf, config::File), ConfigErrors> {
    match options.config.as_deref() {
        Some(p) => Ok((p.to_path_buf(), config::read(p)?.0)),
        None => {
            let text = match options.api {
                Some(a) => DEFAULT_CONFIG.replace(DEFAULT_API, &a.to_string()),
                None => DEFAULT_CONFIG.to_string(),
            };
            let path = PathBuf::from(DEFAULT_CONFIG_NAME);
            let file = config::parse(&path, &text)?;
            Ok((path, file))
        }
    }
}

/// Loads the config file (or the embedded default), then adds every stored
/// probe to it, each as a change of its own: a stored probe that no longer
/// loads (the operator tightened a ceiling, its plugin went) is left out
/// and named in the second value, so it cannot stop the agent from
/// starting. The file's own errors are the caller's.
///
/// This is the one place a [`Registry`] is built from the config.
pub async fn load(
    engine: &Engine,
    options: &AgentOptions,
    cache: &crate::registry::resolve::Cache,
) -> Result<(Registry, Vec<LeftOut>), ConfigErrors> {
    let (path, file) = read_config(options)?;
    cache.release_unused();
    let mut reg = Registry::load_with(engine, &path, file, cache.clone()).await?;
    if options.config.is_none() {
        reg.source = None;
    }
    let mut left_out: Vec<LeftOut> = reg
        .unavailable
        .iter()
        .map(|u| LeftOut {
            probe: u.probe.to_string(),
            tenant: u.tenant.clone(),
            reason: u.error.to_string(),
            plugin: u.plugin.clone(),
        })
        .collect();
    let state_dir = options.state_dir.clone().or_else(|| reg.state_dir.clone());
    if let Some(dir) = &state_dir {
        let store = Store::open(dir).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                place: config::Place {
                    file: dir.join("managed"),
                    line: 0,
                    column: 0,
                },
                message: format!("the stored probes cannot be opened: {e}"),
            }])
        })?;
        for p in store.probes() {
            let change = managed::to_target(&store, &p)
                .map_err(|e| e.to_string())
                .map(|t| Change::add(vec![t]));
            let prepared = match change {
                Ok(c) => reg.prepare(engine, c).await.map_err(|e| messages(&e)),
                Err(e) => Err(e),
            };
            match prepared {
                Ok(prepared) if !prepared.waiting().is_empty() => {
                    reg.pulls.extend_from_slice(prepared.pulls());
                    reg.waiting.extend_from_slice(prepared.waiting());
                }
                Ok(prepared) => {
                    reg.pulls.extend_from_slice(prepared.pulls());
                    let _ = reg.commit(prepared);
                }
                Err(reason) => left_out.push(LeftOut {
                    probe: p.name,
                    tenant: p.tenant.as_str().into(),
                    reason,
                    plugin: p.spec["plugin"]
                        .as_str()
                        .filter(|n| crate::registry::resolve::is_oci(n))
                        .map(str::to_string),
                }),
            }
        }
    }
    for l in &left_out {
        tracing::error!("{l}; left out");
    }
    Ok((reg, left_out))
}

/// Adds to `reg`'s tenants those its namespace templates make for
/// `labelled`; what each labelled namespace got.
fn with_namespace_tenants(reg: &mut Registry, labelled: &BTreeMap<String, String>) -> Vec<NamespaceTenant> {
    if labelled.is_empty() {
        return Vec::new();
    }
    let (made, outcomes) = crate::registry::settings::generate(&reg.namespace_templates, &reg.tenants, labelled);
    if !made.is_empty() {
        reg.tenants = Arc::new(reg.tenants.extended(made));
    }
    outcomes
}

/// Logs, once, what a labelled namespace got when it differs from what it
/// had (`before`): which of the template and an explicit tenant or mapping
/// won, or why it has no tenant; and the namespaces no longer labelled.
fn log_namespace_changes(before: &[NamespaceTenant], now: &[NamespaceTenant]) {
    let had: BTreeMap<&str, &NamespaceTenant> = before.iter().map(|n| (n.namespace.as_str(), n)).collect();
    for n in now {
        if had.get(n.namespace.as_str()) == Some(&n) {
            continue;
        }
        let (namespace, template) = (n.namespace.as_str(), n.template.as_str());
        match n.outcome {
            TemplateOutcome::UnknownTemplate | TemplateOutcome::OverLimit => {
                tracing::warn!(
                    namespace,
                    template,
                    "kubernetes: namespace labelled sonde.dev/tenant-template: {}",
                    n.outcome
                );
            }
            _ => tracing::info!(
                namespace,
                template,
                "kubernetes: namespace labelled sonde.dev/tenant-template: {}",
                n.outcome
            ),
        }
    }
    let labelled: std::collections::BTreeSet<&str> = now.iter().map(|n| n.namespace.as_str()).collect();
    for (namespace, n) in had {
        if !labelled.contains(namespace) && n.outcome == TemplateOutcome::Templated {
            tracing::info!(namespace, template = %n.template, "kubernetes: namespace no longer labelled sonde.dev/tenant-template: its tenant is gone");
        }
    }
}

/// The messages of `errors`, without their place (a stored probe's place
/// is its name, which a [`LeftOut`] says already).
fn messages(errors: &ConfigErrors) -> String {
    errors
        .0
        .iter()
        .map(|e| e.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// How [`managed::to_target`] names a stored probe's source, which the
/// registry's errors about it carry.
fn source_of(name: &str) -> PathBuf {
    PathBuf::from(format!("PUT /v1/probes/{name}"))
}

/// What an agent hands [`Control::new`]: the parts it built and shares
/// with the control.
pub struct ControlParts {
    /// The engine every probe runs on.
    pub engine: Engine,
    /// The agent's options (config path, state dir, …).
    pub options: AgentOptions,
    /// Where uploads are kept (the options' state dir, else the config's).
    pub state_dir: Option<std::path::PathBuf>,
    /// The scheduler that runs the probes in force.
    pub scheduler: scheduler::SchedulerHandle,
    /// The executor the scheduler's calls go through.
    pub executor: Executor,
    /// The agent's status (last load, last reload error).
    pub status: Arc<Mutex<AgentStatus>>,
    /// The tenants in force, shared with the API's authentication.
    pub tenants: Arc<Mutex<Arc<Tenants>>>,
    /// The probes in force.
    pub registry: Registry,
    /// Resolved plugins and background pulls, shared by every load.
    pub cache: crate::registry::resolve::Cache,
}

/// The running agent's control: reloads and runtime management.
pub struct Control {
    pub(crate) engine: Engine,
    pub(crate) options: AgentOptions,
    pub(crate) store: Option<Store>,
    pub(crate) scheduler: scheduler::SchedulerHandle,
    pub(crate) executor: Executor,
    pub(crate) status: Arc<Mutex<AgentStatus>>,
    pub(crate) tenants: Arc<Mutex<Arc<Tenants>>>,
    pub(crate) require_signed: AtomicBool,
    /// The registry in force. Its lock serialises every change: checked
    /// against it, stored, committed, handed to the scheduler. Never held
    /// across the compile of an upload.
    pub(crate) registry: tokio::sync::Mutex<Registry>,
    /// One lock per tenant with a compile in flight: its uploads compile
    /// one at a time.
    pub(crate) compiling: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Counts whole-registry replacements (reloads), which drop the probes
    /// of [`Control::apply_change`].
    pub(crate) reloads: tokio::sync::watch::Sender<u64>,
    /// What every load shares: resolved plugins and the background pulls.
    pub(crate) cache: crate::registry::resolve::Cache,
    /// The Kubernetes namespaces labelled `sonde.dev/tenant-template`, each
    /// with the label's value, as last seen ([`Control::set_labelled_namespaces`]):
    /// every load makes their tenants from the templates in force.
    pub(crate) labelled: Mutex<Arc<BTreeMap<String, String>>>,
}

impl Control {
    /// The control of a running agent, from the parts it shares with it.
    pub fn new(parts: ControlParts) -> Self {
        let ControlParts {
            engine,
            options,
            state_dir,
            scheduler,
            executor,
            status,
            tenants,
            registry,
            cache,
        } = parts;
        Self {
            store: state_dir.as_deref().map(Store::new),
            require_signed: AtomicBool::new(registry.require_signed),
            engine,
            options,
            scheduler,
            executor,
            status,
            tenants,
            registry: tokio::sync::Mutex::new(registry),
            compiling: Mutex::default(),
            reloads: tokio::sync::watch::Sender::new(0),
            cache,
            labelled: Mutex::default(),
        }
    }

    /// The engine the agent's probes run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The probes in force, behind the lock that serialises every change.
    pub fn registry(&self) -> &tokio::sync::Mutex<Registry> {
        &self.registry
    }
}

impl fmt::Debug for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

fn tenant_of(who: &Principal) -> &str {
    match who {
        Principal::Operator => DEFAULT_TENANT,
        Principal::Tenant(t) => t,
    }
}

fn check_name(what: Subject, name: &str) -> Result<(), ControlError> {
    if managed::valid_name(name) {
        Ok(())
    } else {
        Err(ControlError::BadName {
            what,
            name: name.to_string(),
        })
    }
}

/// Whether a plugin that does not load is the uploader's fault (its
/// bytes), rather than the agent's.
fn uploaders_fault(e: &LoadError) -> bool {
    matches!(
        e,
        LoadError::NotWasm { .. }
            | LoadError::CoreModule { .. }
            | LoadError::WrongWorld { .. }
            | LoadError::UnknownImport { .. }
            | LoadError::Compile { .. }
            | LoadError::OverBudget { .. }
            // Its `describe` trapped, timed out or reached past its grants.
            | LoadError::Describe { .. }
    )
}

impl Control {
    /// The tenants in force.
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts a whole new registry in force (in `current`): tenants, status,
    /// then the scheduler.
    async fn apply(
        &self,
        current: &mut Registry,
        reg: Registry,
        left_out: Vec<LeftOut>,
        namespaces: Vec<NamespaceTenant>,
    ) -> ReloadSummary {
        let before = self.engine.host_limits();
        if before != reg.host_limits {
            self.engine.set_host_limits(reg.host_limits);
            tracing::info!(
                changed = %sonde_sandbox::host::bounds::changes(&before, &reg.host_limits),
                "sandbox: the new bounds are in force for every call that starts from now; calls in flight finish under theirs, and a smaller lookups_in_flight or blocking_threads takes effect as the work holding the gate ends"
            );
        }
        self.executor.configure(&reg.tenants);
        self.executor.record_pulls(&reg.pulls);
        *self.tenants.lock().unwrap_or_else(|e| e.into_inner()) = reg.tenants.clone();
        self.require_signed.store(reg.require_signed, Ordering::Relaxed);
        {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.loaded_at = Some(SystemTime::now());
            s.reload_error = None;
            s.left_out = left_out;
            s.pulling = reg.waiting.clone();
            s.probes = reg.probes().len();
            log_namespace_changes(&s.namespace_tenants, &namespaces);
            s.namespace_tenants = namespaces;
        }
        *current = reg;
        let summary = self.scheduler.reload(&*current).await;
        self.reloads.send_modify(|n| *n += 1);
        summary
    }

    /// Commits a change prepared against `reg` and hands what it did to
    /// the scheduler; the probes it names are no longer left out.
    async fn commit(&self, reg: &mut Registry, prepared: Prepared, names: &[&str]) -> ReloadSummary {
        self.executor.record_pulls(prepared.pulls());
        let delta = reg.commit(prepared);
        {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.probes = reg.probes().len();
            s.left_out.retain(|l| !names.contains(&l.probe.as_str()));
        }
        self.scheduler.reload(delta).await
    }

    /// Reads the config file again (with the stored probes) and applies
    /// it; an invalid one is refused, the old config keeps running and the
    /// error is kept in the status.
    pub async fn reload(&self) -> Result<ReloadSummary, ConfigErrors> {
        let mut current = self.registry.lock().await;
        self.reload_locked(&mut current).await
    }

    /// After the pull of `reference` ended (`None`: of some references):
    /// loads the config again if a probe of the file or the store waits on
    /// it. Checked under the registry's lock, so that a reload in progress
    /// that saw the pull running is never missed.
    pub async fn take_up(&self, reference: Option<&str>) {
        let mut current = self.registry.lock().await;
        let due = reference.is_none_or(|r| self.waits_on(r));
        if due {
            tracing::debug!(plugin = %reference.unwrap_or("(several)"), "a pull ended: loading the config again");
            let _ = self.reload_locked(&mut current).await;
        }
    }

    async fn reload_locked(&self, current: &mut Registry) -> Result<ReloadSummary, ConfigErrors> {
        match self.load().await {
            Ok((reg, left_out, namespaces)) => {
                for w in &reg.warnings {
                    tracing::warn!("{w}");
                }
                let summary = self.apply(current, reg, left_out, namespaces).await;
                let (config, probes) = {
                    let st = self.status.lock().unwrap_or_else(|e| e.into_inner());
                    (st.config.clone(), st.probes)
                };
                tracing::info!(
                    config = %config,
                    probes,
                    added = summary.added.len(),
                    changed = summary.changed.len(),
                    removed = summary.removed.len(),
                    kept = summary.kept,
                    "config reloaded"
                );
                Ok(summary)
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the previous config keeps running: fix the file (`sonde validate FILE`) and reload again");
                self.status.lock().unwrap_or_else(|e| e.into_inner()).reload_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    fn store(&self) -> Result<&Store, ControlError> {
        self.store.as_ref().ok_or(ControlError::Conflict(Conflict::NoStateDir))
    }

    /// After a stored plugin changed: loads and applies everything again,
    /// since any probe may use it.
    async fn reload_after_change(&self, current: &mut Registry) -> Result<(), ControlError> {
        let (reg, left_out, namespaces) = self
            .load()
            .await
            .map_err(|source| ControlError::Unavailable { stored: true, source })?;
        self.apply(current, reg, left_out, namespaces).await;
        Ok(())
    }

    /// [`load`], then the tenants the namespace templates make for the
    /// labelled namespaces, added last: the file's targets and the stored
    /// probes are checked against the config's tenants only, so a
    /// templated tenant's probes come only from SondeChecks.
    async fn load(&self) -> Result<(Registry, Vec<LeftOut>, Vec<NamespaceTenant>), ConfigErrors> {
        let (mut reg, left_out) = load(&self.engine, &self.options, &self.cache).await?;
        let labelled = self.labelled.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let namespaces = with_namespace_tenants(&mut reg, &labelled);
        Ok((reg, left_out, namespaces))
    }

    /// Whether the config in force has a namespace template
    /// (`kubernetes.namespace_templates`): only then are Namespaces watched.
    pub async fn has_namespace_templates(&self) -> bool {
        !self.registry.lock().await.namespace_templates.templates.is_empty()
    }

    /// Puts in force the tenants the templates make for `labelled`
    /// (namespace to the value of its `sonde.dev/tenant-template` label):
    /// unless it is what is in force already, the config is loaded again
    /// with them (as a reload; the file's own errors refuse it and keep the
    /// tenants in force, and the next reload that loads puts `labelled` in
    /// force). Every later reload keeps them. Returns whether it loaded.
    pub async fn set_labelled_namespaces(&self, labelled: BTreeMap<String, String>) -> bool {
        let mut current = self.registry.lock().await;
        {
            let mut now = self.labelled.lock().unwrap_or_else(|e| e.into_inner());
            if **now == labelled {
                return false;
            }
            *now = Arc::new(labelled);
        }
        tracing::debug!("kubernetes: the labelled namespaces changed: loading the config again with their tenants");
        let _ = self.reload_locked(&mut current).await;
        true
    }

    /// Adds or replaces the caller's plugin `name` (`PUT /v1/plugins/{name}`):
    /// validates the component and stores it as the caller's; probes that
    /// use it restart with the new version. Returns whether it replaced an
    /// existing one.
    pub async fn put_plugin(&self, who: &Principal, name: &str, wasm: &[u8]) -> Result<bool, ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        check_name(Subject::Plugin, name)?;
        if sonde_builtins::get(name).is_some() {
            return Err(Conflict::BuiltIn { name: name.to_string() }.into());
        }
        if self.require_signed.load(Ordering::Relaxed) {
            return Err(Conflict::RequireSigned.into());
        }
        if wasm.len() > managed::MAX_PLUGIN_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Plugin,
                limit: managed::MAX_PLUGIN_BYTES,
            });
        }
        let refuse_taken = |owner: &Option<String>| {
            if owner.as_deref().is_some_and(|o| o != tenant) {
                return Err(ControlError::NotFound {
                    what: Subject::Plugin,
                    name: name.to_string(),
                    taken: true,
                });
            }
            Ok(())
        };
        refuse_taken(&store.plugin_owner(name))?;
        // Compiled before the control lock is taken, so another tenant's
        // change never waits for this compile; one compile per tenant at
        // a time, so a tenant cannot hold many compilers at once. Kept
        // loaded until the registry holds it, so it is compiled once.
        let loaded = {
            let _one_at_a_time = self.compile_lane(tenant).lock_owned().await;
            let start = std::time::Instant::now();
            let loaded = self.engine.load(&format!("upload {name}"), wasm).await;
            self.executor.record_compile(tenant, start.elapsed());
            loaded
        };
        let _loaded = match loaded {
            Ok(plugin) => plugin,
            Err(e) if uploaders_fault(&e) => {
                return Err(ControlError::Invalid {
                    what: Subject::Plugin,
                    name: name.to_string(),
                    problems: vec![Problem::Plugin(e)],
                });
            }
            Err(e) => {
                return Err(ControlError::Internal {
                    action: "load the plugin",
                    source: Box::new(e),
                });
            }
        };
        let mut current = self.registry.lock().await;
        let owner = store.plugin_owner(name);
        refuse_taken(&owner)?;
        let old = std::fs::read(store.plugin_path(tenant, name))
            .ok()
            .map(|b| Digest::of(&b));
        store
            .put_plugin(tenant, name, wasm)
            .map_err(internal("store the plugin"))?;
        tracing::info!(tenant, plugin = name, bytes = wasm.len(), "plugin stored");
        self.reload_after_change(&mut current).await?;
        if let Some(old) = old {
            self.forget_unless_stored(store, &old);
        }
        Ok(owner.is_some())
    }

    /// Lets the engine free the compile-cache file of `digest` unless a
    /// stored plugin (of any tenant) still has those bytes.
    fn forget_unless_stored(&self, store: &Store, digest: &Digest) {
        let stored = store
            .plugins()
            .iter()
            .any(|(_, _, path)| std::fs::read(path).is_ok_and(|b| Digest::of(&b) == *digest));
        if !stored {
            self.engine.forget(digest);
        }
    }

    /// The lock that lets one compile of `tenant` run at a time.
    fn compile_lane(&self, tenant: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut lanes = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
        // Only lanes someone holds or waits for are kept.
        lanes.retain(|_, l| Arc::strong_count(l) > 1);
        lanes.entry(tenant.to_string()).or_default().clone()
    }

    /// Removes the caller's plugin `name` (`DELETE /v1/plugins/{name}`);
    /// refused while a probe of the caller uses it.
    pub async fn delete_plugin(&self, who: &Principal, name: &str) -> Result<(), ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        let mut current = self.registry.lock().await;
        if !managed::valid_name(name) || store.plugin_owner(name).as_deref() != Some(tenant) {
            return Err(ControlError::NotFound {
                what: Subject::Plugin,
                name: name.to_string(),
                taken: false,
            });
        }
        let users: Vec<String> = store
            .probes()
            .into_iter()
            .filter(|p| p.tenant == tenant && p.spec["plugin"].as_str() == Some(name))
            .map(|p| p.name)
            .collect();
        if !users.is_empty() {
            return Err(Conflict::InUse {
                plugin: name.to_string(),
                probes: users,
            }
            .into());
        }
        let old = std::fs::read(store.plugin_path(tenant, name))
            .ok()
            .map(|b| Digest::of(&b));
        store
            .delete_plugin(tenant, name)
            .map_err(internal("delete the plugin"))?;
        tracing::info!(tenant, plugin = name, "plugin deleted");
        self.reload_after_change(&mut current).await?;
        // Its compiled code went with the old registry; its cache file
        // goes now, unless another plugin of the same bytes still runs.
        if let Some(old) = old {
            self.forget_unless_stored(store, &old);
        }
        Ok(())
    }

    /// Adds or replaces the caller's probe `name` (`PUT /v1/probes/{name}`)
    /// from its spec (YAML or JSON): validates it against the caller's
    /// quotas and ceiling (with the whole config), stores it and starts
    /// it. `owner_now(name)` says which tenant owns a probe of that name
    /// now, if any. Returns whether it replaced an existing one.
    pub async fn put_probe(
        &self,
        who: &Principal,
        name: &str,
        body: &[u8],
        owner_now: impl Fn(&str) -> Option<String>,
    ) -> Result<bool, ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        check_name(Subject::Probe, name)?;
        if body.len() > managed::MAX_PROBE_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Probe,
                limit: managed::MAX_PROBE_BYTES,
            });
        }
        let spec = managed::parse_spec(body).map_err(|source| ControlError::BadSpec {
            name: name.to_string(),
            source,
        })?;
        let mut reg = self.registry.lock().await;
        let mine = self.check_owner(store, who, name, &owner_now)?;
        let probe = StoredProbe {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
        };
        let prepared = self
            .prepare(&reg, store, std::slice::from_ref(&probe), &[(name, mine)])
            .await?;
        store.put_probe(&probe).map_err(internal("store the probe"))?;
        tracing::info!(tenant, probe = name, "probe stored");
        self.commit(&mut reg, prepared, &[name]).await;
        Ok(mine)
    }

    /// Adds or replaces several of the caller's probes at once (`PUT
    /// /v1/probes` with a list of specs, each with its `name`): all are
    /// checked together, as one change, and either all are stored and
    /// started or none is. Returns, per probe in the order sent, whether it
    /// replaced an existing one.
    pub async fn put_probes(
        &self,
        who: &Principal,
        body: &[u8],
        owner_now: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, bool)>, ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        if body.len() > managed::MAX_BATCH_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Probe,
                limit: managed::MAX_BATCH_BYTES,
            });
        }
        let specs = managed::parse_batch(body).map_err(|source| ControlError::BadSpec {
            name: String::new(),
            source,
        })?;
        for (name, _) in &specs {
            check_name(Subject::Probe, name)?;
        }
        let mut reg = self.registry.lock().await;
        let mut replaced = Vec::with_capacity(specs.len());
        let probes: Vec<StoredProbe> = specs
            .into_iter()
            .map(|(name, spec)| StoredProbe {
                tenant: tenant.to_string(),
                name,
                spec,
            })
            .collect();
        for p in &probes {
            replaced.push(self.check_owner(store, who, &p.name, &owner_now)?);
        }
        let names: Vec<(&str, bool)> = probes
            .iter()
            .map(|p| p.name.as_str())
            .zip(replaced.iter().copied())
            .collect();
        let prepared = self.prepare(&reg, store, &probes, &names).await?;
        // All stored, or none, across a crash too (a journal).
        store.put_probes(&probes).map_err(internal("store the probes"))?;
        tracing::info!(tenant, probes = probes.len(), "probes stored");
        let plain: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
        self.commit(&mut reg, prepared, &plain).await;
        Ok(probes.into_iter().map(|p| p.name).zip(replaced).collect())
    }

    /// Whether the caller's probe `name` exists (to be replaced), or an
    /// error when the name is another's or the config file's.
    fn check_owner(
        &self,
        store: &Store,
        who: &Principal,
        name: &str,
        owner_now: &impl Fn(&str) -> Option<String>,
    ) -> Result<bool, ControlError> {
        let mine = store.probe(tenant_of(who), name).is_some();
        match owner_now(name) {
            Some(_) if mine => Ok(true),
            // Another tenant's: as if it did not exist, but not free.
            Some(owner) if !who.sees(&owner) => Err(ControlError::NotFound {
                what: Subject::Probe,
                name: name.to_string(),
                taken: true,
            }),
            Some(_) => Err(Conflict::InConfigFile {
                probe: name.to_string(),
            }
            .into()),
            None => Ok(mine),
        }
    }

    /// Checks stored probes `probes` (each replacing the caller's probe of
    /// its name when `names` says it exists) against `reg` as one change.
    async fn prepare(
        &self,
        reg: &Registry,
        store: &Store,
        probes: &[StoredProbe],
        names: &[(&str, bool)],
    ) -> Result<Prepared, ControlError> {
        let invalid = |name: &str, problems: Vec<ConfigError>| ControlError::Invalid {
            what: Subject::Probe,
            name: name.to_string(),
            problems: problems.into_iter().map(Problem::Config).collect(),
        };
        let mut change = Change::default();
        for ((name, mine), p) in names.iter().zip(probes) {
            if *mine {
                change.remove.push((*name).into());
            }
            let target = managed::to_target(store, p).map_err(|e| {
                invalid(
                    name,
                    vec![ConfigError {
                        place: config::Place {
                            file: source_of(name),
                            line: 0,
                            column: 0,
                        },
                        message: e.to_string(),
                    }],
                )
            })?;
            change.add.push(target);
        }
        let batch = probes.len() > 1;
        let prepared = reg.prepare(&self.engine, change).await.map_err(|errors| {
            let name = if batch { "" } else { names[0].0 };
            invalid(name, errors.0)
        })?;
        match prepared.waiting().first() {
            Some(w) => Err(ControlError::Pulling {
                plugin: w.plugin.clone(),
                since: w.since,
            }),
            None => Ok(prepared),
        }
    }

    /// Applies `change` to the registry in force as one incremental change,
    /// nothing stored: probes a controller keeps from another source of
    /// truth (the Kubernetes controller: one per
    /// Pod gate). Refused whole, with every error, or committed and handed
    /// to the scheduler. A reload of the config file drops such probes;
    /// the controller puts them back (it follows [`Control::reloads`]).
    ///
    /// A change whose `oci://` plugin is being pulled is not applied
    /// ([`ChangeError::Pulling`]); [`Control::pulls_ended`] tells when to
    /// send it again. Nothing here waits on a registry.
    pub async fn apply_change(&self, change: Change) -> Result<ReloadSummary, ChangeError> {
        let mut reg = self.registry.lock().await;
        // Said here, without the list of the tenants there are (the
        // registry's message, for the file's author): such a refusal is
        // read by the source's users (an Event in a namespace), to whom
        // other tenants' names are none of their business.
        let unknown: Vec<ConfigError> = change
            .add
            .iter()
            .filter_map(|t| {
                let id = t.tenant.as_ref()?;
                let name = id.value.trim();
                reg.tenants.get(name).is_none().then(|| ConfigError {
                    place: config::place(t.source.as_deref().unwrap_or(std::path::Path::new("")), &id.referenced),
                    message: format!("tenant: no tenant {name:?} is defined on this agent"),
                })
            })
            .collect();
        if !unknown.is_empty() {
            return Err(ChangeError::Invalid(ConfigErrors(unknown)));
        }
        let prepared = reg.prepare(&self.engine, change).await.map_err(ChangeError::Invalid)?;
        if !prepared.waiting().is_empty() {
            return Err(ChangeError::Pulling(prepared.waiting().to_vec()));
        }
        Ok(self.commit(&mut reg, prepared, &[]).await)
    }

    /// Checks `change` against the registry in force as
    /// [`Control::apply_change`] would, and drops it: nothing is committed,
    /// nothing scheduled. A change whose `oci://` plugin is being pulled
    /// passes (the pull goes on in the background, as a change would
    /// start it). The Kubernetes status writer's dry run of a SondeCheck.
    pub async fn check_change(&self, change: Change) -> Result<(), ConfigErrors> {
        let reg = self.registry.lock().await;
        reg.prepare(&self.engine, change).await.map(drop)
    }

    /// Tells of each `oci://` reference whose background pull ended (landed
    /// or failed) or whose backoff passed.
    pub fn pulls_ended(&self) -> tokio::sync::broadcast::Receiver<Arc<str>> {
        match self.cache.pulls() {
            Some(p) => p.subscribe(),
            None => tokio::sync::broadcast::channel(1).1,
        }
    }

    /// Background pulls running or waiting for a slot.
    pub fn pulls_in_flight(&self) -> usize {
        self.cache.pulls().map_or(0, |p| p.in_flight())
    }

    /// Whether a reload would take up a probe of the file or the store that
    /// waits on (or was left out by) a pull of `reference`.
    fn waits_on(&self, reference: &str) -> bool {
        let s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.pulling.iter().any(|w| w.plugin == reference)
            || s.left_out.iter().any(|l| l.plugin.as_deref() == Some(reference))
    }

    /// Follows whole-registry replacements: the count changes after each
    /// reload of the config file (or of stored plugins).
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// Removes the caller's probe `name` (`DELETE /v1/probes/{name}`): only
    /// probes added through the API go this way. `visible` says whether
    /// the caller can see a probe of that name (one of the config file's).
    pub async fn delete_probe(&self, who: &Principal, name: &str, visible: bool) -> Result<(), ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        let mut reg = self.registry.lock().await;
        let removed =
            managed::valid_name(name) && store.delete_probe(tenant, name).map_err(internal("delete the probe"))?;
        if !removed {
            return Err(if visible {
                Conflict::InConfigFile {
                    probe: name.to_string(),
                }
                .into()
            } else {
                ControlError::NotFound {
                    what: Subject::Probe,
                    name: name.to_string(),
                    taken: false,
                }
            });
        }
        tracing::info!(tenant, probe = name, "probe deleted");
        match reg.prepare(&self.engine, Change::remove([name])).await {
            Ok(prepared) => {
                self.commit(&mut reg, prepared, &[name]).await;
                Ok(())
            }
            // A removal breaks no rule; if it did, the registry would say so.
            Err(source) => Err(ControlError::Unavailable { stored: true, source }),
        }
    }
}
