//! A Pod as the controller sees it ([`PodView`]) and a gate's condition
//! on it ([`Cond`]).

use crate::crd::GATE_PREFIX;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sonde_core::thresholds::Counter;
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The per-Pod override annotations a Pod may set, as
/// `sonde.dev/<check-name>.<field>`.
pub(crate) const OVERRIDABLE: &[&str] = &["port"];
/// The longest condition message written (the API server takes more; a
/// readiness gate's message is for humans reading `kubectl describe`).
pub(crate) const MAX_MESSAGE: usize = 256;

/// A Pod by namespace and name.
pub(crate) type PodKey = (String, String);

/// What the controller needs of a Pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PodView {
    /// Namespace and name.
    pub key: PodKey,
    /// Its UID: the precondition of every write.
    pub uid: String,
    /// Every address in `status.podIPs` (or `status.podIP`), primary first.
    pub ips: Vec<IpAddr>,
    /// Named container ports.
    pub ports: BTreeMap<String, u16>,
    /// The SondeChecks its readiness gates name.
    pub gates: BTreeSet<String>,
    /// Its `sonde.dev/` annotations.
    pub annotations: BTreeMap<String, String>,
    /// Its conditions of type `sonde.dev/…`, by type.
    pub conditions: BTreeMap<String, Cond>,
    /// Whether it is going away (deleting, or its containers are done).
    pub gone: bool,
}

