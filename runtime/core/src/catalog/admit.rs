//! The check and resolve steps of a [`Change`]: what depends on the rest of
//! the catalog (unique names, probe quotas) is checked against the
//! catalog as it would be after the change's removals, through a
//! [`CatalogOverlay`], so a change of one probe costs one probe's checks
//! whatever the catalog holds.

use super::problem::{ConfigProblem, Located};
use super::{Catalog, Change, Prepared, ProbeSpec, PullCost, ResolveError, TargetEntry, TargetSpec, probe, resolve};
use crate::config::{self, ConfigError, Kind, Place};
use crate::tenants::{Quotas, Tenant, TenantId};
use sonde_sandbox::engine::{CapabilityKind, Engine, Plugin, PluginInfo};
use sonde_sandbox::host::{Grants, NetPattern};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// The catalog as it would be with a change applied so far: names taken
/// and probes counted, on top of the catalog less what the change
/// removes.
pub(super) struct CatalogOverlay<'r> {
    catalog: &'r Catalog,
    removed_targets: HashSet<Arc<str>>,
    removed_probes: HashSet<Arc<str>>,
    /// Probes the removals take from each tenant.
    removed_counts: HashMap<TenantId, usize>,
    target_names: HashMap<String, Place>,
    probe_names: HashMap<String, Place>,
    counts: HashMap<TenantId, usize>,
}

impl<'r> CatalogOverlay<'r> {
    pub(super) fn new(catalog: &'r Catalog, remove: &[Arc<str>]) -> Self {
        let mut p = CatalogOverlay {
            catalog,
            removed_targets: HashSet::new(),
            removed_probes: HashSet::new(),
            removed_counts: HashMap::new(),
            target_names: HashMap::new(),
            probe_names: HashMap::new(),
            counts: HashMap::new(),
        };
        for name in remove {
            let Some(t) = catalog.targets.get(name) else { continue };
            if !p.removed_targets.insert(name.clone()) {
                continue;
            }
            for (probe, _) in &t.probes {
                if let Some(spec) = catalog.probes.get(probe) {
                    *p.removed_counts.entry(spec.tenant.clone()).or_default() += 1;
                }
                p.removed_probes.insert(probe.clone());
            }
        }
        p
    }

    /// Where a target named `name` is already defined.
    fn target_place(&self, name: &str) -> Option<Place> {
        if let Some(p) = self.target_names.get(name) {
            return Some(p.clone());
        }
        self.catalog
            .targets
            .get(name)
            .filter(|_| !self.removed_targets.contains(name))
            .map(|t| t.place.clone())
    }

    /// Where a probe named `name` is already defined.
    fn probe_place(&self, name: &str) -> Option<Place> {
        if let Some(p) = self.probe_names.get(name) {
            return Some(p.clone());
        }
        if self.removed_probes.contains(name) {
            return None;
        }
        let spec = self.catalog.probes.get(name)?;
        let t = self.catalog.targets.get(&spec.target)?;
        t.probes.iter().find(|(n, _)| &**n == name).map(|(_, p)| p.clone())
    }

    /// Counts one more probe of `tenant`; returns how many it then has.
    fn count(&mut self, tenant: &TenantId) -> usize {
        let added = self.counts.entry(tenant.clone()).or_default();
        *added += 1;
        let base = self.catalog.probe_count(tenant);
        let removed = self.removed_counts.get(tenant).copied().unwrap_or(0);
        base.saturating_sub(removed) + *added
    }
}

/// Runs `change` through the check, resolve and build steps against `catalog`.
/// Errors go to `errors`; what was built is returned either way, but is
/// only fit to commit when no error was found.
pub(super) async fn prepare(
    catalog: &Catalog,
    engine: &Engine,
    change: Change,
    errors: &mut Vec<ConfigError>,
) -> Prepared {
    let mut admission = Admission {
        catalog,
        engine,
        secrets: &change.secrets,
        overlay: CatalogOverlay::new(catalog, &change.remove),
        resolved: HashMap::new(),
        out: Prepared {
            generation: catalog.generation,
            remove: change.remove.clone(),
            ..Prepared::default()
        },
    };
    for t in &change.add {
        let path = t.source.as_deref().unwrap_or(&catalog.path);
        let mut problems = Vec::new();
        let built = admission.target(path, t, &mut problems).await;
        errors.extend(problems.into_iter().map(|l| l.into_error(path)));
        admission.out.targets.push(built);
    }
    admission.out
}

