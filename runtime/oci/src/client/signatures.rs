//! Finding an artifact's signatures in a registry: cosign's `.sig` tag,
//! OCI 1.1 referrers (or the referrers tag without the API) and sonde's old
//! tag, gathered into one bounded document.

use super::Client;
use super::registry::RegistryClient;
use crate::signing::{
    BUNDLE_MEDIA_TYPE, GATHERED_FORMAT, Gathered, Item, MAX_ITEMS, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE,
    is_bundle_type,
};
use crate::{MAX_METADATA_BYTES, OciError, Reference, SIGNATURE_MEDIA_TYPE};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use sonde_policy::identity::Digest;

/// The most signature referrers of one manifest that are read.
const MAX_SIGNATURE_REFERRERS: usize = 8;

/// Where a signature is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignatureLocation {
    /// An OCI 1.1 referrer: a manifest whose subject is the artifact.
    Referrer {
        /// The signature manifest's digest.
        manifest: String,
    },
    /// A tag: cosign's `sha256-HEX.sig`, or sonde's old `sha256-HEX.sonde-sig`.
    Tag {
        /// The tag.
        tag: String,
    },
    /// Read from the cache (it was fetched from the registry before).
    Cache,
}

impl SignatureLocation {
    pub(super) fn describe(&self, artifact: &Reference) -> String {
        match self {
            Self::Referrer { manifest } => format!("the signature referrer {manifest} of {artifact}"),
            Self::Tag { tag } => format!("the signature tag {tag} of {artifact}"),
            Self::Cache => format!("the cached signature of {artifact}"),
        }
    }
}

