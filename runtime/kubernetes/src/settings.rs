//! The agent's Kubernetes settings (the `kubernetes:` block, defaults
//! filled in) and the plugin allowlist a SondeCheck is held to.

use sonde_core::config::KubernetesSpec;
use sonde_core::tenants::DEFAULT_TENANT;
use sonde_oci::{Reference, RegistryScope};
use std::collections::BTreeMap;
use std::time::Duration;

/// Default `kubernetes.plugins`: the built-ins that reach a port.
pub const DEFAULT_PLUGINS: &[&str] = &["http", "tcp", "grpc"];
/// Default `kubernetes.qps`.
pub const DEFAULT_QPS: f64 = 5.0;
/// Default `kubernetes.burst`.
pub const DEFAULT_BURST: u32 = 10;
/// Default `kubernetes.message_refresh`: a gate's message follows its
/// probe's latest run at most this often while its status holds.
pub const DEFAULT_MESSAGE_REFRESH: Duration = Duration::from_secs(60);
/// The shortest `kubernetes.message_refresh`.
pub(crate) const MIN_MESSAGE_REFRESH: Duration = Duration::from_secs(1);
/// Default `kubernetes.node_tenant`.
pub const DEFAULT_NODE_TENANT: &str = "node";
/// Default `kubernetes.node_heartbeat`: node-problem-detector's, and the
/// kubelet's own `nodeStatusReportFrequency`.
pub const DEFAULT_NODE_HEARTBEAT: Duration = Duration::from_secs(300);
/// The shortest `kubernetes.node_heartbeat`.
pub(crate) const MIN_NODE_HEARTBEAT: Duration = Duration::from_secs(10);

/// The agent's Kubernetes settings, defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct GateSettings {
    /// The node whose Pods are checked.
    pub node_name: String,
    /// The plugin allowlist (see [`Allowlist::allows`]): built-in names, plugin
    /// files or directories (ending in `/`) on the agent's disk, registry
    /// scopes (`oci://ghcr.io/acme/*`, `oci://ghcr.io/acme/pg-check`) and
    /// `sha256:` manifest digests. Parsed once, here.
    pub plugins: Allowlist,
    /// Namespace to tenant; others use the tenant of their own name.
    pub namespaces: BTreeMap<String, String>,
    /// Writes per second, agent-wide.
    pub qps: f64,
    /// Writes allowed at once.
    pub burst: u32,
    /// How often gates whose status holds take their probe's latest
    /// message (at most one such write per Pod per period).
    pub message_refresh: Duration,
    /// What SondeNodeChecks need of the agent.
    pub node: NodeSettings,
}

/// The agent's settings for SondeNodeChecks.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSettings {
    /// The node's address (`$(NODE_IP)`), when known.
    pub ip: Option<String>,
    /// The tenant of the node checks' probes.
    pub tenant: String,
    /// How often a holding Node condition is written again.
    pub heartbeat: Duration,
}

impl Default for NodeSettings {
    /// No address, tenant [`DEFAULT_NODE_TENANT`], heartbeat
    /// [`DEFAULT_NODE_HEARTBEAT`].
    fn default() -> Self {
        Self {
            ip: None,
            tenant: DEFAULT_NODE_TENANT.into(),
            heartbeat: DEFAULT_NODE_HEARTBEAT,
        }
    }
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GateSettingsError {
    /// No node name in the config or `$NODE_NAME`.
    #[error(
        "kubernetes: no node name: set NODE_NAME (the downward API's spec.nodeName, see deploy/kubernetes/daemonset.yaml) or kubernetes.node_name"
    )]
    NoNodeName,
    /// An allowlist entry that is none of the forms [`Allowlist::allows`] takes.
    #[error("kubernetes.plugins: {entry:?} {why}")]
    Allowlist {
        /// The entry.
        entry: String,
        /// What is wrong with it.
        why: AllowlistProblem,
    },
    /// `qps` or `burst` is not positive.
    #[error("kubernetes: qps and burst must be positive (qps {qps}, burst {burst})")]
    Rate {
        /// The qps.
        qps: f64,
        /// The burst.
        burst: u32,
    },
    /// `message_refresh` is shorter than 1 s (`MIN_MESSAGE_REFRESH`).
    #[error("kubernetes.message_refresh: {} is shorter than 1s", humantime::format_duration(*.0))]
    MessageRefresh(Duration),
    /// `node_heartbeat` is shorter than 10 s (`MIN_NODE_HEARTBEAT`).
    #[error("kubernetes.node_heartbeat: {} is shorter than 10s", humantime::format_duration(*.0))]
    NodeHeartbeat(Duration),
}