/// What admitting one change works with: the registry, the engine that
/// loads plugins, the catalog as the change leaves it so far, the plugins
/// resolved so far, and what has been built.
struct Admission<'a, 'r> {
    catalog: &'r Catalog,
    engine: &'a Engine,
    /// The change's own secrets ([`Change::secrets`]).
    secrets: &'a [Arc<sonde_policy::secrets::SecretCell>],
    overlay: CatalogOverlay<'r>,
    /// Plugin files and OCI tags are resolved once per change; built-ins
    /// and digest-pinned references once per registry.
    resolved: Resolved,
    out: Prepared,
}

/// One target being admitted: where it is written, and its tenant.
struct TargetContext<'t> {
    path: &'t Path,
    config: &'t config::Target,
    name: Arc<str>,
    /// `None` for a tenant not defined (an error already): its probes are
    /// checked against no ceiling.
    tenant: Option<Arc<Tenant>>,
    tenant_id: TenantId,
    quotas: Quotas,
}

impl Admission<'_, '_> {
    /// One target and its probes through the pipeline.
    async fn target(&mut self, path: &Path, t: &config::Target, problems: &mut Vec<Located>) -> TargetEntry {
        let draft = probe::target(t, problems);
        let place = config::place(path, &t.name.referenced);
        self.check_target_name(&draft.name, t, &place, problems);
        let (tenant, tenant_id) = tenant_of(self.catalog, t, problems);
        let target = TargetContext {
            path,
            config: t,
            name: draft.name.as_str().into(),
            quotas: tenant.as_ref().map_or(Quotas::UNLIMITED, |t| t.quotas),
            tenant,
            tenant_id,
        };
        let mut entry = TargetEntry {
            spec: Arc::new(TargetSpec {
                name: target.name.clone(),
                address: draft.address.clone(),
                tenant: target.tenant_id.clone(),
                on_failure: draft.on_failure,
            }),
            place,
            probes: Vec::new(),
        };
        let mut startup_seen = false;
        for p in &t.probes {
            let d = probe::probe(&draft.name, &draft.address, p, &target.quotas, problems);
            check_one_startup(&target, p, &d, &mut startup_seen, problems);
            if let Some(admitted) = self.probe(&target, p, d, problems).await {
                entry.probes.push(admitted);
            }
        }
        entry
    }

    /// A target's name is not taken (by the catalog after the change's
    /// removals, or earlier in the change); it is taken from now on.
    fn check_target_name(&mut self, name: &str, t: &config::Target, place: &Place, problems: &mut Vec<Located>) {
        if !super::valid_name(name) {
            return;
        }
        match self.overlay.target_place(name) {
            Some(first) => problems.push(Located {
                at: t.name.referenced,
                problem: ConfigProblem::TargetDuplicate {
                    name: name.to_string(),
                    first,
                },
            }),
            None => {
                self.overlay.target_names.insert(name.to_string(), place.clone());
            }
        }
    }

