//! What one monitor's conditions are, and what each rule's verdict changes,
//! as node-problem-detector's custom plugin monitor decides it.

use crate::config::{NpdMonitor, NpdRule, NpdRuleKind};
use std::time::SystemTime;

/// A rule program's verdict, by NPD's exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 0: the problem is absent.
    Ok,
    /// 1: the problem is present.
    Problem,
    /// Anything else, a timeout, a denial: nobody knows.
    Unknown,
}

/// A Node condition's status, in NPD's convention: `True` means the
/// problem is present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    /// The problem is present.
    True,
    /// The problem is absent.
    False,
    /// Its rule could not tell.
    Unknown,
}

impl ConditionStatus {
    /// How the API server spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    fn of(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Ok => Self::False,
            Verdict::Problem => Self::True,
            Verdict::Unknown => Self::Unknown,
        }
    }
}

/// A monitor file's `conditions`, each `False` with its default reason and
/// message, as of `now`: where both kinds of monitor start.
pub(crate) fn defaults(conditions: &[crate::config::NpdCondition], now: SystemTime) -> Vec<Condition> {
    conditions
        .iter()
        .map(|c| Condition {
            kind: c.kind.clone(),
            status: ConditionStatus::False,
            reason: c.reason.clone(),
            message: c.message.clone(),
            transition: now,
        })
        .collect()
}

/// One condition as a monitor holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// Its type, e.g. `NTPProblem`.
    pub kind: String,
    /// Whether the problem is present.
    pub status: ConditionStatus,
    /// Why, in one word.
    pub reason: String,
    /// Why, in words.
    pub message: String,
    /// When its status, reason or message last changed.
    pub transition: SystemTime,
}

/// Whether an Event reports a problem or a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// A condition changed (`Normal`).
    Info,
    /// A temporary problem was found, or a condition became `True`
    /// (`Warning`).
    Warning,
}

/// What a monitor reports after a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// A condition's new status, reason or message.
    Condition(Condition),
    /// An Event on the Node.
    Event {
        /// Warning or normal.
        severity: Severity,
        /// Its reason.
        reason: String,
        /// Its message.
        message: String,
    },
}

/// The conditions of one monitor.
#[derive(Clone, Debug)]
pub struct MonitorState {
    conditions: Vec<Condition>,
    message_change_updates: bool,
}

impl MonitorState {
    /// Every condition of `monitor` with its status `False` and its default
    /// reason and message, as of `now`.
    pub fn new(monitor: &NpdMonitor, now: SystemTime) -> Self {
        Self {
            conditions: defaults(&monitor.conditions, now),
            message_change_updates: monitor.message_change_updates,
        }
    }

    /// The conditions as they are.
    pub fn conditions(&self) -> &[Condition] {
        &self.conditions
    }

    /// What `rule`'s `verdict` with `message` changes, as of `now`: for a
    /// temporary rule, a Warning Event when the problem is present; for a
    /// permanent one, its condition when its status changes (or its reason,
    /// or its message when `enable_message_change_based_condition_update`
    /// is on, while the problem stays), with an Event saying so.
    pub fn apply(
        &mut self,
        monitor: &NpdMonitor,
        rule: &NpdRule,
        verdict: Verdict,
        message: &str,
        now: SystemTime,
    ) -> Vec<Report> {
        let kind = match &rule.kind {
            NpdRuleKind::Temporary => {
                return match verdict {
                    Verdict::Problem => vec![Report::Event {
                        severity: Severity::Warning,
                        reason: rule.reason.clone(),
                        message: message.to_string(),
                    }],
                    _ => Vec::new(),
                };
            }
            NpdRuleKind::Permanent(kind) => kind,
        };
        let Some(default) = monitor.conditions.iter().find(|c| &c.kind == kind) else {
            return Vec::new();
        };
        let Some(condition) = self.conditions.iter_mut().find(|c| &c.kind == kind) else {
            return Vec::new();
        };
        let status = ConditionStatus::of(verdict);
        let (reason, message) = match (condition.status, status) {
            // The problem came.
            (was, ConditionStatus::True) if was != ConditionStatus::True => (rule.reason.as_str(), message),
            // The problem stays, under another reason (or message).
            (ConditionStatus::True, ConditionStatus::True)
                if condition.reason != rule.reason || (self.message_change_updates && condition.message != message) =>
            {
                (rule.reason.as_str(), message)
            }
            (ConditionStatus::True, ConditionStatus::True) => return Vec::new(),
            (was, now_is) if was == now_is => return Vec::new(),
            // Gone, or not known: the default reason; the program's words
            // only when they help to find out why it is not known.
            (_, ConditionStatus::False) => (default.reason.as_str(), default.message.as_str()),
            (_, _) => (default.reason.as_str(), message),
        };
        condition.status = status;
        condition.reason = reason.to_string();
        condition.message = message.to_string();
        condition.transition = now;
        let event = condition_event(&condition.kind, status, &condition.reason, &condition.message);
        vec![Report::Condition(condition.clone()), event]
    }
}

/// The Event NPD makes when a condition changes: Warning when the problem
/// came, normal otherwise, its message in NPD's words (the condition's
/// message quoted as Go's `%q` quotes it).
pub fn condition_event(kind: &str, status: ConditionStatus, reason: &str, message: &str) -> Report {
    Report::Event {
        severity: if status == ConditionStatus::True {
            Severity::Warning
        } else {
            Severity::Info
        },
        reason: reason.to_string(),
        message: format!(
            "Node condition {kind} is now: {}, reason: {reason}, message: {}",
            status.as_str(),
            go_quote(message)
        ),
    }
}

