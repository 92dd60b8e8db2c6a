//! From probe states to gate conditions: each state change (or refresh of
//! a holding gate's message) becomes the condition wanted on its Pod, queued
//! in the [`WriteQueue`](super::queue::WriteQueue) and sent as the queue says.

use super::plan::Binding;
use super::queue::{Done, Finished, Outgoing};
use super::{Reconciler, pod_ref};
use crate::crd::GATE_FIELD_MANAGER;
use crate::crd::Mode;
use crate::events::pod_reference;
use crate::view::{Cond, CondStatus, PodKey, PodView, condition_type};
use crate::writer::{Outcome, patch_body};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use sonde_core::results::StateChange;
use sonde_sandbox::verdict::{Reason, Status};
use std::sync::atomic::Ordering;
use tokio::time::Instant;

impl Reconciler {
    pub(super) async fn on_change(&mut self, c: &StateChange) {
        let Some(b) = self.bindings.get(&*c.probe).cloned() else {
            return;
        };
        let timed_out = self
            .results
            .get(&c.probe)
            .and_then(|v| v.last)
            .is_some_and(|o| o.result.reason == Some(Reason::Timeout));
        let cond = Cond::of_state(c.to, timed_out, &c.message);
        if let Some(pod) = self.view(&b.pod)
            && c.to != Status::Unknown
        {
            let message = format!("{}: {}", b.check, cond.message);
            let about = pod_reference(&pod.key.0, &pod.key.1, &pod.uid);
            self.events
                .record(about, cond.status == CondStatus::False, &cond.reason, &message);
        }
        let passed = cond.status == CondStatus::True;
        self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
        if b.mode == Mode::StartupOnly && passed {
            // Set once and left: the probe goes, the condition stays.
            self.started.insert((b.uid.clone(), b.check.clone()));
            self.remove_probe(&c.probe).await;
            self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        }
    }

    /// After missed state changes: every gate's condition from its probe's state.
    pub(super) fn resync_states(&mut self) {
        let all: Vec<(String, Binding)> = self.bindings.iter().map(|(n, b)| (n.clone(), b.clone())).collect();
        for (name, b) in all {
            let Some(view) = self.results.get(&name) else { continue };
            if view.stale {
                continue;
            }
            let (timed_out, message) = view.last.as_ref().map_or((false, String::new()), |o| {
                (o.result.reason == Some(Reason::Timeout), o.result.message.clone())
            });
            let cond = Cond::of_state(view.state, timed_out, &message);
            self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
        }
    }

    /// Each gate whose status holds takes the message of its probe's
    /// latest run (see [`Cond::latest`]): `kubectl describe pod` says why
    /// now, not why when the status last flipped. Called every
    /// `kubernetes.message_refresh`, so a Pod gets at most one such write
    /// per period (its gates' changes share one patch), and none while the
    /// messages are the same.
    pub(super) fn refresh_messages(&mut self) {
        let all: Vec<(String, Binding)> = self.bindings.iter().map(|(n, b)| (n.clone(), b.clone())).collect();
        for (name, b) in all {
            let Some(view) = self.results.get(&name).filter(|v| !v.stale) else {
                continue;
            };
            if let Some(cond) = view.last.as_ref().and_then(|o| Cond::latest(view.state, &o.result)) {
                self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
            }
        }
    }

    /// Queues `cond` for gate `ctype` of Pod `key` (of `uid`), replacing
    /// what was queued; nothing when the Pod has it already.
    pub(super) fn want(&mut self, key: &PodKey, uid: &str, ctype: &str, cond: Cond) {
        let stored = self.stored(key);
        self.writes.want(key, uid, ctype, cond, stored);
    }

    /// Pod `key` as the store holds it (without what was written since).
    pub(super) fn stored(&self, key: &PodKey) -> Option<PodView> {
        PodView::of(&*self.pods.get(&pod_ref(key))?)
    }

    /// Sends what is due, as the rate limit allows.
    pub(super) fn pump(&mut self) {
        let pods = self.pods.clone();
        let stored = |key: &PodKey| PodView::of(&*pods.get(&pod_ref(key))?);
        let (sends, wake) = self.writes.pump(Instant::now(), stored);
        if let Some(at) = wake {
            self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
        }
        for send in sends {
            self.send(send);
        }
    }

    pub(super) fn send(
        &self,
        Outgoing {
            pod: key,
            uid,
            conds: diffs,
        }: Outgoing,
    ) {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let conds: Vec<(&str, &Cond, bool)> = diffs.iter().map(|(t, c, f)| (t.as_str(), c, *f)).collect();
        let body = patch_body(&uid, &conds, &now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let tx = self.done_tx.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            stats.patch_attempts.fetch_add(1, Ordering::Relaxed);
            let params = PatchParams {
                field_manager: Some(GATE_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = api
                .patch_status(&key.1, &params, &Patch::Strategic(&body))
                .await
                .map(|_| ());
            let outcome = Outcome::of(&result);
            let sent = diffs.into_iter().map(|(t, c, _)| (t, c)).collect();
            // The controller gone, nobody is left to tell.
            let _ = tx.send(Done {
                pod: key,
                uid,
                sent,
                outcome,
            });
        });
    }

    pub(super) fn on_done(&mut self, done: Done) {
        let stored = self.pods.get(&pod_ref(&done.pod)).and_then(|p| p.metadata.uid.clone());
        let (namespace, name) = &done.pod;
        match (
            self.writes.on_done(&done, Instant::now(), stored.as_deref()),
            &done.outcome,
        ) {
            (Finished::Written, _) => {
                self.stats.patches.fetch_add(1, Ordering::Relaxed);
            }
            (Finished::Gone, _) => {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%namespace, pod = %name, "the Pod is gone (or was recreated); its condition is not written");
            }
            (Finished::Failed(wait), Outcome::Forbidden(message)) => {
                self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
                if let Some(wait) = wait {
                    tracing::error!(%namespace, pod = %name, error = %message, retry_in_s = wait.as_secs(), "writing the gate condition was forbidden: check the ClusterRole (pods/status patch) and the admission policy (own node only)");
                }
            }
            (Finished::Failed(wait), outcome) => {
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
                if let (Some(wait), Outcome::Retry(message)) = (wait, outcome) {
                    tracing::warn!(%namespace, pod = %name, error = %message, retry_in_ms = wait.as_millis() as u64, "writing the gate condition failed; retrying");
                }
            }
        }
    }
}
