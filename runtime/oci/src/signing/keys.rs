//! Keys: a signer's secret key and the public key an operator trusts,
//! their files (a header line, then `name: value` lines), and [`keygen`](super::cosign::keygen).

use super::{
    PUBLIC_KEY_HEADER, SECRET_KEY_HEADER, SIGNATURE_FORMAT, SignatureError, SignatureFile, check_signer_name, io_error,
    read_small,
};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sonde_policy::identity::{self, Digest};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The id of a public key: the first 8 bytes of its SHA-256, in hex.
fn key_id(key: &VerifyingKey) -> String {
    identity::hex(&Digest::of(key.as_bytes()).as_bytes()[..8])
}

/// Parses a key file: its header, then `signer:` and `key:` lines.
fn parse_key_file(path: &Path, kind: &'static str, header: &str) -> Result<(String, [u8; 32]), SignatureError> {
    let bytes = read_small(path)?;
    let text = String::from_utf8(bytes).map_err(|_| SignatureError::MalformedKey {
        path: path.display().to_string(),
        kind,
        detail: "not UTF-8 text".into(),
    })?;
    parse_key_text(&path.display().to_string(), &text, kind, header)
}

/// Parses a key file's text; `source` names it in errors.
fn parse_key_text(
    source: &str,
    text: &str,
    kind: &'static str,
    header: &str,
) -> Result<(String, [u8; 32]), SignatureError> {
    let malformed = |detail: String| SignatureError::MalformedKey {
        path: source.to_string(),
        kind,
        detail,
    };
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    match lines.next() {
        Some(first) if first == header => {}
        Some(first) if first == SECRET_KEY_HEADER || first == PUBLIC_KEY_HEADER => {
            let other = if kind == "secret" { "a public" } else { "a secret" };
            return Err(malformed(format!("this is {other} key file")));
        }
        _ => return Err(malformed(format!("the first line must be `{header}`"))),
    }
    let (mut signer, mut key) = (None, None);
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| malformed(format!("line {line:?} is not `name: value`")))?;
        let value = value.trim();
        match name.trim() {
            "signer" => signer = Some(value.to_string()),
            "key" => key = Some(value.to_string()),
            other => return Err(malformed(format!("unknown field {other:?}"))),
        }
    }
    let signer = signer.ok_or_else(|| malformed("no `signer:` line".into()))?;
    check_signer_name(&signer).map_err(|e| malformed(e.to_string()))?;
    let key = key.ok_or_else(|| malformed("no `key:` line".into()))?;
    let key: [u8; 32] = BASE64
        .decode(&key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| malformed("`key:` is not 32 bytes of base64".into()))?;
    Ok((signer, key))
}

/// A secret signing key and the name it signs as.
pub struct SecretKey {
    signer: String,
    key: SigningKey,
}

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretKey")
            .field("signer", &self.signer)
            .field("key_id", &self.public().key_id)
            .finish_non_exhaustive()
    }
}

