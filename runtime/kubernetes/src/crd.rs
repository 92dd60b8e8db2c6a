//! The `SondeCheck` custom resource (`sonde.dev/v1alpha1`, namespaced).
//! The Rust type is the source of truth: `#[derive(CustomResource)]` gives
//! it its `kube::Resource` and its CRD, from which
//! `deploy/kubernetes/crd.yaml` is generated ([`crate::crd_yaml`]; a test fails
//! when the shipped file and the type disagree, see docs/kubernetes.md).
//! Field names follow the kubelet's probe spec; the doc comments of the
//! spec's fields are the descriptions `kubectl explain` shows. Unsigned
//! fields are declared with the formats Kubernetes knows (`int32`,
//! `int64`, with their `minimum`): schemars' `uint32` and `uint64` make
//! kube-apiserver 1.37 warn on every apply of the CRD.

// These docs are also the CRD's descriptions (`kubectl explain`), where
// `<check-name>` is a placeholder, not an HTML tag.
#![allow(
    rustdoc::invalid_html_tags,
    reason = "the docs are the CRD's descriptions, read as plain text"
)]
#![allow(
    unreachable_pub,
    reason = "the crate exports these types; the lint misreads them through kube's CustomResource derive"
)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "sonde.dev";
/// The API version within the group.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "SondeCheck";
/// The prefix of a readiness gate's condition type that names a
/// SondeCheck: `sonde.dev/<check-name>`.
pub const GATE_PREFIX: &str = "sonde.dev/";

/// The field manager of the gate conditions the agents write on Pods
/// (`managedFields` shows it owning its conditions only).
pub const GATE_FIELD_MANAGER: &str = "sonde";

/// The field manager of the SondeChecks' statuses and of the Lease that
/// elects their writer.
pub const STATUS_FIELD_MANAGER: &str = "sonde-status";

/// What the check runs against each Pod that names it in a readiness gate
/// sonde.dev/<check-name> (the resource is `SondeCheck`).
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "sonde.dev",
    version = "v1alpha1",
    kind = "SondeCheck",
    namespaced,
    derive = "PartialEq",
    shortname = "sck",
    category = "sonde",
    doc = "A check that sonde's DaemonSet runs against each Pod that names it in a readiness gate sonde.dev/<check-name>.",
    status = "SondeCheckStatus",
    printcolumn = r#"{"name": "Plugin", "type": "string", "jsonPath": ".spec.plugin"}"#,
    printcolumn = r#"{"name": "Mode", "type": "string", "jsonPath": ".spec.mode"}"#,
    printcolumn = r#"{"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status", "description": "Whether the agents accept the check (the Accepted condition's reason says why not)"}"#,
    printcolumn = r#"{"name": "Ready", "type": "integer", "jsonPath": ".status.podsReady", "description": "Pods whose gate on the check is True"}"#,
    printcolumn = r#"{"name": "NotReady", "type": "integer", "jsonPath": ".status.podsNotReady", "description": "Pods whose gate on the check is False"}"#,
    printcolumn = r#"{"name": "Unknown", "type": "integer", "jsonPath": ".status.podsUnknown", "description": "Pods whose gate on the check is Unknown or not written yet"}"#,
    printcolumn = r#"{"name": "Reason", "type": "string", "priority": 1, "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name": "Port", "type": "string", "priority": 1, "jsonPath": ".spec.port"}"#,
    printcolumn = r#"{"name": "Service", "type": "string", "priority": 1, "jsonPath": ".spec.service.name"}"#,
    printcolumn = r#"{"name": "Period", "type": "integer", "priority": 1, "jsonPath": ".spec.periodSeconds"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
