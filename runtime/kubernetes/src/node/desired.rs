//! What a SondeNodeCheck asks of one node's agent, as pure functions:
//! whether its `nodeSelector` selects the node ([`selects`]), whether the
//! check may be applied at all ([`refusal`]: the allowlist, the kubelet's
//! condition types, one check per condition type), and the probe it maps
//! to on this node ([`node_probe`]), `$(NODE_NAME)` and `$(NODE_IP)`
//! expanded, in the node tenant.

use super::crd::{KUBELET_CONDITIONS, NodeConditionSpec, SondeNodeCheck, TaintSpec};
use crate::crd::check_selector;
use crate::desired::bounded_name;
use crate::expand::{expand_str, expand_with};
use crate::settings::GateSettings;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use sonde_core::tenants::DEFAULT_TENANT;
use std::collections::BTreeMap;

/// What a node check may know of its node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeIdentity<'a> {
    /// The Node's name.
    pub(crate) name: &'a str,
    /// Its address, when the agent knows it.
    pub(crate) ip: Option<&'a str>,
}

impl NodeIdentity<'_> {
    fn var(&self, name: &str) -> Option<&str> {
        match name {
            "NODE_NAME" => Some(self.name),
            "NODE_IP" => self.ip,
            _ => None,
        }
    }
}

/// Why a SondeNodeCheck is not applied. Each message names the field and
/// its value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NodeRefusal {
    /// The plugin is not on the allowlist.
    #[error("spec.plugin {plugin:?} is not on the agent's allowlist (kubernetes.plugins)")]
    PluginNotAllowed { plugin: String },
    /// The condition type is the kubelet's.
    #[error(
        "spec.condition.type {type_:?} is owned by the kubelet (Ready, MemoryPressure, DiskPressure, PIDPressure, NetworkUnavailable)"
    )]
    KubeletCondition { type_: String },
    /// More than one check claims the condition type: all are refused.
    #[error("spec.condition.type {type_:?} is claimed by more than one SondeNodeCheck: {}", .checks.join(", "))]
    ConditionClaimed { type_: String, checks: Vec<String> },
    /// A malformed `nodeSelector`.
    #[error("spec.nodeSelector: {0}")]
    InvalidNodeSelector(String),
    /// The agent's config has no tenant `kubernetes.node_tenant`.
    #[error(
        "the agents' kubernetes.node_tenant {tenant:?} is not a tenant of their config: node checks run in it (docs/kubernetes.md, \"Node conditions\")"
    )]
    NoTenant { tenant: String },
    /// The target names `$(NODE_IP)` and the agent does not know it.
    #[error(
        "spec.target {target:?}: the agent does not know its node's address (NODE_IP from the downward API's status.hostIP, or kubernetes.node_ip)"
    )]
    NoNodeIp { target: String },
}

impl NodeRefusal {
    /// The `Accepted` condition's reason.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::PluginNotAllowed { .. } => "PluginNotAllowed",
            Self::KubeletCondition { .. } => "KubeletCondition",
            Self::ConditionClaimed { .. } => "ConditionClaimed",
            Self::InvalidNodeSelector(_) => "InvalidNodeSelector",
            Self::NoNodeIp { .. } => "NoNodeIP",
            Self::NoTenant { .. } => "NoTenant",
        }
    }
}

/// The SondeNodeChecks claiming each condition type, names sorted.
pub(crate) fn claims<'a>(checks: impl IntoIterator<Item = &'a SondeNodeCheck>) -> BTreeMap<String, Vec<String>> {
    let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in checks {
        claims
            .entry(c.spec.condition.type_.clone())
            .or_default()
            .push(c.name_any());
    }
    for names in claims.values_mut() {
        names.sort();
    }
    claims
}

