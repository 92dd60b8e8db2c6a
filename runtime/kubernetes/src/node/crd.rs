//! The `SondeNodeCheck` custom resource (`sonde.dev/v1alpha1`,
//! cluster-scoped): a check each agent whose node it selects runs against
//! its own node, and the Node condition it owns. Generated into
//! `deploy/kubernetes/crd.yaml` beside the SondeCheck
//! ([`crate::crd_yaml`]). Every string a CEL rule reads has a
//! `maxLength`, so the rules' estimated cost stays within the budget of the
//! oldest supported API server (1.24).

#![allow(
    unreachable_pub,
    reason = "the crate exports these types; the lint misreads them through kube's CustomResource derive"
)]

use crate::crd::{CheckLimits, StatusCondition, any_object, label_selector_schema, one, ten, three};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The kind.
pub const NODE_KIND: &str = "SondeNodeCheck";

/// The field manager of the Node conditions (and taints) the agents write.
pub const NODE_FIELD_MANAGER: &str = "sonde-node";

/// The condition types the kubelet owns on a Node: a SondeNodeCheck may
/// not claim one (nor may a `node_problem_detector:` monitor).
pub use sonde_core::config::KUBELET_CONDITIONS;

/// A check that every agent whose node the `nodeSelector` selects runs
/// against its own node, setting one Node condition (node-problem-detector's
/// convention: `True` means the problem is present).
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "sonde.dev",
    version = "v1alpha1",
    kind = "SondeNodeCheck",
    derive = "PartialEq",
    shortname = "snc",
    category = "sonde",
    doc = "A check that sonde's DaemonSet runs on each node it selects, setting a Node condition (True while the problem is present).",
    status = "SondeNodeCheckStatus",
    printcolumn = r#"{"name": "Condition", "type": "string", "jsonPath": ".spec.condition.type"}"#,
    printcolumn = r#"{"name": "Plugin", "type": "string", "jsonPath": ".spec.plugin"}"#,
    printcolumn = r#"{"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status", "description": "Whether the agents accept the check (the Accepted condition's reason says why not)"}"#,
    printcolumn = r#"{"name": "Reason", "type": "string", "priority": 1, "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name": "Target", "type": "string", "priority": 1, "jsonPath": ".spec.target"}"#,
    printcolumn = r#"{"name": "Taint", "type": "string", "priority": 1, "jsonPath": ".spec.taint.key"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("!has(self.timeoutSeconds) || !has(self.periodSeconds) || self.timeoutSeconds <= self.periodSeconds").message("timeoutSeconds must not exceed periodSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct SondeNodeCheckSpec {
    /// The plugin that runs the check: a built-in name (http, tcp, grpc), a
    /// plugin on the agent's disk, or an oci://registry/repository@sha256:...
    /// reference. The agent's plugin allowlist decides which are allowed.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('oci://') || self.contains('@sha256:')").message("an oci:// plugin is pinned by digest (oci://registry/repository@sha256:...)"))]
    pub plugin: String,
    /// The plugin's config, checked against the plugin's JSON Schema by the
    /// agent; $(NODE_NAME) and $(NODE_IP) in its strings are the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub config: Option<serde_json::Value>,
    /// What the check reaches on the node, host:port, with $(NODE_NAME)
    /// and $(NODE_IP) replaced by the node's name and address (for example
    /// $(NODE_IP):9099). Held to the node tenant's ceiling.
    #[schemars(length(min = 1, max = 512))]
    pub target: String,
    /// Seconds after the agent starts the check before its first run.
    #[serde(default)]
    #[schemars(range(max = 3600), extend("format" = "int32"))]
    pub initial_delay_seconds: u32,
    /// Seconds between runs.
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 3600), extend("format" = "int32"))]
    pub period_seconds: u32,
    /// The deadline of one run, in seconds; at most periodSeconds.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 60), extend("format" = "int32"))]
    pub timeout_seconds: u32,
    /// Passes in a row that clear the condition (set it False).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 100), extend("format" = "int32"))]
    pub success_threshold: u32,
    /// Failures in a row that raise the condition (set it True).
    #[serde(default = "three")]
    #[schemars(range(min = 1, max = 100), extend("format" = "int32"))]
    pub failure_threshold: u32,
    /// Per-run limits, within the node tenant's ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CheckLimits>,
    /// The Nodes that run the check (matchLabels, matchExpressions); unset,
    /// every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "node_selector_schema")]
    pub node_selector: Option<LabelSelector>,
    /// The Node condition the check owns.
    pub condition: NodeConditionSpec,
    /// A taint the agent puts on its Node while the condition is True, and
    /// takes off when it clears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint: Option<TaintSpec>,
}

