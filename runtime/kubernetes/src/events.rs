//! Kubernetes Events the agent records (events.k8s.io/v1, through
//! kube-runtime's [`Recorder`]): one on a Pod per gate transition, one on a
//! SondeCheck refused (naming what was refused), one on a Pod for an
//! unknown override annotation. Events are best-effort: held to the
//! agent's `kubernetes.qps`/`burst` apart from condition writes, dropped
//! (and counted) past that rate, never retried; a failed one is logged and
//! counted. The recorder folds a repeat of the same reason on the same
//! object within 6 minutes into the first Event's series (its count and
//! last-seen time, which `kubectl describe` shows as `(x3 over 5m)`); a
//! node problem's Event folds only into one of the same reason and message
//! ([`EventSink::record_distinct`]), as node-problem-detector's do.

use super::stats::Stats;
use super::writer::TokenBucket;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The controller Events are reported by (`kubectl describe`'s "From").
pub(crate) const REPORTER: &str = "sonde";
/// The action of every Event: the agent checked the object.
const ACTION: &str = "Check";
/// The longest note the events.k8s.io API takes, in bytes.
const MAX_NOTE: usize = 1024;

/// The most distinct messages [`EventSink::record_distinct`] keeps a
/// recorder for; past it the least recent goes (its next repeat is a new
/// Event, not a count).
const MAX_DISTINCT: usize = 256;

/// Records Events within a rate, in the background.
pub(crate) struct EventSink {
    recorder: Recorder,
    /// One recorder per (reason, message) of node problems, most recent
    /// last: kube-runtime's recorder folds every Event of one reason into
    /// the first one's series whatever its note, where node-problem-
    /// detector (client-go's recorder) folds only identical ones.
    distinct: VecDeque<((String, String), Recorder)>,
    client: kube::Client,
    reporter: Reporter,
    bucket: TokenBucket,
    stats: Arc<Stats>,
}

impl EventSink {
    /// A sink of `node`'s agent, at most `qps` Events a second after a
    /// `burst`, counting into `stats`.
    pub(crate) fn new(client: kube::Client, node: &str, qps: f64, burst: u32, stats: Arc<Stats>) -> Self {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance: Some(node.into()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            distinct: VecDeque::new(),
            client,
            reporter,
            bucket: TokenBucket::new(qps, burst),
            stats,
        }
    }

    /// Records an Event on `regarding` as [`EventSink::record`] does, one
    /// of its own for each distinct message of a reason: only a repeat of
    /// the same message adds to a series, as node-problem-detector's do.
    pub(crate) fn record_distinct(&mut self, regarding: ObjectReference, warning: bool, reason: &str, message: &str) {
        let key = (reason.to_string(), message.to_string());
        let recorder = match self.distinct.iter().position(|(k, _)| *k == key) {
            Some(i) => self.distinct.remove(i).map(|(_, r)| r),
            None => None,
        }
        .unwrap_or_else(|| Recorder::new(self.client.clone(), self.reporter.clone()));
        if self.distinct.len() == MAX_DISTINCT {
            self.distinct.pop_front();
        }
        self.distinct.push_back((key, recorder.clone()));
        self.publish(recorder, regarding, warning, reason, message);
    }

    /// Records an Event on `regarding` (`warning` or normal), in the
    /// background; past the rate it is dropped and counted.
    pub(crate) fn record(&mut self, regarding: ObjectReference, warning: bool, reason: &str, message: &str) {
        let recorder = self.recorder.clone();
        self.publish(recorder, regarding, warning, reason, message);
    }

    fn publish(&mut self, recorder: Recorder, regarding: ObjectReference, warning: bool, reason: &str, message: &str) {
        if self.bucket.take(tokio::time::Instant::now()).is_err() {
            self.stats.events_dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(namespace = ?regarding.namespace, name = ?regarding.name, reason, "event dropped: over the rate");
            return;
        }
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note(message)),
            action: ACTION.into(),
            secondary: None,
        };
        let stats = self.stats.clone();
        tokio::spawn(async move {
            match recorder.publish(&event, &regarding).await {
                Ok(()) => {
                    stats.events_sent.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    stats.events_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%error, namespace = ?regarding.namespace, name = ?regarding.name, reason = %event.reason, "cannot record a Kubernetes Event; does the ClusterRole allow events.k8s.io events create and patch?");
                }
            }
        });
    }
}

/// `message` cut to [`MAX_NOTE`] bytes on a char boundary.
fn note(message: &str) -> String {
    super::view::cut(message, MAX_NOTE)
}

/// The reference to a Pod an Event is about.
pub(crate) fn pod_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_on_a_char_boundary() {
        assert_eq!(note("short"), "short");
        let long = "é".repeat(MAX_NOTE);
        let cut = note(&long);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with("..."), "{}", cut.len());
    }
}