/// Why `check` is refused on every node alike (`claims` from [`claims`]),
/// or `Ok` when it is not.
pub(crate) fn refusal(
    check: &SondeNodeCheck,
    settings: &GateSettings,
    claims: &BTreeMap<String, Vec<String>>,
) -> Result<(), NodeRefusal> {
    let spec = &check.spec;
    if !settings.allows(&spec.plugin) {
        return Err(NodeRefusal::PluginNotAllowed {
            plugin: spec.plugin.clone(),
        });
    }
    let type_ = &spec.condition.type_;
    if KUBELET_CONDITIONS.contains(&type_.as_str()) {
        return Err(NodeRefusal::KubeletCondition { type_: type_.clone() });
    }
    if let Some(names) = claims.get(type_).filter(|n| n.len() > 1) {
        return Err(NodeRefusal::ConditionClaimed {
            type_: type_.clone(),
            checks: names.clone(),
        });
    }
    if let Some(selector) = &spec.node_selector {
        check_selector(selector).map_err(|e| NodeRefusal::InvalidNodeSelector(e.to_string()))?;
    }
    Ok(())
}

/// Whether `selector` (none: every node) selects a Node with `labels`,
/// with Kubernetes' rules: every matchLabels pair, every expression.
pub(crate) fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else { return true };
    let pairs = selector.match_labels.iter().flatten();
    if !pairs.into_iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let listed = || value.is_some_and(|v| e.values.iter().flatten().any(|x| x == v));
        match e.operator.as_str() {
            "In" => listed(),
            "NotIn" => !listed(),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// The probe of a node check on one node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodeProbe {
    /// The probe's and its target's name.
    pub(crate) name: String,
    /// The check's name.
    pub(crate) check: String,
    /// The whole target entry, as the config file would have it.
    pub(crate) target: serde_json::Value,
    /// The condition it owns.
    pub(crate) condition: NodeConditionSpec,
    /// The taint while the condition is True.
    pub(crate) taint: Option<TaintSpec>,
}

/// The name of the probe (and target) of node check `check`:
/// `k8snode_<check>`.
pub(crate) fn node_probe_name(check: &str) -> String {
    bounded_name(format!("k8snode_{check}"))
}

