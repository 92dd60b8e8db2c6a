//! Performing a Pod's plan: the catalog changes, the Events on Pods and
//! SondeChecks, and the conditions of gates that have no probe.

use super::Reconciler;
use super::plan::{AddProbe, Binding, PodPlan};
use crate::crd::SondeCheck;
use crate::desired::messages;
use crate::events::pod_reference;
use crate::view::{Cond, PodKey, PodView, condition_type};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use sonde_core::catalog::Change;
use sonde_core::control::ChangeError;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Why a catalog change of the controller's was not applied.
pub(super) enum Applied {
    /// Refused: what is wrong.
    Refused(sonde_core::config::ConfigErrors),
    /// Its plugin is being pulled: the text for the gate and the Event.
    Pulling(String),
}

impl Reconciler {
    /// Performs `plan` for Pod `key` (`pod`): the catalog changes, the
    /// Events, the conditions of gates that have no probe.
    pub(super) async fn apply_plan(&mut self, key: &PodKey, pod: Option<&PodView>, plan: PodPlan) {
        let uid = pod.map(|p| p.uid.clone()).unwrap_or_default();
        for check in plan.started {
            self.started.insert((uid.clone(), check));
        }
        for (annotation, message) in plan.unknown_overrides {
            if self.overrides_reported.insert((uid.clone(), annotation))
                && let Some(pod) = pod
            {
                let about = pod_reference(&pod.key.0, &pod.key.1, &pod.uid);
                self.events.record(about, true, "UnknownOverride", &message);
            }
        }
        for (check, message) in &plan.refused_checks {
            self.note(check, "Refused", true, message);
        }
        for (check, name, problem) in &plan.secret_notes {
            self.note_secret(check, name, problem.as_ref());
        }
        self.stats.refused.fetch_add(plan.refusals, Ordering::Relaxed);
        for name in &plan.remove {
            self.remove_probe(name).await;
        }
        let mut unavailable = plan.unavailable;
        for bad in plan.bad {
            let message = messages(&bad.errors);
            self.refused(&bad.check, key, &message, bad.replaces, &bad.name).await;
            unavailable.push((bad.check, message));
        }
        for add in plan.add {
            if let Some(gate) = self.add_probe(key, &uid, add).await {
                unavailable.push(gate);
            }
        }
        self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        if pod.is_some_and(|p| !p.gone) {
            for (check, message) in unavailable {
                self.want(key, &uid, &condition_type(&check), Cond::unavailable(&message));
            }
        }
    }

    /// Adds (or replaces) the probe of one gate; the gate and why, when it
    /// has none after all.
    pub(super) async fn add_probe(&mut self, key: &PodKey, uid: &str, add: AddProbe) -> Option<(String, String)> {
        let AddProbe {
            name,
            check,
            desired,
            target,
            replaces,
            seed,
            oci,
            secrets,
        } = add;
        let change = Change {
            remove: if replaces { vec![name.as_str().into()] } else { vec![] },
            add: vec![target],
            secrets: secrets.iter().cloned().collect(),
        };
        // The state already on the Pod: no write until a threshold is crossed again.
        self.results.seed(&name, seed);
        match self.apply(change).await {
            Ok(()) => {
                let binding = Binding {
                    pod: key.clone(),
                    uid: uid.to_string(),
                    check,
                    target: desired.target,
                    mode: desired.mode,
                    secrets,
                };
                self.bindings.insert(name, binding);
                None
            }
            Err(Applied::Pulling(message)) => {
                // Never waited for: the gate says so, the pull goes on in
                // the background, and its end brings this Pod back.
                self.retry_pods.insert(key.clone());
                if replaces {
                    self.remove_probe(&name).await;
                }
                if let Some(c) = self.check(key, &check) {
                    self.note(&c, "PluginPulling", false, &message);
                }
                Some((check, message))
            }
            Err(Applied::Refused(errors)) => {
                if oci {
                    // A failed pull is tried again when its backoff passes.
                    self.retry_pods.insert(key.clone());
                }
                let message = messages(&errors);
                self.refused(&check, key, &message, replaces, &name).await;
                Some((check, message))
            }
        }
    }

    pub(super) fn check(&self, (namespace, _): &PodKey, name: &str) -> Option<Arc<SondeCheck>> {
        self.checks.get(&ObjectRef::new(name).within(namespace))
    }

    /// A gate's probe the catalog refused: the Event on its SondeCheck,
    /// and the old probe (if any) removed.
    pub(super) async fn refused(&mut self, check: &str, key: &PodKey, message: &str, replaces: bool, name: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if replaces {
            self.remove_probe(name).await;
        }
        if let Some(c) = self.check(key, check) {
            self.note(&c, "Refused", true, message);
        }
    }

    /// Removes probe `name` from the catalog and forgets it; a failure is
    /// logged and counted.
    pub(super) async fn remove_probe(&mut self, name: &str) {
        if let Err(e) = self.control.apply_change(Change::remove([name])).await {
            self.stats.change_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(probe = name, error = %e, "kubernetes: cannot remove a gate's probe");
        } else {
            self.stats.changes.fetch_add(1, Ordering::Relaxed);
        }
        self.bindings.remove(name);
    }

    /// Records an Event on SondeCheck `c`, once per message.
    pub(super) fn note(&mut self, c: &SondeCheck, reason: &str, warning: bool, message: &str) {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        if self.refusals.get(&key).map(String::as_str) == Some(message) {
            return;
        }
        tracing::warn!(namespace = %key.0, check = %key.1, event = reason, message = %message, "SondeCheck not applied");
        self.refusals.insert(key, message.to_string());
        self.events.record(c.object_ref(&()), warning, reason, message);
    }

    pub(super) async fn apply(&mut self, change: Change) -> Result<(), Applied> {
        match self.control.apply_change(change).await {
            Ok(_) => {
                self.stats.changes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(ChangeError::Invalid(e)) => Err(Applied::Refused(e)),
            Err(e @ ChangeError::Pulling(_)) => Err(Applied::Pulling(e.to_string())),
        }
    }
}
