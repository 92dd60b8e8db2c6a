//! What a plugin's signature may be, and checking it: every form is read
//! from bytes (a file beside the plugin, or what the registry held) and
//! checked with the `sigstore` crate's keys.
//!
//! - a sigstore bundle (v0.3) with a `messageSignature` over the plugin's
//!   bytes (`cosign sign-blob --new-bundle-format --bundle`), or with a
//!   DSSE envelope whose in-toto statement names the plugin's digest;
//! - cosign's older blob bundle (`{"base64Signature": …}`) or a bare
//!   base64 signature (`cosign sign-blob --output-signature`);
//! - what sonde gathered from a registry for an artifact
//!   ([`GATHERED_FORMAT`]): the image manifest and its signatures — the
//!   simple-signing layers of cosign's `.sig` tag, the bundles of its OCI
//!   1.1 referrers, sonde's old signatures — checked against the
//!   manifest's digest, the manifest against the plugin's bytes;
//! - sonde's own deprecated `sonde-signature-v1` file.

use super::cosign::SIMPLE_SIGNING_TYPE;
use super::keys::{KeyMaterial, PublicKey};
use super::{MAX_FILE_BYTES, SignatureError, Signer};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sonde_policy::identity::Digest;

/// The `format` of the document sonde keeps for a registry artifact's
/// signatures.
pub const GATHERED_FORMAT: &str = "sonde-oci-signatures-v1";
/// The most signatures one document may hold.
pub const MAX_ITEMS: usize = 16;
/// The largest gathered document: the manifest and its signatures.
pub const MAX_GATHERED_BYTES: u64 = 32 * MAX_FILE_BYTES;

/// The signatures sonde found in a registry for one image manifest.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Gathered {
    /// Always [`GATHERED_FORMAT`].
    pub format: String,
    /// The image manifest the signatures are over, base64.
    pub manifest: String,
    /// The signatures, at most [`MAX_ITEMS`].
    pub items: Vec<Item>,
}

/// One signature found in a registry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Item {
    /// A layer of cosign's `sha256-HEX.sig` manifest: the payload and the
    /// annotation's signature, both base64.
    SimpleSigning {
        /// The simple-signing payload.
        payload: String,
        /// The signature over it.
        signature: String,
    },
    /// A sigstore bundle from an OCI 1.1 referrer, base64.
    Bundle {
        /// The bundle's JSON.
        bundle: String,
    },
    /// sonde's deprecated signature file, base64.
    Sonde {
        /// The file.
        file: String,
    },
}

