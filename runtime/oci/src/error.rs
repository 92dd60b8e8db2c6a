//! What can go wrong between sonde and a registry. Every message names the
//! reference or registry at fault; none carries a credential.

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
        /// What failed.
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
    #[error("{reference}: not a wasm component artifact: {detail}")]
    NotWasm {
        /// The reference.
        reference: String,
        /// What is wrong.
        detail: String,
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
    #[error("registry {registry}: {detail}")]
    Refused {
        /// `HOST[:PORT]`.
        registry: String,
        /// What was refused and why.
        detail: String,
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
    /// A settings file (password, CA) could not be used.
    #[error("registry {registry}: {path}: {detail}")]
    Settings {
        /// `HOST[:PORT]`.
        registry: String,
        /// The file.
        path: String,
        /// What is wrong (never the file's contents).
        detail: String,
    },
    /// A signature could not be made.
    #[error("cannot sign: {0}")]
    Signing(String),
    /// The cache directory could not be read or written.
    #[error("OCI cache {path}: {source}")]
    Cache {
        /// The file or directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
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