impl GateSettings {
    /// The settings of a `kubernetes:` block (or none: the defaults), with
    /// `env_node` (`$NODE_NAME`) when the block names no node. The node's
    /// address is the block's `node_ip`, else `$NODE_IP`.
    pub fn new(spec: Option<&KubernetesSpec>, env_node: Option<String>) -> Result<Self, GateSettingsError> {
        let node_name = spec
            .and_then(|s| s.node_name.clone())
            .or(env_node)
            .filter(|n| !n.is_empty())
            .ok_or(GateSettingsError::NoNodeName)?;
        let qps = spec.and_then(|s| s.qps).unwrap_or(DEFAULT_QPS);
        let burst = spec.and_then(|s| s.burst).unwrap_or(DEFAULT_BURST);
        if !(qps > 0.0 && qps.is_finite()) || burst == 0 {
            return Err(GateSettingsError::Rate { qps, burst });
        }
        let message_refresh = spec
            .and_then(|s| s.message_refresh)
            .map_or(DEFAULT_MESSAGE_REFRESH, |d| d.0);
        if message_refresh < MIN_MESSAGE_REFRESH {
            return Err(GateSettingsError::MessageRefresh(message_refresh));
        }
        let plugins = spec
            .and_then(|s| s.plugins.clone())
            .unwrap_or_else(|| DEFAULT_PLUGINS.iter().map(|p| p.to_string()).collect());
        let plugins = Allowlist::parse(&plugins)?;
        let heartbeat = spec
            .and_then(|s| s.node_heartbeat)
            .map_or(DEFAULT_NODE_HEARTBEAT, |d| d.0);
        if heartbeat < MIN_NODE_HEARTBEAT {
            return Err(GateSettingsError::NodeHeartbeat(heartbeat));
        }
        let node = NodeSettings {
            ip: sonde_core::catalog::settings::node_ip(spec),
            tenant: spec
                .and_then(|s| s.node_tenant.clone())
                .unwrap_or_else(|| DEFAULT_NODE_TENANT.into()),
            heartbeat,
        };
        Ok(Self {
            node_name,
            plugins,
            namespaces: spec.map(|s| s.namespaces.clone()).unwrap_or_default(),
            qps,
            burst,
            message_refresh,
            node,
        })
    }

    /// The tenant of `namespace`: the mapped one, else the one of its own
    /// name. The operator's tenant (no ceiling) is never implied: a
    /// namespace named `default` maps to it only when listed.
    pub fn tenant_of<'a>(&'a self, namespace: &'a str) -> Option<&'a str> {
        match self.namespaces.get(namespace) {
            Some(t) => Some(t),
            None if namespace == DEFAULT_TENANT => None,
            None => Some(namespace),
        }
    }

    /// Whether the allowlist lets a SondeCheck name `plugin`.
    pub fn allows(&self, plugin: &str) -> bool {
        self.plugins.allows(plugin)
    }
}

/// The `kubernetes.plugins` allowlist, each entry parsed once: built-in
/// names, plugin files or directories (ending in `/`) on the agent's disk,
/// registry scopes (`oci://ghcr.io/acme/*`, `oci://ghcr.io/acme/pg-check`)
/// and `sha256:` manifest digests.
#[derive(Clone, PartialEq)]
pub struct Allowlist(Vec<(String, Allow)>);

impl std::fmt::Debug for Allowlist {
    /// The entries as written.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(text, _)| text)).finish()
    }
}

