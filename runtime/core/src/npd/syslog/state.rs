//! What a system-log monitor's match changes, as NPD's log monitor
//! decides it: a temporary rule's match is a Warning Event; a permanent
//! rule's match sets its condition `True` with the rule's reason, and when
//! that is a change (the condition was `False`, or had another reason) it
//! takes the match's message and an Event says so. Nothing sets it back to
//! `False`: NPD's conditions of a log monitor stay until it restarts.

use crate::config::{NpdLogMonitor, NpdLogRule, NpdRuleKind};
use crate::npd::state::{condition_event, defaults};
use crate::npd::{Condition, ConditionStatus, Report, Severity};
use std::time::SystemTime;

/// The conditions of one system-log monitor.
#[derive(Clone, Debug)]
pub struct LogState {
    conditions: Vec<Condition>,
}

impl LogState {
    /// Every condition of `monitor` `False`, with its default reason and
    /// message, as of `now`.
    pub fn new(monitor: &NpdLogMonitor, now: SystemTime) -> Self {
        Self {
            conditions: defaults(&monitor.conditions, now),
        }
    }

    /// The conditions as they are.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// What `rule`'s match, whose message is `message` and whose first
    /// line was written `at`, changes.
    pub fn apply(&mut self, rule: &NpdLogRule, message: &str, at: SystemTime) -> Vec<Report> {
        let kind = match &rule.kind {
            NpdRuleKind::Temporary => {
                return vec![Report::Event {
                    severity: Severity::Warning,
                    reason: rule.reason.clone(),
                    message: message.to_string(),
                }];
            }
            NpdRuleKind::Permanent(kind) => kind,
        };
        let Some(c) = self.conditions.iter_mut().find(|c| &c.kind == kind) else {
            return Vec::new();
        };
        if c.status == ConditionStatus::True && c.reason == rule.reason {
            return Vec::new();
        }
        // A change of status or of reason: NPD moves the transition time
        // and takes the match's message.
        c.status = ConditionStatus::True;
        c.reason = rule.reason.clone();
        c.message = message.to_string();
        c.transition = at;
        vec![
            Report::Condition(c.clone()),
            condition_event(&c.kind, ConditionStatus::True, &c.reason, &c.message),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NpdFile;

    fn monitor() -> NpdLogMonitor {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.json");
        std::fs::write(
            &file,
            r#"{"plugin": "kmsg", "source": "kernel-monitor",
                "conditions": [{"type": "KernelDeadlock", "reason": "KernelHasNoDeadlock", "message": "kernel has no deadlock"}],
                "rules": [
                  {"type": "temporary", "reason": "OOMKilling", "pattern": "Killed process .*"},
                  {"type": "permanent", "condition": "KernelDeadlock", "reason": "DockerHung", "pattern": "task docker:\\w+ blocked"},
                  {"type": "permanent", "condition": "KernelDeadlock", "reason": "AufsUmountHung", "pattern": "task umount\\.aufs:\\w+ blocked"}
                ]}"#,
        )
        .unwrap();
        match NpdFile::read(&file, dir.path()).unwrap() {
            NpdFile::Log(m) => m,
            NpdFile::Custom(_) => unreachable!(),
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s)
    }

    #[test]
    fn a_temporary_match_is_an_event_each_time() {
        let m = monitor();
        let mut s = LogState::new(&m, at(0));
        for _ in 0..2 {
            assert_eq!(
                s.apply(&m.rules[0], "Killed process 9 (x)", at(1)),
                vec![Report::Event {
                    severity: Severity::Warning,
                    reason: "OOMKilling".into(),
                    message: "Killed process 9 (x)".into()
                }]
            );
        }
        assert_eq!(s.conditions()[0].status, ConditionStatus::False);
    }

    #[test]
    fn a_permanent_match_sets_its_condition_once_per_reason_and_never_clears_it() {
        let m = monitor();
        let mut s = LogState::new(&m, at(0));
        assert_eq!(
            s.conditions()[0],
            Condition {
                kind: "KernelDeadlock".into(),
                status: ConditionStatus::False,
                reason: "KernelHasNoDeadlock".into(),
                message: "kernel has no deadlock".into(),
                transition: at(0)
            }
        );
        let r = s.apply(&m.rules[1], "task docker:1 blocked", at(5));
        assert!(matches!(&r[0], Report::Condition(c)
            if c.status == ConditionStatus::True && c.reason == "DockerHung" && c.message == "task docker:1 blocked" && c.transition == at(5)));
        assert_eq!(
            r[1],
            Report::Event {
                severity: Severity::Warning,
                reason: "DockerHung".into(),
                message:
                    "Node condition KernelDeadlock is now: True, reason: DockerHung, message: \"task docker:1 blocked\""
                        .into()
            }
        );
        assert!(
            s.apply(&m.rules[1], "task docker:2 blocked", at(6)).is_empty(),
            "same reason: no change, the first message stays"
        );
        assert_eq!(s.conditions()[0].message, "task docker:1 blocked");
        let r = s.apply(&m.rules[2], "task umount.aufs:3 blocked", at(7));
        assert!(
            matches!(&r[0], Report::Condition(c) if c.reason == "AufsUmountHung"),
            "another reason is a change"
        );
    }
}
