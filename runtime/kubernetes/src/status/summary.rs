//! What a SondeCheck's status should say, as pure functions: its gates
//! counted ([`aggregate`]), whether the agents accept it and why not
//! ([`Verdict`] and its reasons), and the status object ([`next_status`]).

use crate::crd::{GATE_PREFIX, SondeCheck, SondeCheckStatus, StatusCondition};
use crate::desired::Refusal;
use crate::view::{CondStatus, PodKey, PodView};
use k8s_openapi::api::core::v1::Pod;
use sonde_core::config::ConfigErrors;
use std::collections::BTreeMap;

/// The type of the condition that says whether the agents accept a check.
pub const ACCEPTED: &str = "Accepted";
/// The name of the stand-in Pod a check with no Pod yet is tried on.
const ANY_POD: &str = "any-pod";

/// The gates of one check, by their condition's status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// `True`.
    pub(crate) ready: u32,
    /// `False`.
    pub(crate) not_ready: u32,
    /// `Unknown`, or no condition yet.
    pub(crate) unknown: u32,
}

/// A Pod the leader follows: one with a `sonde.dev/*` readiness gate.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tracked {
    /// What the controller would see of it.
    pub(crate) view: PodView,
    /// Its node.
    pub(crate) node: Option<String>,
}

impl Tracked {
    /// `pod`, when one of its readiness gates names a SondeCheck.
    pub(crate) fn of(pod: &Pod) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let gated = spec
            .readiness_gates
            .iter()
            .flatten()
            .any(|g| g.condition_type.starts_with(GATE_PREFIX));
        if !gated {
            return None;
        }
        Some(Self {
            view: PodView::of(pod)?,
            node: spec.node_name.clone(),
        })
    }

    /// Whether a check can be tried on it: it has an address and is not going.
    pub(crate) fn usable(&self) -> bool {
        !self.view.ips.is_empty() && !self.view.gone
    }
}

/// Each check's counts and the Pod it is tried on (the first usable one by
/// name), by (namespace, check).
pub(crate) fn aggregate<'a>(
    pods: impl IntoIterator<Item = &'a Tracked>,
) -> BTreeMap<PodKey, (Counts, Option<&'a Tracked>)> {
    let mut out: BTreeMap<PodKey, (Counts, Option<&'a Tracked>)> = BTreeMap::new();
    for pod in pods {
        if pod.view.gone {
            continue;
        }
        for check in &pod.view.gates {
            let entry = out.entry((pod.view.key.0.clone(), check.clone())).or_default();
            let cond = pod.view.conditions.get(&format!("{GATE_PREFIX}{check}"));
            match cond.map(|c| c.status) {
                Some(CondStatus::True) => entry.0.ready += 1,
                Some(CondStatus::False) => entry.0.not_ready += 1,
                _ => entry.0.unknown += 1,
            }
            if pod.usable() && entry.1.is_none_or(|o| pod.view.key < o.view.key) {
                entry.1 = Some(pod);
            }
        }
    }
    out
}

/// Whether the agents accept a check, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Accepted.
    pub(crate) accepted: bool,
    /// `Accepted`, or why not (`PluginNotAllowed`, `OutsideCeiling`, ...).
    pub(crate) reason: &'static str,
    /// For people.
    pub(crate) message: String,
}

impl Verdict {
    pub(crate) fn accepted(with_pod: bool) -> Self {
        let message = if with_pod {
            "the plugin is allowed, and the probe of a Pod that names it fits its tenant's ceiling and the plugin's schema"
        } else {
            "the plugin is allowed and its config fits the plugin's schema; no Pod names it in a readiness gate yet, so the address is checked against the tenant's ceiling when one does"
        };
        Self {
            accepted: true,
            reason: "Accepted",
            message: message.into(),
        }
    }

    pub(crate) fn refused(reason: &'static str, message: String) -> Self {
        Self {
            accepted: false,
            reason,
            message: crate::view::cut(&message, 1024),
        }
    }
}