    /// One probe of `target` checked, its plugin resolved and its spec
    /// built; its name and where it is written, or `None` when it is left
    /// out (refused, or waiting for or unable to get its plugin).
    async fn probe(
        &mut self,
        target: &TargetContext<'_>,
        p: &config::Probe,
        mut d: probe::ProbeDraft,
        problems: &mut Vec<Located>,
    ) -> Option<(Arc<str>, Place)> {
        let name_place = config::place(target.path, &d.name_at);
        self.check_probe_name(&d, &name_place, problems);
        self.check_quota(target, &d, problems);
        check_ceiling(target, p, &mut d, problems);
        if let Some(tenant) = &target.tenant {
            let owned = super::secrets::Owned {
                tenant,
                given: self.secrets,
            };
            d.grants.secrets = super::secrets::grant(&owned, &self.catalog.tenants, &p.grants.secrets, problems);
        }
        super::secrets::check_exposure(
            &self.catalog.tenants,
            &d.grants,
            &p.grants.secrets,
            &p.grants.files,
            problems,
        );
        if !registry_allowed(target, p, &d, problems) {
            return None;
        }
        let (plugin, plugin_ref) = self.plugin(target, p, &d, problems).await?;
        self.check_schema(&plugin, p, &d, problems);
        self.warn_ungranted(target, &plugin, p, &d);
        let name: Arc<str> = d.name.as_str().into();
        self.out.probes.push(Arc::new(ProbeSpec {
            name: name.clone(),
            target: target.name.clone(),
            tenant: target.tenant_id.clone(),
            kind: d.kind,
            plugin_ref,
            plugin,
            address: d.address,
            config: d.config.to_string(),
            period: d.period,
            initial_delay: d.initial_delay,
            propagate: d.propagate,
            success_threshold: d.success_threshold,
            failure_threshold: d.failure_threshold,
            limits: d.limits,
            grants: Arc::new(d.grants),
            groups: d.groups.into(),
            labels: d.labels.into(),
        }));
        Some((name, name_place))
    }

    /// A probe's name is not taken; it is taken from now on.
    fn check_probe_name(&mut self, d: &probe::ProbeDraft, place: &Place, problems: &mut Vec<Located>) {
        if !super::valid_name(&d.name) {
            return;
        }
        match self.overlay.probe_place(&d.name) {
            Some(first) => problems.push(Located {
                at: d.name_at,
                problem: ConfigProblem::ProbeDuplicate {
                    name: d.name.clone(),
                    defaulted: d.defaulted,
                    first,
                },
            }),
            None => {
                self.overlay.probe_names.insert(d.name.clone(), place.clone());
            }
        }
    }

    /// The probe is counted against its tenant's `max_probes`; the first
    /// one over it is named.
    fn check_quota(&mut self, target: &TargetContext<'_>, d: &probe::ProbeDraft, problems: &mut Vec<Located>) {
        if self.overlay.count(&target.tenant_id) == target.quotas.max_probes.saturating_add(1) {
            problems.push(Located {
                at: d.name_at,
                problem: ConfigProblem::OverQuota {
                    tenant: target.tenant_id.clone(),
                    probe: d.name.clone(),
                    max: target.quotas.max_probes,
                },
            });
        }
    }

    /// `plugin` when its tenant may run it: a tenant with `ceiling.signers`
    /// runs only built-ins and plugins one of them signed.
    fn signed_for_tenant(
        &self,
        target: &TargetContext<'_>,
        p: &config::Probe,
        plugin: (Arc<Plugin>, String),
    ) -> Result<(Arc<Plugin>, String), ResolveError> {
        let limit = target
            .tenant
            .as_ref()
            .and_then(|t| t.ceiling.as_ref()?.signers.as_ref());
        let Some(allowed) = limit else { return Ok(plugin) };
        if sonde_builtins::get(&p.plugin.value).is_some() {
            return Ok(plugin);
        }
        let signers = self.catalog.cache.signers(&plugin.0.digest());
        if signers.iter().any(|s| allowed.contains(s)) {
            return Ok(plugin);
        }
        Err(ResolveError::NotTenantsSigner {
            tenant: target.tenant_id.to_string(),
            plugin: plugin.1,
            signers: signers.to_vec(),
            allowed: allowed.clone(),
        })
    }

