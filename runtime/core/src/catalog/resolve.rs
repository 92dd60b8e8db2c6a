//! The resolve step: a plugin as written in the config (`http`,
//! `./check.wasm`) becomes a loaded [`Plugin`], its signature checked first
//! when the config requires it, and its config schema compiled once per
//! digest. Built-ins never change, so a registry keeps them by name; files
//! are read again on every change, since they may have been replaced.

use super::outcome::{PullCost, ResolveError};
use super::pulls::{Asked, Pulls};
use sonde_oci::signing::PublicKey;
use sonde_sandbox::engine::{Engine, LoadError, Plugin};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// How plugin files must be signed (`trust:`, `require_signed:`).
#[derive(Debug, Default)]
pub struct Trust {
    /// The keys whose signatures are accepted.
    pub keys: Vec<PublicKey>,
    /// Whether an unsigned or untrusted plugin file is refused.
    pub required: bool,
}

/// Whether `name` is written as a file rather than a built-in's name or
/// an OCI reference.
pub(crate) fn is_path(name: &str) -> bool {
    !is_oci(name) && (name.contains('/') || name.ends_with(".wasm"))
}

/// Whether `name` is an OCI reference (`oci://…`).
pub fn is_oci(name: &str) -> bool {
    sonde_oci::Reference::is_oci(name)
}

/// Pulls (or finds in the cache) the plugin `name`, an `oci://` reference,
/// checks its signature first when `trust.required`, and loads it.
/// Returns it with its reference pinned to the digest that runs, and the
/// bytes that came from the registry (0 when the cache had everything).
pub(crate) async fn oci_plugin(
    engine: &Engine,
    client: &sonde_oci::Client,
    name: &str,
    trust: &Trust,
    cache: &Cache,
) -> Result<(Arc<Plugin>, String, u64), ResolveError> {
    let oci = |e| ResolveError::Oci(Arc::new(e));
    let reference = sonde_oci::Reference::parse(name).map_err(oci)?;
    let resolved = client.resolve(&reference).await.map_err(oci)?;
    if let sonde_oci::Source::CacheRegistryDown { error, .. } = &resolved.source {
        tracing::warn!(plugin = %resolved.pinned(), error = %error, "registry unreachable; the plugin is loaded from the cache");
    }
    let (plugin, pinned) = verify_and_load(engine, &resolved, trust, cache).await?;
    Ok((plugin, pinned, resolved.transferred))
}

/// Checks `resolved`'s signatures when any key is trusted (refusing it
/// when `trust.required` and none verifies), then loads it and records
/// who signed it in `cache`: the plugin and its pinned reference.
async fn verify_and_load(
    engine: &Engine,
    resolved: &sonde_oci::Resolved,
    trust: &Trust,
    cache: &Cache,
) -> Result<(Arc<Plugin>, String), ResolveError> {
    let pinned = resolved.pinned().to_string();
    let signers = signers_or_refusal(&pinned, trust, || resolved.verify(&trust.keys))?;
    let plugin = engine
        .load(&pinned, &resolved.bytes)
        .await
        .map_err(|e| ResolveError::Load(Arc::new(e)))?;
    cache.record_signers(plugin.digest(), signers);
    Ok((plugin, pinned))
}

/// The names of the trusted signers `verify` finds: none when no key is
/// trusted or none verifies, and an error for the latter when
/// `trust.required`.
fn signers_or_refusal(
    plugin: &str,
    trust: &Trust,
    verify: impl FnOnce() -> Result<Vec<sonde_oci::signing::Signer>, sonde_oci::signing::SignatureError>,
) -> Result<Vec<String>, ResolveError> {
    if trust.keys.is_empty() && !trust.required {
        return Ok(Vec::new());
    }
    match verify() {
        Ok(signers) => {
            for s in &signers {
                tracing::info!(plugin, signer = %s.name, key = %s.key_id, "plugin signature verified");
            }
            Ok(signers.into_iter().map(|s| s.name).collect())
        }
        Err(e) if trust.required || !e.is_verdict() => Err(ResolveError::Unsigned(Arc::new(e))),
        Err(e) => {
            tracing::debug!(plugin, error = %e, "no trusted signature (not required)");
            Ok(Vec::new())
        }
    }
}

