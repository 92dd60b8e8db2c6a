//! Resolving a reference: through the cache, the registry when it answers,
//! and the signature beside the artifact.

use super::Client;
use super::registry::RegistryClient;
use super::signatures::{SignatureLocation, cosign_tag, signature_tag};
use crate::error::NotWasm;
use crate::signing::{PublicKey, SignatureError, Signer};
use crate::{OciError, Reference, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use sonde_policy::identity::Digest;
use std::sync::Arc;

/// How far a download has got, for a progress display.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Bytes received.
    pub done: u64,
    /// Bytes expected.
    pub total: u64,
}

/// Where the bytes of a resolve came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The registry was asked (a tag resolved now, or missing blobs pulled).
    Registry,
    /// Everything came from the cache: the reference is pinned and cached,
    /// and the registry was not needed (a signature lookup may still have
    /// been tried).
    Cache,
    /// The registry could not be asked and the cache stood in. For a tag,
    /// the digest is the one it resolved to at `tag_resolved_at`.
    CacheRegistryDown {
        /// Why the registry could not be asked.
        error: String,
        /// For a tag: when it last resolved (RFC 3339).
        tag_resolved_at: Option<String>,
    },
}

/// A component resolved from a reference, verified against its digests.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The reference as given.
    pub reference: Reference,
    /// The manifest digest: what runs, and what a pinned reference names.
    pub digest: String,
    /// The digest of the component itself (what a sonde signature signs).
    pub wasm_digest: String,
    /// The component.
    pub bytes: Arc<[u8]>,
    /// The sonde signature attached to the manifest, if any (the
    /// `FILE.wasm.sig` JSON), and where it was found.
    pub signature: Option<(Vec<u8>, SignatureLocation)>,
    /// Where this came from.
    pub source: Source,
    /// The bytes downloaded from the registry for this resolve (manifests,
    /// the component, the signature); 0 when all came from the cache. For
    /// counting pulls against a tenant.
    pub transferred: u64,
}

impl Resolved {
    /// The reference pinned to the digest that resolved (what to show in
    /// status, metrics and events).
    pub fn pinned(&self) -> Reference {
        self.reference.with_digest(&self.digest)
    }

    /// Checks the attached signatures with [`crate::signing::verify_all`]:
    /// missing, tampered and untrusted are told apart exactly as for a
    /// file. Every trusted signer that signed it.
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<Vec<Signer>, SignatureError> {
        let plugin = self.pinned().to_string();
        let sig_name = match &self.signature {
            Some((_, loc)) => loc.describe(&self.pinned()),
            None => format!(
                "in the registry (no signature referrer, no tag {} or {})",
                cosign_tag(&self.digest),
                signature_tag(&self.digest)
            ),
        };
        crate::signing::verify_all(
            &plugin,
            &self.bytes,
            &sig_name,
            self.signature.as_ref().map(|(b, _)| b.as_slice()),
            trusted,
        )
    }
}

/// What [`Client::blob_or_fetch`] fetches when the cache lacks it.
enum Fetch<'a> {
    Manifest,
    Component {
        layer: &'a OciDescriptor,
        max: u64,
        progress: &'a (dyn Fn(Progress) + Sync),
    },
}

/// One resolve under way: the registry it asks, its deadline, where its
/// bytes have come from so far, the error that showed the registry down
/// (then only the cache is read), and the bytes that came over the network.
struct Resolving {
    registry: Arc<RegistryClient>,
    deadline: tokio::time::Instant,
    source: Source,
    offline: Option<OciError>,
    transferred: u64,
}

