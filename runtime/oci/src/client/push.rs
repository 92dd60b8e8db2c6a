//! Pushing a component as a CNCF wasm artifact, and its signature.

use super::registry::RegistryClient;
use super::resolve::{parse_manifest, wasm_layer};
use super::{Client, SignatureLocation, signature_tag};
use crate::{
    OCI_MANIFEST_MEDIA_TYPE, OciError, Reference, SIGNATURE_MEDIA_TYPE, WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE,
};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::Serialize;
use sonde_policy::identity::{self, Digest, WasmKind};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// The media type and content of the OCI "empty" config a signature
/// manifest carries (image-spec 1.1).
const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_CONFIG: &[u8] = b"{}";

/// What a component needs and offers, for the artifact's config (the
/// `component` field of the CNCF wasm config).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ComponentInfo {
    /// The interfaces and functions it exports.
    pub exports: Vec<String>,
    /// The interfaces it imports.
    pub imports: Vec<String>,
    /// The world it targets, such as `sonde:probe/plugin@0.1.0`.
    pub target: Option<String>,
}

/// What a push stored.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// The reference pinned to the pushed manifest.
    pub reference: Reference,
    /// The manifest digest.
    pub digest: String,
    /// The component's digest.
    pub wasm_digest: String,
}

/// Where a pushed signature went.
#[derive(Clone, Debug)]
pub struct SignaturePushed {
    /// The artifact signed, pinned.
    pub artifact: Reference,
    /// How it is attached.
    pub location: SignatureLocation,
}

/// The CNCF wasm config (`application/vnd.wasm.config.v0+json`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    created: String,
    architecture: &'static str,
    os: &'static str,
    layer_digests: [&'a str; 1],
    component: &'a ComponentInfo,
}

fn descriptor(media_type: &str, bytes: &[u8]) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.to_string(),
        digest: Digest::of(bytes).to_string(),
        size: bytes.len() as i64,
        ..Default::default()
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