impl Gathered {
    /// The document for `manifest` and `items`, as stored.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A signature to check: the bytes signed and the signature, or why it
/// cannot count (it signs another artifact).
struct Candidate {
    message: Vec<u8>,
    signature: Vec<u8>,
}

/// What the evidence held, before any key was tried.
#[derive(Default)]
struct Found {
    candidates: Vec<Candidate>,
    legacy: Vec<Vec<u8>>,
    /// Signatures over another artifact: the digest they sign.
    other_subject: Option<String>,
    /// Why some signature could not be checked at all.
    notes: Vec<String>,
}

/// Every trusted signer whose signature in `evidence` covers `wasm`.
pub(super) fn verify_all(
    plugin: &str,
    wasm: &[u8],
    sig_name: &str,
    evidence: &[u8],
    trusted: &[PublicKey],
) -> Result<Vec<Signer>, SignatureError> {
    let malformed = |detail: String| SignatureError::MalformedSignature {
        sig: sig_name.to_string(),
        detail,
    };
    if evidence.len() as u64 > MAX_GATHERED_BYTES {
        return Err(malformed(format!("larger than {MAX_GATHERED_BYTES} bytes")));
    }
    let digest = Digest::of(wasm);
    let mut found = Found::default();
    let text = evidence.trim_ascii();
    if text.starts_with(b"{") {
        let doc: Value = serde_json::from_slice(text).map_err(|e| malformed(e.to_string()))?;
        read_document(&doc, text, wasm, &digest, &mut found).map_err(|e| malformed(e.to_string()))?;
    } else {
        let signature = BASE64
            .decode(text)
            .map_err(|_| malformed("neither JSON nor a base64 signature".into()))?;
        found.candidates.push(Candidate {
            message: wasm.to_vec(),
            signature,
        });
    }
    let mut signers = Vec::new();
    let mut legacy_error = None;
    for file in &found.legacy {
        match super::verify_legacy(plugin, wasm, sig_name, file, trusted) {
            Ok(s) => signers.push(s),
            Err(e) => legacy_error = Some(e),
        }
    }
    for c in &found.candidates {
        for key in trusted {
            let KeyMaterial::Pem(k) = &key.key else { continue };
            let sig = sigstore::crypto::Signature::Raw(&c.signature);
            if k.verify_signature(sig, &c.message).is_ok() && !signers.iter().any(|s: &Signer| s.key_id == key.key_id) {
                signers.push(Signer {
                    name: key.signer.clone(),
                    key_id: key.key_id.clone(),
                    signed_at: "unknown".into(),
                    digest: digest.to_string(),
                });
            }
        }
    }
    if !signers.is_empty() {
        return Ok(signers);
    }
    if found.candidates.is_empty() {
        if let Some(e) = legacy_error {
            return Err(e);
        }
        if let Some(signed) = found.other_subject {
            return Err(SignatureError::DigestMismatch {
                plugin: plugin.to_string(),
                sig: sig_name.to_string(),
                actual: digest.hex(),
                signed,
            });
        }
        let why = found
            .notes
            .first()
            .cloned()
            .unwrap_or_else(|| "it holds no signature".into());
        return Err(malformed(why));
    }
    let mut why = found.notes;
    if let Some(other) = found.other_subject {
        why.push(format!("others sign {other}"));
    }
    Err(SignatureError::NoTrustedSignature {
        plugin: plugin.to_string(),
        sig: sig_name.to_string(),
        found: found.candidates.len() + found.legacy.len(),
        trusted: trusted.len(),
        why: if why.is_empty() {
            String::new()
        } else {
            format!(" ({})", why.join("; "))
        },
    })
}

/// Why an evidence document cannot be read.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    /// A part that must be JSON is not.
    #[error("{what}: {source}")]
    Json {
        /// Which part.
        what: &'static str,
        /// serde_json's words.
        source: serde_json::Error,
    },
    /// A part that must be base64 is not.
    #[error("{0} is not base64")]
    NotBase64(&'static str),
    /// More signatures than one document may hold.
    #[error("more than {MAX_ITEMS} signatures")]
    TooMany,
    /// A bundle that signs nothing sonde reads.
    #[error("a bundle with neither messageSignature nor dsseEnvelope")]
    EmptyBundle,
    /// JSON of no kind sonde reads.
    #[error("not a signature sonde reads (a sigstore bundle, cosign's blob bundle, or a sonde signature)")]
    UnknownKind,
}

/// Reads a JSON evidence document into `found`.
fn read_document(doc: &Value, raw: &[u8], wasm: &[u8], digest: &Digest, found: &mut Found) -> Result<(), Unreadable> {
    let format = doc.get("format").and_then(Value::as_str);
    if format == Some(super::SIGNATURE_FORMAT) {
        found.legacy.push(raw.to_vec());
        return Ok(());
    }
    if format == Some(GATHERED_FORMAT) {
        let gathered: Gathered = serde_json::from_slice(raw).map_err(|source| Unreadable::Json {
            what: "the gathered signatures",
            source,
        })?;
        return read_gathered(&gathered, digest, found);
    }
    if doc.get("mediaType").and_then(Value::as_str).is_some_and(is_bundle_type) {
        return read_bundle(doc, wasm, &digest.hex(), found);
    }
    if let Some(sig) = doc.get("base64Signature").and_then(Value::as_str) {
        // cosign's older bundle: a signature over the blob (a `cert`, when
        // there is one, is a keyless signer's and is not trusted by key).
        let signature = BASE64
            .decode(sig)
            .map_err(|_| Unreadable::NotBase64("base64Signature"))?;
        found.candidates.push(Candidate {
            message: wasm.to_vec(),
            signature,
        });
        return Ok(());
    }
    Err(Unreadable::UnknownKind)
}

/// Whether `t` is a sigstore bundle's media type (any version).
pub(crate) fn is_bundle_type(t: &str) -> bool {
    t.starts_with("application/vnd.dev.sigstore.bundle") && t.ends_with("+json")
}

/// The signatures gathered for an image manifest: the manifest must hold
/// the plugin (`digest`), and each signature must sign the manifest.
fn read_gathered(g: &Gathered, digest: &Digest, found: &mut Found) -> Result<(), Unreadable> {
    if g.items.len() > MAX_ITEMS {
        return Err(Unreadable::TooMany);
    }
    let manifest = BASE64
        .decode(&g.manifest)
        .map_err(|_| Unreadable::NotBase64("manifest"))?;
    let m: Value = serde_json::from_slice(&manifest).map_err(|source| Unreadable::Json {
        what: "manifest",
        source,
    })?;
    let holds = m.get("layers").and_then(Value::as_array).is_some_and(|ls| {
        ls.iter()
            .any(|l| l.get("digest").and_then(Value::as_str) == Some(&digest.to_string()))
    });
    if !holds {
        found.other_subject = Some("a manifest that does not hold this plugin".into());
        return Ok(());
    }
    let manifest_digest = Digest::of(&manifest);
    for item in &g.items {
        let b64 = |s: &str| BASE64.decode(s).map_err(|_| Unreadable::NotBase64("an item"));
        match item {
            Item::SimpleSigning { payload, signature } => {
                let payload = b64(payload)?;
                read_simple_signing(payload, b64(signature)?, &manifest_digest, found);
            }
            Item::Bundle { bundle } => {
                let bytes = b64(bundle)?;
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(doc) => read_bundle(&doc, &manifest, &manifest_digest.hex(), found)?,
                    Err(e) => found.notes.push(format!("a bundle is not JSON: {e}")),
                }
            }
            Item::Sonde { file } => found.legacy.push(b64(file)?),
        }
    }
    Ok(())
}

