//! A loaded plugin and what its `describe` said, mapped from the WIT types.

use super::CacheOutcome;
use super::store::CallState;
use crate::bindings::{self, sonde::probe::types as wit};
use crate::verdict::{plugin_text, truncate};
use serde::Serialize;
use sonde_policy::identity::Digest;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The kinds of capability a plugin may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CapabilityKind {
    /// Connections beyond the target.
    Net,
    /// Programs the host runs for the plugin.
    Exec,
    /// Read-only paths.
    Files,
}

impl CapabilityKind {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Net => "net",
            Self::Exec => "exec",
            Self::Files => "files",
        }
    }
}

/// A capability a plugin asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Capability {
    /// Its kind.
    pub kind: CapabilityKind,
    /// The pattern it needs.
    pub value: String,
    /// Why.
    pub why: String,
}

/// What a plugin's `describe` said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Who ships it.
    pub vendor: String,
    /// What it checks.
    pub description: String,
    /// JSON Schema for its config.
    pub config_schema: Option<String>,
    /// What it asks to be granted.
    pub capabilities: Vec<Capability>,
}

impl From<wit::PluginInfo> for PluginInfo {
    fn from(i: wit::PluginInfo) -> Self {
        Self {
            name: plugin_text(i.name, 128),
            version: plugin_text(i.version, 64),
            vendor: plugin_text(i.vendor, 128),
            description: plugin_text(i.description, 4096),
            config_schema: i.config_schema.map(|s| truncate(s, 64 * 1024)),
            capabilities: i
                .capabilities
                .into_iter()
                .take(64)
                .map(|c| Capability {
                    kind: match c.kind {
                        wit::CapabilityKind::Net => CapabilityKind::Net,
                        wit::CapabilityKind::Exec => CapabilityKind::Exec,
                        wit::CapabilityKind::Files => CapabilityKind::Files,
                    },
                    value: plugin_text(c.value, 256),
                    why: plugin_text(c.why, 1024),
                })
                .collect(),
        }
    }
}

/// A loaded plugin: compiled, checked and pre-instantiated. Cheap to share.
pub struct Plugin {
    pub(super) label: String,
    pub(super) digest: Digest,
    pub(super) info: PluginInfo,
    pub(super) imports: Vec<String>,
    /// Pre-instantiated against the linker for calls without a `files` grant.
    pub(super) pre_closed: bindings::PluginPre<CallState>,
    /// Pre-instantiated against the linker for calls with a `files` grant.
    pub(super) pre_files: bindings::PluginPre<CallState>,
    pub(super) cache: CacheOutcome,
    /// Its compile-cache file, removed when the plugin is dropped if it
    /// was forgotten ([`Engine::forget`](super::Engine::forget)) while still in use.
    pub(super) cache_file: Option<PathBuf>,
    pub(super) forgotten: AtomicBool,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if self.forgotten.load(Ordering::Relaxed)
            && let Some(file) = &self.cache_file
        {
            let _ = std::fs::remove_file(file);
        }
    }
}

impl Plugin {
    /// The file path or built-in name it was loaded from.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The digest of its bytes.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// What its `describe` said.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The names of the interfaces and functions it imports.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Whether it came from the compile cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }
}
