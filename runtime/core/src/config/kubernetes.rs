//! The `kubernetes:` block: Pod readiness gates and namespace templates.

use super::*;

/// The `kubernetes:` block: how the agent serves Pod readiness gates.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSpec {
    /// `node_name: worker-1` — the node whose Pods are checked; default
    /// `$NODE_NAME` (the downward API's `spec.nodeName`).
    #[serde(default)]
    pub node_name: Option<String>,
    /// `plugins: [http, tcp, "oci://ghcr.io/acme/*"]` — the plugins a
    /// SondeCheck may name: built-in names, absolute paths of plugin files
    /// or of directories (ending in `/`) on the agent's disk, registry
    /// scopes (`oci://HOST/REPOSITORY`, `oci://HOST/PREFIX/*`,
    /// `oci://HOST/*`, as a tenant ceiling's `registries`) and manifest
    /// digests `sha256:…`. Default `[http, tcp, grpc]`.
    #[serde(default)]
    pub plugins: Option<Vec<String>>,
    /// `namespaces: {default: shop}` — namespace to tenant; a namespace not
    /// listed uses the tenant of its own name.
    #[serde(default)]
    pub namespaces: BTreeMap<String, String>,
    /// `qps: 5` — writes to the API server per second, agent-wide. Default 5.
    #[serde(default)]
    pub qps: Option<f64>,
    /// `burst: 10` — writes allowed at once above `qps`. Default 10.
    #[serde(default)]
    pub burst: Option<u32>,
    /// `message_refresh: 1m` (default) — while a gate's status holds, how
    /// often its message is brought up to date with its probe's latest
    /// run: at most one such write per Pod per period, and none while the
    /// message is the same. At least `1s`.
    #[serde(default)]
    pub message_refresh: Option<Dur>,
    /// `namespace_templates: {team: {quotas: {...}, ceiling: {...}}}` —
    /// tenants for namespaces the cluster admin opts in with the label
    /// `sonde.dev/tenant-template: <name>`: each such namespace gets a
    /// tenant of its own name with the template's quotas and ceiling,
    /// unless `tenants:` defines that id or `namespaces` maps the
    /// namespace. A name is a label value (1-63 characters). Default: none
    /// (no Namespace is watched).
    #[serde(default)]
    pub namespace_templates: BTreeMap<String, Spanned<TenantTemplateSpec>>,
    /// `max_templated_namespaces: 1000` (default) — the most tenants the
    /// templates make; namespaces past it (in name order) get none.
    #[serde(default)]
    pub max_templated_namespaces: Option<Spanned<u32>>,
    /// `node_ip: 10.0.0.7` — the node's address, `$(NODE_IP)` in a
    /// SondeNodeCheck's target and config; default `$NODE_IP` (the
    /// downward API's `status.hostIP`).
    #[serde(default)]
    pub node_ip: Option<String>,
    /// `node_tenant: node` (default) — the tenant whose quotas and ceiling
    /// hold SondeNodeChecks' probes; a tenant the config does not define
    /// refuses them all.
    #[serde(default)]
    pub node_tenant: Option<String>,
    /// `node_heartbeat: 5m` (default, node-problem-detector's) — how often
    /// each Node condition a SondeNodeCheck owns is written again while it
    /// holds (its `lastHeartbeatTime`), so a stopped agent shows as a stale
    /// heartbeat. At least `10s`.
    #[serde(default)]
    pub node_heartbeat: Option<Dur>,
}

/// A `kubernetes.namespace_templates` entry: what a `tenants:` entry sets
/// of quotas and ceiling, without an id (the namespace's name is the
/// tenant's) or a token (its probes come only from SondeChecks).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTemplateSpec {
    /// As a tenant's `quotas`.
    #[serde(default)]
    pub quotas: QuotasSpec,
    /// As a tenant's `ceiling`.
    #[serde(default)]
    pub ceiling: CeilingSpec,
}
