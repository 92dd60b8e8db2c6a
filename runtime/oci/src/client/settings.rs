//! How sonde reaches registries and where it caches what it pulls.

use crate::remote::Limits;
use sonde_policy::identity;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How sonde reaches registries and where it caches what it pulls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    /// The cache directory (`STATE_DIR/oci` for the agent, the user cache
    /// for `sonde check`).
    pub cache_dir: PathBuf,
    /// Evict unused blobs beyond this many bytes [default: 1 GiB].
    pub cache_max_bytes: u64,
    /// Per registry (`HOST` or `HOST:PORT`, as in references): credentials,
    /// CA, plain HTTP. A registry not listed is reached anonymously over
    /// HTTPS with the system roots.
    pub registries: BTreeMap<String, RegistryAccess>,
    /// The longest a whole pull may take (the tag, the manifest, the
    /// component and the signature together), and a whole push
    /// [default: 60s].
    pub timeout: Duration,
    /// The per-step bounds within it: connecting, and each wait for data
    /// (a silent registry is given up on after [`Limits::idle`]).
    pub limits: Limits,
    /// The largest component accepted [default: 32 MiB].
    pub max_bytes: u64,
}

impl ClientSettings {
    /// The defaults, caching in `cache_dir`.
    pub fn new(cache_dir: PathBuf) -> Self {
        Self {
            cache_dir,
            cache_max_bytes: 1 << 30,
            registries: BTreeMap::new(),
            timeout: Duration::from_secs(60),
            limits: Limits::default(),
            max_bytes: identity::MAX_PLUGIN_BYTES,
        }
    }
}

/// How to reach one registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryAccess {
    /// The user for basic auth (and the token flow, which starts from it).
    pub username: Option<String>,
    /// The file holding the password (its first line). Read once, when the
    /// client is built; never logged.
    pub password_file: Option<PathBuf>,
    /// A PEM file of CA certificates trusted for this registry, besides the
    /// system roots.
    pub ca_file: Option<PathBuf>,
    /// Speak plain HTTP (no TLS) to this registry. Only for loopback and dev
    /// registries, and only when set explicitly.
    pub insecure: bool,
}