/// `text` as Go's `strconv.Quote` writes it: in double quotes, with `"`,
/// `\` and control characters escaped (`\n`, `\x01`, `\u0085`).
pub fn go_quote(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NpdCondition;
    use std::path::PathBuf;
    use std::time::Duration;

    fn monitor(message_change_updates: bool) -> NpdMonitor {
        NpdMonitor {
            source: "ntp-custom-plugin-monitor".into(),
            invoke_interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            max_output_length: 80,
            concurrency: 3,
            message_change_updates,
            skip_initial_status: false,
            conditions: vec![NpdCondition {
                kind: "NTPProblem".into(),
                reason: "NTPIsUp".into(),
                message: "ntp service is up".into(),
            }],
            rules: vec![
                rule(NpdRuleKind::Permanent("NTPProblem".into()), "NTPIsDown"),
                rule(NpdRuleKind::Permanent("NTPProblem".into()), "NTPIsSlow"),
                rule(NpdRuleKind::Temporary, "ClockJumped"),
            ],
        }
    }

    fn rule(kind: NpdRuleKind, reason: &str) -> NpdRule {
        NpdRule {
            kind,
            reason: reason.into(),
            path: PathBuf::from("/p"),
            args: Vec::new(),
            timeout: Duration::from_secs(3),
            invoke_interval: Duration::from_secs(30),
        }
    }

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// (status, reason, message) of the condition a report set, if any.
    fn set(reports: &[Report]) -> Option<(ConditionStatus, String, String)> {
        reports.iter().find_map(|r| match r {
            Report::Condition(c) => Some((c.status, c.reason.clone(), c.message.clone())),
            Report::Event { .. } => None,
        })
    }

    #[test]
    fn a_permanent_rule_sets_its_condition_on_each_change_only() {
        let m = monitor(false);
        let mut s = MonitorState::new(&m, at(0));
        let down = &m.rules[0];
        assert_eq!(s.conditions()[0].status, ConditionStatus::False);
        assert!(
            s.apply(&m, down, Verdict::Ok, "fine", at(1)).is_empty(),
            "False stays False"
        );
        let r = s.apply(&m, down, Verdict::Problem, "ntp is down", at(2));
        assert_eq!(
            set(&r),
            Some((ConditionStatus::True, "NTPIsDown".into(), "ntp is down".into()))
        );
        assert!(
            matches!(&r[1], Report::Event { severity: Severity::Warning, reason, message }
                if reason == "NTPIsDown" && message == "Node condition NTPProblem is now: True, reason: NTPIsDown, message: \"ntp is down\"")
        );
        assert_eq!(s.conditions()[0].transition, at(2));
        assert!(
            s.apply(&m, down, Verdict::Problem, "ntp is still down", at(3))
                .is_empty(),
            "a new message alone changes nothing unless asked"
        );
        let r = s.apply(&m, &m.rules[1], Verdict::Problem, "ntp is slow", at(4));
        assert_eq!(
            set(&r),
            Some((ConditionStatus::True, "NTPIsSlow".into(), "ntp is slow".into())),
            "another reason while True is a change"
        );
        let r = s.apply(&m, down, Verdict::Unknown, "timed out", at(5));
        assert_eq!(
            set(&r),
            Some((ConditionStatus::Unknown, "NTPIsUp".into(), "timed out".into())),
            "unknown keeps the program's words"
        );
        let r = s.apply(&m, down, Verdict::Ok, "fine", at(6));
        assert_eq!(
            set(&r),
            Some((ConditionStatus::False, "NTPIsUp".into(), "ntp service is up".into()))
        );
        assert!(matches!(
            &r[1],
            Report::Event {
                severity: Severity::Info,
                ..
            }
        ));
    }

    #[test]
    fn messages_are_quoted_as_go_quotes_them() {
        assert_eq!(
            go_quote("a \"b\" \\ c\nd\te\u{1}\u{7f}é\u{85}"),
            r#""a \"b\" \\ c\nd\te\x01\x7fé\u0085""#
        );
    }

    #[test]
    fn message_change_updates_follow_the_message_while_the_problem_stays() {
        let m = monitor(true);
        let mut s = MonitorState::new(&m, at(0));
        let down = &m.rules[0];
        s.apply(&m, down, Verdict::Problem, "offset 3s", at(1));
        let r = s.apply(&m, down, Verdict::Problem, "offset 9s", at(2));
        assert_eq!(set(&r).unwrap().2, "offset 9s");
        assert!(s.apply(&m, down, Verdict::Problem, "offset 9s", at(3)).is_empty());
    }

    #[test]
    fn a_temporary_rule_makes_an_event_per_problem_and_no_condition() {
        let m = monitor(false);
        let mut s = MonitorState::new(&m, at(0));
        let jump = &m.rules[2];
        for _ in 0..2 {
            assert_eq!(
                s.apply(&m, jump, Verdict::Problem, "clock jumped 4s", at(1)),
                vec![Report::Event {
                    severity: Severity::Warning,
                    reason: "ClockJumped".into(),
                    message: "clock jumped 4s".into()
                }]
            );
        }
        assert!(s.apply(&m, jump, Verdict::Ok, "", at(2)).is_empty());
        assert!(s.apply(&m, jump, Verdict::Unknown, "", at(2)).is_empty());
        assert_eq!(s.conditions()[0].status, ConditionStatus::False);
    }
}
