//! Plugin signing: a vendor signs a component, and an operator who trusts
//! the vendor's public key can tell a signed plugin from an unsigned,
//! tampered or foreign one before running it. Built-in plugins are trusted
//! by being embedded and are never checked.
//!
//! Keys and signatures are cosign's, so a vendor whose CI signs with
//! cosign signs sonde plugins the same way, and an operator can check
//! either tool's signatures with either tool:
//!
//! - **Keys**: PEM public keys (ECDSA P-256/P-384, ed25519, RSA), named
//!   after their file (`acme.pub` is signer `acme`); private keys in
//!   cosign's encrypted format (password from `COSIGN_PASSWORD`) or
//!   unencrypted PKCS#8. [`keygen`] writes an ECDSA P-256 pair as
//!   `cosign generate-key-pair` does.
//! - **A file**: `FILE.wasm.sigstore.json`, a sigstore bundle with a
//!   signature over the file ([`sign_file`]; `cosign sign-blob --bundle`),
//!   or `FILE.wasm.sig`, a bare base64 signature (`cosign sign-blob
//!   --output-signature`) or what `sonde plugin pull` gathered.
//! - **In a registry**: the layers of cosign's `sha256-HEX.sig` tag
//!   (`cosign sign`, [`crate::Client::push_cosign_signature`]) and sigstore
//!   bundles among the manifest's OCI 1.1 referrers (`cosign attest
//!   --new-bundle-format`), gathered into one [`Gathered`] document.
//!
//! Verification is the `sigstore` crate's: [`verify_all`] returns every
//! trusted signer whose signature covers the bytes. Keyless signatures (a
//! Fulcio certificate and a Rekor entry) are recognised and refused with
//! that reason: sonde trusts keys only (docs/plugins.md, "Keyless").
//!
//! sonde's own `sonde-signature-v1` files and `sonde-public-key v1 ed25519`
//! keys still verify, for one release (deprecated; nothing writes them).
//!
//! # Examples
//!
//! ```no_run
//! use sonde_oci::signing::{self, PublicKey};
//! use std::path::Path;
//!
//! # fn demo() -> Result<(), signing::SignatureError> {
//! let trusted = vec![PublicKey::read(Path::new("/etc/sonde/keys/acme.pub"))?];
//! for signer in signing::verify_file(Path::new("/opt/acme/replica.wasm"), &trusted)? {
//!     println!("signed by {} ({})", signer.name, signer.key_id);
//! }
//! # Ok(())
//! # }
//! ```

mod cosign;
mod evidence;
mod keys;

pub use cosign::{
    BUNDLE_MEDIA_TYPE, PASSWORD_ENV, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, SigningKey, keygen,
    simple_signing_payload,
};
pub(crate) use evidence::is_bundle_type;
pub use evidence::{GATHERED_FORMAT, Gathered, Item, MAX_GATHERED_BYTES, MAX_ITEMS};
pub use keys::{PublicKey, SecretKey, legacy_keygen, public_key_path};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use sonde_policy::identity::{self, Digest, ReadError};

use std::path::{Path, PathBuf};

/// The first line of a secret key file.
pub(crate) const SECRET_KEY_HEADER: &str = "sonde-secret-key v1 ed25519";
/// The first line of a public key file.
pub const PUBLIC_KEY_HEADER: &str = "sonde-public-key v1 ed25519";
/// The `format` of a signature file, and the first line of what is signed.
pub(crate) const SIGNATURE_FORMAT: &str = "sonde-signature-v1";

/// Key and signature files larger than this are refused unread.
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// The longest signer name.
const MAX_SIGNER_BYTES: usize = 128;

