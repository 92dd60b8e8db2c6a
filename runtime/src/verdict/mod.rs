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

pub(crate) mod from_wit;

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

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    const MARK: &str = "…[cut]";
    let mut end = max.saturating_sub(MARK.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(MARK);
    s
}

/// Text a plugin wrote, made safe to show (the one boundary where plugin
/// text enters the host: results, log records, `describe`, denials): every
/// control character — newline, carriage return, escape, the C1 range — is
/// written as its Rust escape (`\n`, `\u{1b}`), so the text can neither
/// forge a log line nor drive a terminal; then it is cut to `max` bytes.
pub(crate) fn plugin_text(s: String, max: usize) -> String {
    // Cut first so a huge text costs no huge copy; escaping at most
    // multiplies the length by 8 (`\u{9b}` for a 2-byte character: ×4).
    let s = truncate(s, max);
    if !s.chars().any(char::is_control) {
        return s;
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    truncate(out, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_text_has_no_control_characters() {
        let forged = "ok\n2026-11-24T04:00:00Z  INFO sonde: all good\r\u{1b}[2J\u{9b}31m\tend".to_string();
        let shown = plugin_text(forged, 1024);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(
            shown,
            "ok\\n2026-11-24T04:00:00Z  INFO sonde: all good\\r\\u{1b}[2J\\u{9b}31m\\tend"
        );
        assert_eq!(plugin_text("plain é".into(), 1024), "plain é");
        let long = plugin_text("\u{1b}".repeat(1000), 100);
        assert!(long.len() <= 100 && !long.chars().any(char::is_control), "{long:?}");
    }

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
    fn truncate_respects_char_boundaries() {
        let s = "é".repeat(100);
        let t = truncate(s, 21);
        assert!(t.len() <= 21, "{}", t.len());
        assert!(t.ends_with("…[cut]"));
        assert_eq!(truncate("short".into(), 10), "short");
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
