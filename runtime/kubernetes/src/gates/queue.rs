//! The per-Pod, latest-wins write queue of gate conditions, as a pure
//! state machine: its inputs are the conditions wanted, the Pods as the
//! store holds them, the answers of finished writes and the time
//! (`Instant`s handed in); its outputs are the patches to send now and
//! when to look again. The controller owns one and performs what it says.
//!
//! - **Latest wins**: a condition wanted again before it was sent replaces
//!   the queued one; a Pod's gates share one patch.
//! - **One write per Pod at a time**: what is wanted while a Pod's patch is
//!   in flight waits for its answer.
//! - **Backoff**: after a conflict or a server error the Pod's next write
//!   waits [`backoff`](crate::writer::backoff), doubling up to its bound; after a 403, slowly.
//! - **UID**: a write is for one Pod UID; a Pod gone or recreated under the
//!   same name drops the old one's writes.
//! - **Rate limit**: every patch takes a token of the agent-wide bucket, in
//!   the order Pods were queued.

use crate::view::{Cond, PodKey, PodView};
use crate::writer::{Outcome, TokenBucket, backoff_with};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// The conditions waiting to be written on one Pod (latest wins).
#[derive(Debug)]
struct PendingWrite {
    uid: String,
    conds: BTreeMap<String, Cond>,
    attempts: u32,
    not_before: Option<Instant>,
}

impl PendingWrite {
    fn new(uid: &str) -> Self {
        Self {
            uid: uid.to_string(),
            conds: BTreeMap::new(),
            attempts: 0,
            not_before: None,
        }
    }
}

/// The conditions the agent wrote on a Pod since its last watch event
/// (so they are not written twice before the watch shows them).
#[derive(Debug)]
struct Written {
    uid: String,
    conds: BTreeMap<String, Cond>,
}

/// A patch to send: the conditions of Pod `pod` (of `uid`) that differ
/// from what it has, each with whether its status flips.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Outgoing {
    /// The Pod.
    pub(crate) pod: PodKey,
    /// Its UID, the patch's precondition.
    pub(crate) uid: String,
    /// Condition type, condition, whether its status flips.
    pub(crate) conds: Vec<(String, Cond, bool)>,
}

/// What a sent patch came to.
#[derive(Debug)]
pub(crate) struct Done {
    /// The Pod.
    pub(crate) pod: PodKey,
    /// The UID it was sent for.
    pub(crate) uid: String,
    /// The conditions it carried.
    pub(crate) sent: Vec<(String, Cond)>,
    /// The API server's answer.
    pub(crate) outcome: Outcome,
}

/// What the queue made of a finished write, for the log and the stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finished {
    /// Written.
    Written,
    /// The Pod is gone (or another of its name): its writes are dropped.
    Gone,
    /// Failed: the Pod's next write waits this long (none when nothing is
    /// left to write).
    Failed(Option<Duration>),
}

/// The write queue ([module docs](self)).
#[derive(Debug)]
pub(crate) struct WriteQueue {
    pending: HashMap<PodKey, PendingWrite>,
    order: VecDeque<PodKey>,
    in_flight: HashSet<PodKey>,
    written: HashMap<PodKey, Written>,
    bucket: TokenBucket,
    /// Whether backoffs get their random spread (off in tests).
    jitter: bool,
}

