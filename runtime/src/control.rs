//! What changes a running agent's config: reloads of the file, and tenants
//! adding or removing plugins and probes through the API. Every change goes
//! through one lock and one path: build the whole new [`Registry`] (file +
//! stored probes), validate it, store what the caller sent, then hand the
//! registry to the scheduler. A refused change leaves nothing stored and
//! nothing running changed.

use crate::agent::{AgentOptions, DEFAULT_API, DEFAULT_CONFIG, DEFAULT_CONFIG_NAME};
use crate::api::AgentStatus;
use crate::config::{self, ConfigErrors};
use crate::engine::{Engine, LoadError};
use crate::executor::Executor;
use crate::managed::{self, Store, StoredProbe};
use crate::registry::Registry;
use crate::scheduler::{self, ReloadSummary};
use crate::tenants::{DEFAULT_TENANT, Principal, Tenants};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A change the API refused, with the HTTP status to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 400, 404, 409, 413, 422 or 503.
    pub status: u16,
    /// What is wrong.
    pub message: String,
}

fn refuse(status: u16, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        message: message.into(),
    }
}

/// The source name of a stored probe's errors.
fn source_of(name: &str) -> PathBuf {
    PathBuf::from(format!("PUT /v1/probes/{name}"))
}

/// Loads the config file (or the embedded default) with every stored
/// probe. A stored probe that no longer loads (the operator tightened a
/// ceiling, a plugin was removed) is left out and named in the second
/// value, so it cannot stop the agent from starting.
pub async fn load(
    engine: &Engine,
    options: &AgentOptions,
    extra: Option<&StoredProbe>,
) -> Result<(Registry, Vec<String>), ConfigErrors> {
    let mut skip: HashSet<String> = HashSet::new();
    let mut skipped = Vec::new();
    loop {
        let (path, mut file) = match options.config.as_deref() {
            Some(p) => (p.to_path_buf(), config::read(p)?.0),
            None => {
                let text = match options.api {
                    Some(a) => DEFAULT_CONFIG.replace(DEFAULT_API, &a.to_string()),
                    None => DEFAULT_CONFIG.to_string(),
                };
                let path = PathBuf::from(DEFAULT_CONFIG_NAME);
                let file = config::parse(&path, &text)?;
                (path, file)
            }
        };
        // Relative to the config file, as the registry has it.
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let state_dir = options
            .state_dir
            .clone()
            .or_else(|| file.state_dir.as_ref().map(|d| base.join(d)));
        if let Some(dir) = &state_dir {
            let store = Store::new(dir);
            let mut stored = store.probes();
            if let Some(x) = extra {
                stored.retain(|p| p.name != x.name);
                stored.push(x.clone());
            }
            stored.retain(|p| !skip.contains(&p.name));
            for p in &stored {
                match managed::to_target(&store, p) {
                    Ok(t) => file.targets.push(t),
                    Err(e) if extra.is_some_and(|x| x.name == p.name) => {
                        return Err(ConfigErrors(vec![config::ConfigError {
                            place: config::Place {
                                file: source_of(&p.name),
                                line: 0,
                                column: 0,
                            },
                            message: e.to_string(),
                        }]));
                    }
                    Err(e) => {
                        skip.insert(p.name.clone());
                        skipped.push(format!("stored probe {:?} of tenant {:?}: {e}", p.name, p.tenant));
                    }
                }
            }
        }
        match Registry::load(engine, &path, file).await {
            Ok(mut reg) => {
                if options.config.is_none() {
                    reg.source = None;
                }
                for s in &skipped {
                    tracing::error!("{s}; left out");
                }
                return Ok((reg, skipped));
            }
            Err(errors) => {
                // Leave out stored probes that fail; the file's own errors,
                // and the probe being added, are the caller's to see.
                let bad: Vec<(String, String)> = errors
                    .0
                    .iter()
                    .filter_map(|e| {
                        let f = e.place.file.to_string_lossy();
                        let name = f.strip_prefix("PUT /v1/probes/")?;
                        Some((name.to_string(), e.message.clone()))
                    })
                    .filter(|(n, _)| extra.is_none_or(|x| &x.name != n) && !skip.contains(n))
                    .collect();
                let file_errors = errors.0.iter().any(|e| !e.place.file.starts_with("PUT /v1/probes/"));
                let extra_errors = errors
                    .0
                    .iter()
                    .any(|e| extra.is_some_and(|x| e.place.file == source_of(&x.name)));
                if bad.is_empty() || file_errors || extra_errors {
                    return Err(errors);
                }
                for (name, why) in bad {
                    skipped.push(format!("stored probe {name:?}: {why}"));
                    skip.insert(name);
                }
            }
        }
    }
}