/// Checks a manifest against the CNCF wasm layout and returns its one
/// component layer.
pub(super) fn wasm_layer(
    reference: &Reference,
    manifest: &OciImageManifest,
    max: u64,
) -> Result<OciDescriptor, OciError> {
    let not_wasm = |why: NotWasm| OciError::NotWasm {
        reference: reference.to_string(),
        why,
    };
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(not_wasm(NotWasm::ConfigMediaType(
            manifest.config.media_type.chars().take(200).collect(),
        )));
    }
    let wasm: Vec<&OciDescriptor> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER_MEDIA_TYPE)
        .collect();
    let [layer] = wasm.as_slice() else {
        return Err(not_wasm(NotWasm::Layers(wasm.len())));
    };
    if Digest::parse(&layer.digest).is_err() {
        return Err(not_wasm(NotWasm::LayerDigest(layer.digest.chars().take(200).collect())));
    }
    if layer.size < 0 || layer.size as u64 > max {
        return Err(OciError::TooLarge {
            reference: reference.to_string(),
            what: "component",
            size: layer.size.max(0) as u64,
            limit: max,
        });
    }
    Ok((*layer).clone())
}

pub(super) fn parse_manifest(reference: &Reference, bytes: &[u8]) -> Result<OciImageManifest, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::NotWasm {
        reference: reference.to_string(),
        why: NotWasm::Manifest(e),
    })
}

impl Client {
    /// Resolves `reference` to a verified component: a tag to its manifest
    /// digest (asking the registry), then the manifest, the component and
    /// its signature, each from the cache when there and from the registry
    /// otherwise, each checked against its digest.
    ///
    /// Offline: a pinned reference whose blobs are cached resolves without
    /// the registry; a tag resolves to the digest it last resolved to here
    /// ([`Source::CacheRegistryDown`] says so). A reference never pulled,
    /// with the registry down, is [`OciError::NotCached`].
    pub async fn resolve(&self, reference: &Reference) -> Result<Resolved, OciError> {
        self.resolve_with_progress(reference, &|_| {}).await
    }

