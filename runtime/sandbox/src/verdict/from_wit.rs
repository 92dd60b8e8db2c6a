//! A plugin's own answer, as the WIT types carry it, mapped to a
//! [`RunResult`]: its status, its capped message, detail and metrics, or its
//! `probe-error` with the reason it names.

use super::{
    MAX_DETAIL_BYTES, MAX_MESSAGE_BYTES, MAX_METRIC_NAME_BYTES, MAX_METRICS, Metric, Reason, RunResult, Status,
    plugin_text,
};
use crate::bindings::sonde::probe::types as wit;
use std::time::Duration;

pub(crate) fn probe_error(e: wit::ProbeError) -> RunResult {
    let (reason, message) = match e {
        wit::ProbeError::InvalidConfig(m) => (Reason::InvalidConfig, m),
        wit::ProbeError::Denied(m) => (Reason::Denied, m),
        wit::ProbeError::Io(m) => (Reason::Io, m),
        wit::ProbeError::Internal(m) => (Reason::Internal, m),
    };
    RunResult::error(reason, plugin_text(message, MAX_MESSAGE_BYTES))
}

/// A metric name the host accepts: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(crate) fn from_outcome(o: wit::Outcome) -> RunResult {
    let status = match o.status {
        wit::Status::Success => Status::Success,
        wit::Status::Warning => Status::Warning,
        wit::Status::Failure => Status::Failure,
        wit::Status::Unknown => Status::Unknown,
    };
    let metrics = o
        .metrics
        .into_iter()
        .filter(|m| m.name.len() <= MAX_METRIC_NAME_BYTES && valid_metric_name(&m.name) && m.value.is_finite())
        .take(MAX_METRICS)
        .map(|m| Metric {
            name: m.name,
            value: m.value,
            unit: plugin_text(m.unit, MAX_METRIC_NAME_BYTES),
        })
        .collect();
    RunResult {
        status,
        reason: None,
        message: plugin_text(o.message, MAX_MESSAGE_BYTES),
        metrics,
        detail: o.detail.map(|d| plugin_text(d, MAX_DETAIL_BYTES)),
        duration: Duration::ZERO,
        fuel_consumed: 0,
        memory_bytes: 0,
        observed: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_is_capped() {
        let o = wit::Outcome {
            status: wit::Status::Warning,
            message: "x".repeat(100_000),
            metrics: (0..1000)
                .map(|i| wit::Metric {
                    name: format!("m{i}"),
                    value: i as f64,
                    unit: String::new(),
                })
                .chain([wit::Metric {
                    name: "bad name".into(),
                    value: 1.0,
                    unit: String::new(),
                }])
                .collect(),
            detail: Some("d".repeat(100_000)),
        };
        let r = from_outcome(o);
        assert_eq!(r.status, Status::Warning);
        assert!(r.message.len() <= MAX_MESSAGE_BYTES);
        assert!(r.detail.unwrap().len() <= MAX_DETAIL_BYTES);
        assert_eq!(r.metrics.len(), MAX_METRICS);
    }

    #[test]
    fn metric_names() {
        assert!(valid_metric_name("connect_seconds"));
        assert!(valid_metric_name("_x1"));
        assert!(!valid_metric_name("1x"));
        assert!(!valid_metric_name("a-b"));
        assert!(!valid_metric_name(""));
    }
}
