//! The registry client: resolve (pull through the cache), push, and attach
//! or fetch signatures. Built on `oci-client` (the ORAS project's Rust
//! client), which speaks the distribution API and the token flow.
//!
//! Here: the [`Client`] and what every exchange shares (its registries,
//! the cache, the deadline). Its settings are `settings`, a registry's
//! client and credentials `registry`, pulling `resolve`, pushing `push`.

mod push;
mod registry;
mod resolve;
mod settings;
mod signatures;

pub use push::{ComponentInfo, Pushed, SignaturePushed};
pub use resolve::{Progress, Resolved, Source};
pub use settings::{ClientSettings, RegistryAccess};
pub use signatures::{SignatureLocation, cosign_tag, signature_tag};

use crate::OciError;
use crate::cache::Cache;
use registry::{RegistryClient, build_registry};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A client for plugin artifacts in OCI registries, with its cache.
///
/// Lifecycle: built once per process ([`Client::new`] reads password and CA
/// files then); [`Client::resolve`] per plugin load.
pub struct Client {
    settings: ClientSettings,
    cache: Cache,
    registries: Mutex<HashMap<String, Arc<RegistryClient>>>,
    /// Blobs resolved by this process: never evicted while it runs.
    in_use: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("cache", &self.cache.dir())
            .field("registries", &self.settings.registries.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Builds the client: opens the cache and reads every configured
    /// registry's password and CA file (errors name the file, never its
    /// contents).
    pub fn new(settings: ClientSettings) -> Result<Self, OciError> {
        let cache = Cache::open(&settings.cache_dir, settings.cache_max_bytes)?;
        let mut registries = HashMap::new();
        for (name, s) in &settings.registries {
            registries.insert(name.clone(), Arc::new(build_registry(name, s, settings.limits)?));
        }
        Ok(Self {
            settings,
            cache,
            registries: Mutex::new(registries),
            in_use: Mutex::new(HashSet::new()),
        })
    }

    /// The cache this client pulls through.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    fn registry(&self, name: &str) -> Result<Arc<RegistryClient>, OciError> {
        let mut map = self.registries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = map.get(name) {
            return Ok(r.clone());
        }
        let r = Arc::new(build_registry(name, &RegistryAccess::default(), self.settings.limits)?);
        map.insert(name.to_string(), r.clone());
        Ok(r)
    }

    fn mark_in_use(&self, digest: &str) {
        self.in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string());
    }

    /// Evicts least recently used blobs this process has not resolved until
    /// the cache is within `cache_max_bytes`. Returns the bytes freed.
    pub(crate) fn prune_cache(&self) -> Result<u64, OciError> {
        let in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner()).clone();
        self.cache.prune(&in_use)
    }

    /// `f`, given up on at `deadline` (the whole pull's or push's).
    async fn bounded<T>(
        &self,
        deadline: tokio::time::Instant,
        registry: &str,
        f: impl std::future::Future<Output = Result<T, OciError>>,
    ) -> Result<T, OciError> {
        match tokio::time::timeout_at(deadline, f).await {
            Ok(r) => r,
            Err(_) => Err(OciError::Timeout {
                registry: registry.to_string(),
                after: self.settings.timeout,
            }),
        }
    }

    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.settings.timeout
    }
}
