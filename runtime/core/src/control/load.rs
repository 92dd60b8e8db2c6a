//! Loading the config (the file, then the stored probes) and putting a
//! whole new catalog in force: reloads, and the tenants of labelled
//! namespaces.

use super::{AgentOptions, Control, ControlError, DEFAULT_API, DEFAULT_CONFIG, DEFAULT_CONFIG_NAME, LeftOut};
use crate::catalog::settings::{NamespaceTenant, TemplateOutcome};
use crate::catalog::{Catalog, Change, Prepared};
use crate::config::{self, ConfigError, ConfigErrors};
use crate::scheduler::ReloadSummary;
use crate::tenants::Tenants;
use crate::uploads::{self, Store};
use sonde_sandbox::engine::Engine;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

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
/// This is the one place a [`Catalog`] is built from the config.
pub async fn load(
    engine: &Engine,
    options: &AgentOptions,
    cache: &crate::catalog::resolve::Cache,
) -> Result<(Catalog, Vec<LeftOut>), ConfigErrors> {
    let (path, file) = read_config(options)?;
    cache.release_unused();
    let mut catalog = Catalog::load_with(engine, &path, file, cache.clone()).await?;
    if options.config.is_none() {
        catalog.source = None;
    }
    let mut left_out: Vec<LeftOut> = catalog
        .unavailable
        .iter()
        .map(|u| LeftOut {
            probe: u.probe.to_string(),
            tenant: u.tenant.clone(),
            reason: u.error.to_string(),
            plugin: u.plugin.clone(),
        })
        .collect();
    let state_dir = options.state_dir.clone().or_else(|| catalog.agent.state_dir.clone());
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
            let change = uploads::to_target(&store, &p)
                .map_err(|e| e.to_string())
                .map(|t| Change::add(vec![t]));
            let prepared = match change {
                Ok(c) => catalog.prepare(engine, c).await.map_err(|e| messages(&e)),
                Err(e) => Err(e),
            };
            match prepared {
                Ok(prepared) if !prepared.waiting().is_empty() => {
                    catalog.pulls.extend_from_slice(prepared.pulls());
                    catalog.waiting.extend_from_slice(prepared.waiting());
                }
                Ok(prepared) => {
                    catalog.pulls.extend_from_slice(prepared.pulls());
                    let _ = catalog.commit(prepared);
                }
                Err(reason) => left_out.push(LeftOut {
                    probe: p.name,
                    tenant: p.tenant.as_str().into(),
                    reason,
                    plugin: p.spec["plugin"]
                        .as_str()
                        .filter(|n| crate::catalog::resolve::is_oci(n))
                        .map(str::to_string),
                }),
            }
        }
    }
    for l in &left_out {
        tracing::error!("{l}; left out");
    }
    Ok((catalog, left_out))
}