impl Client {
    /// Gathers the signatures of the manifest `pinned` names (its bytes:
    /// `manifest`) into one [`Gathered`] document: the bundles and sonde
    /// signatures among its OCI 1.1 referrers (or the referrers tag
    /// `sha256-HEX` of a registry without the API), the layers of cosign's
    /// `sha256-HEX.sig` tag and sonde's old `sha256-HEX.sonde-sig` tag. At
    /// most [`MAX_ITEMS`] signatures of at most [`MAX_METADATA_BYTES`]
    /// each are read; `None` when there is none.
    pub(super) async fn fetch_signature(
        &self,
        registry: &RegistryClient,
        pinned: &Reference,
        manifest: &[u8],
    ) -> Result<Option<(Vec<u8>, SignatureLocation)>, OciError> {
        let digest = pinned.digest().unwrap_or_default().to_string();
        let mut items = Vec::new();
        let mut location = None;
        for entry in self.referrer_entries(registry, pinned, &digest).await? {
            let at = pinned.with_digest(&entry);
            let bytes = registry.remote.manifest(&at, true).await?;
            if Digest::of(&bytes).to_string() != entry {
                continue;
            }
            let found = self.signatures_in(registry, &at, &bytes, &digest, &mut items).await?;
            if found && location.is_none() {
                location = Some(SignatureLocation::Referrer { manifest: entry });
            }
        }
        for tag in [cosign_tag(&digest), signature_tag(&digest)] {
            let at = pinned.with_tag(&tag);
            let bytes = match registry.remote.manifest(&at, true).await {
                Ok(b) => b,
                Err(OciError::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            if self.signatures_in(registry, &at, &bytes, &digest, &mut items).await? && location.is_none() {
                location = Some(SignatureLocation::Tag { tag });
            }
        }
        let Some(location) = location else { return Ok(None) };
        let gathered = Gathered {
            format: GATHERED_FORMAT.to_string(),
            manifest: BASE64.encode(manifest),
            items,
        };
        Ok(Some((gathered.to_bytes(), location)))
    }

    /// The digests of the referrers of `pinned` that may be signatures:
    /// from the referrers API, else from the referrers tag schema.
    async fn referrer_entries(
        &self,
        registry: &RegistryClient,
        pinned: &Reference,
        digest: &str,
    ) -> Result<Vec<String>, OciError> {
        let mut index = None;
        for artifact_type in [SIGNATURE_MEDIA_TYPE, BUNDLE_MEDIA_TYPE] {
            match registry.remote.referrers(pinned, artifact_type).await {
                Ok(Some(bytes)) => {
                    let i = serde_json::from_slice::<OciImageIndex>(&bytes).ok();
                    let entries = i.map(|i| i.manifests).unwrap_or_default();
                    index.get_or_insert_with(Vec::new).extend(entries);
                }
                Ok(None) => {}
                // A registry that fails the referrers API may still have the tags.
                Err(e @ (OciError::Registry { .. } | OciError::NotFound { .. })) => {
                    tracing::debug!(reference = %pinned, error = %e, "no referrers; trying the tags");
                }
                Err(e) => return Err(e),
            }
        }
        let entries = match index {
            Some(entries) => entries,
            // No referrers API: the fallback tag, as cosign and oras write it.
            None => match registry
                .remote
                .index(&pinned.with_tag(&digest.replacen(':', "-", 1)))
                .await
            {
                Ok(bytes) => serde_json::from_slice::<OciImageIndex>(&bytes)
                    .map(|i| i.manifests)
                    .unwrap_or_default(),
                Err(OciError::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(e),
            },
        };
        // The newest last, as registries list them in push order; a
        // registry listing more than a few is not read further.
        Ok(entries
            .iter()
            .rev()
            .filter(|e| Digest::parse(&e.digest).is_ok())
            .take(MAX_SIGNATURE_REFERRERS)
            .map(|e| e.digest.clone())
            .collect())
    }

    /// Adds the signatures of `subject` that the manifest `bytes` (at
    /// `at`) holds to `items`: cosign's simple-signing layers, sigstore
    /// bundles, sonde's signature. Whether it held any.
    async fn signatures_in(
        &self,
        registry: &RegistryClient,
        at: &Reference,
        bytes: &[u8],
        subject: &str,
        items: &mut Vec<Item>,
    ) -> Result<bool, OciError> {
        let Ok(m) = serde_json::from_slice::<OciImageManifest>(bytes) else {
            return Ok(false);
        };
        if m.subject.as_ref().is_some_and(|s| s.digest != subject) {
            return Ok(false);
        }
        let before = items.len();
        for layer in m.layers.iter().take(MAX_ITEMS) {
            if items.len() >= MAX_ITEMS || Digest::parse(&layer.digest).is_err() {
                break;
            }
            let simple = layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE;
            let signature = layer.annotations.as_ref().and_then(|a| a.get(SIGNATURE_ANNOTATION));
            let wanted = (simple && signature.is_some())
                || is_bundle_type(&layer.media_type)
                || layer.media_type == SIGNATURE_MEDIA_TYPE;
            if !wanted {
                continue;
            }
            if layer.size < 0 || layer.size as u64 > MAX_METADATA_BYTES {
                return Err(OciError::TooLarge {
                    reference: at.to_string(),
                    what: "signature",
                    size: layer.size.max(0) as u64,
                    limit: MAX_METADATA_BYTES,
                });
            }
            let blob = registry
                .remote
                .blob(at, &layer.digest, layer.size as u64, "signature", &|_| {})
                .await?;
            let blob = BASE64.encode(blob);
            items.push(match signature {
                Some(sig) if simple => Item::SimpleSigning {
                    payload: blob,
                    signature: sig.clone(),
                },
                _ if layer.media_type == SIGNATURE_MEDIA_TYPE => Item::Sonde { file: blob },
                _ => Item::Bundle { bundle: blob },
            });
        }
        Ok(items.len() > before)
    }
}

/// cosign's tag for the signatures of manifest `digest`: `sha256-HEX.sig`.
pub fn cosign_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

/// sonde's tag for the signature of manifest `digest`: `sha256-HEX.sonde-sig`,
/// beside (never over) cosign's `sha256-HEX.sig` for the same manifest.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sonde-sig", digest.replacen(':', "-", 1))
}
