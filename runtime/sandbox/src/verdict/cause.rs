//! Why a run failed, in a word from a fixed set: the label that lets a
//! dashboard or an alert say *why* without reading the message.
//!
//! A [`Reason`] is its own cause. A plugin's own `failure` is sorted by
//! what the host saw of the run ([`Observed`](super::Observed)) and the well-known metrics
//! a plugin reports: the name did not resolve, no connection was made, a
//! TLS handshake failed, the status was not the one expected, a regex did
//! not hold; anything else is the plugin's `check`.

use super::{Reason, RunResult, Status};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The metric a plugin reports (1) when a regex decided its failure.
pub const REGEX_METRIC: &str = "failed_due_to_regex";
/// The metric a plugin reports (1) when the status (HTTP, or a health
/// check's serving status) decided its failure.
pub const STATUS_METRIC: &str = "failed_due_to_status";
/// The metric a plugin reports (1) when its own deadline for an answer
/// passed (the run's deadline left it time to say so).
pub const TIMEOUT_METRIC: &str = "failed_due_to_timeout";
/// The metric a gRPC health check reports: the serving status (1 is
/// `SERVING`).
pub const SERVING_METRIC: &str = "grpc_serving_status";

/// Why a run failed: one of 15 words, so a series labelled by it stays
/// small.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// [`Reason::Timeout`], or a plugin that reported [`TIMEOUT_METRIC`].
    Timeout,
    /// [`Reason::Trap`].
    Trap,
    /// [`Reason::Fuel`].
    Fuel,
    /// [`Reason::Memory`].
    Memory,
    /// [`Reason::Denied`].
    Denied,
    /// [`Reason::InvalidConfig`].
    InvalidConfig,
    /// [`Reason::Io`].
    Io,
    /// [`Reason::Internal`].
    Internal,
    /// [`Reason::HostLimit`].
    HostLimit,
    /// The target's name gave no address.
    Resolve,
    /// A connection was tried and none was made (refused, unreachable).
    Connect,
    /// A TLS handshake failed.
    Tls,
    /// The answer's status was not the one expected.
    Status,
    /// A body, header, reply or record regex did not hold.
    Regex,
    /// The plugin's own check failed, for any other reason (its message
    /// says which).
    Check,
}

impl Cause {
    /// Every cause, in the order docs list them.
    pub const ALL: [Cause; 15] = [
        Cause::Timeout,
        Cause::Trap,
        Cause::Fuel,
        Cause::Memory,
        Cause::Denied,
        Cause::InvalidConfig,
        Cause::Io,
        Cause::Internal,
        Cause::HostLimit,
        Cause::Resolve,
        Cause::Connect,
        Cause::Tls,
        Cause::Status,
        Cause::Regex,
        Cause::Check,
    ];

    /// The kebab-case name used as a label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Timeout => Reason::Timeout.as_str(),
            Cause::Trap => Reason::Trap.as_str(),
            Cause::Fuel => Reason::Fuel.as_str(),
            Cause::Memory => Reason::Memory.as_str(),
            Cause::Denied => Reason::Denied.as_str(),
            Cause::InvalidConfig => Reason::InvalidConfig.as_str(),
            Cause::Io => Reason::Io.as_str(),
            Cause::Internal => Reason::Internal.as_str(),
            Cause::HostLimit => Reason::HostLimit.as_str(),
            Cause::Resolve => "resolve",
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Status => "status",
            Cause::Regex => "regex",
            Cause::Check => "check",
        }
    }
}

