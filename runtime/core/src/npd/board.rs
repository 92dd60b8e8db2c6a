//! What the monitors last reported, kept for `/metrics` and `/v1/status`,
//! written to the log, and followed by the Node writer in Kubernetes mode
//! ([`Board::follow`], [`Board::take_events`]).

use super::syslog::LineOutcome;
use super::{Condition, ConditionStatus, LogSink, Report, Severity, Sink};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Mutex, PoisonError};
use tokio::sync::watch;

/// The most Events kept for the Node writer; past it the oldest go.
pub const MAX_PENDING_EVENTS: usize = 256;

/// The monitors' conditions and problem counts, agent-wide.
pub struct Board {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Default for Board {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

/// An Event a monitor made, for the Node writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingEvent {
    /// The monitor's `source`.
    pub source: String,
    /// Warning or normal.
    pub severity: Severity,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

#[derive(Default)]
struct State {
    /// (source, type) → the condition as last reported.
    conditions: BTreeMap<(String, String), Condition>,
    /// (source, reason) → problems found: Warning Events.
    problems: BTreeMap<(String, String), u64>,
    /// Events not yet taken (the latest [`MAX_PENDING_EVENTS`]): kept
    /// from the start, so that what a monitor finds before the Node writer
    /// follows (a kernel log's last minutes, read at once) reaches the Node.
    pending: VecDeque<PendingEvent>,
    /// (source, outcome) → lines a system-log monitor read.
    lines: BTreeMap<(String, LineOutcome), u64>,
}

impl fmt::Debug for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Board").finish_non_exhaustive()
    }
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes on every report from now on (the Events made before are kept
    /// for [`Board::take_events`], at most [`MAX_PENDING_EVENTS`]).
    pub fn follow(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The Events made since the last call, oldest first.
    pub fn take_events(&self) -> Vec<PendingEvent> {
        self.lock().pending.drain(..).collect()
    }

    /// The conditions as last reported, by source.
    pub fn conditions(&self) -> Vec<(String, Condition)> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.conditions
            .iter()
            .map(|((src, _), c)| (src.clone(), c.clone()))
            .collect()
    }

    /// Forgets the conditions of `source` (its monitor left the config).
    pub fn forget(&self, source: &str) {
        self.lock().conditions.retain(|(src, _), _| src != source);
        self.changed.send_modify(|n| *n += 1);
    }

    /// `sonde_node_problem` (1 while a condition's problem is present, 0
    /// otherwise, labelled with its current reason) and
    /// `sonde_node_problems` (problems found, by reason), as NPD's
    /// `problem_gauge` and `problem_counter`.
    pub fn encode(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let s = self.lock();
        let mut e = enc.encode_descriptor(
            "sonde_node_problem",
            "1 while a node-problem-detector monitor's condition holds its problem, by its current reason",
            None,
            MetricType::Gauge,
        )?;
        for ((source, kind), c) in &s.conditions {
            let labels = [
                ("source", source.as_str()),
                ("type", kind.as_str()),
                ("reason", c.reason.as_str()),
            ];
            ConstGauge::new(i64::from(c.status == ConditionStatus::True)).encode(e.encode_family(&labels)?)?;
        }
        let mut e = enc.encode_descriptor(
            "sonde_node_problems",
            "Problems a node-problem-detector monitor found (its Warning Events), by reason",
            None,
            MetricType::Counter,
        )?;
        for ((source, reason), n) in &s.problems {
            let labels = [("source", source.as_str()), ("reason", reason.as_str())];
            ConstCounter::new(*n).encode(e.encode_family(&labels)?)?;
        }
        let mut e = enc.encode_descriptor(
            "sonde_node_log_lines",
            "Lines a node-problem-detector system-log monitor read, by outcome: read (matched), cut (matched after being cut to max_line_bytes), dropped (over max_lines_per_second, not matched)",
            None,
            MetricType::Counter,
        )?;
        for ((source, outcome), n) in &s.lines {
            let labels = [("source", source.as_str()), ("outcome", outcome.as_str())];
            ConstCounter::new(*n).encode(e.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Sink for Board {
    fn report(&self, source: &str, report: &Report) {
        {
            let mut s = self.lock();
            match report {
                Report::Condition(c) => {
                    s.conditions.insert((source.to_string(), c.kind.clone()), c.clone());
                }
                Report::Event {
                    severity,
                    reason,
                    message,
                } => {
                    if *severity == Severity::Warning {
                        *s.problems.entry((source.to_string(), reason.clone())).or_default() += 1;
                    }
                    if s.pending.len() == MAX_PENDING_EVENTS {
                        s.pending.pop_front();
                    }
                    s.pending.push_back(PendingEvent {
                        source: source.to_string(),
                        severity: *severity,
                        reason: reason.clone(),
                        message: message.clone(),
                    });
                }
            }
        }
        LogSink.report(source, report);
        self.changed.send_modify(|n| *n += 1);
    }

    fn line(&self, source: &str, outcome: LineOutcome) {
        *self.lock().lines.entry((source.to_string(), outcome)).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str) -> Report {
        Report::Event {
            severity: Severity::Warning,
            reason: reason.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn events_made_before_a_follower_are_kept_and_bounded() {
        let board = Board::default();
        board.report("s", &event("Before"));
        let woken = board.follow();
        assert_eq!(board.take_events()[0].reason, "Before", "kept for the follower to come");
        for i in 0..MAX_PENDING_EVENTS + 3 {
            board.report("s", &event(&format!("R{i}")));
        }
        assert!(woken.has_changed().unwrap());
        let taken = board.take_events();
        assert_eq!(taken.len(), MAX_PENDING_EVENTS);
        assert_eq!(taken[0].reason, "R3", "the oldest went first");
        assert!(board.take_events().is_empty());
        let counted = board.lock().problems[&("s".to_string(), "R0".to_string())];
        assert_eq!(counted, 1, "counted whether or not kept");
    }
}