/// Why signing, verifying or handling a key failed. Each message names the
/// file at fault.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The plugin has no signature file.
    #[error("{plugin}: unsigned: no signature file {sig}")]
    Unsigned {
        /// The plugin's file.
        plugin: String,
        /// Where its signature was looked for.
        sig: String,
    },
    /// The plugin's bytes are not those that were signed.
    #[error("{plugin}: tampered: its digest sha256:{actual} is not the signed sha256:{signed} ({sig})")]
    DigestMismatch {
        /// The plugin's file.
        plugin: String,
        /// The signature file.
        sig: String,
        /// The digest of the plugin as it is.
        actual: String,
        /// The digest the signature names.
        signed: String,
    },
    /// The signature does not verify with the signer's (trusted) key: the
    /// signature file was altered.
    #[error("{plugin}: tampered: the signature in {sig} does not match key {key_id} ({signer})")]
    BadSignature {
        /// The plugin's file.
        plugin: String,
        /// The signature file.
        sig: String,
        /// The name the signature claims.
        signer: String,
        /// The key id it names.
        key_id: String,
    },
    /// The signature was made with a key that is not trusted.
    #[error(
        "{plugin}: untrusted: signed by {signer:?} with key {key_id}, which is not among the {trusted} trusted key(s) ({sig})"
    )]
    Untrusted {
        /// The plugin's file.
        plugin: String,
        /// The signature file.
        sig: String,
        /// The name the signature claims.
        signer: String,
        /// The key id it names.
        key_id: String,
        /// How many keys are trusted.
        trusted: usize,
    },
    /// The signature file is not a sonde signature.
    #[error("{sig}: not a valid signature: {detail}")]
    MalformedSignature {
        /// The signature file.
        sig: String,
        /// What is wrong.
        detail: String,
    },
    /// A key file is not a sonde key of the expected kind.
    #[error("{path}: not a valid sonde {kind} key file: {detail}")]
    MalformedKey {
        /// The key file.
        path: String,
        /// `secret` or `public`.
        kind: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A key file to be written already exists.
    #[error("{path}: already exists; sonde does not overwrite keys")]
    KeyExists {
        /// The existing file.
        path: String,
    },
    /// The signer name cannot be used.
    #[error("signer name {name:?}: {detail}")]
    BadSignerName {
        /// The name given.
        name: String,
        /// Why it is refused.
        detail: String,
    },
    /// The crypto library could not sign.
    #[error("cannot sign: {0}")]
    Sign(#[source] sigstore::errors::SigstoreError),
    /// No signature found verifies with a trusted key.
    #[error("{plugin}: untrusted: {found} signature(s) in {sig}, none by the {trusted} trusted key(s){why}")]
    NoTrustedSignature {
        /// The plugin.
        plugin: String,
        /// Where the signatures were found.
        sig: String,
        /// How many signatures were found.
        found: usize,
        /// How many keys are trusted.
        trusted: usize,
        /// What else was wrong, as `: …` (a signature over another digest, say), or empty.
        why: String,
    },
    /// The system gave no randomness for a new key.
    #[error("cannot generate a key: no randomness from the system: {0}")]
    Random(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl SignatureError {
    /// Whether the error says the plugin must not be trusted (unsigned,
    /// tampered, untrusted or a malformed signature), rather than that
    /// the check itself could not be made (a key file missing, say).
    pub fn is_verdict(&self) -> bool {
        matches!(
            self,
            Self::Unsigned { .. }
                | Self::DigestMismatch { .. }
                | Self::BadSignature { .. }
                | Self::Untrusted { .. }
                | Self::NoTrustedSignature { .. }
                | Self::MalformedSignature { .. }
        )
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SignatureError + '_ {
    move |source| SignatureError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Reads a small text file, refusing large ones unread.
fn read_small(path: &Path) -> Result<Vec<u8>, SignatureError> {
    read_capped(path, MAX_FILE_BYTES)
}

/// `path`'s bytes, through [`identity::read_regular`]: a regular file of at
/// most `max` bytes (a FIFO or device is refused, never waited on).
fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, SignatureError> {
    let invalid = |why: String| SignatureError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    };
    identity::read_regular(path, max).map_err(|e| match e {
        ReadError::Io(source) => io_error(path)(source),
        ReadError::NotAFile(kind) => invalid(format!("not a regular file ({kind})")),
        ReadError::TooLarge { .. } => invalid(format!("larger than {max} bytes")),
    })
}

fn check_signer_name(name: &str) -> Result<(), SignatureError> {
    let bad = |detail: &str| SignatureError::BadSignerName {
        name: name.to_string(),
        detail: detail.to_string(),
    };
    if name.trim().is_empty() {
        return Err(bad("must not be empty"));
    }
    if name.len() > MAX_SIGNER_BYTES {
        return Err(bad("longer than 128 bytes"));
    }
    if name.chars().any(char::is_control) || name != name.trim() {
        return Err(bad("must not contain control characters or leading/trailing spaces"));
    }
    Ok(())
}

/// The contents of a `FILE.wasm.sig` file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// Always [`SIGNATURE_FORMAT`].
    pub format: String,
    /// Always `ed25519`.
    pub algorithm: String,
    /// The name of whoever signed.
    pub signer: String,
    /// The id of the key that signed.
    pub key_id: String,
    /// When, in RFC 3339 (UTC, seconds).
    pub signed_at: String,
    /// `sha256:` and the component's digest in hex.
    pub digest: String,
    /// The ed25519 signature of [`SignatureFile::signed_message`], base64.
    pub signature: String,
}

impl SignatureFile {
    /// The text the signature covers.
    pub(crate) fn signed_message(&self) -> String {
        format!(
            "{SIGNATURE_FORMAT}\nsigner: {}\nkey_id: {}\nsigned_at: {}\ndigest: {}\n",
            self.signer, self.key_id, self.signed_at, self.digest
        )
    }

    /// The file's text: pretty JSON and a final newline.
    pub fn to_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        text
    }
}

/// Who signed a plugin that verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Signer {
    /// The name in the signature (signed by the key, so as trusted as it).
    pub name: String,
    /// The id of the trusted key that verified it.
    pub key_id: String,
    /// When it was signed, as the signature says (RFC 3339).
    pub signed_at: String,
    /// The component's digest, `sha256:` and hex.
    pub digest: String,
}

/// Where the signature of the component at `wasm` lives: `FILE.wasm.sig`.
pub fn signature_path(wasm: &Path) -> PathBuf {
    let mut name = wasm.as_os_str().to_os_string();
    name.push(".sig");
    PathBuf::from(name)
}

/// Checks that `wasm` (the component loaded from `plugin`, a name used in
/// messages) carries a valid signature by one of `trusted`.
///
/// `sig` is the signature file's contents, or `None` when there is none;
/// `sig_name` names it in messages. The errors tell apart an unsigned plugin
/// ([`SignatureError::Unsigned`]), a tampered one (its bytes changed:
/// [`SignatureError::DigestMismatch`]; the signature file changed:
/// [`SignatureError::BadSignature`]) and one signed by a key not trusted
/// ([`SignatureError::Untrusted`]).
pub fn verify(
    plugin: &str,
    wasm: &[u8],
    sig_name: &str,
    sig: Option<&[u8]>,
    trusted: &[PublicKey],
) -> Result<Signer, SignatureError> {
    let mut all = verify_all(plugin, wasm, sig_name, sig, trusted)?;
    Ok(all.swap_remove(0))
}

/// As [`verify`], every trusted signer whose signature covers `wasm` (at
/// least one), so that a tenant limited to some signers can be checked.
pub fn verify_all(
    plugin: &str,
    wasm: &[u8],
    sig_name: &str,
    sig: Option<&[u8]>,
    trusted: &[PublicKey],
) -> Result<Vec<Signer>, SignatureError> {
    let Some(sig_bytes) = sig else {
        return Err(SignatureError::Unsigned {
            plugin: plugin.to_string(),
            sig: sig_name.to_string(),
        });
    };
    evidence::verify_all(plugin, wasm, sig_name, sig_bytes, trusted)
}

/// Checks sonde's deprecated `sonde-signature-v1` file `sig_bytes`.
fn verify_legacy(
    plugin: &str,
    wasm: &[u8],
    sig_name: &str,
    sig_bytes: &[u8],
    trusted: &[PublicKey],
) -> Result<Signer, SignatureError> {
    let malformed = |detail: String| SignatureError::MalformedSignature {
        sig: sig_name.to_string(),
        detail,
    };
    if sig_bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(malformed(format!("larger than {MAX_FILE_BYTES} bytes")));
    }
    let file: SignatureFile = serde_json::from_slice(sig_bytes).map_err(|e| malformed(e.to_string()))?;
    if file.format != SIGNATURE_FORMAT {
        return Err(malformed(format!(
            "format {:?}, expected {SIGNATURE_FORMAT:?}",
            file.format
        )));
    }
    if file.algorithm != "ed25519" {
        return Err(malformed(format!(
            "algorithm {:?}, expected \"ed25519\"",
            file.algorithm
        )));
    }
    check_signer_name(&file.signer).map_err(|e| malformed(e.to_string()))?;
    if humantime::parse_rfc3339(&file.signed_at).is_err() {
        return Err(malformed(format!(
            "signed_at {:?} is not an RFC 3339 time",
            file.signed_at
        )));
    }
    let signature: [u8; 64] = BASE64
        .decode(&file.signature)
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| malformed("signature is not 64 bytes of base64".into()))?;
    let actual = Digest::of(wasm).hex();
    let signed = file.digest.strip_prefix("sha256:").unwrap_or(&file.digest);
    if signed != actual {
        return Err(SignatureError::DigestMismatch {
            plugin: plugin.to_string(),
            sig: sig_name.to_string(),
            actual,
            signed: signed.to_string(),
        });
    }
    let legacy_key = |k: &&PublicKey| match &k.key {
        keys::KeyMaterial::Legacy(v) => (k.key_id == file.key_id).then_some(*v),
        keys::KeyMaterial::Pem(_) => None,
    };
    let Some(key) = trusted.iter().find_map(|k| legacy_key(&k)) else {
        return Err(SignatureError::Untrusted {
            plugin: plugin.to_string(),
            sig: sig_name.to_string(),
            signer: file.signer,
            key_id: file.key_id,
            trusted: trusted.len(),
        });
    };
    let signature = ed25519_dalek::Signature::from_bytes(&signature);
    if key.verify_strict(file.signed_message().as_bytes(), &signature).is_err() {
        return Err(SignatureError::BadSignature {
            plugin: plugin.to_string(),
            sig: sig_name.to_string(),
            signer: file.signer,
            key_id: file.key_id,
        });
    }
    Ok(Signer {
        name: file.signer,
        key_id: file.key_id,
        signed_at: file.signed_at,
        digest: file.digest,
    })
}

