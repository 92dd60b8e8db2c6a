//! The election of the one agent that writes SondeChecks' statuses, by
//! optimistic concurrency on the Lease [`LEASE_NAME`] (see the
//! [`status`](crate::status) module for the rules).
//!
//! What to do with a Lease read ([`step`]) and when to act next and whether
//! this agent leads ([`Leadership`]) are pure functions of what was read and
//! the `Instant`s handed in, tested under paused time; [`elect`] performs
//! them against the API server.

use crate::crd::STATUS_FIELD_MANAGER;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{GetParams, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The Lease the agents elect the status writer with.
pub const LEASE_NAME: &str = "sonde-status";

/// The election's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a Lease not renewed stays its holder's (`leaseDurationSeconds`).
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
    /// How long the holder goes on writing without a renewal (less than
    /// `duration`, so it stops before anyone else may take over).
    pub renew_deadline: Duration,
    /// How often a non-holder reads the Lease, plus up to `jitter`.
    pub retry_every: Duration,
    /// The most added at random to each `retry_every`.
    pub jitter: Duration,
}

impl Default for LeaseTiming {
    /// A 30 s lease renewed every 10 s; non-holders read it every 30-50 s.
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(20),
            retry_every: Duration::from_secs(30),
            jitter: Duration::from_secs(20),
        }
    }
}

/// What a non-holder or the holder does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// It is ours: renew it.
    Renew,
    /// Nobody holds it, or its holder let it expire: take it.
    Take,
    /// Someone else holds it.
    Wait,
}

/// The step for `spec` at resourceVersion `rv` read at `now` by `me`;
/// `observed` is the resourceVersion seen last and when it was first seen
/// (expiry is judged by the reader's clock, not the holder's timestamps).
pub(crate) fn step(
    spec: Option<&LeaseSpec>,
    rv: &str,
    me: &str,
    observed: &mut Option<(String, Instant)>,
    now: Instant,
    duration: Duration,
) -> Step {
    let holder = spec.and_then(|s| s.holder_identity.as_deref()).unwrap_or("");
    if holder == me {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::Take;
    }
    // The holder's own duration, but no more than ten of ours: a Lease
    // written with a huge one does not stall the election forever.
    let lasts = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(duration, Duration::from_secs)
        .min(duration * 10);
    match observed {
        Some((seen, since)) if seen == rv => {
            if now.saturating_duration_since(*since) >= lasts {
                Step::Take
            } else {
                Step::Wait
            }
        }
        _ => {
            *observed = Some((rv.to_string(), now));
            Step::Wait
        }
    }
}

/// One elector's state.
struct Elector {
    api: Api<Lease>,
    me: String,
    timing: LeaseTiming,
    /// The Lease as this agent last wrote it, while it holds it.
    held: Option<Lease>,
    observed: Option<(String, Instant)>,
}