    /// As [`Client::resolve`], calling `progress` as the component downloads.
    pub async fn resolve_with_progress(
        &self,
        reference: &Reference,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Resolved, OciError> {
        let mut r = Resolving {
            registry: self.registry(reference.registry())?,
            deadline: self.deadline(),
            source: Source::Cache,
            offline: None,
            transferred: 0,
        };
        // 1. The manifest digest.
        let digest = self.manifest_digest(&mut r, reference).await?;
        let pinned = reference.with_digest(&digest);

        // 2. The manifest, then 3. the component.
        let manifest_bytes = self.blob_or_fetch(&mut r, &pinned, &digest, Fetch::Manifest).await?;
        let manifest = parse_manifest(&pinned, &manifest_bytes)?;
        let layer = wasm_layer(&pinned, &manifest, self.settings.max_bytes)?;
        let component = Fetch::Component {
            layer: &layer,
            max: self.settings.max_bytes,
            progress,
        };
        let wasm = self.blob_or_fetch(&mut r, &pinned, &layer.digest, component).await?;

        // 4. The signature.
        let signature = self.signature_of(&mut r, &pinned, &digest, &manifest_bytes).await?;
        self.mark_in_use(&digest);
        self.mark_in_use(&layer.digest);
        if let Err(e) = self.prune_cache() {
            tracing::warn!(error = %e, "cannot prune the OCI cache");
        }
        Ok(Resolved {
            reference: reference.clone(),
            digest,
            wasm_digest: layer.digest,
            bytes: wasm.into(),
            signature,
            source: r.source,
            transferred: r.transferred,
        })
    }

    /// The manifest digest `reference` names: its own, or what its tag
    /// resolves to now (cached with the manifest), or, with the registry
    /// down, what the tag last resolved to.
    async fn manifest_digest(&self, r: &mut Resolving, reference: &Reference) -> Result<String, OciError> {
        if let Some(d) = reference.digest() {
            return Ok(d.to_string());
        }
        let registry = r.registry.clone();
        match self
            .bounded(r.deadline, registry.name.as_str(), self.fetch_tag(&registry, reference))
            .await
        {
            Ok((digest, manifest)) => {
                r.transferred += manifest.len() as u64;
                self.cache.put(&digest, &manifest)?;
                self.cache.remember_tag(reference, &digest)?;
                r.source = Source::Registry;
                Ok(digest)
            }
            Err(e) if e.is_offline() => match self.cache.recall_tag(reference)? {
                Some(memo) => {
                    tracing::warn!(reference = %reference, digest = %memo.digest, resolved_at = %memo.resolved_at, error = %e, "registry down; using the digest this tag last resolved to");
                    r.source = Source::CacheRegistryDown {
                        error: e.to_string(),
                        tag_resolved_at: Some(memo.resolved_at),
                    };
                    r.offline = Some(e);
                    Ok(memo.digest)
                }
                None => Err(OciError::NotCached {
                    reference: reference.to_string(),
                    source: Box::new(e),
                }),
            },
            Err(e) => Err(e),
        }
    }

    /// The signatures of the manifest `digest`. When the registry was
    /// asked for the rest (a tag resolved, a blob fetched), it is asked
    /// for these too, so that a signature added or removed since is seen;
    /// when everything came from the cache (a pinned reference pulled
    /// before), the cached signatures are used and the registry is asked
    /// only when none are cached. Never asked with the registry down.
    async fn signature_of(
        &self,
        r: &mut Resolving,
        pinned: &Reference,
        digest: &str,
        manifest: &[u8],
    ) -> Result<Option<(Vec<u8>, SignatureLocation)>, OciError> {
        let cached = || -> Result<Option<(Vec<u8>, SignatureLocation)>, OciError> {
            if let Some(sig_digest) = self.cache.recall_signature(digest)?
                && let Some(bytes) = self.cache.get(&sig_digest)?
            {
                self.mark_in_use(&sig_digest);
                return Ok(Some((bytes, SignatureLocation::Cache)));
            }
            Ok(None)
        };
        if r.source == Source::Cache
            && let Some(found) = cached()?
        {
            return Ok(Some(found));
        }
        if r.offline.is_some() {
            return cached();
        }
        let registry = r.registry.clone();
        match self
            .bounded(
                r.deadline,
                registry.name.as_str(),
                self.fetch_signature(&registry, pinned, manifest),
            )
            .await
        {
            Ok(Some((bytes, loc))) => {
                r.transferred += bytes.len() as u64;
                let d = Digest::of(&bytes).to_string();
                self.cache.put(&d, &bytes)?;
                self.cache.remember_signature(digest, &d)?;
                self.mark_in_use(&d);
                Ok(Some((bytes, loc)))
            }
            Ok(None) => Ok(None),
            Err(e) if e.is_offline() => {
                tracing::warn!(reference = %pinned, error = %e, "registry down; using the cached signatures, if any");
                if r.source == Source::Cache {
                    r.source = Source::CacheRegistryDown {
                        error: e.to_string(),
                        tag_resolved_at: None,
                    };
                }
                cached()
            }
            Err(e) => Err(e),
        }
    }

    /// Resolves a pinned `reference` from the cache alone, without a
    /// byte of network: `None` unless its manifest and component are
    /// cached (and its signature too, when `need_signature`).
    pub fn resolve_cached(&self, reference: &Reference, need_signature: bool) -> Result<Option<Resolved>, OciError> {
        let Some(digest) = reference.digest() else {
            return Ok(None);
        };
        let Some(manifest) = self.cache.get(digest)? else {
            return Ok(None);
        };
        let pinned = reference.with_digest(digest);
        let layer = wasm_layer(&pinned, &parse_manifest(&pinned, &manifest)?, self.settings.max_bytes)?;
        let Some(wasm) = self.cache.get(&layer.digest)? else {
            return Ok(None);
        };
        let mut signature = None;
        if let Some(sig_digest) = self.cache.recall_signature(digest)?
            && let Some(bytes) = self.cache.get(&sig_digest)?
        {
            self.mark_in_use(&sig_digest);
            signature = Some((bytes, SignatureLocation::Cache));
        }
        if need_signature && signature.is_none() {
            return Ok(None);
        }
        self.mark_in_use(digest);
        self.mark_in_use(&layer.digest);
        Ok(Some(Resolved {
            reference: reference.clone(),
            digest: digest.to_string(),
            wasm_digest: layer.digest,
            bytes: wasm.into(),
            signature,
            source: Source::Cache,
            transferred: 0,
        }))
    }

    /// A blob from the cache, else fetched (checked, then cached, and
    /// counted in `r`). With the registry down, a blob not cached is
    /// [`OciError::NotCached`].
    async fn blob_or_fetch(
        &self,
        r: &mut Resolving,
        pinned: &Reference,
        digest: &str,
        what: Fetch<'_>,
    ) -> Result<Vec<u8>, OciError> {
        if let Some(bytes) = self.cache.get(digest)? {
            return Ok(bytes);
        }
        let registry = &*r.registry;
        let deadline = r.deadline;
        if let Some(e) = &r.offline {
            return Err(OciError::NotCached {
                reference: pinned.to_string(),
                source: Box::new(OciError::Unreachable {
                    registry: registry.name.clone(),
                    detail: e.to_string(),
                }),
            });
        }
        let fetched = match what {
            Fetch::Manifest => {
                self.bounded(deadline, &registry.name, Self::fetch_manifest(registry, pinned))
                    .await
            }
            Fetch::Component { layer, max, progress } => {
                self.bounded(
                    deadline,
                    &registry.name,
                    Self::fetch_blob(registry, pinned, layer, max, "component", progress),
                )
                .await
            }
        };
        match fetched {
            Ok(bytes) => {
                let actual = Digest::of(&bytes).to_string();
                if actual != digest {
                    return Err(OciError::DigestMismatch {
                        reference: pinned.to_string(),
                        expected: digest.to_string(),
                        actual,
                    });
                }
                self.cache.put(digest, &bytes)?;
                if r.source == Source::Cache {
                    r.source = Source::Registry;
                }
                r.transferred += bytes.len() as u64;
                Ok(bytes)
            }
            Err(e) if e.is_offline() => Err(OciError::NotCached {
                reference: pinned.to_string(),
                source: Box::new(e),
            }),
            Err(e) => Err(e),
        }
    }

    /// Asks the registry what a tag points at: (digest, manifest bytes).
    async fn fetch_tag(&self, registry: &RegistryClient, reference: &Reference) -> Result<(String, Vec<u8>), OciError> {
        let bytes = Self::fetch_manifest(registry, reference).await?;
        Ok((Digest::of(&bytes).to_string(), bytes))
    }

    /// A manifest, read up to [`MAX_MANIFEST_BYTES`](crate::remote::MAX_MANIFEST_BYTES).
    pub(super) async fn fetch_manifest(registry: &RegistryClient, reference: &Reference) -> Result<Vec<u8>, OciError> {
        registry.remote.manifest(reference, false).await
    }

    /// A blob at its declared size, hashed as it streams: refused as soon
    /// as it passes `layer.size`, when it ends short or hashes wrong, and
    /// when it declares more than `max` bytes.
    async fn fetch_blob(
        registry: &RegistryClient,
        reference: &Reference,
        layer: &OciDescriptor,
        max: u64,
        what: &'static str,
        progress: &(dyn Fn(Progress) + Sync),
    ) -> Result<Vec<u8>, OciError> {
        if layer.size < 0 || layer.size as u64 > max {
            return Err(OciError::TooLarge {
                reference: reference.to_string(),
                what,
                size: layer.size.max(0) as u64,
                limit: max,
            });
        }
        registry
            .remote
            .blob(reference, &layer.digest, layer.size as u64, what, progress)
            .await
    }
}
