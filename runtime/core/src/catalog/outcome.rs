//! What resolving a plugin comes to besides the plugin: why it could not
//! be had, and what pulling it cost. Its own module so that resolving
//! ([`super::resolve`]) and background pulls ([`super::pulls`]) share the
//! types without importing each other.

use sonde_oci::signing::SignatureError;
use sonde_sandbox::engine::LoadError;
use std::sync::Arc;

/// Why a plugin could not be had.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    /// No built-in of that name, and not a path.
    #[error(
        "unknown built-in {name:?} (built-ins: {}); a file needs a path such as ./{name}.wasm",
        sonde_builtins::names().collect::<Vec<_>>().join(", ")
    )]
    UnknownBuiltin {
        /// The name written.
        name: String,
    },
    /// The component does not load (read, compile, world, describe).
    #[error("{0}")]
    Load(Arc<LoadError>),
    /// `require_signed` and the file's signature does not verify.
    #[error("refused (require_signed): {0}")]
    Unsigned(Arc<SignatureError>),
    /// The signature file cannot be read.
    #[error("{0}")]
    Signature(Arc<SignatureError>),
    /// The plugin is not signed by one of its tenant's `ceiling.signers`.
    #[error(
        "tenant {tenant:?} runs only plugins signed by {}: {plugin} is signed by {}",
        allowed.join(", "),
        if signers.is_empty() { "no trusted signer".to_string() } else { signers.join(", ") }
    )]
    NotTenantsSigner {
        /// The tenant.
        tenant: String,
        /// The plugin, as shown.
        plugin: String,
        /// Its trusted signers.
        signers: Vec<String>,
        /// The tenant's signers.
        allowed: Vec<String>,
    },
    /// An `oci://` reference that cannot be parsed, reached or pulled.
    #[error("{0}")]
    Oci(Arc<sonde_oci::OciError>),
}

impl ResolveError {
    /// Whether the error came from a registry (or what it sent), not from
    /// the reference or the agent's settings: in the agent such a failure
    /// leaves its probes out rather than refusing the config.
    pub(crate) fn is_remote(&self) -> bool {
        match self {
            Self::Oci(e) => !matches!(
                **e,
                sonde_oci::OciError::InvalidReference { .. } | sonde_oci::OciError::Settings { .. }
            ),
            Self::Unsigned(_) | Self::Load(_) | Self::NotTenantsSigner { .. } => true,
            Self::UnknownBuiltin { .. } | Self::Signature(_) => false,
        }
    }

    /// Whether the plugin is an `oci://` reference its registry could not
    /// give now, with nothing cached ([`OciError::is_unavailable`](sonde_oci::OciError::is_unavailable)).
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(self, Self::Oci(e) if e.is_unavailable())
    }
}

/// What resolving one `oci://` plugin cost: charged to the tenant whose
/// probe named it first in a change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PullCost {
    /// Bytes that came from the registry (manifests, component, signature).
    pub bytes: u64,
    /// Time spent asking the registry and reading the cache.
    pub elapsed: std::time::Duration,
}