impl WriteQueue {
    /// An empty queue under a rate limit of `qps` patches a second, up to
    /// `burst` at once.
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        Self {
            pending: HashMap::new(),
            order: VecDeque::new(),
            in_flight: HashSet::new(),
            written: HashMap::new(),
            bucket: TokenBucket::new(qps, burst),
            jitter: true,
        }
    }

    /// `view` with the conditions written since the Pod's last watch event.
    pub(crate) fn overlay(&self, view: &mut PodView) {
        if let Some(w) = self.written.get(&view.key).filter(|w| w.uid == view.uid) {
            view.conditions
                .extend(w.conds.iter().map(|(t, c)| (t.clone(), c.clone())));
        }
    }

    /// Queues `cond` for gate `ctype` of Pod `key` (of `uid`), replacing
    /// what was queued; nothing when the Pod (`stored`, as the store holds
    /// it) has it already.
    pub(crate) fn want(&mut self, key: &PodKey, uid: &str, ctype: &str, cond: Cond, stored: Option<PodView>) {
        let on_pod = stored
            .map(|mut p| {
                self.overlay(&mut p);
                p
            })
            .filter(|p| p.uid == uid)
            .and_then(|p| p.conditions.get(ctype).cloned());
        let same = on_pod.as_ref() == Some(&cond);
        let p = self
            .pending
            .entry(key.clone())
            .or_insert_with(|| PendingWrite::new(uid));
        if p.uid != uid {
            *p = PendingWrite::new(uid);
        }
        if same {
            p.conds.remove(ctype);
        } else {
            p.conds.insert(ctype.to_string(), cond);
            if !self.order.contains(key) {
                self.order.push_back(key.clone());
            }
        }
        if p.conds.is_empty() && !self.in_flight.contains(key) {
            self.pending.remove(key);
        }
    }

    /// The patches due at `now` as the rate limit allows (each Pod's now in
    /// flight), and when to pump again at the latest; `stored` is a Pod as
    /// the store holds it.
    pub(crate) fn pump(
        &mut self,
        now: Instant,
        stored: impl Fn(&PodKey) -> Option<PodView>,
    ) -> (Vec<Outgoing>, Option<Instant>) {
        let mut sends = Vec::new();
        let mut wake: Option<Instant> = None;
        let mut i = 0;
        while i < self.order.len() {
            let key = self.order[i].clone();
            if self.in_flight.contains(&key) {
                i += 1;
                continue;
            }
            let Some(p) = self.pending.get(&key) else {
                self.order.remove(i);
                continue;
            };
            if let Some(t) = p.not_before
                && t > now
            {
                wake = Some(wake.map_or(t, |w| w.min(t)));
                i += 1;
                continue;
            }
            let pod = stored(&key)
                .map(|mut pod| {
                    self.overlay(&mut pod);
                    pod
                })
                .filter(|pod| pod.uid == p.uid);
            let Some(pod) = pod else {
                // The Pod went (or came back as another): nothing to write.
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            };
            let conds = differences(&pod, &p.conds);
            if conds.is_empty() {
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            }
            if let Err(at) = self.bucket.take(now) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
                break;
            }
            let uid = p.uid.clone();
            self.order.remove(i);
            self.in_flight.insert(key.clone());
            sends.push(Outgoing { pod: key, uid, conds });
        }
        (sends, wake)
    }

    /// Takes the answer of a sent patch at `now`; `stored_uid` is the UID
    /// of the Pod of that name the store holds.
    pub(crate) fn on_done(&mut self, done: &Done, now: Instant, stored_uid: Option<&str>) -> Finished {
        self.in_flight.remove(&done.pod);
        let finished = match &done.outcome {
            Outcome::Written => {
                self.on_written(done, stored_uid);
                Finished::Written
            }
            Outcome::Gone => {
                if self.pending.get(&done.pod).is_some_and(|p| p.uid == done.uid) {
                    self.pending.remove(&done.pod);
                }
                Finished::Gone
            }
            Outcome::Forbidden(_) | Outcome::Retry(_) => Finished::Failed(self.on_failed(done, now)),
        };
        if let Some(p) = self.pending.get(&done.pod) {
            if p.conds.is_empty() {
                self.pending.remove(&done.pod);
            } else if !self.order.contains(&done.pod) {
                self.order.push_back(done.pod.clone());
            }
        }
        finished
    }

    fn on_written(&mut self, done: &Done, stored_uid: Option<&str>) {
        if stored_uid == Some(done.uid.as_str()) {
            let w = self.written.entry(done.pod.clone()).or_insert_with(|| Written {
                uid: done.uid.clone(),
                conds: BTreeMap::new(),
            });
            if w.uid != done.uid {
                w.uid = done.uid.clone();
                w.conds.clear();
            }
            w.conds.extend(done.sent.iter().cloned());
        }
        if let Some(p) = self.pending.get_mut(&done.pod) {
            p.attempts = 0;
            p.not_before = None;
            // What changed meanwhile stays queued (latest wins).
            p.conds
                .retain(|t, c| !done.sent.iter().any(|(st, sc)| st == t && sc == c));
        }
    }

    fn on_failed(&mut self, done: &Done, now: Instant) -> Option<Duration> {
        let p = self.pending.get_mut(&done.pod)?;
        p.attempts += 1;
        let spread = if self.jitter { fastrand::f64() } else { 0.0 };
        let wait = backoff_with(&done.outcome, p.attempts, spread);
        p.not_before = Some(now + wait);
        Some(wait)
    }

    /// A watch event of Pod `key`, after the store took it (`stored_uid`:
    /// the UID it holds now, if any): the store shows what was written,
    /// and a Pod gone or recreated under the same name has nothing of the
    /// old one's written.
    pub(crate) fn on_pod_event(&mut self, key: &PodKey, stored_uid: Option<&str>) {
        self.written.remove(key);
        if self
            .pending
            .get(key)
            .is_some_and(|p| Some(p.uid.as_str()) != stored_uid)
        {
            self.pending.remove(key);
        }
    }

    /// A (re-)list of the Pods: the store holds what the API server has
    /// now, newer than anything written before it; `stored_uid` says which
    /// Pods it holds.
    pub(crate) fn on_relist(&mut self, stored_uid: impl Fn(&PodKey) -> Option<String>) {
        self.written.clear();
        self.pending
            .retain(|key, p| stored_uid(key).as_deref() == Some(p.uid.as_str()));
    }
}