/// The probe of `check` on `node`, in the node tenant (`tenant_known`:
/// whether the agent's config has it); its refusals are [`refusal`]'s, the
/// missing tenant, and a target naming an address the agent does not know.
pub(crate) fn node_probe(
    check: &SondeNodeCheck,
    node: &NodeIdentity<'_>,
    settings: &GateSettings,
    claims: &BTreeMap<String, Vec<String>>,
    tenant_known: bool,
) -> Result<NodeProbe, NodeRefusal> {
    refusal(check, settings, claims)?;
    if !tenant_known {
        return Err(NodeRefusal::NoTenant {
            tenant: settings.node.tenant.clone(),
        });
    }
    let spec = &check.spec;
    let var = |name: &str| node.var(name);
    // In `host:port`, an IPv6 node address goes in brackets.
    let bracketed = node.ip.filter(|ip| ip.contains(':')).map(|ip| format!("[{ip}]"));
    let address = expand_str(&spec.target, |name: &str| match (name, &bracketed) {
        ("NODE_IP", Some(b)) => Some(b.as_str()),
        _ => var(name),
    });
    if address.contains("$(NODE_IP)") {
        return Err(NodeRefusal::NoNodeIp {
            target: spec.target.clone(),
        });
    }
    let check_name = check.name_any();
    let name = node_probe_name(&check_name);
    let config = spec.config.clone().unwrap_or_else(|| serde_json::json!({}));
    let secs = |s: u32| serde_json::Value::from(format!("{s}s"));
    let mut probe = serde_json::json!({
        "name": name,
        "kind": "readiness",
        "plugin": spec.plugin,
        "config": expand_with(&config, &var),
        "period": secs(spec.period_seconds),
        "initial_delay": secs(spec.initial_delay_seconds),
        "timeout": secs(spec.timeout_seconds),
        "success_threshold": spec.success_threshold,
        "failure_threshold": spec.failure_threshold,
        "labels": { "node": node.name, "check": check_name },
    });
    if let Some(l) = &spec.limits {
        let mut limits = serde_json::Map::new();
        if let Some(f) = l.fuel {
            limits.insert("fuel".into(), f.into());
        }
        if let Some(m) = &l.memory {
            limits.insert("memory".into(), m.clone().into());
        }
        probe["limits"] = limits.into();
    }
    let mut target = serde_json::json!({ "name": name, "address": address, "probes": [probe] });
    if settings.node.tenant != DEFAULT_TENANT {
        target["tenant"] = settings.node.tenant.clone().into();
    }
    Ok(NodeProbe {
        name,
        check: check_name,
        target,
        condition: spec.condition.clone(),
        taint: spec.taint.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> GateSettings {
        GateSettings::new(None, Some("node-1".into())).unwrap()
    }

    fn check(name: &str, spec: serde_json::Value) -> SondeNodeCheck {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheck",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    }

    fn felix(name: &str) -> SondeNodeCheck {
        check(
            name,
            serde_json::json!({"plugin": "http", "target": "$(NODE_IP):9099",
                               "config": {"path": "/liveness", "host": "$(NODE_NAME)"},
                               "condition": {"type": "CalicoUnhealthy"}}),
        )
    }

    #[test]
    fn the_probe_has_the_node_expanded_in_the_node_tenant() {
        let c = felix("felix");
        let node = NodeIdentity {
            name: "node-1",
            ip: Some("10.0.0.7"),
        };
        let p = node_probe(&c, &node, &settings(), &claims([&c]), true).unwrap();
        assert_eq!(p.name, "k8snode_felix");
        assert_eq!(p.target["address"], "10.0.0.7:9099");
        assert_eq!(p.target["tenant"], "node");
        assert_eq!(p.target["probes"][0]["config"]["host"], "node-1");
        assert_eq!(p.target["probes"][0]["failure_threshold"], 3);
    }

    #[test]
    fn refusals_name_the_field_and_value() {
        let s = settings();
        let no_ip = NodeIdentity {
            name: "node-1",
            ip: None,
        };
        let c = felix("felix");
        let e = node_probe(&c, &no_ip, &s, &claims([&c]), true).unwrap_err();
        assert_eq!(e.reason(), "NoNodeIP");
        assert!(e.to_string().contains("spec.target \"$(NODE_IP):9099\""), "{e}");
        let e = node_probe(&c, &no_ip, &s, &claims([&c]), false).unwrap_err();
        assert_eq!(e.reason(), "NoTenant");
        assert!(e.to_string().contains("kubernetes.node_tenant \"node\""), "{e}");

        let exec = check(
            "x",
            serde_json::json!({"plugin": "exec", "target": "127.0.0.1:1", "condition": {"type": "X"}}),
        );
        let e = refusal(&exec, &s, &claims([&exec])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.plugin \"exec\" is not on the agent's allowlist (kubernetes.plugins)"
        );

        for kubelet in KUBELET_CONDITIONS {
            let k = check(
                "k",
                serde_json::json!({"plugin": "tcp", "target": "127.0.0.1:1", "condition": {"type": kubelet}}),
            );
            let e = refusal(&k, &s, &claims([&k])).unwrap_err();
            assert_eq!(e.reason(), "KubeletCondition");
            assert!(e.to_string().contains(&format!("spec.condition.type \"{kubelet}\"")));
        }

        let (a, b) = (felix("b-second"), felix("a-first"));
        let all = claims([&a, &b]);
        for c in [&a, &b] {
            let e = refusal(c, &s, &all).unwrap_err();
            assert_eq!(
                e.to_string(),
                "spec.condition.type \"CalicoUnhealthy\" is claimed by more than one SondeNodeCheck: a-first, b-second"
            );
        }
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"pool": "gpu"},
            "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]},
                                 {"key": "draining", "operator": "DoesNotExist"}]
        }))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert!(selects(Some(&selector), &labels(&[("pool", "gpu"), ("zone", "a")])));
        assert!(!selects(Some(&selector), &labels(&[("pool", "cpu"), ("zone", "a")])));
        assert!(!selects(Some(&selector), &labels(&[("pool", "gpu"), ("zone", "c")])));
        assert!(!selects(
            Some(&selector),
            &labels(&[("pool", "gpu"), ("zone", "a"), ("draining", "")])
        ));
        assert!(selects(None, &labels(&[])));
    }
}