/// Loads a built-in by name, or a `.wasm` file by path (relative to `base`),
/// checking its signature first when a key is trusted (and refusing it
/// when `trust.required` and it is not signed by one), and recording who
/// signed it in `cache`. The bytes checked are the bytes loaded.
pub async fn plugin(
    engine: &Engine,
    base: &Path,
    name: &str,
    trust: &Trust,
    cache: &Cache,
) -> Result<Arc<Plugin>, ResolveError> {
    let load = |e: LoadError| ResolveError::Load(Arc::new(e));
    if is_path(name) {
        let path = base.join(name);
        cache.check_trust(trust);
        if trust.keys.is_empty() && !trust.required {
            return engine.load_file(&path).await.map_err(load);
        }
        let label = path.display().to_string();
        let bytes = sonde_sandbox::engine::read_plugin_file(&path).await.map_err(load)?;
        let sig = sonde_oci::signing::read_signature(&path).map_err(|e| ResolveError::Signature(Arc::new(e)))?;
        let (sig_name, sig) = match sig {
            Some((p, s)) => (p.display().to_string(), Some(s)),
            None => (sonde_oci::signing::bundle_path(&path).display().to_string(), None),
        };
        let signers = signers_or_refusal(&label, trust, || {
            sonde_oci::signing::verify_all(&label, &bytes, &sig_name, sig.as_deref(), &trust.keys)
        })?;
        let plugin = engine.load(&label, &bytes).await.map_err(load)?;
        cache.record_signers(plugin.digest(), signers);
        return Ok(plugin);
    }
    match sonde_builtins::get(name) {
        Some(bytes) => engine.load(name, bytes).await.map_err(load),
        None => Err(ResolveError::UnknownBuiltin { name: name.to_string() }),
    }
}

/// What a registry keeps between changes: built-ins by name, each
/// digest's compiled config schema, the registry client, and — in the
/// agent, where it outlives reloads — the background [`Pulls`]. Clones
/// share it.
#[derive(Clone, Default)]
pub struct Cache {
    inner: Arc<Mutex<CacheInner>>,
    /// Set in the agent: `oci://` plugins not at hand are pulled in the
    /// background instead of waited for.
    pulls: Option<Pulls>,
}

#[derive(Default)]
struct CacheInner {
    builtins: HashMap<String, Arc<Plugin>>,
    /// Digest-pinned `oci://` references never change: resolved once.
    pinned: HashMap<String, (Arc<Plugin>, String)>,
    schemas: HashMap<sonde_policy::identity::Digest, Option<Arc<jsonschema::Validator>>>,
    oci: Option<(sonde_oci::ClientSettings, Arc<sonde_oci::Client>)>,
    /// The trust settings the resolved plugins were checked under.
    trust: Option<(bool, Vec<String>)>,
    /// The trusted signers of each plugin checked under them, by digest.
    signed: HashMap<sonde_policy::identity::Digest, Arc<[String]>>,
}

/// What asking for an `oci://` plugin gives.
pub(crate) enum OciPlugin {
    /// Resolved, with what it cost (when this change is the one charged).
    Ready((Arc<Plugin>, String), Option<PullCost>),
    /// Being pulled in the background since then; the probes that need it
    /// wait ([`Cache::pulls`] says when it ends).
    Pulling(std::time::SystemTime),
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").finish_non_exhaustive()
    }
}

impl Cache {
    /// A cache whose `oci://` plugins are pulled in the background (the
    /// agent's): a change never waits on a registry.
    pub fn background() -> Self {
        Self {
            pulls: Some(Pulls::default()),
            ..Self::default()
        }
    }