/// The queued conditions that differ from `pod`'s, each with whether its
/// status flips.
fn differences(pod: &PodView, queued: &BTreeMap<String, Cond>) -> Vec<(String, Cond, bool)> {
    queued
        .iter()
        .filter(|(t, c)| pod.conditions.get(*t) != Some(*c))
        .map(|(t, c)| {
            let flip = pod.conditions.get(t).is_none_or(|old| old.status != c.status);
            (t.clone(), c.clone(), flip)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::CondStatus;
    use crate::writer::{FIRST_BACKOFF, FORBIDDEN_BACKOFF, MAX_BACKOFF, MAX_FORBIDDEN_BACKOFF};

    const GATE: &str = "sonde.dev/ready";

    fn key(name: &str) -> PodKey {
        ("shop".into(), name.into())
    }

    fn pod(name: &str, uid: &str) -> PodView {
        PodView {
            key: key(name),
            uid: uid.into(),
            ..PodView::default()
        }
    }

    fn cond(status: CondStatus, message: &str) -> Cond {
        Cond {
            status,
            reason: "CheckPassed".into(),
            message: message.into(),
        }
    }

    fn queue(qps: f64, burst: u32) -> WriteQueue {
        WriteQueue {
            jitter: false,
            ..WriteQueue::new(qps, burst)
        }
    }

    /// Every Pod of `names` in the store, of UID `u1`.
    fn store(names: &'static [&'static str]) -> impl Fn(&PodKey) -> Option<PodView> {
        move |k: &PodKey| names.contains(&k.1.as_str()).then(|| pod(&k.1, "u1"))
    }

    fn done(send: &Outgoing, outcome: Outcome) -> Done {
        Done {
            pod: send.pod.clone(),
            uid: send.uid.clone(),
            sent: send.conds.iter().map(|(t, c, _)| (t.clone(), c.clone())).collect(),
            outcome,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_latest_condition_wins_and_one_patch_carries_it() {
        let mut q = queue(5.0, 10);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::True, "200"),
            Some(pod("a", "u1")),
        );
        let (sends, wake) = q.pump(Instant::now(), store(&["a"]));
        assert_eq!(
            sends,
            vec![Outgoing {
                pod: key("a"),
                uid: "u1".into(),
                conds: vec![(GATE.into(), cond(CondStatus::True, "200"), true)],
            }]
        );
        assert_eq!(wake, None);
        // Wanting what the Pod has queues nothing.
        let mut q = queue(5.0, 10);
        let mut has = pod("a", "u1");
        has.conditions.insert(GATE.into(), cond(CondStatus::True, "200"));
        q.want(&key("a"), "u1", GATE, cond(CondStatus::True, "200"), Some(has.clone()));
        assert!(q.pump(Instant::now(), move |_| Some(has.clone())).0.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_has_one_write_in_flight_and_the_next_waits_for_its_answer() {
        let mut q = queue(5.0, 10);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        let (sends, _) = q.pump(Instant::now(), store(&["a"]));
        assert_eq!(sends.len(), 1);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::True, "200"),
            Some(pod("a", "u1")),
        );
        assert!(q.pump(Instant::now(), store(&["a"])).0.is_empty(), "in flight");
        let f = q.on_done(&done(&sends[0], Outcome::Written), Instant::now(), Some("u1"));
        assert_eq!(f, Finished::Written);
        let (next, _) = q.pump(Instant::now(), store(&["a"]));
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].conds[0].1, cond(CondStatus::True, "200"));
        // What was written counts as on the Pod until its watch event.
        q.on_done(&done(&next[0], Outcome::Written), Instant::now(), Some("u1"));
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::True, "200"),
            Some(pod("a", "u1")),
        );
        assert!(q.pump(Instant::now(), store(&["a"])).0.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn conflicts_and_server_errors_back_off_doubling_up_to_the_bound() {
        let mut q = queue(1000.0, 1000);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        let mut waits = Vec::new();
        for attempt in 0..10 {
            let now = Instant::now();
            let (sends, _) = q.pump(now, store(&["a"]));
            assert_eq!(sends.len(), 1, "attempt {attempt}");
            let outcome = if attempt % 2 == 0 {
                Outcome::Retry("409 conflict".into())
            } else {
                Outcome::Retry("500 internal".into())
            };
            let Finished::Failed(Some(wait)) = q.on_done(&done(&sends[0], outcome), now, Some("u1")) else {
                panic!("a retry");
            };
            waits.push(wait);
            // Nothing before the backoff passes; the pump says when.
            let (early, wake) = q.pump(now + wait - Duration::from_millis(1), store(&["a"]));
            assert!(early.is_empty());
            assert_eq!(wake, Some(now + wait));
            tokio::time::advance(wait).await;
        }
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert_eq!(waits[2], FIRST_BACKOFF * 4);
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF));
        // And goes on at the bound.
        let (sends, _) = q.pump(Instant::now(), store(&["a"]));
        q.on_done(
            &done(&sends[0], Outcome::Retry("500".into())),
            Instant::now(),
            Some("u1"),
        );
        tokio::time::advance(MAX_BACKOFF).await;
        let (sends, _) = q.pump(Instant::now(), store(&["a"]));
        assert_eq!(sends.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_forbidden_write_is_retried_slowly() {
        let mut q = queue(5.0, 10);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        let now = Instant::now();
        let (sends, _) = q.pump(now, store(&["a"]));
        let f = q.on_done(&done(&sends[0], Outcome::Forbidden("rbac".into())), now, Some("u1"));
        assert_eq!(f, Finished::Failed(Some(FORBIDDEN_BACKOFF)));
        let (none, wake) = q.pump(now, store(&["a"]));
        assert!(none.is_empty());
        assert_eq!(wake, Some(now + FORBIDDEN_BACKOFF));
        tokio::time::advance(FORBIDDEN_BACKOFF).await;
        let mut last = Duration::ZERO;
        for _ in 0..10 {
            let (sends, _) = q.pump(Instant::now() + last, store(&["a"]));
            assert_eq!(sends.len(), 1);
            let Finished::Failed(Some(w)) = q.on_done(
                &done(&sends[0], Outcome::Forbidden("rbac".into())),
                Instant::now() + last,
                Some("u1"),
            ) else {
                panic!("a retry");
            };
            last += w;
            assert!(w <= MAX_FORBIDDEN_BACKOFF);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_uid_drops_the_old_pod_s_writes() {
        let mut q = queue(5.0, 10);
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        // Recreated under the same name before the write went out.
        let (sends, wake) = q.pump(Instant::now(), |k: &PodKey| Some(pod(&k.1, "u2")));
        assert!(sends.is_empty() && wake.is_none());
        assert!(q.pending.is_empty() && q.order.is_empty());
        // Or the watch shows the new one first.
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        q.on_pod_event(&key("a"), Some("u2"));
        assert!(q.pump(Instant::now(), store(&["a"])).0.is_empty());
        // Or the write answers that the Pod of that UID is gone.
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        let (sends, _) = q.pump(Instant::now(), store(&["a"]));
        assert_eq!(
            q.on_done(&done(&sends[0], Outcome::Gone), Instant::now(), None),
            Finished::Gone
        );
        assert!(q.pump(Instant::now(), store(&["a"])).0.is_empty());
        // A write for the new UID replaces the old one's.
        q.want(
            &key("a"),
            "u1",
            GATE,
            cond(CondStatus::False, "503"),
            Some(pod("a", "u1")),
        );
        q.want(
            &key("a"),
            "u2",
            GATE,
            cond(CondStatus::True, "200"),
            Some(pod("a", "u2")),
        );
        let (sends, _) = q.pump(Instant::now(), |k: &PodKey| Some(pod(&k.1, "u2")));
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].uid, "u2");
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limit_sends_in_queue_order() {
        let mut q = queue(1.0, 2);
        for name in ["c", "a", "b"] {
            q.want(
                &key(name),
                "u1",
                GATE,
                cond(CondStatus::True, "200"),
                Some(pod(name, "u1")),
            );
        }
        let t0 = Instant::now();
        let (sends, wake) = q.pump(t0, store(&["a", "b", "c"]));
        let names: Vec<&str> = sends.iter().map(|s| s.pod.1.as_str()).collect();
        assert_eq!(names, ["c", "a"], "the burst, in the order queued");
        assert_eq!(wake, Some(t0 + Duration::from_secs(1)));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(q.pump(Instant::now(), store(&["a", "b", "c"])).0.is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        let (sends, wake) = q.pump(Instant::now(), store(&["a", "b", "c"]));
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].pod, key("b"));
        assert_eq!(wake, None);
    }
}
