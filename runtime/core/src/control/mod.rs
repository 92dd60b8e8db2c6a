//! What changes a running agent's config: reloads of the file, and tenants
//! adding or removing plugins and probes through the API. Every change goes
//! through one lock and one path ([`load()`]: build the whole new
//! [`Catalog`] from the file and the stored probes), is validated, stores
//! what the caller sent, then hands the catalog to the scheduler. A
//! refused change leaves nothing stored and nothing running changed.
//!
//! Control speaks domain types: a refusal is a [`ControlError`], a stored
//! probe that no longer loads is a [`LeftOut`]. Turning them into HTTP is
//! the API's business.

use crate::auth::{ApiAuth, Principal};
use crate::catalog::Catalog;
use crate::catalog::settings::NamespaceTenant;
use crate::config::{ConfigError, ConfigErrors};
use crate::executor::Executor;
use crate::scheduler;
use crate::tenants::{DEFAULT_TENANT, TenantId, Tenants};
use crate::uploads::{self, SpecError, Store};
use serde::Serialize;
use sonde_sandbox::engine::{Engine, LoadError};
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

mod load;
mod plugins;
mod probes;

pub use load::load;

/// The config `sonde run` uses without `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("../default.yaml");
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
    pub pulling: Vec<crate::catalog::Waiting>,
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

/// A probe that does not load and is left out of the catalog so that it
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
    /// The agent requires signed plugins and the upload carries no
    /// signature.
    #[error(
        "this agent requires signed plugins (require_signed): send the plugin's sigstore bundle (`sonde plugin sign` writes FILE.wasm.sigstore.json), base64, in the Sonde-Signature header"
    )]
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
    Pulling(Vec<crate::catalog::Waiting>),
}

fn pulling_text(waiting: &[crate::catalog::Waiting]) -> String {
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
    /// The upload's signature does not make it runnable: unsigned,
    /// tampered, by no trusted key, or not by one of the tenant's signers.
    #[error("{0}")]
    Signature(String),
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
    /// Resolved plugins and background pulls, shared by every load.
    pub cache: crate::catalog::resolve::Cache,
}

/// The running agent's control: reloads and runtime management.
pub struct Control {
    pub(crate) engine: Engine,
    pub(crate) options: AgentOptions,
    pub(crate) store: Option<Store>,
    pub(crate) scheduler: scheduler::SchedulerHandle,
    pub(crate) executor: Executor,
    pub(crate) status: Arc<Mutex<AgentStatus>>,
    /// The tenants in force: replaced whole at each load, read by the
    /// API's authentication ([`Control::tenants`]).
    pub(crate) tenants: tokio::sync::watch::Sender<Arc<Tenants>>,
    pub(crate) require_signed: AtomicBool,
    /// The catalog in force. Its lock serialises every change: checked
    /// against it, stored, committed, handed to the scheduler. Never held
    /// across the compile of an upload.
    pub(crate) catalog: tokio::sync::Mutex<Catalog>,
    /// One lock per tenant with a compile in flight: its uploads compile
    /// one at a time.
    pub(crate) compiling: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Counts whole-catalog replacements (reloads), which drop the probes
    /// of [`Control::apply_change`].
    pub(crate) reloads: tokio::sync::watch::Sender<u64>,
    /// What every load shares: resolved plugins and the background pulls.
    pub(crate) cache: crate::catalog::resolve::Cache,
    /// The Kubernetes namespaces labelled `sonde.dev/tenant-template`, each
    /// with the label's value, as last seen ([`Control::set_labelled_namespaces`]):
    /// every load makes their tenants from the templates in force.
    pub(crate) labelled: tokio::sync::watch::Sender<Arc<BTreeMap<String, String>>>,
}

impl Control {
    /// The control of a running agent, from the parts it shares with it,
    /// with nothing in force yet: the agent's first catalog is put in
    /// force by [`Control::put_in_force`], as every reload's is.
    pub fn new(parts: ControlParts) -> Self {
        let ControlParts {
            engine,
            options,
            state_dir,
            scheduler,
            executor,
            status,
            cache,
        } = parts;
        Self {
            store: state_dir.as_deref().map(Store::new),
            require_signed: AtomicBool::new(false),
            engine,
            options,
            scheduler,
            executor,
            status,
            tenants: tokio::sync::watch::Sender::new(Arc::default()),
            catalog: tokio::sync::Mutex::new(Catalog::default()),
            compiling: Mutex::default(),
            reloads: tokio::sync::watch::Sender::new(0),
            cache,
            labelled: tokio::sync::watch::Sender::default(),
        }
    }

    /// The engine the agent's probes run on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The probes in force, behind the lock that serialises every change.
    pub fn catalog(&self) -> &tokio::sync::Mutex<Catalog> {
        &self.catalog
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
    if uploads::valid_name(name) {
        Ok(())
    } else {
        Err(ControlError::BadName {
            what,
            name: name.to_string(),
        })
    }
}

/// How [`uploads::to_target`] names a stored probe's source, which the
/// catalog's errors about it carry.
fn source_of(name: &str) -> PathBuf {
    PathBuf::from(format!("PUT /v1/probes/{name}"))
}

impl Control {
    /// Where uploads are kept, or a conflict when the agent has no state dir.
    fn store(&self) -> Result<&Store, ControlError> {
        self.store.as_ref().ok_or(ControlError::Conflict(Conflict::NoStateDir))
    }
}
