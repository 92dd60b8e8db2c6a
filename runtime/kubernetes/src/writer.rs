//! Writing gate conditions: the patch (a strategic merge of one condition
//! with the Pod's UID as precondition), the agent-wide rate limit, the
//! per-Pod backoff and what each API answer means for the write.

use super::view::Cond;
use std::time::Duration;
use tokio::time::Instant;

/// The patch of `pods/{name}/status` that sets `conds` (each with its
/// condition type, and whether its status flips) on the Pod of `uid`,
/// and nothing else: a strategic merge keyed by condition type, so the
/// kubelet's conditions stay; `metadata.uid` makes the API server refuse
/// the write to another Pod of the same name. `lastTransitionTime` only
/// on a flip.
pub(crate) fn patch_body(uid: &str, conds: &[(&str, &Cond, bool)], now: &str) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = conds
        .iter()
        .map(|(type_, c, flip)| {
            let mut v = serde_json::json!({
                "type": type_,
                "status": c.status.as_str(),
                "reason": c.reason,
                "message": c.message,
            });
            if *flip {
                v["lastTransitionTime"] = now.into();
            }
            v
        })
        .collect();
    serde_json::json!({
        "metadata": { "uid": uid },
        "status": { "conditions": conditions },
    })
}

/// Sleeps until `at` (a write's backoff or rate limit); forever without
/// one.
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A token bucket: `qps` tokens a second, up to `burst` at once.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        Self {
            qps,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: Instant::now(),
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
    }

    /// Takes a token, or says when the next one comes.
    pub(crate) fn take(&mut self, now: Instant) -> Result<(), Instant> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(now + Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// What became of a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Written.
    Written,
    /// The Pod of that UID is gone (404, or the UID precondition failed):
    /// drop the write.
    Gone,
    /// Refused for lack of permission (RBAC, the admission policy): retry
    /// slowly, report.
    Forbidden(String),
    /// A conflict or a server or transport error: retry with backoff.
    Retry(String),
}

impl Outcome {
    /// The outcome of an API answer.
    pub(crate) fn of(result: &Result<(), kube::Error>) -> Self {
        match result {
            Ok(()) => Self::Written,
            Err(kube::Error::Api(s)) => match s.code {
                404 => Self::Gone,
                409 if s.message.contains("Precondition failed") || s.message.contains("UID") => Self::Gone,
                403 => Self::Forbidden(s.message.clone()),
                _ => Self::Retry(format!("{} {}", s.code, s.message)),
            },
            Err(e) => Self::Retry(e.to_string()),
        }
    }
}

/// The first retry after an error; it doubles up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between retries of a conflicting or failing write.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The first retry after a 403; it doubles up to [`MAX_FORBIDDEN_BACKOFF`].
pub(crate) const FORBIDDEN_BACKOFF: Duration = Duration::from_secs(30);
/// The longest wait between retries of a forbidden write.
pub(crate) const MAX_FORBIDDEN_BACKOFF: Duration = Duration::from_secs(300);

/// The wait before retry number `attempt` (1-based) of a write that ended
/// in `outcome`, with up to a quarter of random spread.
pub(crate) fn backoff(outcome: &Outcome, attempt: u32) -> Duration {
    backoff_with(outcome, attempt, fastrand::f64())
}

/// [`backoff`] with the random part given: `spread` in `[0, 1)` adds that
/// fraction of a quarter (0 in tests, for exact waits).
pub(crate) fn backoff_with(outcome: &Outcome, attempt: u32, spread: f64) -> Duration {
    let (first, max) = match outcome {
        Outcome::Forbidden(_) => (FORBIDDEN_BACKOFF, MAX_FORBIDDEN_BACKOFF),
        _ => (FIRST_BACKOFF, MAX_BACKOFF),
    };
    let base = first.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(max);
    base + base.mul_f64(spread / 4.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::CondStatus;

    #[test]
    fn the_patch_carries_the_uid_and_one_condition() {
        let c = Cond {
            status: CondStatus::False,
            reason: "CheckFailed".into(),
            message: "503".into(),
        };
        let body = patch_body("u1", &[("sonde.dev/ready", &c, true)], "2026-01-01T00:00:00Z");
        assert_eq!(body["metadata"], serde_json::json!({"uid": "u1"}));
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        let body = patch_body("u1", &[("sonde.dev/ready", &c, false)], "x");
        assert!(body["status"]["conditions"][0].get("lastTransitionTime").is_none());
        assert_eq!(
            body.as_object().unwrap().len(),
            2,
            "nothing but metadata.uid and status"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_holds_qps_after_the_burst() {
        let mut b = TokenBucket::new(2.0, 3);
        let now = Instant::now();
        for _ in 0..3 {
            b.take(now).unwrap();
        }
        let next = b.take(now).unwrap_err();
        assert_eq!(next - now, Duration::from_millis(500));
        b.take(next).unwrap();
    }

    #[test]
    fn backoff_grows_and_is_bounded() {
        let r = Outcome::Retry("409".into());
        assert!(backoff(&r, 1) >= FIRST_BACKOFF && backoff(&r, 1) < FIRST_BACKOFF * 2);
        assert!(backoff(&r, 30) <= MAX_BACKOFF.mul_f64(1.25));
        assert!(backoff(&Outcome::Forbidden(String::new()), 1) >= FORBIDDEN_BACKOFF);
    }
}
