//! The conditions and Events of the agent's `node_problem_detector:`
//! monitors ([`sonde_core::npd`]) on this Node: each condition written
//! through the same writer as the node checks' (one patch per change, the
//! heartbeat with theirs), each Event on the Node. A condition type a
//! SondeNodeCheck claims too is not written: one condition has one owner,
//! and the refusal names both.

use super::NodeChecks;
use super::condition::{NodeCond, Write};
use super::desired::claims;
use super::reconcile::node_reference;
use sonde_core::npd::{ConditionStatus, Severity};

impl NodeChecks {
    /// Brings the monitors' conditions on the Node in line with what they
    /// last reported, and records their Events.
    pub(super) fn on_problems(&mut self) {
        let claimed = claims(self.checks.state().iter().map(|c| &**c));
        let reported = self.problems.conditions();
        let mut seen = Vec::new();
        for (source, c) in reported {
            if let Some(checks) = claimed.get(&c.kind) {
                let message = format!(
                    "condition {} is claimed by node-problem-detector monitor {source:?} and by SondeNodeCheck {}: one condition has one owner; the monitor's is not written",
                    c.kind,
                    checks.join(", ")
                );
                self.log_refusal(&format!("node-problem-detector {source}"), &message);
                continue;
            }
            seen.push(c.kind.clone());
            let cond = NodeCond {
                problem: c.status == ConditionStatus::True,
                unknown: c.status == ConditionStatus::Unknown,
                reason: c.reason.clone(),
                message: crate::view::cut(c.message.trim(), super::condition::MAX_MESSAGE),
            };
            let before = self.npd.get(&c.kind);
            if before == Some(&cond) {
                continue;
            }
            // After a restart, the status the Node already has is no transition.
            let was = match before {
                Some(b) => Some(b.status()),
                None => self.status_on_node(&c.kind),
            };
            let transition = was != Some(cond.status());
            self.npd.insert(c.kind.clone(), cond.clone());
            self.writer.queue(&c.kind, Write::Set { cond, transition });
        }
        // A monitor that left the config takes its conditions with it.
        let gone: Vec<String> = self.npd.keys().filter(|k| !seen.contains(k)).cloned().collect();
        for kind in gone {
            self.npd.remove(&kind);
            self.writer.queue(&kind, Write::Delete);
        }
        // Without the Node (not listed yet, or gone) the Events stay on the
        // board (bounded: MAX_PENDING_EVENTS) until there is one to put
        // them on.
        // The message as NPD writes it, so an Event reads the same whichever
        // wrote it (NPD names the monitor's source as the Event's
        // component; sonde's Events all come from sonde, the log names the
        // source).
        let Some(node) = self.this_node() else { return };
        for e in self.problems.take_events() {
            let warning = e.severity == Severity::Warning;
            self.events
                .record_distinct(node_reference(&node), warning, &e.reason, &e.message);
        }
    }

    /// The status condition `kind` has on this Node, if any.
    fn status_on_node(&self, kind: &str) -> Option<&'static str> {
        let node = self.this_node()?;
        let status = node
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == kind)?
            .status
            .clone();
        ["True", "False", "Unknown"].into_iter().find(|s| *s == status)
    }

    /// The monitors' conditions written again: their part of the heartbeat.
    pub(super) fn problems_heartbeat(&mut self) {
        for (kind, cond) in &self.npd {
            self.writer.queue(
                kind,
                Write::Set {
                    cond: cond.clone(),
                    transition: false,
                },
            );
        }
    }
}