impl SecretKey {
    /// Generates a new key from the system's randomness.
    pub fn generate(signer: &str) -> Result<Self, SignatureError> {
        check_signer_name(signer)?;
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| SignatureError::Random(e.to_string()))?;
        Ok(Self {
            signer: signer.to_string(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Reads a secret key file.
    pub fn read(path: &Path) -> Result<Self, SignatureError> {
        let (signer, seed) = parse_key_file(path, "secret", SECRET_KEY_HEADER)?;
        Ok(Self {
            signer,
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// The name this key signs as.
    pub fn signer(&self) -> &str {
        &self.signer
    }

    /// Its public half.
    pub fn public(&self) -> PublicKey {
        let key = self.key.verifying_key();
        PublicKey {
            signer: self.signer.clone(),
            key_id: key_id(&key),
            key: KeyMaterial::Legacy(key),
        }
    }

    fn to_file_text(&self) -> String {
        format!(
            "{SECRET_KEY_HEADER}\nsigner: {}\nkey: {}\n",
            self.signer,
            BASE64.encode(self.key.to_bytes())
        )
    }

    /// Signs a component: the signature file's contents.
    pub fn sign(&self, wasm: &[u8], at: SystemTime) -> SignatureFile {
        let public = self.public();
        let mut sig = SignatureFile {
            format: SIGNATURE_FORMAT.into(),
            algorithm: "ed25519".into(),
            signer: self.signer.clone(),
            key_id: public.key_id,
            signed_at: humantime::format_rfc3339_seconds(at).to_string(),
            digest: Digest::of(wasm).to_string(),
            signature: String::new(),
        };
        sig.signature = BASE64.encode(self.key.sign(sig.signed_message().as_bytes()).to_bytes());
        sig
    }
}

/// The key itself: sonde's own ed25519 format (deprecated, read for one
/// release) or a PEM public key as cosign writes it.
#[derive(Clone)]
pub(super) enum KeyMaterial {
    /// A `sonde-public-key v1 ed25519` file.
    Legacy(VerifyingKey),
    /// A PEM `PUBLIC KEY` (ECDSA P-256/P-384, ed25519 or RSA).
    Pem(std::sync::Arc<sigstore::crypto::CosignVerificationKey>),
}

/// A public key an operator trusts, with the name it was issued to.
#[derive(Clone)]
pub struct PublicKey {
    pub(super) signer: String,
    pub(super) key_id: String,
    pub(super) key: KeyMaterial,
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.signer == other.signer && self.key_id == other.key_id
    }
}

impl Eq for PublicKey {}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("signer", &self.signer)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl PublicKey {
    /// Reads a public key file: a PEM `PUBLIC KEY` (what `sonde plugin
    /// keygen` and `cosign generate-key-pair` write), named after the file
    /// (`acme.pub` is signer `acme`), or a deprecated sonde key file.
    pub fn read(path: &Path) -> Result<Self, SignatureError> {
        let bytes = read_small(path)?;
        if is_pem(&bytes) {
            return public_from_pem(&path.display().to_string(), signer_of_path(path), &bytes);
        }
        let (signer, bytes) = parse_key_file(path, "public", PUBLIC_KEY_HEADER)?;
        Self::from_parts(&path.display().to_string(), signer, &bytes)
    }

    /// Parses the text of a public key file given inline (in a config
    /// file, say); `source` names it in errors (`config.yaml: trust[0]`).
    pub fn parse(source: &str, text: &str) -> Result<Self, SignatureError> {
        let (signer, bytes) = parse_key_text(source, text, "public", PUBLIC_KEY_HEADER)?;
        Self::from_parts(source, signer, &bytes)
    }

    fn from_parts(source: &str, signer: String, bytes: &[u8; 32]) -> Result<Self, SignatureError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|e| SignatureError::MalformedKey {
            path: source.to_string(),
            kind: "public",
            detail: format!("not an ed25519 public key: {e}"),
        })?;
        Ok(Self {
            signer,
            key_id: key_id(&key),
            key: KeyMaterial::Legacy(key),
        })
    }

    /// The name in the key file.
    pub fn signer(&self) -> &str {
        &self.signer
    }

    /// The key's id: the first 8 bytes of its SHA-256, in hex.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Whether this is a deprecated sonde-format key.
    pub fn is_legacy(&self) -> bool {
        matches!(self.key, KeyMaterial::Legacy(_))
    }
}

/// The signer name of a PEM key file: its name without `.pub` or `.pem`.
pub(super) fn signer_of_path(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".pub")
        .or_else(|| name.strip_suffix(".pem"))
        .unwrap_or(&name);
    stem.to_string()
}

/// The public key file written next to a private key file: `NAME.pub`
/// for `NAME.key` (as cosign names them), else `KEYFILE.pub`.
pub fn public_key_path(secret: &Path) -> PathBuf {
    let text = secret.as_os_str().to_string_lossy();
    match text.strip_suffix(".key") {
        Some(stem) if !stem.is_empty() && !stem.ends_with('/') => PathBuf::from(format!("{stem}.pub")),
        _ => {
            let mut name = secret.as_os_str().to_os_string();
            name.push(".pub");
            PathBuf::from(name)
        }
    }
}

/// Generates a key pair in sonde's deprecated format for `signer` and
/// writes the secret key to `path` (mode 0600) and the public key to
/// `path.pub`. Kept so that operators and tests can check the old format
/// still verifies; `sonde plugin keygen` writes cosign's format
/// ([`super::keygen`]).
pub fn legacy_keygen(path: &Path, signer: &str) -> Result<PublicKey, SignatureError> {
    let key = SecretKey::generate(signer)?;
    let public = key.public();
    let verifying = key.key.verifying_key();
    let public_text = format!(
        "{PUBLIC_KEY_HEADER}\nsigner: {}\nkey: {}\n",
        public.signer,
        BASE64.encode(verifying.as_bytes())
    );
    write_pair(path, key.to_file_text().as_bytes(), public_text.as_bytes())?;
    Ok(public)
}

/// Writes a secret key to `path` (mode 0600) and its public half to
/// `path.pub`, refusing to overwrite either, and leaving neither when the
/// second cannot be written.
pub(super) fn write_pair(path: &Path, secret: &[u8], public: &[u8]) -> Result<(), SignatureError> {
    let public_path = public_key_path(path);
    for p in [path, public_path.as_path()] {
        if p.symlink_metadata().is_ok() {
            return Err(SignatureError::KeyExists {
                path: p.display().to_string(),
            });
        }
    }
    write_new(path, secret, 0o600)?;
    if let Err(e) = write_new(&public_path, public, 0o644) {
        // Leave no secret key without its public half.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// Creates `path` with `mode`, failing when it exists.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), SignatureError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => SignatureError::KeyExists {
                path: path.display().to_string(),
            },
            _ => SignatureError::Io {
                path: path.display().to_string(),
                source,
            },
        })?;
    file.write_all(contents).map_err(io_error(path))?;
    file.sync_all().map_err(io_error(path))
}

