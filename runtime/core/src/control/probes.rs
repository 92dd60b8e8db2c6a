//! Probes changed through the API (stored, per tenant) and by a
//! controller (incremental changes, nothing stored).

use super::{
    ChangeError, Conflict, Control, ControlError, Problem, Subject, check_name, internal, source_of, tenant_of,
};
use crate::auth::Principal;
use crate::catalog::{Catalog, Change, Prepared};
use crate::config::{self, ConfigError, ConfigErrors};
use crate::scheduler::ReloadSummary;
use crate::uploads::{self, Store, StoredProbe};

impl Control {
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
        if body.len() > uploads::MAX_PROBE_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Probe,
                limit: uploads::MAX_PROBE_BYTES,
            });
        }
        let spec = uploads::parse_spec(body).map_err(|source| ControlError::BadSpec {
            name: name.to_string(),
            source,
        })?;
        let mut catalog = self.catalog.lock().await;
        let mine = self.check_owner(store, who, name, &owner_now)?;
        let probe = StoredProbe {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
        };
        let prepared = self
            .prepare(&catalog, store, std::slice::from_ref(&probe), &[(name, mine)])
            .await?;
        store.put_probe(&probe).map_err(internal("store the probe"))?;
        tracing::info!(tenant, probe = name, "probe stored");
        self.commit(&mut catalog, prepared, &[name]).await;
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
        if body.len() > uploads::MAX_BATCH_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Probe,
                limit: uploads::MAX_BATCH_BYTES,
            });
        }
        let specs = uploads::parse_batch(body).map_err(|source| ControlError::BadSpec {
            name: String::new(),
            source,
        })?;
        for (name, _) in &specs {
            check_name(Subject::Probe, name)?;
        }
        let mut catalog = self.catalog.lock().await;
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
        let prepared = self.prepare(&catalog, store, &probes, &names).await?;
        // All stored, or none, across a crash too (a journal).
        store.put_probes(&probes).map_err(internal("store the probes"))?;
        tracing::info!(tenant, probes = probes.len(), "probes stored");
        let plain: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
        self.commit(&mut catalog, prepared, &plain).await;
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
    /// its name when `names` says it exists) against `catalog` as one change.
    async fn prepare(
        &self,
        catalog: &Catalog,
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
            let target = uploads::to_target(store, p).map_err(|e| {
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
        let prepared = catalog.prepare(&self.engine, change).await.map_err(|errors| {
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

    /// Applies `change` to the catalog in force as one incremental change,
    /// nothing stored: probes a controller keeps from another source of
    /// truth (the Kubernetes controller: one per
    /// Pod gate). Refused whole, with every error, or committed and handed
    /// to the scheduler. A reload of the config file drops such probes;
    /// the controller puts them back (it follows [`Control::reloads`]).
    ///
    /// A change whose `oci://` plugin is being pulled is not applied
    /// ([`ChangeError::Pulling`]); [`Control::pulls_ended`] tells when to
    /// send it again. Nothing here waits on a catalog.
    pub async fn apply_change(&self, change: Change) -> Result<ReloadSummary, ChangeError> {
        let mut catalog = self.catalog.lock().await;
        // Said here, without the list of the tenants there are (the
        // catalog's message, for the file's author): such a refusal is
        // read by the source's users (an Event in a namespace), to whom
        // other tenants' names are none of their business.
        let unknown: Vec<ConfigError> = change
            .add
            .iter()
            .filter_map(|t| {
                let id = t.tenant.as_ref()?;
                let name = id.value.trim();
                catalog.tenants.get(name).is_none().then(|| ConfigError {
                    place: config::place(t.source.as_deref().unwrap_or(std::path::Path::new("")), &id.referenced),
                    message: format!("tenant: no tenant {name:?} is defined on this agent"),
                })
            })
            .collect();
        if !unknown.is_empty() {
            return Err(ChangeError::Invalid(ConfigErrors(unknown)));
        }
        let prepared = catalog
            .prepare(&self.engine, change)
            .await
            .map_err(ChangeError::Invalid)?;
        if !prepared.waiting().is_empty() {
            return Err(ChangeError::Pulling(prepared.waiting().to_vec()));
        }
        Ok(self.commit(&mut catalog, prepared, &[]).await)
    }

    /// Checks `change` against the catalog in force as
    /// [`Control::apply_change`] would, and drops it: nothing is committed,
    /// nothing scheduled. A change whose `oci://` plugin is being pulled
    /// passes (the pull goes on in the background, as a change would
    /// start it). The Kubernetes status writer's dry run of a SondeCheck.
    pub async fn check_change(&self, change: Change) -> Result<(), ConfigErrors> {
        let catalog = self.catalog.lock().await;
        catalog.prepare(&self.engine, change).await.map(drop)
    }
    /// Removes the caller's probe `name` (`DELETE /v1/probes/{name}`): only
    /// probes added through the API go this way. `visible` says whether
    /// the caller can see a probe of that name (one of the config file's).
    pub async fn delete_probe(&self, who: &Principal, name: &str, visible: bool) -> Result<(), ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        let mut catalog = self.catalog.lock().await;
        let removed =
            uploads::valid_name(name) && store.delete_probe(tenant, name).map_err(internal("delete the probe"))?;
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
        match catalog.prepare(&self.engine, Change::remove([name])).await {
            Ok(prepared) => {
                self.commit(&mut catalog, prepared, &[name]).await;
                Ok(())
            }
            // A removal breaks no rule; if it did, the catalog would say so.
            Err(source) => Err(ControlError::Unavailable { stored: true, source }),
        }
    }
}