/// The running agent's control: reloads and runtime management.
pub struct Control {
    pub(crate) engine: Engine,
    pub(crate) options: AgentOptions,
    pub(crate) store: Option<Store>,
    pub(crate) scheduler: scheduler::Handle,
    pub(crate) executor: Executor,
    pub(crate) status: Arc<Mutex<AgentStatus>>,
    pub(crate) tenants: Arc<Mutex<Arc<Tenants>>>,
    pub(crate) require_signed: std::sync::atomic::AtomicBool,
    pub(crate) lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

fn tenant_of(who: &Principal) -> &str {
    match who {
        Principal::Operator => DEFAULT_TENANT,
        Principal::Tenant(t) => t,
    }
}

impl Control {
    /// The tenants in force.
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn apply_status(&self, reg: &Registry, left_out: Vec<String>) {
        self.executor.configure(&reg.tenants);
        *self.tenants.lock().unwrap_or_else(|e| e.into_inner()) = reg.tenants.clone();
        self.require_signed
            .store(reg.require_signed, std::sync::atomic::Ordering::Relaxed);
        let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
        s.loaded_at = Some(SystemTime::now());
        s.reload_error = None;
        s.left_out = left_out;
        s.probes = reg.probes.len();
    }

    async fn apply(&self, reg: Registry, left_out: Vec<String>) -> ReloadSummary {
        self.apply_status(&reg, left_out);
        self.scheduler.reload(reg).await
    }

    /// Reads the config file again (with the stored probes) and applies
    /// it; an invalid one is refused, the old config keeps running and the
    /// error is kept in the status.
    pub async fn reload(&self) -> Result<ReloadSummary, ConfigErrors> {
        let _guard = self.lock.lock().await;
        match load(&self.engine, &self.options, None).await {
            Ok((reg, left_out)) => {
                for w in &reg.warnings {
                    tracing::warn!("{w}");
                }
                let summary = self.apply(reg, left_out).await;
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

    fn store(&self) -> Result<&Store, Refusal> {
        self.store.as_ref().ok_or_else(|| {
            refuse(
                409,
                "this agent has no state_dir, so it cannot keep plugins and probes added through the API",
            )
        })
    }

    async fn reload_after_change(&self, what: &str) -> Result<(), Refusal> {
        match load(&self.engine, &self.options, None).await {
            Ok((reg, left_out)) => {
                self.apply(reg, left_out).await;
                Ok(())
            }
            Err(e) => Err(refuse(
                503,
                format!("{what} was stored, but the config does not load: {e}"),
            )),
        }
    }

    /// `PUT /v1/plugins/{name}`: validates the component and stores it as
    /// the caller's; probes that use it restart with the new version.
    /// Returns whether it replaced an existing one.
    pub async fn put_plugin(&self, who: &Principal, name: &str, wasm: &[u8]) -> Result<bool, Refusal> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        if !managed::valid_name(name) {
            return Err(refuse(
                400,
                format!("{name:?}: a plugin name is 1-128 letters, digits, `-`, `_` or `.`"),
            ));
        }
        if crate::builtins::get(name).is_some() {
            return Err(refuse(409, format!("{name:?} is a built-in plugin's name")));
        }
        if self.require_signed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(refuse(
                409,
                "this agent requires signed plugins (require_signed), so it takes no uploads",
            ));
        }
        if wasm.len() > managed::MAX_PLUGIN_BYTES {
            return Err(refuse(
                413,
                format!("larger than the {} byte limit", managed::MAX_PLUGIN_BYTES),
            ));
        }
        let _guard = self.lock.lock().await;
        let owner = store.plugin_owner(name);
        if owner.as_deref().is_some_and(|o| o != tenant) {
            return Err(refuse(
                404,
                format!("no plugin named {name:?} of yours, and the name is not free"),
            ));
        }
        if let Err(e) = self.engine.load(&format!("upload {name}"), wasm).await {
            let status = match e {
                LoadError::NotWasm { .. }
                | LoadError::CoreModule { .. }
                | LoadError::WrongWorld { .. }
                | LoadError::UnknownImport { .. }
                | LoadError::Compile { .. } => 422,
                _ => 500,
            };
            return Err(refuse(status, e.to_string()));
        }
        store
            .put_plugin(tenant, name, wasm)
            .map_err(|e| refuse(500, format!("cannot store the plugin: {e}")))?;
        tracing::info!(tenant, plugin = name, bytes = wasm.len(), "plugin stored");
        self.reload_after_change("the plugin").await?;
        Ok(owner.is_some())
    }

    /// `DELETE /v1/plugins/{name}`: refused while a probe of the caller uses it.
    pub async fn delete_plugin(&self, who: &Principal, name: &str) -> Result<(), Refusal> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        let _guard = self.lock.lock().await;
        if !managed::valid_name(name) || store.plugin_owner(name).as_deref() != Some(tenant) {
            return Err(refuse(404, format!("no plugin named {name:?}")));
        }
        let users: Vec<String> = store
            .probes()
            .into_iter()
            .filter(|p| p.tenant == tenant && p.spec["plugin"].as_str() == Some(name))
            .map(|p| p.name)
            .collect();
        if !users.is_empty() {
            return Err(refuse(
                409,
                format!(
                    "plugin {name:?} is used by probes {}: delete them first",
                    users.join(", ")
                ),
            ));
        }
        store
            .delete_plugin(tenant, name)
            .map_err(|e| refuse(500, format!("cannot delete the plugin: {e}")))?;
        tracing::info!(tenant, plugin = name, "plugin deleted");
        self.reload_after_change("the deletion").await
    }