impl Elector {
    fn stamp(&self, lease: &mut Lease, take: bool) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if take {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.map_or(0, |t| t.saturating_add(1)));
            spec.holder_identity = Some(self.me.clone());
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(i32::try_from(self.timing.duration.as_secs()).unwrap_or(i32::MAX));
    }

    /// Writes `lease` (replace, by its resourceVersion): whether it is ours now.
    async fn write(&mut self, lease: Lease) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(STATUS_FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match self.api.replace(LEASE_NAME, &params, &lease).await {
            Ok(l) => {
                self.held = Some(l);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.held = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// One round: renew what it holds, or read the Lease and create, take
    /// or leave it. Whether this agent holds it now.
    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        if let Some(mut lease) = self.held.clone() {
            self.stamp(&mut lease, false);
            return self.write(lease).await;
        }
        let lease = match self.api.get_with(LEASE_NAME, &GetParams::any()).await {
            Ok(l) => Some(l),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => return Err(e),
        };
        let Some(mut lease) = lease else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            self.stamp(&mut lease, true);
            let params = PostParams {
                field_manager: Some(STATUS_FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            return match self.api.create(&params, &lease).await {
                Ok(l) => {
                    self.held = Some(l);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        match step(
            lease.spec.as_ref(),
            &rv,
            &self.me,
            &mut self.observed,
            now,
            self.timing.duration,
        ) {
            Step::Wait => Ok(false),
            Step::Renew => {
                self.stamp(&mut lease, false);
                self.write(lease).await
            }
            Step::Take => {
                self.stamp(&mut lease, true);
                let won = self.write(lease).await?;
                if won {
                    tracing::info!(holder = %self.me, "kubernetes: took the status Lease; this agent writes SondeCheck statuses");
                }
                Ok(won)
            }
        }
    }

    /// Runs the election, telling `leading` whether this agent leads.
    async fn run(mut self, leading: watch::Sender<bool>) {
        let mut leadership = Leadership::new(self.timing);
        loop {
            let start = Instant::now();
            // A call that hangs must not keep a leader past its deadline.
            let round = match tokio::time::timeout_at(leadership.deadline(start), self.attempt()).await {
                Ok(Ok(true)) => Round::Held,
                Ok(Ok(false)) => Round::NotHeld,
                Ok(Err(e)) => Round::Failed(e.to_string()),
                Err(_) => Round::Failed("the API server did not answer in time".to_string()),
            };
            let jitter = self.timing.jitter.mul_f64(fastrand::f64());
            let next = leadership.after(start, Instant::now(), &round, jitter);
            if let Round::Failed(e) = &round {
                if next.stepped_down {
                    tracing::warn!(error = %e, "kubernetes: could not renew the status Lease in time; no longer writing SondeCheck statuses");
                    self.held = None;
                } else {
                    tracing::warn!(error = %e, "kubernetes: the status Lease could not be read or written (does the Role allow leases get, create and update in the agent's namespace?)");
                }
            }
            leading.send_if_modified(|l| std::mem::replace(l, next.leading) != next.leading);
            tokio::time::sleep_until(next.at).await;
        }
    }
}

/// What came of one round of the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Round {
    /// This agent holds the Lease (created, taken or renewed).
    Held,
    /// Another holds it, or a write of ours lost (a `409`).
    NotHeld,
    /// The API server could not be asked, or did not answer in time.
    Failed(String),
}

/// What to do after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    /// Whether this agent leads (writes statuses) until the next round.
    pub(crate) leading: bool,
    /// When the next round starts.
    pub(crate) at: Instant,
    /// Whether this round ended a leadership that could not be renewed in
    /// time.
    pub(crate) stepped_down: bool,
}

/// Whether this agent leads and when it acts next: a pure state machine
/// over the rounds' results and the `Instant`s they started and ended at.
/// A holder renews every [`LeaseTiming::renew_every`] and leads until
/// [`LeaseTiming::renew_deadline`] after its last successful round, so it
/// stops before anyone else may take the Lease over; a non-holder reads
/// the Lease every [`LeaseTiming::retry_every`] plus jitter.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leadership {
    timing: LeaseTiming,
    /// Until when this agent leads without another renewal.
    lead_until: Option<Instant>,
}

impl Leadership {
    /// Not leading.
    pub(crate) fn new(timing: LeaseTiming) -> Self {
        Self {
            timing,
            lead_until: None,
        }
    }

    /// The latest a round started at `start` may end: a leader's deadline,
    /// or one renewal period.
    pub(crate) fn deadline(&self, start: Instant) -> Instant {
        self.lead_until.unwrap_or(start + self.timing.renew_every)
    }

    /// After a round started at `start` ended at `now` with `round`;
    /// `jitter` is the random part of a non-holder's wait.
    pub(crate) fn after(&mut self, start: Instant, now: Instant, round: &Round, jitter: Duration) -> Next {
        let mut stepped_down = false;
        let wait = match round {
            Round::Held => {
                self.lead_until = Some(start + self.timing.renew_deadline);
                self.timing.renew_every
            }
            Round::NotHeld => {
                self.lead_until = None;
                self.timing.retry_every + jitter
            }
            Round::Failed(_) => {
                if self.lead_until.is_some_and(|t| now >= t) {
                    self.lead_until = None;
                    stepped_down = true;
                }
                match self.lead_until {
                    Some(_) => self.timing.renew_every / 5,
                    None => self.timing.retry_every + jitter,
                }
            }
        };
        // A leader wakes by its deadline at the latest: the round then
        // times out at once and it steps down.
        let mut at = now + wait;
        if let Some(t) = self.lead_until {
            at = at.min(t);
        }
        Next {
            leading: self.lead_until.is_some(),
            at,
            stepped_down,
        }
    }
}

/// A running election ([`elect`]); dropping it stops it (the Lease is left
/// to expire).
pub struct Election {
    /// Whether this agent holds the Lease.
    pub leading: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Election {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the election for the Lease [`LEASE_NAME`] in `namespace` as
/// `holder` (the node's name).
pub fn elect(client: kube::Client, namespace: &str, holder: &str, timing: LeaseTiming) -> Election {
    let (tx, leading) = watch::channel(false);
    let elector = Elector {
        api: Api::namespaced(client, namespace),
        me: holder.to_string(),
        timing,
        held: None,
        observed: None,
    };
    Election {
        leading,
        task: tokio::spawn(elector.run(tx)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(30),
            ..LeaseSpec::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_taken_only_when_unchanged_for_its_duration() {
        let d = Duration::from_secs(30);
        let mut seen = None;
        let t0 = Instant::now();
        assert_eq!(step(Some(&lease("me")), "1", "me", &mut seen, t0, d), Step::Renew);
        assert_eq!(step(Some(&lease("")), "1", "me", &mut seen, t0, d), Step::Take);
        assert_eq!(step(None, "1", "me", &mut seen, t0, d), Step::Take);
        assert_eq!(step(Some(&lease("a")), "1", "me", &mut seen, t0, d), Step::Wait);
        let t1 = t0 + Duration::from_secs(29);
        assert_eq!(step(Some(&lease("a")), "1", "me", &mut seen, t1, d), Step::Wait);
        // Renewed meanwhile: the clock starts again.
        let t2 = t0 + Duration::from_secs(40);
        assert_eq!(step(Some(&lease("a")), "2", "me", &mut seen, t2, d), Step::Wait);
        assert_eq!(
            step(Some(&lease("a")), "2", "me", &mut seen, t2 + Duration::from_secs(29), d),
            Step::Wait
        );
        assert_eq!(
            step(Some(&lease("a")), "2", "me", &mut seen, t2 + d, d),
            Step::Take,
            "unchanged for a whole lease duration"
        );
        // The lease's own duration wins over the reader's default.
        let mut long = lease("a");
        long.lease_duration_seconds = Some(300);
        let mut seen = None;
        assert_eq!(step(Some(&long), "5", "me", &mut seen, t0, d), Step::Wait);
        assert_eq!(step(Some(&long), "5", "me", &mut seen, t0 + d, d), Step::Wait);
    }

    fn timing() -> LeaseTiming {
        LeaseTiming {
            jitter: Duration::ZERO,
            ..LeaseTiming::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_renews_before_expiry_and_steps_down_before_anyone_may_take_over() {
        let t = timing();
        let mut l = Leadership::new(t);
        let t0 = Instant::now();
        assert_eq!(
            l.deadline(t0),
            t0 + t.renew_every,
            "a non-holder's round lasts one period"
        );
        let next = l.after(t0, t0, &Round::Held, Duration::ZERO);
        assert!(next.leading && !next.stepped_down);
        assert_eq!(next.at, t0 + t.renew_every, "renewed every renew_every");
        assert!(next.at < t0 + t.duration);
        assert_eq!(l.deadline(next.at), t0 + t.renew_deadline);
        // Renewals fail: it goes on leading, retrying often, until its deadline.
        tokio::time::advance(t.renew_every).await;
        let now = Instant::now();
        let next = l.after(now, now, &Round::Failed("503".into()), Duration::ZERO);
        assert!(next.leading);
        assert_eq!(next.at, now + t.renew_every / 5);
        tokio::time::advance(t.renew_deadline - t.renew_every).await;
        let now = Instant::now();
        let next = l.after(now, now, &Round::Failed("timeout".into()), Duration::ZERO);
        assert!(!next.leading && next.stepped_down);
        assert!(t.renew_deadline < t.duration, "stepped down before the Lease expires");
        assert_eq!(next.at, now + t.retry_every);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_or_another_holder_ends_the_lead() {
        let t = timing();
        let mut l = Leadership::new(t);
        let t0 = Instant::now();
        assert!(l.after(t0, t0, &Round::Held, Duration::ZERO).leading);
        tokio::time::advance(t.renew_every).await;
        let now = Instant::now();
        let next = l.after(now, now, &Round::NotHeld, Duration::from_secs(3));
        assert!(!next.leading && !next.stepped_down);
        assert_eq!(
            next.at,
            now + t.retry_every + Duration::from_secs(3),
            "reads again after retry_every and jitter"
        );
        // A failure while not leading only waits.
        let next = l.after(now, now, &Round::Failed("503".into()), Duration::ZERO);
        assert!(!next.leading && !next.stepped_down);
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_or_expired_lease_is_acquired_and_a_lost_renewal_is_another_s() {
        let d = Duration::from_secs(30);
        let mut seen = None;
        let t0 = Instant::now();
        // Free: no holder.
        assert_eq!(
            step(Some(&LeaseSpec::default()), "1", "me", &mut seen, t0, d),
            Step::Take
        );
        // Held by another: wait, however old its renewTime says it is.
        let mut old = lease("a");
        old.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(step(Some(&old), "7", "me", &mut seen, t0, d), Step::Wait);
        tokio::time::advance(d).await;
        assert_eq!(step(Some(&old), "7", "me", &mut seen, Instant::now(), d), Step::Take);
    }
}