impl Allowlist {
    /// Parses every entry; the first that cannot be compared safely is
    /// the error, named.
    pub fn parse(entries: &[String]) -> Result<Self, GateSettingsError> {
        let parsed = entries.iter().map(|entry| match allow_entry(entry) {
            Ok(allow) => Ok((entry.clone(), allow)),
            Err(why) => Err(GateSettingsError::Allowlist {
                entry: entry.clone(),
                why,
            }),
        });
        Ok(Self(parsed.collect::<Result<_, _>>()?))
    }

    /// Whether the allowlist lets a SondeCheck name `plugin`. The plugin is
    /// compared in its parsed form, never as text against a prefix: a
    /// registry reference by registry and repository (so `acme/*` does not
    /// cover `acme-evil/x`), a path only when lexically normal (so a
    /// directory entry does not cover `dir/../elsewhere`), a digest only as
    /// the digest a reference is pinned to.
    pub fn allows(&self, plugin: &str) -> bool {
        let entries = self.0.iter().map(|(_, allow)| allow);
        if Reference::is_oci(plugin) {
            let Ok(reference) = Reference::parse(plugin) else {
                return false;
            };
            return entries.into_iter().any(|a| match a {
                Allow::Scope(scope) => scope.covers(&reference),
                Allow::Digest(d) => reference.digest() == Some(d.as_str()),
                Allow::Exact(_) | Allow::Directory(_) => false,
            });
        }
        if plugin.starts_with('/') && !lexically_normal(plugin) {
            return false;
        }
        entries.into_iter().any(|a| match a {
            Allow::Exact(e) => e == plugin,
            Allow::Directory(d) => plugin.starts_with(d.as_str()),
            Allow::Scope(_) | Allow::Digest(_) => false,
        })
    }
}

/// One allowlist entry, parsed.
#[derive(Clone, Debug, PartialEq)]
enum Allow {
    /// A built-in's name, or a plugin file's absolute path: that exactly.
    Exact(String),
    /// A directory (`/opt/sonde/plugins/`): the files under it.
    Directory(String),
    /// A registry scope: the references it covers.
    Scope(RegistryScope),
    /// A manifest digest: any reference pinned to it.
    Digest(String),
}

/// Why an allowlist entry cannot be compared safely.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistProblem {
    /// An `oci://` entry that is not a registry scope.
    #[error("is not a registry scope: {0}")]
    NotAScope(#[source] sonde_oci::OciError),
    /// A `sha256:` entry that is not a whole digest.
    #[error("is not a digest (sha256: and 64 lowercase hex digits)")]
    NotADigest,
    /// An absolute path with `.`, `..` or empty components.
    #[error("must be a normal absolute path (no `.`, `..` or empty components)")]
    NotNormal,
    /// None of the forms.
    #[error("is none of: a built-in's name, an absolute path, oci://HOST/REPOSITORY(/*), sha256:DIGEST")]
    UnknownForm,
}

fn allow_entry(entry: &str) -> Result<Allow, AllowlistProblem> {
    if Reference::is_oci(entry) {
        return RegistryScope::parse(entry)
            .map(Allow::Scope)
            .map_err(AllowlistProblem::NotAScope);
    }
    if let Some(hex) = entry.strip_prefix("sha256:") {
        return if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            Ok(Allow::Digest(entry.to_string()))
        } else {
            Err(AllowlistProblem::NotADigest)
        };
    }
    if entry.starts_with('/') {
        if !lexically_normal(entry.trim_end_matches('/')) {
            return Err(AllowlistProblem::NotNormal);
        }
        return Ok(if entry.ends_with('/') {
            Allow::Directory(entry.to_string())
        } else {
            Allow::Exact(entry.to_string())
        });
    }
    if entry.is_empty() || entry.contains(['/', ':', '@']) {
        return Err(AllowlistProblem::UnknownForm);
    }
    Ok(Allow::Exact(entry.to_string()))
}

/// An absolute path with no `.`, `..` or empty component: what it names
/// does not depend on a prefix test being fooled (`/opt/p/../../etc`).
fn lexically_normal(path: &str) -> bool {
    path.strip_prefix('/')
        .is_some_and(|rest| rest.split('/').all(|c| !c.is_empty() && c != "." && c != ".."))
}
