//! The Secrets of the checks this node's Pods name: each reference
//! registered in the [`SecretBook`](crate::secrets::SecretBook) when a Pod's gates are reconciled, the
//! reads it hands out started in spawned tasks (the controller's task never
//! waits on the API server), what they found recorded, and the checks whose
//! references changed state reconciled, with an Event on each when a
//! reference loses or regains its value.

use super::{Reconciler, key_of};
use crate::crd::SondeCheck;
use crate::secrets::{CellKey, Held, Outcome, Problem, REREAD_EVERY, SecretKey, check_refs, read};
use crate::view::{PodKey, PodView};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use tokio::time::Instant;

/// What a read of a Secret found, reported back to the controller's task.
pub(crate) struct SecretRead {
    secret: SecretKey,
    outcome: Outcome,
}

impl Reconciler {
    /// The references of the checks `pod`'s gates name, each registered
    /// and as its gates see it.
    pub(super) fn hold_secrets(&mut self, pod: Option<&PodView>) -> HashMap<CellKey, Held> {
        let mut held = HashMap::new();
        let Some(pod) = pod else { return held };
        let now = Instant::now();
        for key in self.wanted_refs(pod) {
            let h = self.secrets.want(&key, now);
            held.insert(key, h);
        }
        held
    }

    /// The references of the checks `pod`'s gates name, in a namespace
    /// with a tenant (those of malformed `secretRefs` left out: the check
    /// is refused; those of a StartupOnly gate that passed: it runs no more).
    fn wanted_refs(&self, pod: &PodView) -> Vec<CellKey> {
        let namespace = &pod.key.0;
        let Some(owner) = self.settings.tenant_of(namespace) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for gate in &pod.gates {
            if self.started.contains(&(pod.uid.clone(), gate.clone())) {
                continue;
            }
            let Some(c) = self.check(&pod.key, gate) else { continue };
            if check_refs(&c.spec.secret_refs).is_err() {
                continue;
            }
            out.extend(c.spec.secret_refs.iter().map(|r| CellKey::of(namespace, owner, r)));
        }
        out
    }

    /// Starts the reads that are due, each in a task of its own that
    /// reports back; every [`REREAD_EVERY`], first drops the references no
    /// Pod of this node needs any more.
    pub(super) fn start_secret_reads(&mut self) {
        let now = Instant::now();
        if now >= self.secret_sweep {
            self.secret_sweep = now + REREAD_EVERY;
            self.sweep_secrets();
        }
        for (secret, keys) in self.secrets.due(now) {
            let client = self.client.clone();
            let tx = self.secret_tx.clone();
            tokio::spawn(async move {
                let outcome = read(client, &secret.0, &secret.1, &keys).await;
                // Fails only when the controller is gone.
                let _ = tx.send(SecretRead { secret, outcome });
            });
        }
    }

    /// Keeps the references the Pods of this node need, and the Event
    /// memory of checks that still exist.
    fn sweep_secrets(&mut self) {
        let mut wanted = BTreeSet::new();
        for pod in self.pods.state() {
            if let Some(view) = PodView::of(&pod) {
                wanted.extend(self.wanted_refs(&view));
            }
        }
        self.secrets.retain(&wanted);
        let checks = self.checks.clone();
        self.secret_events.retain(|(ns, name, _), _| {
            checks
                .get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
                .is_some()
        });
    }

    /// A read ended: its Secret's cells take what it found, and the checks
    /// of references whose state changed are reconciled.
    pub(super) async fn on_secret_read(&mut self, done: SecretRead) {
        let SecretRead { secret, outcome } = done;
        let counter = match outcome {
            Outcome::Read { .. } => &self.stats.secret_reads,
            _ => &self.stats.secret_read_errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Outcome::Failed(why) = &outcome {
            tracing::warn!(namespace = %secret.0, secret = %secret.1, %why, "kubernetes: cannot read a Secret of a check's secretRefs; retrying");
        }
        if self.secrets.record(&secret, outcome, Instant::now()) {
            let mut checks: Vec<PodKey> = self
                .checks
                .state()
                .iter()
                .filter(|c| c.metadata.namespace.as_deref() == Some(secret.0.as_str()))
                .filter(|c| c.spec.secret_refs.iter().any(|r| r.secret_name == secret.1))
                .filter_map(|c| key_of(&**c))
                .collect();
            checks.sort();
            for key in checks {
                self.reconcile_check(&key).await;
            }
        }
        self.start_secret_reads();
    }

    /// A check changed: its Secrets are read again at once.
    pub(super) fn hurry_secrets(&mut self, c: &SondeCheck) {
        let Some(namespace) = c.metadata.namespace.clone() else {
            return;
        };
        let now = Instant::now();
        for r in &c.spec.secret_refs {
            self.secrets.hurry(&(namespace.clone(), r.secret_name.clone()), now);
        }
    }

    /// Records an Event on check `c` when its reference `name` loses its
    /// value (`problem`, a Warning naming the Secret and key) or regains it
    /// (Normal `SecretAvailable`); nothing while it stays as it was.
    pub(super) fn note_secret(&mut self, c: &SondeCheck, name: &str, problem: Option<&Problem>) {
        let key = (c.namespace().unwrap_or_default(), c.name_any(), name.to_string());
        let now = problem.map(|p| p.message.clone());
        let before = self.secret_events.insert(key.clone(), now.clone());
        match (before.flatten(), problem) {
            (Some(was), Some(p)) if was == p.message => {}
            (_, Some(p)) => {
                tracing::warn!(namespace = %key.0, check = %key.1, event = p.reason, message = %p.message, "a secretRef of a SondeCheck has no value");
                self.events.record(c.object_ref(&()), true, p.reason, &p.message);
            }
            (Some(_), None) => {
                let message = format!("secretRef {name:?} has its value again: the check's gates are checked");
                tracing::info!(namespace = %key.0, check = %key.1, %message, "a secretRef of a SondeCheck is readable");
                self.events
                    .record(c.object_ref(&()), false, "SecretAvailable", &message);
            }
            (None, None) => {}
        }
    }
}
