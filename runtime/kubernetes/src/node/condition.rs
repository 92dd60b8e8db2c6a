//! From a node check's probe state to its Node condition, and what goes
//! to the API server, as pure functions: the condition of a state in
//! node-problem-detector's convention ([`NodeCond::of_state`]), the
//! strategic-merge patch of `nodes/<name>/status` that carries only the
//! conditions sonde owns ([`status_patch`]), the probe state a condition
//! already on the Node seeds ([`seed`]), and the Node's taints with sonde's
//! put on or taken off ([`retaint`]).

use k8s_openapi::api::core::v1::{NodeCondition, Taint};
use sonde_core::thresholds::Counter;
use sonde_sandbox::verdict::Status;
use std::collections::BTreeSet;

use super::crd::NodeConditionSpec;

/// The longest message written on a Node condition, in bytes.
pub(crate) const MAX_MESSAGE: usize = 1024;

/// A Node condition sonde owns, as it is or should be on the Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeCond {
    /// `True`: the problem is present (node-problem-detector's convention).
    pub(crate) problem: bool,
    /// `Unknown`: nobody can tell (a node-problem-detector rule's verdict;
    /// a node check's unknown state writes nothing). `problem` is false.
    pub(crate) unknown: bool,
    /// The check's problem or OK reason.
    pub(crate) reason: String,
    /// The run's message.
    pub(crate) message: String,
}

impl NodeCond {
    /// The condition of probe state `state` (reached by a run that said
    /// `message`, `timed_out` or not); `None` while it is unknown (nothing
    /// is written then).
    pub(crate) fn of_state(state: Status, timed_out: bool, message: &str, spec: &NodeConditionSpec) -> Option<Self> {
        let (problem, reason) = match state {
            Status::Success | Status::Warning => (false, &spec.ok_reason),
            Status::Failure => (true, &spec.problem_reason),
            Status::Unknown => return None,
        };
        let message = message.trim();
        let message = if timed_out && !message.contains("timeout") && !message.contains("timed out") {
            format!("timed out: {message}")
        } else {
            message.to_string()
        };
        Some(Self {
            problem,
            unknown: false,
            reason: reason.clone(),
            message: crate::view::cut(message.trim(), MAX_MESSAGE),
        })
    }

    /// The condition already on the Node, when it is True or False.
    pub(crate) fn on_node(c: &NodeCondition) -> Option<Self> {
        let problem = match c.status.as_str() {
            "True" => true,
            "False" => false,
            _ => return None,
        };
        Some(Self {
            problem,
            unknown: false,
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
        })
    }

    pub(crate) fn status(&self) -> &'static str {
        match (self.problem, self.unknown) {
            (true, _) => "True",
            (false, true) => "Unknown",
            (false, false) => "False",
        }
    }
}

/// The probe state a condition already on the Node seeds, so an agent that
/// restarts writes no transition until a threshold is crossed again.
pub(crate) fn seed(on_node: Option<&NodeCond>) -> Counter {
    let state = match on_node.map(|c| c.problem) {
        Some(true) => Status::Failure,
        Some(false) => Status::Success,
        None => Status::Unknown,
    };
    Counter {
        state,
        consecutive: 0,
        last_pass: None,
    }
}

/// One condition in a status patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Set it; with `lastTransitionTime` when its status flipped.
    Set { cond: NodeCond, transition: bool },
    /// Delete it: its check is gone or no longer selects the node.
    Delete,
}

/// The patch of `nodes/<name>/status` that writes `writes` (by condition
/// type) at `now` and nothing else: a strategic merge keyed by `type`, so
/// the kubelet's conditions and other writers' stay. Every set condition
/// carries `lastHeartbeatTime`; `lastTransitionTime` only on a flip.
pub(crate) fn status_patch<'a>(
    writes: impl IntoIterator<Item = (&'a String, &'a Write)>,
    now: &str,
) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = writes
        .into_iter()
        .map(|(type_, w)| match w {
            Write::Set { cond, transition } => {
                let mut v = serde_json::json!({
                    "type": type_,
                    "status": cond.status(),
                    "reason": cond.reason,
                    "message": cond.message,
                    "lastHeartbeatTime": now,
                });
                if *transition {
                    v["lastTransitionTime"] = now.into();
                }
                v
            }
            Write::Delete => serde_json::json!({"type": type_, "$patch": "delete"}),
        })
        .collect();
    serde_json::json!({ "status": { "conditions": conditions } })
}