/// Whether `bytes` look like a PEM file.
pub(super) fn is_pem(bytes: &[u8]) -> bool {
    bytes.trim_ascii_start().starts_with(b"-----BEGIN ")
}

pub(super) fn malformed_pem(source: &str, kind: &'static str, detail: impl std::fmt::Display) -> SignatureError {
    SignatureError::MalformedKey {
        path: source.to_string(),
        kind,
        detail: detail.to_string(),
    }
}

/// A PEM public key, named `signer`: its id is the first 8 bytes of the
/// SHA-256 of its DER encoding, in hex.
pub(super) fn public_from_pem(source: &str, signer: String, bytes: &[u8]) -> Result<PublicKey, SignatureError> {
    let block = pem::parse(bytes).map_err(|e| malformed_pem(source, "public", format!("not a PEM file: {e}")))?;
    match block.tag() {
        "PUBLIC KEY" => {}
        t if t.contains("PRIVATE KEY") => {
            return Err(malformed_pem(
                source,
                "public",
                "this is a private key; trust its `.pub` half",
            ));
        }
        t => {
            return Err(malformed_pem(
                source,
                "public",
                format!("a PEM {t:?}, expected \"PUBLIC KEY\""),
            ));
        }
    }
    let key = sigstore::crypto::CosignVerificationKey::try_from_der(block.contents())
        .map_err(|e| malformed_pem(source, "public", format!("not a supported public key: {e}")))?;
    super::check_signer_name(&signer).map_err(|e| malformed_pem(source, "public", e))?;
    Ok(PublicKey {
        signer,
        key_id: identity::hex(&Digest::of(block.contents()).as_bytes()[..8]),
        key: KeyMaterial::Pem(std::sync::Arc::new(key)),
    })
}
