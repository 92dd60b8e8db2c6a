//! Keys and signatures in cosign's formats, through the `sigstore` crate's
//! crypto: PEM public keys (ECDSA P-256/P-384, ed25519, RSA), cosign's
//! encrypted private keys (`ENCRYPTED SIGSTORE PRIVATE KEY`, the password
//! from `COSIGN_PASSWORD`, empty when unset), the sigstore bundle a blob
//! signature is written in, and the "simple signing" payload cosign signs
//! for an image.

use super::keys::{PublicKey, is_pem, malformed_pem as malformed, public_from_pem, write_pair};
use super::{SignatureError, read_small};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::signing_key::ecdsa::{ECDSAKeys, EllipticCurve};
use sigstore::crypto::{SigStoreSigner, SigningScheme};
use sonde_policy::identity::Digest;
use std::path::Path;

/// The media type of a sigstore bundle (v0.3), as cosign writes it.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The media type of a layer of cosign's `.sig` manifest.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation that holds a simple-signing layer's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `type` of a simple-signing payload.
pub(super) const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";
/// The environment variable cosign reads a private key's password from.
pub const PASSWORD_ENV: &str = "COSIGN_PASSWORD";

/// A private key in cosign's format, ready to sign.
pub struct SigningKey {
    signer: SigStoreSigner,
    public: PublicKey,
    /// The bundle's key hint: base64 of the SHA-256 of the DER public key.
    hint: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new ECDSA P-256 key (cosign's default), named `signer`.
    pub fn generate(signer: &str) -> Result<(Self, SigStoreKeyPair), SignatureError> {
        let pair = SigStoreKeyPair::ECDSA(
            ECDSAKeys::new(EllipticCurve::P256).map_err(|e| SignatureError::Random(e.to_string()))?,
        );
        let key = Self::from_pair("a new key", signer, &pair)?;
        Ok((key, pair))
    }

    /// Reads a private key file: cosign's encrypted PEM (password from
    /// `COSIGN_PASSWORD`, empty when unset) or an unencrypted PKCS#8 PEM.
    /// Its signer name is the file's name without `.key`.
    pub fn read(path: &Path) -> Result<Self, SignatureError> {
        let source = path.display().to_string();
        let bytes = read_small(path)?;
        if !is_pem(&bytes) {
            return Err(malformed(
                &source,
                "secret",
                "not a PEM private key (a key from `sonde plugin keygen` or `cosign generate-key-pair`; \
                 sonde's old key files no longer sign)",
            ));
        }
        let password = std::env::var(PASSWORD_ENV).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let pair = if text.contains("ENCRYPTED") {
            SigStoreKeyPair::from_encrypted_pem(&bytes, password.as_bytes()).map_err(|e| {
                malformed(
                    &source,
                    "secret",
                    format!("cannot decrypt it with ${PASSWORD_ENV}: {e}"),
                )
            })?
        } else {
            SigStoreKeyPair::from_pem(&bytes).map_err(|e| malformed(&source, "secret", e))?
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let signer = name.strip_suffix(".key").unwrap_or(&name).to_string();
        Self::from_pair(&source, &signer, &pair)
    }

    fn from_pair(source: &str, signer: &str, pair: &SigStoreKeyPair) -> Result<Self, SignatureError> {
        let scheme = match pair {
            SigStoreKeyPair::ECDSA(ECDSAKeys::P256(_)) => SigningScheme::ECDSA_P256_SHA256_ASN1,
            SigStoreKeyPair::ECDSA(ECDSAKeys::P384(_)) => SigningScheme::ECDSA_P384_SHA384_ASN1,
            SigStoreKeyPair::ED25519(_) => SigningScheme::ED25519,
            _ => {
                return Err(malformed(
                    source,
                    "secret",
                    "only ECDSA P-256/P-384 and ed25519 keys sign",
                ));
            }
        };
        let signer_key = pair
            .to_sigstore_signer(&scheme)
            .map_err(|e| malformed(source, "secret", e))?;
        let pem = pair.public_key_to_pem().map_err(|e| malformed(source, "secret", e))?;
        let public = public_from_pem(source, signer.to_string(), pem.as_bytes())?;
        let der = pair.public_key_to_der().map_err(|e| malformed(source, "secret", e))?;
        Ok(Self {
            signer: signer_key,
            public,
            hint: BASE64.encode(Digest::of(&der).as_bytes()),
        })
    }

    /// The public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// Signs `message` (ECDSA over its SHA-256, or ed25519).
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignatureError> {
        self.signer.sign(message).map_err(SignatureError::Sign)
    }

    /// The sigstore bundle (v0.3) of a signature over `blob`: what
    /// `cosign sign-blob --new-bundle-format --bundle` writes with a key
    /// and no transparency log.
    pub fn blob_bundle(&self, blob: &[u8]) -> Result<String, SignatureError> {
        let signature = self.sign(blob)?;
        let hint = &self.hint;
        let bundle = serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": hint}},
            "messageSignature": {
                "messageDigest": {"algorithm": "SHA2_256", "digest": BASE64.encode(Digest::of(blob).as_bytes())},
                "signature": BASE64.encode(signature),
            },
        });
        Ok(format!("{bundle}\n"))
    }
}

/// Generates an ECDSA P-256 key pair for `signer` in cosign's format: the
/// private key encrypted with `COSIGN_PASSWORD` (empty when unset) to
/// `path` (mode 0600), the PEM public key to `path.pub`. Refuses to
/// overwrite either file. `cosign sign --key path` signs with it and
/// `cosign verify --key path.pub` checks what `sonde plugin sign` signed.
pub fn keygen(path: &Path, signer: &str) -> Result<PublicKey, SignatureError> {
    super::check_signer_name(signer)?;
    let (key, pair) = SigningKey::generate(signer)?;
    let password = std::env::var(PASSWORD_ENV).unwrap_or_default();
    let secret = pair
        .private_key_to_encrypted_pem(password.as_bytes())
        .map_err(|e| SignatureError::Random(e.to_string()))?;
    let public = pair
        .public_key_to_pem()
        .map_err(|e| SignatureError::Random(e.to_string()))?;
    write_pair(path, secret.as_bytes(), public.as_bytes())?;
    Ok(key.public)
}

/// The simple-signing payload cosign signs for the image manifest
/// `manifest_digest` of repository `docker_reference` (`host/repo`).
pub fn simple_signing_payload(docker_reference: &str, manifest_digest: &str) -> Vec<u8> {
    let payload = serde_json::json!({
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": manifest_digest},
            "type": SIMPLE_SIGNING_TYPE,
        },
        "optional": null,
    });
    payload.to_string().into_bytes()
}