    /// The background pulls, in the agent.
    pub fn pulls(&self) -> Option<&Pulls> {
        self.pulls.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves `name` as [`plugin`] does, reusing a built-in already loaded.
    pub async fn plugin(
        &self,
        engine: &Engine,
        base: &Path,
        name: &str,
        trust: &Trust,
    ) -> Result<Arc<Plugin>, ResolveError> {
        if !is_path(name)
            && let Some(p) = self.lock().builtins.get(name)
        {
            return Ok(p.clone());
        }
        let p = plugin(engine, base, name, trust, self).await?;
        if !is_path(name) {
            self.lock().builtins.insert(name.to_string(), p.clone());
        }
        Ok(p)
    }

    /// Drops what was resolved under other trust settings than `trust`.
    fn check_trust(&self, trust: &Trust) {
        let now = (
            trust.required,
            trust.keys.iter().map(|k| k.key_id().to_string()).collect::<Vec<_>>(),
        );
        let mut inner = self.lock();
        if inner.trust.as_ref().is_some_and(|t| *t != now) {
            inner.pinned.clear();
            inner.signed.clear();
            if let Some(p) = &self.pulls {
                p.forget();
            }
        }
        inner.trust = Some(now);
    }

    /// Records that the plugin `digest` is signed by `signers` (names of
    /// trusted keys) under the trust settings in force.
    pub(crate) fn record_signers(&self, digest: sonde_policy::identity::Digest, signers: Vec<String>) {
        self.lock().signed.insert(digest, signers.into());
    }

    /// The trusted signers of the plugin `digest`, as last checked: none
    /// when it was not signed by a trusted key, or not checked.
    pub(crate) fn signers(&self, digest: &sonde_policy::identity::Digest) -> Arc<[String]> {
        self.lock().signed.get(digest).cloned().unwrap_or_else(|| Arc::from([]))
    }

    /// Resolves the `oci://` reference `name` as [`oci_plugin`] does, with
    /// the registry's client (built from `settings`, again when they
    /// change), once for a digest-pinned reference.
    ///
    /// In the agent ([`Cache::background`]) it never waits on a registry:
    /// a plugin not resolved yet and not whole in the disk cache is pulled
    /// in the background for `tenant` and [`OciPlugin::Pulling`] returned;
    /// a pull that failed is its error until its backoff passes.
    pub(crate) async fn oci_plugin(
        &self,
        engine: &Engine,
        settings: &sonde_oci::ClientSettings,
        name: &str,
        trust: &Arc<Trust>,
        tenant: &crate::tenants::TenantId,
    ) -> Result<OciPlugin, ResolveError> {
        let oci = |e| ResolveError::Oci(Arc::new(e));
        self.check_trust(trust);
        if let Some(p) = self.lock().pinned.get(name) {
            return Ok(OciPlugin::Ready(p.clone(), None));
        }
        let reference = sonde_oci::Reference::parse(name).map_err(oci)?;
        let client = self.oci_client(settings)?;
        let Some(pulls) = &self.pulls else {
            let started = std::time::Instant::now();
            let (plugin, pinned, bytes) = oci_plugin(engine, &client, name, trust, self).await?;
            let cost = PullCost {
                bytes,
                elapsed: started.elapsed(),
            };
            let resolved = (plugin, pinned);
            if reference.is_pinned() {
                self.lock().pinned.insert(name.to_string(), resolved.clone());
            }
            return Ok(OciPlugin::Ready(resolved, Some(cost)));
        };
        if let Some((ready, cost)) = pulls.take_pinned(name) {
            self.lock().pinned.insert(name.to_string(), ready.clone());
            return Ok(OciPlugin::Ready(ready, cost));
        }
        // Whole in the disk cache: no registry needed, no wait.
        if reference.is_pinned()
            && let Some(resolved) = client.resolve_cached(&reference, trust.required).map_err(oci)?
        {
            let ready = verify_and_load(engine, &resolved, trust, self).await?;
            self.lock().pinned.insert(name.to_string(), ready.clone());
            return Ok(OciPlugin::Ready(ready, Some(PullCost::default())));
        }
        let (engine, trust, owned, cache) = (engine.clone(), trust.clone(), name.to_string(), self.clone());
        let pull = async move {
            let started = std::time::Instant::now();
            let (plugin, pinned, bytes) = oci_plugin(&engine, &client, &owned, &trust, &cache).await?;
            let cost = PullCost {
                bytes,
                elapsed: started.elapsed(),
            };
            Ok(((plugin, pinned), cost))
        };
        Ok(match pulls.ask(name, tenant, reference.is_pinned(), pull) {
            Asked::Ready(ready, cost) => {
                if reference.is_pinned() {
                    self.lock().pinned.insert(name.to_string(), ready.clone());
                }
                OciPlugin::Ready(ready, cost)
            }
            Asked::Pulling(since) => OciPlugin::Pulling(since),
            Asked::Failed(e) => return Err(e),
        })
    }

    /// Forgets the `oci://` plugins nothing else holds any more (no probe
    /// of the catalog in force, no run), so that their compiled code is
    /// freed: called before each whole load, while the catalog in force
    /// still holds what it uses.
    pub(crate) fn release_unused(&self) {
        self.lock().pinned.retain(|_, (p, _)| Arc::strong_count(p) > 1);
        if let Some(p) = &self.pulls {
            p.release_unused();
        }
    }

    fn oci_client(&self, settings: &sonde_oci::ClientSettings) -> Result<Arc<sonde_oci::Client>, ResolveError> {
        let mut inner = self.lock();
        if let Some((s, c)) = &inner.oci
            && s == settings
        {
            return Ok(c.clone());
        }
        let client = Arc::new(sonde_oci::Client::new(settings.clone()).map_err(|e| ResolveError::Oci(Arc::new(e)))?);
        inner.oci = Some((settings.clone(), client.clone()));
        Ok(client)
    }

    /// The compiled config schema of `plugin`, if it publishes one that
    /// compiles.
    pub fn schema(&self, plugin: &Plugin) -> Option<Arc<jsonschema::Validator>> {
        self.lock()
            .schemas
            .entry(plugin.digest())
            .or_insert_with(|| {
                let schema = plugin.info().config_schema.as_deref()?;
                let schema: serde_json::Value = serde_json::from_str(schema).ok()?;
                compile_schema(&schema).map(Arc::new)
            })
            .clone()
    }
}

/// A plugin's config schema as sonde checks it: `format` asserts (a value
/// that does not fit is refused, not only annotated), and the format
/// `regex` is sonde's one dialect (`sonde_regex`), the one the built-in
/// plugins compile their patterns in, so `sonde validate` refuses every
/// pattern a run would.
pub(crate) fn compile_schema(schema: &serde_json::Value) -> Option<jsonschema::Validator> {
    jsonschema::options()
        .should_validate_formats(true)
        .with_format("regex", |s: &str| sonde_regex::compile(s).is_ok())
        .build(schema)
        .ok()
}

/// The first five ways `config` does not fit `validator`, as (JSON pointer,
/// message) pairs. A pattern that is not a regex says why.
pub(crate) fn schema_errors(validator: &jsonschema::Validator, config: &serde_json::Value) -> Vec<(String, String)> {
    validator
        .iter_errors(config)
        .take(5)
        .map(|e| {
            let message = match (e.kind(), e.instance().as_str()) {
                (jsonschema::error::ValidationErrorKind::Format { format }, Some(pattern)) if format == "regex" => {
                    match sonde_regex::compile(pattern) {
                        Err(why) => format!("{pattern:?} is not a regex: {why}"),
                        Ok(_) => e.to_string(),
                    }
                }
                _ => e.to_string(),
            };
            (e.instance_path().to_string(), message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_name_is_a_file_an_oci_reference_or_a_built_in() {
        for file in ["./check.wasm", "plugins/check", "check.wasm", "/abs/check.wasm"] {
            assert!(is_path(file) && !is_oci(file), "{file}");
        }
        let oci = "oci://registry.example/checks/redis@sha256:0123";
        assert!(is_oci(oci) && !is_path(oci), "a reference has slashes but is no file");
        assert!(!is_path("http") && !is_oci("http"), "a built-in");
    }

    #[test]
    fn schema_errors_name_the_pointer_and_stop_at_five() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": { "port": { "type": "integer" } },
            "additionalProperties": { "type": "string" },
        });
        let validator = compile_schema(&schema).unwrap();
        assert!(schema_errors(&validator, &serde_json::json!({"port": 1})).is_empty());
        let one = schema_errors(&validator, &serde_json::json!({"port": "x"}));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].0, "/port");
        let many: serde_json::Map<_, _> = (0..8).map(|i| (format!("k{i}"), serde_json::json!(i))).collect();
        assert_eq!(schema_errors(&validator, &serde_json::Value::Object(many)).len(), 5);
    }

    #[test]
    fn a_regex_format_is_checked_in_the_plugins_dialect() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": { "re": { "type": "string", "format": "regex" } },
        });
        let validator = compile_schema(&schema).unwrap();
        for go in ["(?i)^ok$", "{\"status\":\"UP\"}", "\\p{^Greek}", "\\Qa.b\\E"] {
            assert!(
                schema_errors(&validator, &serde_json::json!({ "re": go })).is_empty(),
                "{go}"
            );
        }
        let bad = schema_errors(&validator, &serde_json::json!({"re": "(a"}));
        assert_eq!(bad[0].0, "/re");
        assert!(
            bad[0].1.contains("\"(a\" is not a regex: unclosed group"),
            "{}",
            bad[0].1
        );
    }
}