/// A taint by key and effect.
pub(crate) type TaintKey = (String, String);

/// The Node's taints `current` with every taint of `wanted` on and every
/// other one of `managed` (the taints sonde's checks may put) off, in
/// order; `None` when that is what the Node has.
pub(crate) fn retaint(
    current: &[Taint],
    managed: &BTreeSet<TaintKey>,
    wanted: &BTreeSet<TaintKey>,
) -> Option<Vec<Taint>> {
    let key = |t: &Taint| (t.key.clone(), t.effect.clone());
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !managed.contains(&key(t)) || wanted.contains(&key(t)))
        .cloned()
        .collect();
    for (k, effect) in wanted {
        if !next.iter().any(|t| &t.key == k && &t.effect == effect) {
            next.push(Taint {
                key: k.clone(),
                effect: effect.clone(),
                ..Taint::default()
            });
        }
    }
    (next != current).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NodeConditionSpec {
        serde_json::from_value(
            serde_json::json!({"type": "CalicoUnhealthy", "problemReason": "FelixDown", "okReason": "FelixUp"}),
        )
        .unwrap()
    }

    #[test]
    fn true_means_the_problem_is_present() {
        let bad = NodeCond::of_state(Status::Failure, false, "connection refused", &spec()).unwrap();
        assert_eq!((bad.problem, bad.reason.as_str()), (true, "FelixDown"));
        let good = NodeCond::of_state(Status::Success, false, "200 OK", &spec()).unwrap();
        assert_eq!((good.problem, good.reason.as_str()), (false, "FelixUp"));
        assert_eq!(NodeCond::of_state(Status::Unknown, false, "", &spec()), None);
        let slow = NodeCond::of_state(Status::Failure, true, "no answer", &spec()).unwrap();
        assert_eq!(slow.message, "timed out: no answer");
        assert_eq!(seed(Some(&bad)).state, Status::Failure);
        assert_eq!(seed(None).state, Status::Unknown);
    }

    #[test]
    fn the_patch_carries_only_sondes_conditions() {
        let cond = NodeCond::of_state(Status::Failure, false, "refused", &spec()).unwrap();
        let writes = [
            (
                "CalicoUnhealthy".to_string(),
                Write::Set {
                    cond: cond.clone(),
                    transition: true,
                },
            ),
            ("Old".to_string(), Write::Delete),
        ];
        let body = status_patch(writes.iter().map(|(t, w)| (t, w)), "2026-01-01T00:00:00Z");
        assert_eq!(
            body,
            serde_json::json!({"status": {"conditions": [
                {"type": "CalicoUnhealthy", "status": "True", "reason": "FelixDown", "message": "refused",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Old", "$patch": "delete"}]}})
        );
        let beat = [(
            "CalicoUnhealthy".to_string(),
            Write::Set {
                cond,
                transition: false,
            },
        )];
        let body = status_patch(beat.iter().map(|(t, w)| (t, w)), "t");
        assert!(body["status"]["conditions"][0].get("lastTransitionTime").is_none());
    }

    #[test]
    fn taints_come_and_go_and_others_stay() {
        let taint = |k: &str, e: &str| Taint {
            key: k.into(),
            effect: e.into(),
            ..Taint::default()
        };
        let ours: TaintKey = ("sonde.dev/calico".into(), "NoSchedule".into());
        let managed = BTreeSet::from([ours.clone()]);
        let others = vec![taint("node.kubernetes.io/unreachable", "NoExecute")];
        let on = retaint(&others, &managed, &managed).unwrap();
        assert_eq!(on, [others[0].clone(), taint("sonde.dev/calico", "NoSchedule")]);
        assert_eq!(retaint(&on, &managed, &managed), None, "already there");
        assert_eq!(retaint(&on, &managed, &BTreeSet::new()).unwrap(), others);
        assert_eq!(retaint(&others, &managed, &BTreeSet::new()), None);
    }
}