impl Client {
    /// Pushes `wasm` as a CNCF wasm artifact to `reference` (its tag; a
    /// pinned reference must name the digest the push produces). `info`
    /// fills the config's `component` field.
    pub async fn push(&self, reference: &Reference, wasm: &[u8], info: &ComponentInfo) -> Result<Pushed, OciError> {
        if wasm.len() as u64 > self.settings.max_bytes {
            return Err(OciError::TooLarge {
                reference: reference.to_string(),
                what: "component",
                size: wasm.len() as u64,
                limit: self.settings.max_bytes,
            });
        }
        if identity::sniff(wasm) != WasmKind::Component {
            return Err(OciError::NotWasm {
                reference: reference.to_string(),
                why: crate::error::NotWasm::NotAComponent,
            });
        }
        let registry = self.registry(reference.registry())?;
        let layer = OciDescriptor {
            annotations: None,
            ..descriptor(WASM_LAYER_MEDIA_TYPE, wasm)
        };
        let created = now_rfc3339();
        let config = serde_json::to_vec(&WasmConfig {
            created: created.clone(),
            architecture: "wasm",
            os: "wasip2",
            layer_digests: [&layer.digest],
            component: info,
        })
        .unwrap_or_default();
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
            config: descriptor(WASM_CONFIG_MEDIA_TYPE, &config),
            layers: vec![layer.clone()],
            subject: None,
            artifact_type: None,
            annotations: Some(BTreeMap::from([(
                "org.opencontainers.image.created".to_string(),
                created,
            )])),
        };
        let manifest_bytes = serde_json::to_vec(&manifest).unwrap_or_default();
        let digest = Digest::of(&manifest_bytes).to_string();
        if let Some(d) = reference.digest()
            && d != digest
        {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                expected: d.to_string(),
                actual: digest,
            });
        }
        let blobs = [(config.as_slice(), &manifest.config.digest), (wasm, &layer.digest)];
        let target = match reference.tag() {
            Some(t) => reference.with_tag(t),
            None => reference.clone(),
        };
        self.bounded(self.deadline(), registry.name.as_str(), async {
            self.push_blobs(&registry, &target, &blobs).await?;
            self.push_manifest(&registry, &target, &manifest_bytes).await
        })
        .await?;
        Ok(Pushed {
            reference: reference.with_digest(&digest),
            digest,
            wasm_digest: layer.digest,
        })
    }

    async fn push_blobs(
        &self,
        registry: &RegistryClient,
        reference: &Reference,
        blobs: &[(&[u8], &String)],
    ) -> Result<(), OciError> {
        let r = reference.to_client();
        registry
            .client
            .store_auth_if_needed(reference.registry(), &registry.auth())
            .await;
        registry
            .client
            .auth(&r, &registry.auth(), oci_client::RegistryOperation::Push)
            .await
            .map_err(|e| registry.error(reference, e))?;
        for (bytes, digest) in blobs {
            let exists = registry.client.blob_exists(&r, digest).await.unwrap_or(false);
            if !exists {
                registry
                    .client
                    .push_blob(&r, bytes.to_vec(), digest)
                    .await
                    .map_err(|e| registry.error(reference, e))?;
            }
        }
        Ok(())
    }

    async fn push_manifest(
        &self,
        registry: &RegistryClient,
        reference: &Reference,
        bytes: &[u8],
    ) -> Result<(), OciError> {
        let content_type = http::HeaderValue::from_static(OCI_MANIFEST_MEDIA_TYPE);
        registry
            .client
            .push_manifest_raw(&reference.to_client(), bytes.to_vec(), content_type)
            .await
            .map_err(|e| registry.error(reference, e))?;
        Ok(())
    }

    /// The artifact `reference` names, to be signed: its manifest, the
    /// manifest's digest (`reference`'s own when pinned, else refused) and
    /// the reference pinned to it; its component must be `wasm_digest`
    /// when given (what a signature of the file signs).
    async fn subject(
        registry: &RegistryClient,
        reference: &Reference,
        wasm_digest: Option<&str>,
    ) -> Result<(Vec<u8>, String, Reference), OciError> {
        let subject_bytes = Self::fetch_manifest(registry, reference).await?;
        let subject_digest = Digest::of(&subject_bytes).to_string();
        if let Some(d) = reference.digest()
            && d != subject_digest
        {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                expected: d.to_string(),
                actual: subject_digest,
            });
        }
        let pinned = reference.with_digest(&subject_digest);
        let subject = parse_manifest(&pinned, &subject_bytes)?;
        let layer = wasm_layer(&pinned, &subject, u64::MAX)?;
        if let Some(w) = wasm_digest
            && layer.digest != w
        {
            return Err(OciError::DigestMismatch {
                reference: format!("{pinned} (its component, which the signature must sign)"),
                expected: w.to_string(),
                actual: layer.digest,
            });
        }
        Ok((subject_bytes, subject_digest, pinned))
    }

    /// Attaches `signature` (a `FILE.wasm.sig` JSON) to the artifact
    /// `reference` names, after checking that the artifact's component is
    /// `wasm_digest` (what the signature signs). It goes as an OCI 1.1
    /// referrer; when the registry does not list referrers, it is also
    /// tagged `sha256-HEX.sonde-sig`, replacing an older one.
    pub async fn push_signature(
        &self,
        reference: &Reference,
        wasm_digest: &str,
        signature: &[u8],
    ) -> Result<SignaturePushed, OciError> {
        let registry = self.registry(reference.registry())?;
        self.bounded(self.deadline(), registry.name.as_str(), async {
            let (subject_bytes, subject_digest, pinned) =
                Self::subject(&registry, reference, Some(wasm_digest)).await?;
            let sig_layer = descriptor(SIGNATURE_MEDIA_TYPE, signature);
            let manifest = OciImageManifest {
                schema_version: 2,
                media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
                config: descriptor(EMPTY_CONFIG_MEDIA_TYPE, EMPTY_CONFIG),
                layers: vec![sig_layer.clone()],
                subject: Some(OciDescriptor {
                    media_type: OCI_MANIFEST_MEDIA_TYPE.to_string(),
                    digest: subject_digest.clone(),
                    size: subject_bytes.len() as i64,
                    ..Default::default()
                }),
                artifact_type: Some(SIGNATURE_MEDIA_TYPE.to_string()),
                annotations: Some(BTreeMap::from([(
                    "org.opencontainers.image.created".to_string(),
                    now_rfc3339(),
                )])),
            };
            let bytes = serde_json::to_vec(&manifest).unwrap_or_default();
            let sig_manifest = Digest::of(&bytes).to_string();
            let empty_digest = Digest::of(EMPTY_CONFIG).to_string();
            let blobs = [(EMPTY_CONFIG, &empty_digest), (signature, &sig_layer.digest)];
            self.push_blobs(&registry, &pinned, &blobs).await?;
            self.push_manifest(&registry, &pinned.with_digest(&sig_manifest), &bytes)
                .await?;
            // A registry that implements the referrers API lists it now.
            let listed = registry
                .client
                .pull_referrers(&pinned.to_client(), Some(SIGNATURE_MEDIA_TYPE))
                .await
                .is_ok_and(|i| i.manifests.iter().any(|m| m.digest == sig_manifest));
            let location = if listed {
                SignatureLocation::Referrer { manifest: sig_manifest }
            } else {
                let tag = signature_tag(&subject_digest);
                self.push_manifest(&registry, &pinned.with_tag(&tag), &bytes).await?;
                SignatureLocation::Tag { tag }
            };
            Ok(SignaturePushed {
                artifact: pinned,
                location,
            })
        })
        .await
    }

    /// Signs the artifact `reference` names with `key` in cosign's format
    /// and attaches the signature as cosign does: a simple-signing layer
    /// (the payload names the manifest digest; the signature is the layer's
    /// `dev.cosignproject.cosign/signature` annotation) on the manifest
    /// tagged `sha256-HEX.sig`, beside the layers already there. `cosign
    /// verify --key` checks it. When `wasm_digest` is given, the artifact's
    /// component must be it.
    pub async fn push_cosign_signature(
        &self,
        reference: &Reference,
        key: &crate::signing::SigningKey,
        wasm_digest: Option<&str>,
    ) -> Result<SignaturePushed, OciError> {
        use crate::signing::{SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};
        let registry = self.registry(reference.registry())?;
        self.bounded(self.deadline(), registry.name.as_str(), async {
            let (_, subject_digest, pinned) = Self::subject(&registry, reference, wasm_digest).await?;
            let repo = format!("{}/{}", pinned.registry(), pinned.repository());
            let payload = crate::signing::simple_signing_payload(&repo, &subject_digest);
            let signature = key.sign(&payload).map_err(|e| OciError::Signing(Box::new(e)))?;
            let tag = super::signatures::cosign_tag(&subject_digest);
            let tag_ref = pinned.with_tag(&tag);
            // Keep the signatures already attached (other keys', cosign's).
            let mut layers = match Self::fetch_manifest(&registry, &tag_ref).await {
                Ok(b) => serde_json::from_slice::<OciImageManifest>(&b)
                    .map(|m| m.layers)
                    .unwrap_or_default(),
                Err(OciError::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(e),
            };
            let mut sig_layer = descriptor(SIMPLE_SIGNING_MEDIA_TYPE, &payload);
            sig_layer.annotations = Some(BTreeMap::from([(
                SIGNATURE_ANNOTATION.to_string(),
                base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &signature),
            )]));
            // The same payload may be signed by several keys: each layer
            // stays, with its own signature (cosign appends likewise).
            let same = |l: &OciDescriptor| l.digest == sig_layer.digest && l.annotations == sig_layer.annotations;
            if !layers.iter().any(same) {
                layers.push(sig_layer);
            }
            let config = serde_json::json!({
                "architecture": "", "os": "", "config": {},
                "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
            })
            .to_string()
            .into_bytes();
            let manifest = OciImageManifest {
                schema_version: 2,
                media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
                config: descriptor("application/vnd.oci.image.config.v1+json", &config),
                layers,
                ..Default::default()
            };
            let bytes = serde_json::to_vec(&manifest).unwrap_or_default();
            let config_digest = Digest::of(&config).to_string();
            let payload_digest = Digest::of(&payload).to_string();
            let blobs = [
                (config.as_slice(), &config_digest),
                (payload.as_slice(), &payload_digest),
            ];
            self.push_blobs(&registry, &pinned, &blobs).await?;
            self.push_manifest(&registry, &tag_ref, &bytes).await?;
            Ok(SignaturePushed {
                artifact: pinned,
                location: SignatureLocation::Tag { tag },
            })
        })
        .await
    }
}