// Not `has(self.port) != has(self.service)`: Kubernetes 1.24's CEL cost
// estimate for that comparison put the CRD over its budget.
#[x_kube(validation = Rule::new("has(self.port) ? !has(self.service) : has(self.service)").message("set exactly one of port (the Pod's port) and service (a Service of the Pod's namespace)"))]
#[x_kube(validation = Rule::new("!has(self.timeoutSeconds) || !has(self.periodSeconds) || self.timeoutSeconds <= self.periodSeconds").message("timeoutSeconds must not exceed periodSeconds"))]
#[serde(rename_all = "camelCase")]
pub struct SondeCheckSpec {
    /// The plugin that runs the check: a built-in name (http, tcp, grpc), a
    /// plugin on the agent's disk, or an oci://registry/repository@sha256:...
    /// reference. The agent's plugin allowlist decides which a namespace may use.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("!self.startsWith('oci://') || self.contains('@sha256:')").message("an oci:// plugin is pinned by digest (oci://registry/repository@sha256:...)"))]
    pub plugin: String,
    /// The plugin's config, checked against the plugin's JSON Schema by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub config: Option<serde_json::Value>,
    /// The Pod's port to check: a number, or the name of one of its
    /// containers' ports. A Pod may override it with the annotation
    /// sonde.dev/<check-name>.port. Exactly one of port and service is set.
    // A structural schema allows no `type` inside anyOf, and numeric bounds
    // do not apply to strings: the name's length and form are OpenAPI's
    // `maxLength` and `pattern` (which apply to strings only), the number's
    // range is CEL's. No CEL string function here: the API server costs an
    // int-or-string at the largest request whatever its `maxLength`, and a
    // `matches` on it put the CRD 100 times over its CEL budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxLength" = 15, "pattern" = PORT_NAME))]
    #[x_kube(validation = Rule::new("type(self) != int || (self >= 1 && self <= 65535)").message("port is a number 1-65535 or a container port's name (IANA_SVC_NAME, at most 15 characters)"))]
    pub port: Option<IntOrString>,
    /// Check through a Service of the Pod's namespace instead of at the
    /// Pod: the agent dials the Service's ClusterIP and port, so the answer
    /// comes from whichever Pod the cluster routes the connection to (use
    /// the http plugin's backend check to require this Pod). Exactly one of
    /// port and service is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// Seconds after the Pod is seen with an IP before the first run.
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
    /// Passes in a row that set the condition True. Unlike a kubelet
    /// liveness probe, any value is allowed.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 100), extend("format" = "int32"))]
    pub success_threshold: u32,
    /// Failures in a row that set the condition False.
    #[serde(default = "three")]
    #[schemars(range(min = 1, max = 100), extend("format" = "int32"))]
    pub failure_threshold: u32,
    /// Continuous keeps checking and follows the result. StartupOnly sets
    /// the condition True once and then stops checking that Pod.
    #[serde(default)]
    pub mode: Mode,
    /// Per-run limits, within the namespace's tenant ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CheckLimits>,
    /// The Pods of the check's namespace that get its readiness gate
    /// sonde.dev/<check-name> when they are created, from the shipped
    /// MutatingAdmissionPolicy (deploy/kubernetes/gate-injection.yaml), in
    /// namespaces labelled sonde.dev/readiness-gates=inject. A Kubernetes
    /// label selector (matchLabels, matchExpressions); unset, no Pod gets
    /// the gate but by its own template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "pod_selector_schema")]
    pub pod_selector: Option<LabelSelector>,
    /// Secrets of the check's namespace the plugin may use without seeing
    /// them: each entry names a key of a Secret, and the plugin's config
    /// writes $(secret:<name>) where the value goes (a header, a
    /// password); the agent puts the value on the wire toward the Pod (or
    /// the Service) checked, and only there. The agent reads a Secret only
    /// where the namespace's owner bound the ClusterRole
    /// sonde-secret-reader to its ServiceAccount (a RoleBinding in the
    /// namespace). While a Secret or key is missing or unreadable the gate
    /// is Unknown, with an Event on the check naming it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub secret_refs: Vec<SecretRef>,
}

/// The most `secretRefs` of one check.
pub const MAX_SECRET_REFS: usize = 8;

/// A secret's handle name (`sonde_policy::secrets::valid_name`).
pub(crate) const SECRET_HANDLE: &str = "^[a-z0-9][-a-z0-9_.]{0,62}$";
/// A Secret's name: a DNS subdomain.
pub(crate) const SECRET_NAME: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A key of a Secret's data.
pub(crate) const SECRET_KEY: &str = "^[-._a-zA-Z0-9]+$";

/// A key of a Secret of the check's namespace, and the name the plugin's
/// config calls it by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// The name the plugin's config uses, as $(secret:<name>): 1 to 63 of
    /// a-z, 0-9, '-', '_' and '.', starting with a letter or digit.
    #[schemars(length(min = 1, max = 63), regex(pattern = SECRET_HANDLE))]
    pub name: String,
    /// The Secret, in the check's own namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_NAME))]
    pub secret_name: String,
    /// The key of the Secret's data whose value is the secret (8 bytes to
    /// 64 KiB; a trailing newline is not part of it).
    #[schemars(length(min = 1, max = 253), regex(pattern = SECRET_KEY))]
    pub key: String,
}

/// A port's name (a DNS label: IANA_SVC_NAME for a container's, the
/// Service's own for a Service's).
const PORT_NAME: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