impl From<Reason> for Cause {
    fn from(r: Reason) -> Self {
        match r {
            Reason::Timeout => Cause::Timeout,
            Reason::Trap => Cause::Trap,
            Reason::Fuel => Cause::Fuel,
            Reason::Memory => Cause::Memory,
            Reason::Denied => Cause::Denied,
            Reason::InvalidConfig => Cause::InvalidConfig,
            Reason::Io => Cause::Io,
            Reason::Internal => Cause::Internal,
            Reason::HostLimit => Cause::HostLimit,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl RunResult {
    /// Why the run failed; `None` when it passed (`success` or `warning`).
    /// Sorted from what the host saw, so it is read before the
    /// observations are dropped (results keep the cause, not them).
    pub fn cause(&self) -> Option<Cause> {
        if matches!(self.status, Status::Success | Status::Warning) {
            return None;
        }
        if let Some(r) = self.reason {
            return Some(r.into());
        }
        let metric = |name: &str| self.metrics.iter().find(|m| m.name == name).map(|m| m.value);
        if metric(TIMEOUT_METRIC).is_some_and(|v| v > 0.0) {
            return Some(Cause::Timeout);
        }
        if metric(REGEX_METRIC).is_some_and(|v| v > 0.0) {
            return Some(Cause::Regex);
        }
        if metric(STATUS_METRIC).is_some_and(|v| v > 0.0) || metric(SERVING_METRIC).is_some_and(|v| v != 1.0) {
            return Some(Cause::Status);
        }
        if let Some(o) = &self.observed {
            if o.first_lookup.is_some_and(|l| !l.found) {
                return Some(Cause::Resolve);
            }
            if o.http.as_ref().is_some_and(|h| h.handshake_failed) {
                return Some(Cause::Tls);
            }
            let answered = o.http.as_ref().is_some_and(|h| h.responses > 0) || o.grpc.is_some_and(|g| g.code.is_some());
            if o.peer.is_some() && o.connect.is_zero() && !answered {
                return Some(Cause::Connect);
            }
        }
        Some(Cause::Check)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::observed::{HttpSeen, Lookup, Observed};
    use std::time::Duration;

    fn failed(observed: Option<Observed>, metrics: &[(&str, f64)]) -> RunResult {
        RunResult {
            status: Status::Failure,
            reason: None,
            message: String::new(),
            metrics: metrics
                .iter()
                .map(|(n, v)| crate::verdict::Metric {
                    name: n.to_string(),
                    value: *v,
                    unit: String::new(),
                })
                .collect(),
            detail: None,
            duration: Duration::ZERO,
            fuel_consumed: 0,
            memory_bytes: 0,
            observed: observed.map(Box::new),
        }
    }

    #[test]
    fn a_failure_is_sorted_by_what_the_host_saw() {
        let ms = Duration::from_millis(1);
        let peer = Some("127.0.0.1".parse().unwrap());
        let lookup = |found| Some(Lookup { took: ms, found });
        let cases = [
            (
                Observed {
                    first_lookup: lookup(false),
                    ..Default::default()
                },
                Cause::Resolve,
            ),
            (
                Observed {
                    first_lookup: lookup(true),
                    peer,
                    ..Default::default()
                },
                Cause::Connect,
            ),
            (
                Observed {
                    peer,
                    connect: ms,
                    ..Default::default()
                },
                Cause::Check,
            ),
            (
                Observed {
                    peer,
                    connect: ms,
                    http: Some(HttpSeen {
                        handshake_failed: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Cause::Tls,
            ),
        ];
        for (observed, cause) in cases {
            assert_eq!(failed(Some(observed.clone()), &[]).cause(), Some(cause), "{observed:?}");
        }
        assert_eq!(failed(None, &[(REGEX_METRIC, 1.0)]).cause(), Some(Cause::Regex));
        assert_eq!(failed(None, &[(TIMEOUT_METRIC, 1.0)]).cause(), Some(Cause::Timeout));
        assert_eq!(failed(None, &[(REGEX_METRIC, 0.0)]).cause(), Some(Cause::Check));
        assert_eq!(failed(None, &[(STATUS_METRIC, 1.0)]).cause(), Some(Cause::Status));
        assert_eq!(failed(None, &[(SERVING_METRIC, 2.0)]).cause(), Some(Cause::Status));
        let mut timeout = failed(None, &[(REGEX_METRIC, 1.0)]);
        timeout.reason = Some(Reason::Timeout);
        assert_eq!(timeout.cause(), Some(Cause::Timeout), "the reason comes first");
        let mut passed = failed(None, &[]);
        passed.status = Status::Warning;
        assert_eq!(passed.cause(), None);
    }

    #[test]
    fn every_cause_has_its_own_name() {
        let names: std::collections::HashSet<_> = Cause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), Cause::ALL.len());
        for c in Cause::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }
}