/// Every reason of the `Accepted` condition (the docs list them all).
#[cfg(test)]
pub(crate) const REASONS: &[&str] = &[
    "Accepted",
    "PluginNotAllowed",
    "NoTenant",
    "OutsideCeiling",
    "InvalidConfig",
    "PluginUnavailable",
    "NoSuchPort",
    "InvalidPort",
    "ServiceNotFound",
    "ServicesNotListed",
    "ServiceWithoutClusterIP",
    "NoSuchServicePort",
    "InvalidPodSelector",
    "InvalidSecretRefs",
];

/// The `Accepted` reason of a refusal by [`desired`](crate::desired::desired).
pub(crate) fn refusal_reason(r: &Refusal) -> &'static str {
    match r {
        Refusal::NoTenant { .. } => "NoTenant",
        Refusal::NoSuchService { .. } => "ServiceNotFound",
        Refusal::ServicesNotListed => "ServicesNotListed",
        Refusal::ServiceWithoutClusterIp { .. } => "ServiceWithoutClusterIP",
        Refusal::NoSuchServicePort { .. } => "NoSuchServicePort",
        Refusal::PortOrService => "InvalidPort",
        Refusal::PluginNotAllowed { .. } => "PluginNotAllowed",
        Refusal::NoSuchPort { .. } => "NoSuchPort",
        Refusal::BadPort { .. } => "InvalidPort",
        Refusal::InvalidPodSelector(_) => "InvalidPodSelector",
        Refusal::InvalidSecretRefs(_) => "InvalidSecretRefs",
    }
}

/// The `Accepted` reason of the catalog's refusal: a tenant's ceiling or
/// quota, a plugin that cannot be had, or anything else in the config.
pub(crate) fn errors_reason(errors: &ConfigErrors) -> &'static str {
    let any = |f: &dyn Fn(&str) -> bool| errors.0.iter().any(|e| f(&e.message));
    if any(&|m| m.contains("tenant's") && (m.contains("ceiling") || m.contains("quota"))) {
        "OutsideCeiling"
    } else if any(&|m| m.starts_with("plugin: ")) {
        "PluginUnavailable"
    } else {
        "InvalidConfig"
    }
}

/// The stand-in a check with no usable Pod is tried on: an address of
/// TEST-NET-1 and every port name resolving, so what does not depend on a
/// Pod (tenant, allowlist, schema, limits) is checked.
pub(crate) fn stand_in(namespace: &str, check: &SondeCheck) -> PodView {
    let mut ports = BTreeMap::new();
    if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) = &check.spec.port {
        ports.insert(name.clone(), 9);
    }
    PodView {
        key: (namespace.to_string(), ANY_POD.to_string()),
        uid: ANY_POD.to_string(),
        ips: vec![std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1))],
        ports,
        ..PodView::default()
    }
}

/// The status a check should have: `counts`, `verdict`, for `generation`;
/// the `Accepted` condition's transition time kept from `current` unless
/// its status flips (then `now`).
pub(crate) fn next_status(
    generation: Option<i64>,
    counts: Counts,
    verdict: &Verdict,
    current: Option<&SondeCheckStatus>,
    now: &str,
) -> SondeCheckStatus {
    let status = if verdict.accepted { "True" } else { "False" };
    let since = current
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == ACCEPTED))
        .filter(|c| c.status == status)
        .map_or_else(|| now.to_string(), |c| c.last_transition_time.clone());
    SondeCheckStatus {
        observed_generation: generation,
        conditions: vec![StatusCondition {
            type_: ACCEPTED.into(),
            status: status.into(),
            reason: verdict.reason.into(),
            message: verdict.message.clone(),
            last_transition_time: since,
            observed_generation: generation,
        }],
        pods_ready: counts.ready,
        pods_not_ready: counts.not_ready,
        pods_unknown: counts.unknown,
    }
}
