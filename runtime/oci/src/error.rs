//! What can go wrong between sonde and a registry. Every message names the
//! reference or registry at fault; none carries a credential.

use crate::{WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};
use std::time::Duration;

/// Why resolving, pulling, pushing or caching a registry artifact failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The text is not an `oci://` reference or registry pattern.
    #[error("{reference}: not a registry reference: {detail}")]
    InvalidReference {
        /// The text given.
        reference: String,
        /// What is wrong.
        detail: String,
    },
    /// The registry could not be reached (connection refused, DNS, TLS).
    #[error("registry {registry}: unreachable: {detail}")]
    Unreachable {
        /// `HOST[:PORT]`.
        registry: String,
        /// What failed: the HTTP client's chain of causes, flattened to
        /// text on purpose so that the registry's password is scrubbed
        /// from it before anyone reads it (a cause kept typed would print
        /// whatever it holds).
        detail: String,
    },
    /// The registry refused the credentials, or wants some and none were set.
    #[error("registry {registry}: authentication failed: {detail}")]
    Auth {
        /// `HOST[:PORT]`.
        registry: String,
        /// What the registry said, without any secret.
        detail: String,
    },
    /// The registry has no such tag, digest or repository.
    #[error("{reference}: not found in the registry")]
    NotFound {
        /// The reference.
        reference: String,
    },
    /// Bytes did not hash to the digest that named them.
    #[error("{reference}: digest mismatch: expected {expected}, got {actual}; refusing it")]
    DigestMismatch {
        /// The reference (or cache path) the bytes came from.
        reference: String,
        /// The digest that named them.
        expected: String,
        /// Their actual digest.
        actual: String,
    },
    /// The artifact is larger than allowed.
    #[error("{reference}: {what} is {size} bytes, more than the {limit}-byte limit")]
    TooLarge {
        /// The reference.
        reference: String,
        /// `component`, `manifest` or `signature`.
        what: &'static str,
        /// Its size (declared or seen so far).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The artifact is not a wasm component in the CNCF wasm OCI layout.
    #[error("{reference}: not a wasm component artifact: {why}")]
    NotWasm {
        /// The reference.
        reference: String,
        /// What is wrong.
        #[source]
        why: NotWasm,
    },
    /// A blob's body was not the size its descriptor declared: longer
    /// (refused as soon as it passed the size) or shorter.
    #[error("{reference}: the {what} is declared {declared} bytes, but the registry {}; refusing it", if *.early { format!("sent (or announced) {got}") } else { format!("ended after {got}") })]
    SizeMismatch {
        /// The reference.
        reference: String,
        /// `component` or `signature`.
        what: &'static str,
        /// The size the descriptor declares.
        declared: u64,
        /// The bytes seen (or the length announced) when it was refused.
        got: u64,
        /// Whether it was refused before the body ended (too long).
        early: bool,
    },
    /// The registry (or where it pointed: a redirect, a token realm, what
    /// its name resolves to) is a place the agent does not go.
    #[error("registry {registry}: {refusal}")]
    Refused {
        /// `HOST[:PORT]`.
        registry: String,
        /// What was refused and why.
        #[source]
        refusal: Box<crate::Refusal>,
    },
    /// The registry went silent: no connection, no first byte, or no next
    /// byte within the step's timeout.
    #[error("registry {registry}: {step}: nothing within {}", humantime::format_duration(*.after))]
    Stalled {
        /// `HOST[:PORT]`.
        registry: String,
        /// What the agent was waiting for.
        step: String,
        /// The step's timeout.
        after: Duration,
    },
    /// The whole pull did not finish within its deadline.
    #[error("registry {registry}: no answer within {}", humantime::format_duration(*.after))]
    Timeout {
        /// `HOST[:PORT]`.
        registry: String,
        /// The timeout.
        after: Duration,
    },
    /// The registry answered with an error.
    #[error("registry {registry}: {detail}")]
    Registry {
        /// `HOST[:PORT]`.
        registry: String,
        /// What it said.
        detail: String,
    },
    /// The reference is not in the cache and the registry could not give it.
    #[error("{reference}: not in the local cache, and the registry could not be asked: {source}")]
    NotCached {
        /// The reference.
        reference: String,
        /// Why the registry could not give it.
        source: Box<OciError>,
    },
    /// A registry's settings (its password or CA file) cannot be used.
    #[error("registry {registry}: {why}")]
    Settings {
        /// `HOST[:PORT]`.
        registry: String,
        /// What is wrong (never a file's contents).
        #[source]
        why: BadSettings,
    },
    /// A signature could not be made.
    #[error("cannot sign: {0}")]
    Signing(#[source] Box<crate::signing::SignatureError>),
    /// The cache directory could not be read or written.
    #[error("OCI cache {path}: {source}")]
    Cache {
        /// The file or directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Why an artifact is not a wasm component in the CNCF wasm OCI layout.
#[derive(Debug, thiserror::Error)]
pub enum NotWasm {
    /// The manifest's config is of another media type.
    #[error("config media type {0:?}, expected {WASM_CONFIG_MEDIA_TYPE:?}")]
    ConfigMediaType(String),
    /// The manifest has no component layer, or several.
    #[error("{0} {WASM_LAYER_MEDIA_TYPE} layers, expected exactly one")]
    Layers(usize),
    /// The component layer's digest is not a sha256 digest.
    #[error("layer digest {0:?} is not sha256")]
    LayerDigest(String),
    /// The manifest does not parse as an OCI image manifest.
    #[error("the manifest is not an OCI image manifest: {0}")]
    Manifest(#[source] serde_json::Error),
    /// The file to push is not a WebAssembly component.
    #[error("the file is not a WebAssembly component (build for wasm32-wasip2)")]
    NotAComponent,
}

/// Why a registry's settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BadSettings {
    /// A file (the password or CA file) cannot be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The password file's first line is empty.
    #[error("{}: the password file is empty", .0.display())]
    EmptyPassword(std::path::PathBuf),
    /// Only one of `username` and `password_file` is set.
    #[error("basic auth needs both username and password_file")]
    HalfBasicAuth,
    /// The CA file holds no PEM block.
    #[error("{}: not a PEM file of certificates", .0.display())]
    NotPem(std::path::PathBuf),
    /// The CA file's certificates do not parse.
    #[error("{}: {source}", path.display())]
    Certificates {
        /// The file.
        path: std::path::PathBuf,
        /// What the TLS library said.
        source: reqwest::Error,
    },
}

impl OciError {
    /// Whether the registry itself could not be asked (unreachable, timed
    /// out), so that what the cache holds may stand in for it.
    pub(crate) fn is_offline(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::Timeout { .. } | Self::Stalled { .. }
        )
    }

    /// Whether the artifact could not be had for reasons outside the
    /// reference itself: the registry unreachable, timing out or failing,
    /// with nothing cached to stand in. An agent starting with such a
    /// reference leaves only its probes out; a bad reference, a digest
    /// mismatch or a refused signature are the config's errors.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::NotCached { .. } | Self::Registry { .. } => true,
            other => other.is_offline(),
        }
    }
}
