//! The `sandbox:` block: what one call may make the host hold.

use super::*;

/// `sandbox:` — the agent-wide bounds on what plugins can make the host
/// hold (`docs/security.md`, "Bounds"). Each key is optional:
///
/// ```yaml
/// sandbox:
///   table_entries_per_call: 256     # resource-table entries per call (64..65536)
///   fields_bytes: 16KiB             # one wasi:http fields (1KiB..1MiB); entries × this
///                                   # is the host memory a call may pin (≤ 256MiB)
///   argument_bytes: 4MiB            # what one host call copies out of the guest (64KiB..64MiB)
///   sockets_per_call: 64            # sockets the host opens for one call
///   lookups_per_call: 4             # wasi:sockets name lookups in flight per call
///   lookups_in_flight: 32           # name lookups for plugins, agent-wide
///   blocking_threads: 64            # blocking threads plugin work may hold (≤ 384)
///   exec_pids: 64                   # pids.max of an exec'd program's cgroup
///   keepalive_idle_per_host: 32     # idle pooled connections per tenant + address
///   keepalive_idle_per_tenant: 64   # per tenant
///   keepalive_idle: 1024            # agent-wide
/// ```
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// `table_entries_per_call: 256`.
    #[serde(default)]
    pub table_entries_per_call: Option<u32>,
    /// `fields_bytes: 16KiB`.
    #[serde(default)]
    pub fields_bytes: Option<Size>,
    /// `argument_bytes: 4MiB`.
    #[serde(default)]
    pub argument_bytes: Option<Size>,
    /// `sockets_per_call: 64`.
    #[serde(default)]
    pub sockets_per_call: Option<u32>,
    /// `lookups_per_call: 4`.
    #[serde(default)]
    pub lookups_per_call: Option<u32>,
    /// `lookups_in_flight: 32`.
    #[serde(default)]
    pub lookups_in_flight: Option<u32>,
    /// `blocking_threads: 64`.
    #[serde(default)]
    pub blocking_threads: Option<u32>,
    /// `exec_pids: 64`.
    #[serde(default)]
    pub exec_pids: Option<u32>,
    /// `keepalive_idle_per_host: 32`.
    #[serde(default)]
    pub keepalive_idle_per_host: Option<u32>,
    /// `keepalive_idle_per_tenant: 64`.
    #[serde(default)]
    pub keepalive_idle_per_tenant: Option<u32>,
    /// `keepalive_idle: 1024`.
    #[serde(default)]
    pub keepalive_idle: Option<u32>,
}
