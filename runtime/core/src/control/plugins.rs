//! Plugins uploaded through the API: stored per tenant, compiled one at a
//! time per tenant, and in force after a reload of everything.

use super::{Conflict, Control, ControlError, Problem, Subject, check_name, internal, tenant_of};
use crate::auth::Principal;
use crate::uploads::{self, Store};
use sonde_policy::identity::Digest;
use sonde_sandbox::engine::LoadError;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
    /// Adds or replaces the caller's plugin `name` (`PUT /v1/plugins/{name}`):
    /// validates the component and stores it as the caller's; probes that
    /// use it restart with the new version. Returns whether it replaced an
    /// existing one.
    ///
    /// `signature` is the plugin's sigstore bundle (the `Sonde-Signature`
    /// header): required when the agent has `require_signed`, and checked
    /// against its `trust` keys and the tenant's `ceiling.signers` before
    /// anything is compiled or stored; it is stored beside the plugin.
    pub async fn put_plugin(
        &self,
        who: &Principal,
        name: &str,
        wasm: &[u8],
        signature: Option<&[u8]>,
    ) -> Result<bool, ControlError> {
        let store = self.store()?;
        let tenant = tenant_of(who);
        check_name(Subject::Plugin, name)?;
        if sonde_builtins::get(name).is_some() {
            return Err(Conflict::BuiltIn { name: name.to_string() }.into());
        }
        if self.require_signed.load(Ordering::Relaxed) && signature.is_none() {
            return Err(Conflict::RequireSigned.into());
        }
        if wasm.len() > uploads::MAX_PLUGIN_BYTES {
            return Err(ControlError::TooLarge {
                what: Subject::Plugin,
                limit: uploads::MAX_PLUGIN_BYTES,
            });
        }
        self.check_upload_signature(tenant, name, wasm, signature).await?;
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
        // loaded until the catalog holds it, so it is compiled once.
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
        let mut current = self.catalog.lock().await;
        let owner = store.plugin_owner(name);
        refuse_taken(&owner)?;
        let old = std::fs::read(store.plugin_path(tenant, name))
            .ok()
            .map(|b| Digest::of(&b));
        store
            .put_plugin(tenant, name, wasm, signature)
            .map_err(internal("store the plugin"))?;
        tracing::info!(tenant, plugin = name, bytes = wasm.len(), "plugin stored");
        self.reload_after_change(&mut current).await?;
        if let Some(old) = old {
            self.forget_unless_stored(store, &old);
        }
        Ok(owner.is_some())
    }

    /// Checks an upload's signature as the catalog will check the stored
    /// plugin: when the agent requires signatures or the tenant has
    /// `ceiling.signers`, it must verify with a `trust` key (and be one of
    /// the tenant's signers). A signature the agent does not need is still
    /// checked, so that nothing unverifiable is stored.
    async fn check_upload_signature(
        &self,
        tenant: &str,
        name: &str,
        wasm: &[u8],
        signature: Option<&[u8]>,
    ) -> Result<(), ControlError> {
        let (trust, limit) = {
            let current = self.catalog.lock().await;
            let limit = current
                .tenants
                .get(tenant)
                .and_then(|t| t.ceiling.as_ref()?.signers.clone());
            (current.trust().clone(), limit)
        };
        if signature.is_none() && !trust.required && limit.is_none() {
            return Ok(());
        }
        let invalid = |why: String| ControlError::Invalid {
            what: Subject::Plugin,
            name: name.to_string(),
            problems: vec![Problem::Signature(why)],
        };
        let label = format!("upload {name}");
        let signers =
            sonde_oci::signing::verify_all(&label, wasm, "the Sonde-Signature header", signature, &trust.keys)
                .map_err(|e| invalid(e.to_string()))?;
        if let Some(allowed) = limit
            && !signers.iter().any(|s| allowed.contains(&s.name))
        {
            let names: Vec<&str> = signers.iter().map(|s| s.name.as_str()).collect();
            return Err(invalid(format!(
                "tenant {tenant:?} runs only plugins signed by {}: this one is signed by {}",
                allowed.join(", "),
                names.join(", ")
            )));
        }
        Ok(())
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
        let mut current = self.catalog.lock().await;
        if !uploads::valid_name(name) || store.plugin_owner(name).as_deref() != Some(tenant) {
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
        // Its compiled code went with the old catalog; its cache file
        // goes now, unless another plugin of the same bytes still runs.
        if let Some(old) = old {
            self.forget_unless_stored(store, &old);
        }
        Ok(())
    }
}