pub(crate) fn one() -> u32 {
    1
}
pub(crate) fn three() -> u32 {
    3
}
pub(crate) fn ten() -> u32 {
    10
}

impl Default for SondeCheckSpec {
    /// A spec with every documented default and no plugin or port.
    fn default() -> Self {
        Self {
            plugin: String::new(),
            config: None,
            port: None,
            service: None,
            initial_delay_seconds: 0,
            period_seconds: ten(),
            timeout_seconds: one(),
            success_threshold: one(),
            failure_threshold: three(),
            mode: Mode::default(),
            limits: None,
            pod_selector: None,
            secret_refs: Vec::new(),
        }
    }
}

/// The schema of `config`: any JSON object, kept as written.
pub(crate) fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The operators of a label selector's `matchExpressions`.
pub const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// The schema of `podSelector`: Kubernetes' LabelSelector, with its
/// operators listed (an `enum`, checked by the API server without CEL).
fn pod_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    label_selector_schema("a Pod")
}

/// The schema of a label selector of `whom` ("a Pod", "a Node"):
/// Kubernetes' LabelSelector, with its operators listed.
pub(crate) fn label_selector_schema(whom: &str) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": {
            "matchLabels": {
                "description": format!("Labels {whom} must carry, each with this value."),
                "type": "object",
                "additionalProperties": {"type": "string"},
            },
            "matchExpressions": {
                "description": format!("Requirements {whom}'s labels must all meet."),
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"description": "The label's key.", "type": "string"},
                        "operator": {
                            "description": "In and NotIn take values; Exists and DoesNotExist take none.",
                            "type": "string",
                            "enum": SELECTOR_OPERATORS,
                        },
                        "values": {
                            "description": "The values of In and NotIn.",
                            "type": "array",
                            "items": {"type": "string"},
                        },
                    },
                },
            },
        },
    })
}

/// Why a `podSelector` is malformed ([`check_selector`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `In` or `NotIn` without values.
    #[error("podSelector: matchExpressions key {key:?}: operator {operator} needs values")]
    ValuesMissing {
        /// The expression's key.
        key: String,
        /// Its operator.
        operator: String,
    },
    /// `Exists` or `DoesNotExist` with values.
    #[error("podSelector: matchExpressions key {key:?}: operator {operator} takes no values")]
    ValuesNotAllowed {
        /// The expression's key.
        key: String,
        /// Its operator.
        operator: String,
    },
    /// An operator Kubernetes does not have.
    #[error(
        "podSelector: matchExpressions key {key:?}: unknown operator {operator:?} (In, NotIn, Exists, DoesNotExist)"
    )]
    UnknownOperator {
        /// The expression's key.
        key: String,
        /// Its operator.
        operator: String,
    },
}

/// Checks `selector`'s expressions as Kubernetes does: In and NotIn have
/// values, Exists and DoesNotExist have none, no other operator.
pub fn check_selector(selector: &LabelSelector) -> Result<(), SelectorError> {
    for e in selector.match_expressions.iter().flatten() {
        let has_values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        let (key, operator) = (e.key.clone(), e.operator.clone());
        match e.operator.as_str() {
            "In" | "NotIn" if !has_values => return Err(SelectorError::ValuesMissing { key, operator }),
            "Exists" | "DoesNotExist" if has_values => {
                return Err(SelectorError::ValuesNotAllowed { key, operator });
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            _ => return Err(SelectorError::UnknownOperator { key, operator }),
        }
    }
    Ok(())
}

/// A Service of the Pod's namespace, and one of its ports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct ServiceRef {
    /// The Service's name.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The Service's port: its number, or its name in the Service's ports.
    // Checked as [`SondeCheckSpec::port`] is, for the same reason.
    #[schemars(extend("maxLength" = 63, "pattern" = PORT_NAME))]
    #[x_kube(validation = Rule::new("type(self) != int || (self >= 1 && self <= 65535)").message("port is a number 1-65535 or the name of one of the Service's ports"))]
    pub port: IntOrString,
}

/// How long a check keeps running against a Pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Mode {
    /// Keep checking; the condition follows the result.
    #[default]
    Continuous,
    /// Set the condition True once, then stop checking that Pod.
    StartupOnly,
}

/// Per-run limits of a [`SondeCheck`], within its tenant's ceiling.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CheckLimits {
    /// Fuel per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1), extend("format" = "int64"))]
    pub fuel: Option<u64>,
    /// A size such as 16MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?\s*([KMG]i?B|B)?$"))]
    pub memory: Option<String>,
}