/// A simple-signing layer: its payload must name `manifest` as the image.
fn read_simple_signing(payload: Vec<u8>, signature: Vec<u8>, manifest: &Digest, found: &mut Found) {
    let Ok(p) = serde_json::from_slice::<Value>(&payload) else {
        found.notes.push("a simple-signing payload is not JSON".into());
        return;
    };
    let critical = &p["critical"];
    if critical["type"].as_str() != Some(SIMPLE_SIGNING_TYPE) {
        found.notes.push(format!("a payload of type {}", critical["type"]));
        return;
    }
    let signed = critical["image"]["docker-manifest-digest"].as_str().unwrap_or_default();
    if signed != manifest.to_string() {
        found.other_subject = Some(signed.to_string());
        return;
    }
    found.candidates.push(Candidate {
        message: payload,
        signature,
    });
}

/// A sigstore bundle over `subject` (whose SHA-256 is `subject_hex`).
fn read_bundle(doc: &Value, subject: &[u8], subject_hex: &str, found: &mut Found) -> Result<(), Unreadable> {
    let material = &doc["verificationMaterial"];
    if material.get("certificate").is_some() || material.get("x509CertificateChain").is_some() {
        found
            .notes
            .push("a keyless bundle (a Fulcio certificate): sonde verifies signatures by trusted keys only".into());
        return Ok(());
    }
    if let Some(ms) = doc.get("messageSignature") {
        let signed = ms["messageDigest"]["digest"]
            .as_str()
            .and_then(|d| BASE64.decode(d).ok())
            .map(|d| sonde_policy::identity::hex(&d))
            .unwrap_or_default();
        if signed != subject_hex {
            found.other_subject = Some(format!("sha256:{signed}"));
            return Ok(());
        }
        let signature = ms["signature"]
            .as_str()
            .and_then(|s| BASE64.decode(s).ok())
            .ok_or(Unreadable::NotBase64("the bundle's messageSignature.signature"))?;
        found.candidates.push(Candidate {
            message: subject.to_vec(),
            signature,
        });
        return Ok(());
    }
    let Some(env) = doc.get("dsseEnvelope") else {
        return Err(Unreadable::EmptyBundle);
    };
    read_dsse(env, subject_hex, found)
}

/// A DSSE envelope of an in-toto statement: its subject must be
/// `subject_hex`; each of its signatures signs the envelope's PAE.
fn read_dsse(env: &Value, subject_hex: &str, found: &mut Found) -> Result<(), Unreadable> {
    let payload_type = env["payloadType"].as_str().unwrap_or_default();
    let payload = env["payload"]
        .as_str()
        .and_then(|p| BASE64.decode(p).ok())
        .ok_or(Unreadable::NotBase64("the DSSE payload"))?;
    let statement: Value = serde_json::from_slice(&payload).map_err(|source| Unreadable::Json {
        what: "the DSSE payload",
        source,
    })?;
    let subjects: Vec<&str> = statement["subject"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["digest"]["sha256"].as_str()).collect())
        .unwrap_or_default();
    if !subjects.contains(&subject_hex) {
        let other = subjects.first().map(|s| format!("sha256:{s}"));
        found.other_subject = Some(other.unwrap_or_else(|| "no subject".into()));
        return Ok(());
    }
    let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    pae.extend_from_slice(&payload);
    for s in env["signatures"].as_array().into_iter().flatten().take(MAX_ITEMS) {
        if let Some(signature) = s["sig"].as_str().and_then(|s| BASE64.decode(s).ok()) {
            found.candidates.push(Candidate {
                message: pae.clone(),
                signature,
            });
        }
    }
    Ok(())
}