impl PodView {
    /// The view of `pod`; `None` without a namespace, name or UID.
    pub(crate) fn of(pod: &Pod) -> Option<Self> {
        let meta = &pod.metadata;
        let key = (meta.namespace.clone()?, meta.name.clone()?);
        let uid = meta.uid.clone()?;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().filter_map(|i| i.ip.parse().ok()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.as_ref()).and_then(|i| i.parse().ok())
        {
            ips.push(ip);
        }
        let ports = spec
            .map(|s| {
                s.containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
                    .collect()
            })
            .unwrap_or_default();
        let gates = spec
            .and_then(|s| s.readiness_gates.as_ref())
            .map(|g| {
                g.iter()
                    .filter_map(|g| g.condition_type.strip_prefix(GATE_PREFIX))
                    .filter(|n| !n.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let annotations = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| k.starts_with(GATE_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let conditions = status
            .and_then(|s| s.conditions.as_ref())
            .map(|c| {
                c.iter()
                    .filter(|c| c.type_.starts_with(GATE_PREFIX))
                    .map(|c| {
                        (
                            c.type_.clone(),
                            Cond {
                                status: CondStatus::parse(&c.status),
                                reason: c.reason.clone().unwrap_or_default(),
                                message: c.message.clone().unwrap_or_default(),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let phase = status.and_then(|s| s.phase.as_deref());
        let gone = meta.deletion_timestamp.is_some() || matches!(phase, Some("Succeeded" | "Failed"));
        Some(Self {
            key,
            uid,
            ips,
            ports,
            gates,
            annotations,
            conditions,
            gone,
        })
    }

    /// The `sonde.dev/<check>.<field>` annotations of `check` that are not
    /// overridable fields.
    pub(crate) fn unknown_overrides(&self, check: &str) -> Vec<String> {
        let prefix = format!("{GATE_PREFIX}{check}.");
        self.annotations
            .keys()
            .filter(|k| k.strip_prefix(&prefix).is_some_and(|f| !OVERRIDABLE.contains(&f)))
            .cloned()
            .collect()
    }
}

/// A condition's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CondStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl CondStatus {
    fn parse(s: &str) -> Self {
        match s {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }

    /// As the API writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

/// What sonde writes of a gate's condition; a write happens only when it
/// differs from what the Pod has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Cond {
    /// True, False or Unknown.
    pub status: CondStatus,
    /// `CheckPassed`, `CheckFailed`, `CheckTimeout` or `CheckUnavailable`.
    pub reason: String,
    /// A short message from the outcome.
    pub message: String,
}

impl Cond {
    /// The condition for a probe state, from the run that set it.
    pub(crate) fn of_state(state: Status, timed_out: bool, message: &str) -> Self {
        let (status, reason) = match state {
            Status::Success | Status::Warning => (CondStatus::True, "CheckPassed"),
            Status::Failure if timed_out => (CondStatus::False, "CheckTimeout"),
            Status::Failure => (CondStatus::False, "CheckFailed"),
            Status::Unknown => (CondStatus::Unknown, "CheckUnavailable"),
        };
        Self {
            status,
            reason: reason.into(),
            message: short(message),
        }
    }

    /// The condition for a probe state with the message of its latest
    /// run, when that run agrees with the state (a passing run while the
    /// probe passes, a failing one while it fails): how a gate's message
    /// follows the latest reason while its status holds. `None` when the
    /// run disagrees (a failure still under the threshold would explain a
    /// passing gate with a failure) or says nothing (an unknown state).
    pub(crate) fn latest(state: Status, run: &RunResult) -> Option<Self> {
        let cond = Self::of_state(state, run.reason == Some(Reason::Timeout), &run.message);
        let agrees = Self::of_state(run.status, false, "").status == cond.status;
        (agrees && cond.status != CondStatus::Unknown).then_some(cond)
    }

    /// `Unknown`/`CheckUnavailable`: nothing can be said about the Pod.
    pub(crate) fn unavailable(message: &str) -> Self {
        Self {
            status: CondStatus::Unknown,
            reason: "CheckUnavailable".into(),
            message: short(message),
        }
    }

    /// The probe state a condition already on the Pod seeds: the agent
    /// writes nothing until a threshold is crossed again.
    pub(crate) fn seed(cond: Option<&Cond>) -> Counter {
        let state = match cond.map(|c| c.status) {
            Some(CondStatus::True) => Status::Success,
            Some(CondStatus::False) => Status::Failure,
            _ => Status::Unknown,
        };
        Counter {
            state,
            consecutive: 0,
            last_pass: None,
        }
    }
}

/// `message`, trimmed, cut to [`MAX_MESSAGE`] bytes.
fn short(message: &str) -> String {
    cut(message.trim(), MAX_MESSAGE)
}

/// `text` cut to at most `max` bytes (`max` > 3) on a char boundary,
/// ending in `...` when cut.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The condition type of a gate on check `check`.
pub(crate) fn condition_type(check: &str) -> String {
    format!("{GATE_PREFIX}{check}")
}

/// Keeps only what the controller reads of a Pod, so the store holds no
/// more than that: its name, namespace, UID, resource version, deletion
/// time and `sonde.dev/` annotations; its node, readiness gates and named
/// container ports; its phase, IPs and `sonde.dev/` conditions.
pub(crate) fn trim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with(GATE_PREFIX))
        .collect();
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        readiness_gates: spec.readiness_gates,
        containers: spec
            .containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                ports: c.ports.map(|ports| {
                    ports
                        .into_iter()
                        .filter(|p| p.name.is_some())
                        .map(|p| ContainerPort {
                            name: p.name,
                            container_port: p.container_port,
                            ..ContainerPort::default()
                        })
                        .collect()
                }),
                ..Container::default()
            })
            .collect(),
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        pod_ip: status.pod_ip,
        pod_ips: status.pod_ips,
        conditions: status.conditions.map(|c| {
            c.into_iter()
                .filter(|c: &PodCondition| c.type_.starts_with(GATE_PREFIX))
                .collect()
        }),
        ..PodStatus::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store keeps only what the controller reads, and the view of a
    /// trimmed Pod is the view of the whole one.
    #[test]
    fn a_trimmed_pod_keeps_its_view_and_nothing_else() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web-1", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "web"},
                         "annotations": {"sonde.dev/ready.port": "9090", "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(10_000)},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "node-1", "readinessGates": [{"conditionType": "sonde.dev/ready"}],
                     "volumes": [{"name": "v", "emptyDir": {}}],
                     "containers": [{"name": "app", "image": "app", "env": [{"name": "SECRET", "value": "s"}],
                                     "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9000}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}],
                       "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": true, "restartCount": 0}],
                       "conditions": [{"type": "sonde.dev/ready", "status": "True"}, {"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let before = PodView::of(&pod).unwrap();
        let size = serde_json::to_string(&pod).unwrap().len();
        trim_pod(&mut pod);
        assert_eq!(PodView::of(&pod).unwrap(), before);
        let kept = serde_json::to_value(&pod).unwrap();
        assert!(kept.to_string().len() < size / 10, "{kept}");
        assert_eq!(
            kept["metadata"]["annotations"],
            serde_json::json!({"sonde.dev/ready.port": "9090"})
        );
        assert!(kept["metadata"].get("labels").is_none() && kept["metadata"].get("managedFields").is_none());
        assert!(kept["spec"].get("volumes").is_none() && kept["spec"]["containers"][0].get("env").is_none());
        assert!(kept["status"].get("containerStatuses").is_none());
        assert_eq!(kept["status"]["conditions"].as_array().unwrap().len(), 1);
        assert_eq!(
            kept["metadata"]["resourceVersion"], "7",
            "the reflector resumes its watch from it"
        );
    }
}