    /// The probe's plugin, resolved once per change, and its reference as
    /// shown; `None` when the probe is left out: waiting for a pull (in the
    /// agent), its registry unavailable, or the plugin refused.
    async fn plugin(
        &mut self,
        target: &TargetContext<'_>,
        p: &config::Probe,
        d: &probe::ProbeDraft,
        problems: &mut Vec<Located>,
    ) -> Option<(Arc<Plugin>, String)> {
        let tenant = &target.tenant_id;
        let (resolved, cost) =
            resolve_plugin(self.catalog, self.engine, &mut self.resolved, &p.plugin.value, tenant).await;
        if let Some(cost) = cost {
            self.out.pulls.push(super::Pull {
                tenant: tenant.clone(),
                reference: p.plugin.value.clone(),
                cost,
            });
        }
        let resolved = match resolved {
            Ok(Resolution::Ready(pl)) => self.signed_for_tenant(target, p, pl).map(Resolution::Ready),
            other => other,
        };
        match resolved {
            Ok(Resolution::Ready(pl)) => return Some(pl),
            Ok(Resolution::Pulling(since)) => self.out.waiting.push(super::Waiting {
                probe: d.name.as_str().into(),
                target: target.name.clone(),
                tenant: tenant.clone(),
                kind: d.kind,
                plugin: p.plugin.value.clone(),
                since,
            }),
            // In the agent a failed pull leaves its probes out, whatever
            // the registry did wrong: a remote cannot refuse the config.
            Err(e)
                if e.is_unavailable()
                    || (self.catalog.cache.pulls().is_some() && resolve::is_oci(&p.plugin.value) && e.is_remote()) =>
            {
                self.out.unavailable.push(super::Unavailable {
                    probe: d.name.as_str().into(),
                    tenant: tenant.clone(),
                    plugin: Some(p.plugin.value.clone()),
                    error: Located {
                        at: p.plugin.referenced,
                        problem: ConfigProblem::Plugin(e),
                    }
                    .into_error(target.path),
                });
            }
            Err(e) => problems.push(Located {
                at: p.plugin.referenced,
                problem: ConfigProblem::Plugin(e),
            }),
        }
        None
    }

    /// The probe's `config` against the JSON Schema its plugin publishes.
    fn check_schema(&self, plugin: &Plugin, p: &config::Probe, d: &probe::ProbeDraft, problems: &mut Vec<Located>) {
        let Some(v) = self.catalog.cache.schema(plugin) else {
            return;
        };
        let at = p.config.as_ref().map_or(p.plugin.referenced, |c| c.referenced);
        for (pointer, message) in resolve::schema_errors(&v, &d.config) {
            problems.push(Located {
                at,
                problem: ConfigProblem::Schema {
                    at: pointer,
                    message,
                    plugin: p.plugin.value.clone(),
                },
            });
        }
    }

    /// A warning for each capability the plugin asks for and the probe
    /// does not grant.
    fn warn_ungranted(
        &mut self,
        target: &TargetContext<'_>,
        plugin: &Plugin,
        p: &config::Probe,
        d: &probe::ProbeDraft,
    ) {
        for missing in ungranted(plugin.info(), &d.grants, &d.address) {
            self.out.warnings.push(
                Located {
                    at: p.plugin.referenced,
                    problem: ConfigProblem::Ungranted {
                        probe: d.name.clone(),
                        plugin: p.plugin.value.clone(),
                        missing,
                    },
                }
                .into_error(target.path),
            );
        }
    }
}

/// At most one startup probe per target: the second is named.
fn check_one_startup(
    target: &TargetContext<'_>,
    p: &config::Probe,
    d: &probe::ProbeDraft,
    startup_seen: &mut bool,
    problems: &mut Vec<Located>,
) {
    if d.kind != Kind::Startup {
        return;
    }
    if *startup_seen && let Some(k) = &p.kind {
        problems.push(Located {
            at: k.referenced,
            problem: ConfigProblem::SecondStartup(target.name.to_string()),
        });
    }
    *startup_seen = true;
}

/// The probe within its tenant's ceiling (its reach set from the tenant's).
fn check_ceiling(
    target: &TargetContext<'_>,
    p: &config::Probe,
    d: &mut probe::ProbeDraft,
    problems: &mut Vec<Located>,
) {
    let Some(tenant) = &target.tenant else { return };
    d.grants.reach = tenant.reach();
    for error in tenant.check(&d.name, &d.address, &d.grants, &d.limits) {
        let (key, at) = probe::ceiling_key(&error, target.config, p, d);
        problems.push(Located {
            at,
            problem: ConfigProblem::Ceiling { key, error },
        });
    }
}

