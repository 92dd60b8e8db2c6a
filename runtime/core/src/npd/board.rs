//! What the monitors last reported, kept for `/metrics`, and handed on to
//! the log and to whichever sinks are attached (the Node writer in
//! Kubernetes mode).

use super::{Condition, ConditionStatus, LogSink, Report, Severity, Sink};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// The monitors' conditions and problem counts, agent-wide.
#[derive(Default)]
pub struct Board {
    state: Mutex<State>,
    attached: Mutex<Vec<Arc<dyn Sink>>>,
}

#[derive(Default)]
struct State {
    /// (source, type) → the condition as last reported.
    conditions: BTreeMap<(String, String), Condition>,
    /// (source, reason) → problems found: Warning Events.
    problems: BTreeMap<(String, String), u64>,
}

impl fmt::Debug for Board {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Board").finish_non_exhaustive()
    }
}

impl Board {
    /// Hands every report from now on to `sink` too.
    pub fn attach(&self, sink: Arc<dyn Sink>) {
        self.attached.lock().unwrap_or_else(PoisonError::into_inner).push(sink);
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
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.conditions.retain(|(src, _), _| src != source);
    }

    /// `sonde_node_problem` (1 while a condition's problem is present, 0
    /// otherwise, labelled with its current reason) and
    /// `sonde_node_problems` (problems found, by reason), as NPD's
    /// `problem_gauge` and `problem_counter`.
    pub fn encode(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
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
        Ok(())
    }
}

impl Sink for Board {
    fn report(&self, source: &str, report: &Report) {
        {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            match report {
                Report::Condition(c) => {
                    s.conditions.insert((source.to_string(), c.kind.clone()), c.clone());
                }
                Report::Event {
                    severity: Severity::Warning,
                    reason,
                    ..
                } => *s.problems.entry((source.to_string(), reason.clone())).or_default() += 1,
                Report::Event { .. } => {}
            }
        }
        LogSink.report(source, report);
        let attached = self.attached.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for sink in attached {
            sink.report(source, report);
        }
    }
}
