//! Consecutive-result thresholds: when a run's result changes a probe's
//! state, with the kubelet worker's rule. A result that differs from the
//! previous one starts a new run of 1; a run of failures changes the state
//! at `failure_threshold`, a run of passes at `success_threshold`. `warning`
//! passes (it counts as success, Consul's meaning) and shows as the state.
//! Errors (every reason but `timeout`) never count and never change state.

use crate::config::Kind;
use serde::{Deserialize, Serialize};
use sonde_sandbox::verdict::{RunResult, Status};

/// A probe's state and its current run of like results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// The state: `success`, `warning`, `failure` or `unknown`.
    pub state: Status,
    /// How many results in a row were like the last one (pass or fail).
    pub consecutive: u32,
    /// Whether that run is of passes (`Some(true)`), failures, or none yet.
    pub last_pass: Option<bool>,
}

impl Counter {
    /// The state a probe of `kind` starts in: startup `unknown`, readiness
    /// `failure`, liveness `success` (as the kubelet).
    pub fn initial(kind: Kind) -> Self {
        Self {
            state: match kind {
                Kind::Startup => Status::Unknown,
                Kind::Readiness => Status::Failure,
                Kind::Liveness => Status::Success,
            },
            consecutive: 0,
            last_pass: None,
        }
    }

    /// Counts `result` and returns the new state if it changed.
    pub fn observe(&mut self, result: &RunResult, success_threshold: u32, failure_threshold: u32) -> Option<Status> {
        if result.is_error() {
            return None;
        }
        let pass = matches!(result.status, Status::Success | Status::Warning);
        if self.last_pass == Some(pass) {
            self.consecutive = self.consecutive.saturating_add(1);
        } else {
            self.last_pass = Some(pass);
            self.consecutive = 1;
        }
        let threshold = if pass { success_threshold } else { failure_threshold };
        let was_pass = matches!(self.state, Status::Success | Status::Warning);
        // Within a passing state, success and warning follow each run.
        let new = if pass && was_pass {
            result.status
        } else if self.consecutive >= threshold.max(1) {
            if pass { result.status } else { Status::Failure }
        } else {
            return None;
        };
        (new != self.state).then(|| {
            self.state = new;
            new
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_sandbox::verdict::Reason;

    fn ok() -> RunResult {
        RunResult {
            status: Status::Success,
            ..RunResult::error(Reason::Io, "")
        }
        .without_reason()
    }

    fn fail() -> RunResult {
        RunResult {
            status: Status::Failure,
            ..ok()
        }
    }

    fn warn() -> RunResult {
        RunResult {
            status: Status::Warning,
            ..ok()
        }
    }

    #[test]
    fn failure_threshold_counts_consecutive_failures() {
        let mut c = Counter::initial(Kind::Liveness);
        assert_eq!(c.observe(&fail(), 1, 3), None);
        assert_eq!(c.observe(&fail(), 1, 3), None);
        assert_eq!(c.observe(&ok(), 1, 3), None, "a pass resets the run");
        assert_eq!(c.observe(&fail(), 1, 3), None);
        assert_eq!(c.observe(&fail(), 1, 3), None);
        assert_eq!(c.observe(&fail(), 1, 3), Some(Status::Failure));
        assert_eq!(c.consecutive, 3);
        assert_eq!(c.observe(&fail(), 1, 3), None, "no change, no event");
    }

    #[test]
    fn success_threshold_counts_consecutive_passes() {
        let mut c = Counter::initial(Kind::Readiness);
        assert_eq!(c.state, Status::Failure);
        assert_eq!(c.observe(&ok(), 2, 3), None);
        assert_eq!(c.observe(&warn(), 2, 3), Some(Status::Warning), "warning passes");
        assert_eq!(c.observe(&ok(), 2, 3), Some(Status::Success));
    }

    #[test]
    fn errors_never_count() {
        let mut c = Counter::initial(Kind::Readiness);
        c.observe(&ok(), 1, 3);
        for _ in 0..10 {
            assert_eq!(c.observe(&RunResult::error(Reason::Fuel, "x"), 1, 3), None);
        }
        assert_eq!((c.state, c.consecutive), (Status::Success, 1));
    }

    #[test]
    fn a_timeout_is_a_failure() {
        let mut c = Counter::initial(Kind::Liveness);
        let t = RunResult::error(Reason::Timeout, "late");
        assert_eq!(c.observe(&t, 1, 1), Some(Status::Failure));
    }

    #[test]
    fn startup_starts_unknown() {
        let mut c = Counter::initial(Kind::Startup);
        assert_eq!(c.state, Status::Unknown);
        assert_eq!(c.observe(&ok(), 1, 3), Some(Status::Success));
    }
}