/// Whether the probe's plugin may come from where it says: an `oci://`
/// reference outside the tenant's registries is refused before anything
/// is pulled (and the probe left out).
fn registry_allowed(
    target: &TargetContext<'_>,
    p: &config::Probe,
    d: &probe::ProbeDraft,
    problems: &mut Vec<Located>,
) -> bool {
    let Some(ceiling) = target.tenant.as_ref().and_then(|t| t.ceiling.as_ref()) else {
        return true;
    };
    if !resolve::is_oci(&p.plugin.value)
        || sonde_oci::Reference::parse(&p.plugin.value).is_ok_and(|r| ceiling.registries.iter().any(|s| s.covers(&r)))
    {
        return true;
    }
    problems.push(Located {
        at: p.plugin.referenced,
        problem: ConfigProblem::RegistryOutsideCeiling {
            tenant: target.tenant_id.clone(),
            probe: d.name.clone(),
            reference: p.plugin.value.clone(),
        },
    });
    false
}

/// The target's tenant (`None` for one not defined, an error already: its
/// probes are checked against no ceiling) and its id.
fn tenant_of(catalog: &Catalog, t: &config::Target, problems: &mut Vec<Located>) -> (Option<Arc<Tenant>>, TenantId) {
    let Some(id) = &t.tenant else {
        let op = catalog.tenants.operator().clone();
        let id = op.id.clone();
        return (Some(op), id);
    };
    let name = id.value.trim();
    match catalog.tenants.get(name) {
        Some(found) => (Some(found.clone()), found.id.clone()),
        None => {
            problems.push(Located {
                at: id.referenced,
                problem: ConfigProblem::UnknownTenant {
                    id: name.to_string(),
                    known: catalog.tenants.iter().skip(1).map(|t| t.id.to_string()).collect(),
                },
            });
            (None, name.into())
        }
    }
}

/// A plugin resolved, or being pulled since then (in the agent).
#[derive(Clone)]
enum Resolution {
    Ready((Arc<Plugin>, String)),
    Pulling(std::time::SystemTime),
}

/// What a change resolved, by plugin as written: the plugin and its
/// reference as shown (an `oci://` one pinned to its digest).
type Resolved = HashMap<String, Result<Resolution, ResolveError>>;

/// Resolves `name` once per change. An `oci://` plugin resolved now (not
/// by an earlier probe of the change) comes with what its pull cost.
async fn resolve_plugin(
    catalog: &Catalog,
    engine: &Engine,
    files: &mut Resolved,
    name: &str,
    tenant: &TenantId,
) -> (Result<Resolution, ResolveError>, Option<PullCost>) {
    if let Some(r) = files.get(name) {
        return (r.clone(), None);
    }
    let mut cost = None;
    let r = if resolve::is_oci(name) {
        let settings = catalog
            .oci
            .clone()
            .unwrap_or_else(|| Arc::new(sonde_oci::ClientSettings::new(super::settings::oci_cache_dir(None))));
        catalog
            .cache
            .oci_plugin(engine, &settings, name, &catalog.trust, tenant)
            .await
            .map(|outcome| match outcome {
                resolve::OciPlugin::Ready(resolved, c) => {
                    cost = c;
                    Resolution::Ready(resolved)
                }
                resolve::OciPlugin::Pulling(since) => Resolution::Pulling(since),
            })
    } else if resolve::is_path(name) {
        resolve::plugin(engine, &catalog.base, name, &catalog.trust, &catalog.cache)
            .await
            .map(|p| Resolution::Ready((p, name.to_string())))
    } else {
        let builtin = catalog
            .cache
            .plugin(engine, &catalog.base, name, &catalog.trust)
            .await
            .map(|p| Resolution::Ready((p, name.to_string())));
        return (builtin, None);
    };
    files.insert(name.to_string(), r.clone());
    (r, cost)
}

/// What a plugin's `describe` asks for that `grants` (and the target) do
/// not give, as `kind value (why)` texts. A `files` value of `*` means "some
/// path the config names": any `files` grant covers it.
pub(super) fn ungranted(info: &PluginInfo, grants: &Grants, address: &str) -> Vec<String> {
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