/// Where a bundle signing the component at `wasm` is kept:
/// `FILE.wasm.sigstore.json` (what `sonde plugin sign` writes, and the
/// name to give `cosign sign-blob --bundle`).
pub fn bundle_path(wasm: &Path) -> PathBuf {
    let mut name = wasm.as_os_str().to_os_string();
    name.push(".sigstore.json");
    PathBuf::from(name)
}

/// Reads the signature of the component at `wasm`: `FILE.wasm.sigstore.json`
/// when there is one, else `FILE.wasm.sig` (a cosign signature, what `sonde
/// plugin pull` wrote, or a deprecated sonde signature). `None` when
/// neither exists; an error when one cannot be read or is too large.
pub fn read_signature(wasm: &Path) -> Result<Option<(PathBuf, Vec<u8>)>, SignatureError> {
    for path in [bundle_path(wasm), signature_path(wasm)] {
        match read_capped(&path, MAX_GATHERED_BYTES) {
            Ok(s) => return Ok(Some((path, s))),
            Err(SignatureError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Checks the component at `wasm` against its signature file, as
/// [`verify_all`] does. A missing signature is [`SignatureError::Unsigned`].
pub fn verify_file(wasm: &Path, trusted: &[PublicKey]) -> Result<Vec<Signer>, SignatureError> {
    let bytes = read_capped(wasm, identity::MAX_PLUGIN_BYTES)?;
    let (sig_path, sig) = match read_signature(wasm)? {
        Some((p, s)) => (p, Some(s)),
        None => (bundle_path(wasm), None),
    };
    verify_all(
        &wasm.display().to_string(),
        &bytes,
        &sig_path.display().to_string(),
        sig.as_deref(),
        trusted,
    )
}

/// Signs `bytes`, the component as read from `wasm` (once, by the caller,
/// which checked them), with `key` and writes the bundle to
/// `FILE.wasm.sigstore.json` (replacing an older one, atomically).
/// Returns its path.
pub fn sign_file(key: &SigningKey, wasm: &Path, bytes: &[u8]) -> Result<PathBuf, SignatureError> {
    let bundle = key.blob_bundle(bytes)?;
    let path = bundle_path(wasm);
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_error(&path))?;
    std::io::Write::write_all(&mut tmp, bundle.as_bytes()).map_err(io_error(&path))?;
    tmp.persist(&path).map_err(|e| io_error(&path)(e.error))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn key(name: &str) -> SecretKey {
        SecretKey::generate(name).unwrap()
    }

    #[test]
    fn a_signature_covers_digest_signer_and_time() {
        let k = key("acme");
        let wasm = b"\0asm component bytes";
        let sig = k.sign(wasm, SystemTime::UNIX_EPOCH);
        let text = sig.to_text();
        let trusted = [k.public()];
        let signer = verify("p.wasm", wasm, "p.wasm.sig", Some(text.as_bytes()), &trusted).unwrap();
        assert_eq!(signer.name, "acme");
        assert_eq!(signer.signed_at, "1970-01-01T00:00:00Z");

        // Changing any signed field breaks the signature.
        for field in ["signer", "signed_at", "key_id"] {
            let mut forged = sig.clone();
            match field {
                "signer" => forged.signer = "mallory".into(),
                "signed_at" => forged.signed_at = "2030-01-01T00:00:00Z".into(),
                _ => forged.key_id = "0000000000000000".into(),
            }
            let err = verify(
                "p.wasm",
                wasm,
                "p.wasm.sig",
                Some(forged.to_text().as_bytes()),
                &trusted,
            )
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    SignatureError::BadSignature { .. } | SignatureError::Untrusted { .. }
                ),
                "{field}: {err}"
            );
        }
    }

    #[test]
    fn signer_names_are_one_printable_line() {
        assert!(SecretKey::generate("acme corp").is_ok());
        for bad in ["", "a\nb", " lead", &"x".repeat(200)] {
            assert!(SecretKey::generate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn malformed_signature_files_are_refused_with_the_reason() {
        let k = key("acme");
        let wasm = b"bytes";
        let trusted = [k.public()];
        let too_many = format!(
            r#"{{"format": "{GATHERED_FORMAT}", "manifest": "", "items": [{}]}}"#,
            vec![r#"{"sonde": {"file": ""}}"#; MAX_ITEMS + 1].join(",")
        );
        let huge = format!("{{\"pad\": \"{}\"}}", "x".repeat(MAX_GATHERED_BYTES as usize));
        let cases: [(&str, &str); 8] = [
            ("not json", "neither JSON nor a base64 signature"),
            (r#"{"format": "x"}"#, "not a signature sonde reads"),
            (
                r#"{"format": "sonde-signature-v1", "algorithm": "rsa", "signer": "a", "key_id": "", "signed_at": "", "digest": "", "signature": ""}"#,
                "algorithm \"rsa\"",
            ),
            (
                r#"{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "verificationMaterial": {}}"#,
                "neither messageSignature nor dsseEnvelope",
            ),
            (
                r#"{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "verificationMaterial": {"certificate": {"rawBytes": "AA=="}}, "messageSignature": {}}"#,
                "keyless bundle",
            ),
            (r#"{"base64Signature": "%%%"}"#, "base64Signature is not base64"),
            (&too_many, "more than 16 signatures"),
            (&huge, "larger than 2097152 bytes"),
        ];
        for (text, expected) in cases {
            let err = verify("p.wasm", wasm, "p.wasm.sig", Some(text.as_bytes()), &trusted).unwrap_err();
            assert!(matches!(err, SignatureError::MalformedSignature { .. }), "{err}");
            assert!(err.to_string().contains(expected), "{err}");
            assert!(err.to_string().starts_with("p.wasm.sig:"), "{err}");
        }
    }

    #[test]
    fn key_files_round_trip_and_refuse_the_wrong_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acme.key");
        let public = legacy_keygen(&path, "acme").unwrap();
        let secret = SecretKey::read(&path).unwrap();
        assert_eq!(secret.public(), public);
        assert_eq!(PublicKey::read(&public_key_path(&path)).unwrap(), public);
        let err = PublicKey::read(&path).unwrap_err();
        assert!(err.to_string().contains("this is a secret key file"), "{err}");
        let err = SecretKey::read(&public_key_path(&path)).unwrap_err();
        assert!(err.to_string().contains("this is a public key file"), "{err}");
        let text = std::fs::read_to_string(public_key_path(&path)).unwrap();
        assert_eq!(PublicKey::parse("inline", &text).unwrap(), public);
        let err = PublicKey::parse("config.yaml: trust[0]", "nonsense").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("config.yaml: trust[0]: not a valid sonde public key"),
            "{err}"
        );
        let err = legacy_keygen(&path, "acme").unwrap_err();
        assert!(matches!(err, SignatureError::KeyExists { .. }), "{err}");
    }
}