/// How a SondeCheck is doing (its `status` subresource), written by the
/// one agent that holds the Lease `sonde-status` (docs/kubernetes.md, "Is
/// my check working?").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SondeCheckStatus {
    /// The metadata.generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accepted: whether the agents accept the check (allowlist, tenant,
    /// ceiling, plugin schema), and if not, why.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<StatusCondition>,
    /// Pods whose readiness gate on the check is True.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub pods_ready: u32,
    /// Pods whose readiness gate on the check is False.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub pods_not_ready: u32,
    /// Pods whose readiness gate on the check is Unknown or not written yet.
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub pods_unknown: u32,
}

/// A condition of a SondeCheck's status, shaped like Kubernetes'
/// `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusCondition {
    /// The condition's type (Accepted).
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Why, in CamelCase (PluginNotAllowed, OutsideCeiling, ...).
    pub reason: String,
    /// Why, for people.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
    /// The metadata.generation it was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integer of both CRDs has a format Kubernetes knows: an
    /// unknown one (schemars' `uint32`) is warned about on every apply.
    #[test]
    fn the_crds_use_only_integer_formats_kubernetes_knows() {
        let yaml = crate::crd_yaml();
        let formats: std::collections::BTreeSet<&str> =
            yaml.lines().filter_map(|l| l.trim().strip_prefix("format: ")).collect();
        assert!(!formats.is_empty());
        for f in formats {
            assert!(["int32", "int64", "date-time"].contains(&f), "format {f} in:\n{yaml}");
        }
    }

    #[test]
    fn reads_the_crd_example() {
        let c: SondeCheck = serde_json::from_value(serde_json::json!({
            "apiVersion": "sonde.dev/v1alpha1",
            "kind": "SondeCheck",
            "metadata": {"name": "web-ready", "namespace": "shop"},
            "spec": {"plugin": "http", "config": {"path": "/ready"}, "port": "http",
                     "periodSeconds": 5, "mode": "StartupOnly", "limits": {"fuel": 1000}}
        }))
        .unwrap();
        assert_eq!(c.spec.port, Some(IntOrString::String("http".into())));
        assert_eq!(c.spec.period_seconds, 5);
        assert_eq!(
            (c.spec.timeout_seconds, c.spec.failure_threshold),
            (1, 3),
            "the defaults"
        );
        assert_eq!(c.spec.mode, Mode::StartupOnly);
        assert_eq!(c.spec.pod_selector, None, "no podSelector unless written");
        assert_eq!(
            <SondeCheck as kube::Resource>::url_path(&(), Some("shop")),
            "/apis/sonde.dev/v1alpha1/namespaces/shop/sondechecks"
        );
        let sent = serde_json::to_value(&c).unwrap();
        assert_eq!(
            (&sent["apiVersion"], &sent["kind"]),
            (
                &serde_json::json!("sonde.dev/v1alpha1"),
                &serde_json::json!("SondeCheck")
            ),
            "what the API server requires of an object it is sent"
        );
    }

    #[test]
    fn reads_a_pod_selector_and_refuses_malformed_expressions() {
        let spec: SondeCheckSpec = serde_json::from_value(serde_json::json!({
            "plugin": "http", "port": 80,
            "podSelector": {"matchLabels": {"app": "web"},
                            "matchExpressions": [{"key": "track", "operator": "In", "values": ["canary"]},
                                                 {"key": "legacy", "operator": "DoesNotExist"}]}
        }))
        .unwrap();
        let selector = spec.pod_selector.clone().expect("the podSelector");
        assert_eq!(selector.match_labels.unwrap()["app"], "web");
        assert_eq!(check_selector(spec.pod_selector.as_ref().unwrap()), Ok(()));
        let sent = serde_json::to_value(&spec).unwrap();
        assert_eq!(sent["podSelector"]["matchExpressions"][1]["operator"], "DoesNotExist");

        let bad = |operator: &str, values: Option<Vec<&str>>| {
            let e = serde_json::json!({"matchExpressions": [{"key": "k", "operator": operator, "values": values}]});
            check_selector(&serde_json::from_value(e).unwrap()).unwrap_err()
        };
        assert!(matches!(bad("In", None), SelectorError::ValuesMissing { .. }));
        assert!(matches!(
            bad("NotIn", Some(vec![])),
            SelectorError::ValuesMissing { .. }
        ));
        assert!(matches!(
            bad("Exists", Some(vec!["x"])),
            SelectorError::ValuesNotAllowed { .. }
        ));
        let unknown = bad("Matches", Some(vec!["x"]));
        assert!(matches!(unknown, SelectorError::UnknownOperator { .. }));
        assert!(unknown.to_string().contains("\"Matches\""), "{unknown}");
    }
}