fn node_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    label_selector_schema("a Node")
}

/// A condition's reason: CamelCase, as `metav1.Condition`'s.
const REASON: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// A qualified name (an optional DNS-subdomain prefix and `/`, then a
/// name), as a condition type and a taint key are.
const QUALIFIED_NAME: &str =
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// The Node condition a SondeNodeCheck owns, in node-problem-detector's
/// convention: status True while the problem is present, False when not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConditionSpec {
    /// The condition's type (for example KernelDeadlock); not one the
    /// kubelet owns (Ready, MemoryPressure, DiskPressure, PIDPressure,
    /// NetworkUnavailable), and owned by one SondeNodeCheck only.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316), regex(pattern = QUALIFIED_NAME))]
    #[x_kube(validation = Rule::new("!(self in ['Ready', 'MemoryPressure', 'DiskPressure', 'PIDPressure', 'NetworkUnavailable'])").message("the kubelet owns the condition types Ready, MemoryPressure, DiskPressure, PIDPressure and NetworkUnavailable"))]
    pub type_: String,
    /// The reason while the problem is present (status True).
    #[serde(default = "problem_reason")]
    #[schemars(length(min = 1, max = 128), regex(pattern = REASON))]
    pub problem_reason: String,
    /// The reason while it is not (status False).
    #[serde(default = "ok_reason")]
    #[schemars(length(min = 1, max = 128), regex(pattern = REASON))]
    pub ok_reason: String,
}

fn problem_reason() -> String {
    "CheckFailed".into()
}
fn ok_reason() -> String {
    "CheckPassed".into()
}

/// A taint on the Node while its condition is True.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct TaintSpec {
    /// The taint's key; not in Kubernetes' own domains (kubernetes.io,
    /// k8s.io), whose taints its controllers own.
    #[schemars(length(min = 1, max = 316), regex(pattern = QUALIFIED_NAME))]
    #[x_kube(validation = Rule::new("!self.contains('kubernetes.io/') && !self.contains('k8s.io/')").message("taint keys in the kubernetes.io and k8s.io domains belong to Kubernetes"))]
    pub key: String,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: TaintEffect,
}

/// A taint's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum TaintEffect {
    /// No new Pod is scheduled on the node unless it tolerates the taint.
    NoSchedule,
    /// The scheduler avoids the node.
    PreferNoSchedule,
    /// Pods that do not tolerate it are evicted too.
    NoExecute,
}

impl TaintEffect {
    /// As Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// Whether the agents accept a SondeNodeCheck (its `status`), written by
/// the one agent that holds the Lease `sonde-status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SondeNodeCheckStatus {
    /// The metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accepted: whether the agents accept the check (allowlist, condition
    /// type, node tenant's ceiling, plugin schema), and if not, why.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<StatusCondition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_node_check_with_its_defaults() {
        let c: SondeNodeCheck = serde_json::from_value(serde_json::json!({
            "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheck",
            "metadata": {"name": "calico-felix"},
            "spec": {"plugin": "http", "target": "$(NODE_IP):9099",
                     "condition": {"type": "CalicoUnhealthy"},
                     "taint": {"key": "sonde.dev/calico", "effect": "NoSchedule"}}
        }))
        .unwrap();
        assert_eq!(c.spec.condition.problem_reason, "CheckFailed");
        assert_eq!(c.spec.condition.ok_reason, "CheckPassed");
        assert_eq!((c.spec.period_seconds, c.spec.failure_threshold), (10, 3));
        assert_eq!(c.spec.taint.unwrap().effect, TaintEffect::NoSchedule);
        assert_eq!(
            <SondeNodeCheck as kube::Resource>::url_path(&(), None),
            "/apis/sonde.dev/v1alpha1/sondenodechecks",
            "cluster-scoped"
        );
    }
}