/// Adds to `catalog`'s tenants those its namespace templates make for
/// `labelled`; what each labelled namespace got.
fn with_namespace_tenants(catalog: &mut Catalog, labelled: &BTreeMap<String, String>) -> Vec<NamespaceTenant> {
    if labelled.is_empty() {
        return Vec::new();
    }
    let (made, outcomes) = crate::catalog::settings::generate(&catalog.namespace_templates, &catalog.tenants, labelled);
    if !made.is_empty() {
        catalog.tenants = Arc::new(catalog.tenants.extended(made));
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

impl Control {
    /// The tenants in force.
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants.borrow().clone()
    }

    /// Puts the agent's first catalog in force, `left_out` what its load
    /// left out: the same steps as every reload after it.
    pub async fn put_in_force(&self, catalog: Catalog, left_out: Vec<LeftOut>) -> ReloadSummary {
        let mut current = self.catalog.lock().await;
        self.apply(&mut current, catalog, left_out, Vec::new()).await
    }

    /// Puts a whole new catalog in force (in `current`): the sandbox's
    /// bounds, the executor's tenants and pulls, the tenants, status, then
    /// the scheduler. The one path for the first load and every reload.
    async fn apply(
        &self,
        current: &mut Catalog,
        catalog: Catalog,
        left_out: Vec<LeftOut>,
        namespaces: Vec<NamespaceTenant>,
    ) -> ReloadSummary {
        let before = self.engine.host_limits();
        // The first catalog's bounds are the agent's from its start: nothing
        // to say about calls in flight.
        let first = *self.reloads.borrow() == 0;
        if before != catalog.agent.host_limits {
            self.engine.set_host_limits(catalog.agent.host_limits);
        }
        if before != catalog.agent.host_limits && !first {
            tracing::info!(
                changed = %sonde_sandbox::host::bounds::changes(&before, &catalog.agent.host_limits),
                "sandbox: the new bounds are in force for every call that starts from now; calls in flight finish under theirs, and a smaller lookups_in_flight or blocking_threads takes effect as the work holding the gate ends"
            );
        }
        self.executor.configure(&catalog.tenants);
        self.executor.record_pulls(&catalog.pulls);
        self.tenants.send_replace(catalog.tenants.clone());
        self.require_signed
            .store(catalog.agent.require_signed, Ordering::Relaxed);
        {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.loaded_at = Some(SystemTime::now());
            s.reload_error = None;
            s.left_out = left_out;
            s.pulling = catalog.waiting.clone();
            s.probes = catalog.probes().len();
            log_namespace_changes(&s.namespace_tenants, &namespaces);
            s.namespace_tenants = namespaces;
        }
        *current = catalog;
        let summary = self.scheduler.reload(&*current).await;
        self.reloads.send_modify(|n| *n += 1);
        summary
    }

    /// Commits a change prepared against `catalog` and hands what it did to
    /// the scheduler; the probes it names are no longer left out.
    pub(super) async fn commit(&self, catalog: &mut Catalog, prepared: Prepared, names: &[&str]) -> ReloadSummary {
        self.executor.record_pulls(prepared.pulls());
        let delta = catalog.commit(prepared);
        {
            let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            s.probes = catalog.probes().len();
            s.left_out.retain(|l| !names.contains(&l.probe.as_str()));
        }
        self.scheduler.reload(delta).await
    }

    /// Reads the config file again (with the stored probes) and applies
    /// it; an invalid one is refused, the old config keeps running and the
    /// error is kept in the status.
    pub async fn reload(&self) -> Result<ReloadSummary, ConfigErrors> {
        let mut current = self.catalog.lock().await;
        self.reload_locked(&mut current).await
    }

    /// After the pull of `reference` ended (`None`: of some references):
    /// loads the config again if a probe of the file or the store waits on
    /// it. Checked under the catalog's lock, so that a reload in progress
    /// that saw the pull running is never missed.
    pub async fn take_up(&self, reference: Option<&str>) {
        let mut current = self.catalog.lock().await;
        let due = reference.is_none_or(|r| self.waits_on(r));
        if due {
            tracing::debug!(plugin = %reference.unwrap_or("(several)"), "a pull ended: loading the config again");
            let _ = self.reload_locked(&mut current).await;
        }
    }

    async fn reload_locked(&self, current: &mut Catalog) -> Result<ReloadSummary, ConfigErrors> {
        match self.load().await {
            Ok((catalog, left_out, namespaces)) => {
                for w in &catalog.warnings {
                    tracing::warn!("{w}");
                }
                let summary = self.apply(current, catalog, left_out, namespaces).await;
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

    /// After a stored plugin changed: loads and applies everything again,
    /// since any probe may use it.
    pub(super) async fn reload_after_change(&self, current: &mut Catalog) -> Result<(), ControlError> {
        let (catalog, left_out, namespaces) = self
            .load()
            .await
            .map_err(|source| ControlError::Unavailable { stored: true, source })?;
        self.apply(current, catalog, left_out, namespaces).await;
        Ok(())
    }

    /// [`load`], then the tenants the namespace templates make for the
    /// labelled namespaces, added last: the file's targets and the stored
    /// probes are checked against the config's tenants only, so a
    /// templated tenant's probes come only from SondeChecks.
    async fn load(&self) -> Result<(Catalog, Vec<LeftOut>, Vec<NamespaceTenant>), ConfigErrors> {
        let (mut catalog, left_out) = load(&self.engine, &self.options, &self.cache).await?;
        let labelled = self.labelled.borrow().clone();
        let namespaces = with_namespace_tenants(&mut catalog, &labelled);
        Ok((catalog, left_out, namespaces))
    }

    /// Whether the config in force has a namespace template
    /// (`kubernetes.namespace_templates`): only then are Namespaces watched.
    pub async fn has_namespace_templates(&self) -> bool {
        !self.catalog.lock().await.namespace_templates.templates.is_empty()
    }

    /// Puts in force the tenants the templates make for `labelled`
    /// (namespace to the value of its `sonde.dev/tenant-template` label):
    /// unless it is what is in force already, the config is loaded again
    /// with them (as a reload; the file's own errors refuse it and keep the
    /// tenants in force, and the next reload that loads puts `labelled` in
    /// force). Every later reload keeps them. Returns whether it loaded.
    pub async fn set_labelled_namespaces(&self, labelled: BTreeMap<String, String>) -> bool {
        let mut current = self.catalog.lock().await;
        let changed = self.labelled.send_if_modified(|now| {
            let changed = **now != labelled;
            if changed {
                *now = Arc::new(labelled);
            }
            changed
        });
        if !changed {
            return false;
        }
        tracing::debug!("kubernetes: the labelled namespaces changed: loading the config again with their tenants");
        let _ = self.reload_locked(&mut current).await;
        true
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

    /// Follows whole-catalog replacements: the count changes when the
    /// first catalog is put in force, then after each reload of the config
    /// file (or of stored plugins).
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }
}
