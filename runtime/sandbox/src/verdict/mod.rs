//! What one probe run produced: a [`Status`], the [`Reason`] when the run did
//! not end with the plugin's own verdict, and the measurements.
//!
//! The rule (see also `docs/architecture.md`): a plugin's
//! `success | warning | failure` stands; a missed deadline is a `failure` with
//! reason `timeout`; everything else that went wrong (a `probe-error`, a trap,
//! fuel, memory, a denied capability, a host bound) is `unknown` with its
//! reason and never counts against the target. `from_wit` maps a plugin's
//! own answer to these.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

mod cause;
pub(crate) mod from_wit;
pub mod observed;

pub use cause::{Cause, REGEX_METRIC, SERVING_METRIC, STATUS_METRIC, TIMEOUT_METRIC};
pub use observed::Observed;

/// Cap on an outcome's message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024;
/// Cap on an outcome's detail excerpt, in bytes.
pub const MAX_DETAIL_BYTES: usize = 4 * 1024;
/// Cap on the number of metrics one outcome may carry.
pub const MAX_METRICS: usize = 64;
/// Cap on a metric's name and unit, in bytes.
pub const MAX_METRIC_NAME_BYTES: usize = 128;

/// The verdict of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The target is healthy.
    Success,
    /// The target works but deserves attention; counts as success for readiness.
    Warning,
    /// The target is unhealthy.
    Failure,
    /// The run could not tell.
    Unknown,
}

impl Status {
    /// The Nagios-convention exit code: 0, 1, 2 or 3.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Success => 0,
            Self::Warning => 1,
            Self::Failure => 2,
            Self::Unknown => 3,
        }
    }

    /// The lower-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Warning => "warning",
            Self::Failure => "failure",
            Self::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a run did not end with the plugin's own verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The deadline (the probe's `timeout`) passed. Recorded as `failure`.
    Timeout,
    /// The plugin trapped or panicked.
    Trap,
    /// The plugin used up its fuel budget.
    Fuel,
    /// The plugin tried to grow its memory past the cap.
    Memory,
    /// The plugin used a capability it was not granted.
    Denied,
    /// The plugin reported that its config does not fit.
    InvalidConfig,
    /// The plugin reported an I/O error.
    Io,
    /// The plugin reported an internal error, or the host failed to run it.
    Internal,
    /// The plugin made the host hold more than a bound allows: sockets,
    /// resource-table entries (and the host memory behind them), the
    /// agent's share of file descriptors. `unknown`, like every error.
    HostLimit,
}

impl Reason {
    /// The kebab-case name used in output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Trap => "trap",
            Self::Fuel => "fuel",
            Self::Memory => "memory",
            Self::Denied => "denied",
            Self::InvalidConfig => "invalid-config",
            Self::Io => "io",
            Self::Internal => "internal",
            Self::HostLimit => "host-limit",
        }
    }

    /// Whether the run is an error that must never flip a probe's state
    /// (everything but `timeout`).
    pub fn is_error(self) -> bool {
        self != Self::Timeout
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One measurement a plugin reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// A Prometheus-style name.
    pub name: String,
    /// The value.
    pub value: f64,
    /// The unit, or empty.
    pub unit: String,
}

/// The result of one run, as the executor hands it to thresholds and results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The verdict.
    pub status: Status,
    /// Why the run did not end with the plugin's verdict, if it did not.
    pub reason: Option<Reason>,
    /// One line for a person, cut to the host's cap.
    pub message: String,
    /// What the plugin measured, cut to the host's caps.
    pub metrics: Vec<Metric>,
    /// An excerpt the plugin attached, cut to the host's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Wall time from instantiation to the end of the call.
    #[serde(
        rename = "duration_ms",
        serialize_with = "as_millis",
        deserialize_with = "from_millis"
    )]
    pub duration: Duration,
    /// Fuel the call consumed.
    pub fuel_consumed: u64,
    /// The most linear memory the plugin's instance held during the call,
    /// in bytes; not stored with results (the run's span reads it).
    #[serde(skip)]
    pub memory_bytes: u64,
    /// What the host saw of the run's connections, if it opened any; not
    /// stored with results (`/probe` reads it).
    #[serde(skip)]
    pub observed: Option<Box<Observed>>,
}

fn from_millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let ms = f64::deserialize(d)?;
    Ok(Duration::try_from_secs_f64(ms / 1000.0).unwrap_or_default())
}

fn as_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

impl RunResult {
    /// A run that ended for `reason` rather than with the plugin's verdict.
    /// `timeout` is a failure; every other reason is `unknown`.
    pub fn error(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            status: if reason == Reason::Timeout {
                Status::Failure
            } else {
                Status::Unknown
            },
            reason: Some(reason),
            message: message.into(),
            metrics: Vec::new(),
            detail: None,
            duration: Duration::ZERO,
            fuel_consumed: 0,
            memory_bytes: 0,
            observed: None,
        }
    }

    /// Whether this run is an error that must not flip the probe's state.
    pub fn is_error(&self) -> bool {
        self.reason.is_some_and(Reason::is_error)
    }

    /// The same result with its reason cleared: the plugin's own verdict.
    pub fn without_reason(mut self) -> Self {
        self.reason = None;
        self
    }
}

pub(crate) use sonde_policy::text::{plugin_text, truncate};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_is_a_failure_and_not_an_error() {
        let r = RunResult::error(Reason::Timeout, "late");
        assert_eq!(r.status, Status::Failure);
        assert!(!r.is_error());
        let r = RunResult::error(Reason::Fuel, "spent");
        assert_eq!(r.status, Status::Unknown);
        assert!(r.is_error());
    }

    #[test]
    fn json_names() {
        let r = RunResult::error(Reason::InvalidConfig, "x");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["status"], "unknown");
        assert_eq!(v["reason"], "invalid-config");
        assert_eq!(v["duration_ms"], 0.0);
        let v = serde_json::to_value(RunResult::error(Reason::HostLimit, "x")).unwrap();
        assert_eq!(v["status"], "unknown");
        assert_eq!(v["reason"], Reason::HostLimit.as_str());
    }
}