    /// `PUT /v1/probes/{name}`: validates the spec against the caller's
    /// quotas and ceiling (with the whole config), stores it and starts
    /// it. `exists(name)` says who owns a probe of that name now, if any.
    /// Returns whether it replaced an existing one.
    pub async fn put_probe(
        &self,
        who: &Principal,
        name: &str,
        body: &[u8],
        owner_now: impl Fn(&str) -> Option<String>,
    ) -> Result<bool, Refusal> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        if !managed::valid_name(name) {
            return Err(refuse(
                400,
                format!("{name:?}: a probe name is 1-128 letters, digits, `-`, `_` or `.`"),
            ));
        }
        if body.len() > managed::MAX_PROBE_BYTES {
            return Err(refuse(
                413,
                format!("larger than the {} byte limit", managed::MAX_PROBE_BYTES),
            ));
        }
        let spec = managed::parse_spec(body).map_err(|e| refuse(400, e.to_string()))?;
        let _guard = self.lock.lock().await;
        let mine = store.probes().iter().any(|p| p.name == name && p.tenant == tenant);
        match owner_now(name) {
            Some(_) if mine => {}
            // Another tenant's: as if it did not exist, but not free.
            Some(owner) if !who.sees(&owner) => {
                return Err(refuse(
                    404,
                    format!("no probe named {name:?} of yours, and the name is not free"),
                ));
            }
            Some(_) => {
                return Err(refuse(
                    409,
                    format!("probe {name:?} is defined in the config file; change it there"),
                ));
            }
            None => {}
        }
        let probe = StoredProbe {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
        };
        let (reg, left_out) = load(&self.engine, &self.options, Some(&probe)).await.map_err(|e| {
            let own = source_of(name);
            let mine: Vec<String> =
                e.0.iter()
                    .filter(|x| x.place.file == own)
                    .map(|x| x.message.clone())
                    .collect();
            if mine.is_empty() {
                refuse(503, format!("the agent's config does not load: {e}"))
            } else {
                refuse(422, mine.join("\n"))
            }
        })?;
        store
            .put_probe(&probe)
            .map_err(|e| refuse(500, format!("cannot store the probe: {e}")))?;
        tracing::info!(tenant, probe = name, "probe stored");
        self.apply(reg, left_out).await;
        Ok(mine)
    }

    /// `DELETE /v1/probes/{name}`: only probes added through the API.
    pub async fn delete_probe(&self, who: &Principal, name: &str, visible: bool) -> Result<(), Refusal> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        let _guard = self.lock.lock().await;
        let removed = managed::valid_name(name)
            && store
                .delete_probe(tenant, name)
                .map_err(|e| refuse(500, format!("cannot delete the probe: {e}")))?;
        if !removed {
            return Err(if visible {
                refuse(
                    409,
                    format!("probe {name:?} is defined in the config file; change it there"),
                )
            } else {
                refuse(404, format!("no probe named {name:?}"))
            });
        }
        tracing::info!(tenant, probe = name, "probe deleted");
        self.reload_after_change("the deletion").await
    }
}
