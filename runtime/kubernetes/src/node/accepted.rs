//! Each SondeNodeCheck's `Accepted` condition, and one Event on a check
//! that is refused, written by the agent that holds the status Lease only
//! (thousands of agents would otherwise write the same thing). The verdict
//! is the agents' own: [`refusal`](super::desired::refusal) (allowlist, kubelet-owned type, a type
//! claimed twice, selector) and a dry run of the probe on the leader's
//! node against the catalog in force (the node tenant's ceiling and quotas,
//! the plugin's config schema). A status is written only when it differs
//! from what the object has.

use super::NodeChecks;
use super::crd::{SondeNodeCheck, SondeNodeCheckStatus};
use super::desired::{NodeIdentity, claims, node_probe};
use super::writes::Done;
use crate::crd::{STATUS_FIELD_MANAGER, StatusCondition};
use crate::desired::messages;
use crate::status::ACCEPTED;
use crate::writer::Outcome;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use sonde_core::catalog::Change;
use sonde_core::config;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// How often the leader evaluates the SondeNodeChecks.
pub(super) const EVALUATE_EVERY: Duration = Duration::from_secs(2);
/// How long a dry run's verdict on a check is reused while its spec (its
/// generation) and the catalog's config (its reloads) stay the same.
const DRY_RUN_TTL: Duration = Duration::from_secs(60);

/// The leader's memory of what it wrote.
#[derive(Default)]
pub(super) struct Accepted {
    /// The last status sent of each check.
    written: HashMap<String, SondeNodeCheckStatus>,
    in_flight: HashSet<String>,
    /// The last refusal recorded as an Event on each check.
    noted: HashMap<String, String>,
    /// Each check's last dry run: its generation, the catalog's reloads,
    /// when, and the verdict.
    dry_runs: HashMap<String, (Option<i64>, u64, Instant, Verdict)>,
}

/// (status, reason, message) of `Accepted`.
type Verdict = (&'static str, &'static str, String);

impl NodeChecks {
    /// Evaluates every SondeNodeCheck and writes the statuses that differ.
    pub(super) async fn evaluate(&mut self) {
        let all = self.checks.state();
        let claims = claims(all.iter().map(|c| &**c));
        for check in &all {
            let verdict = self.verdict(check, &claims).await;
            self.write_accepted(check, verdict);
        }
        let names: HashSet<String> = all.iter().map(|c| c.name_any()).collect();
        self.accepted.noted.retain(|n, _| names.contains(n));
        self.accepted.written.retain(|n, _| names.contains(n));
        self.accepted.dry_runs.retain(|n, _| names.contains(n));
    }

    async fn verdict(
        &mut self,
        check: &SondeNodeCheck,
        claims: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> Verdict {
        let identity = NodeIdentity {
            name: &self.settings.node_name,
            ip: self.settings.node.ip.as_deref(),
        };
        let probe = match node_probe(check, &identity, &self.settings, claims, self.tenant_known()) {
            Ok(p) => p,
            Err(r) => return ("False", r.reason(), r.to_string()),
        };
        let (generation, reloads, now) = (
            check.metadata.generation,
            *self.control.reloads().borrow(),
            Instant::now(),
        );
        if let Some((g, r, at, verdict)) = self.accepted.dry_runs.get(&probe.check)
            && (*g, *r) == (generation, reloads)
            && now < *at + DRY_RUN_TTL
        {
            return verdict.clone();
        }
        let verdict = self.dry_run(check, &probe).await;
        let entry = (generation, reloads, now, verdict.clone());
        self.accepted.dry_runs.insert(probe.check.clone(), entry);
        verdict
    }

    /// The verdict of a dry run of `probe` against the catalog in force.
    async fn dry_run(&self, check: &SondeNodeCheck, probe: &super::desired::NodeProbe) -> Verdict {
        let source = format!("SondeNodeCheck {}", probe.check);
        let text = serde_json::json!({ "targets": [probe.target] }).to_string();
        let errors = match config::parse(Path::new(&source), &text) {
            Ok(file) => {
                let change = Change {
                    remove: vec![probe.name.as_str().into()],
                    add: file.targets,
                    ..Change::default()
                };
                match self.control.check_change(change).await {
                    Ok(()) => return ("True", ACCEPTED, "every agent whose node it selects runs it".into()),
                    Err(errors) => errors,
                }
            }
            Err(errors) => errors,
        };
        let reason = crate::status::errors_reason(&errors);
        (
            "False",
            reason,
            format!("spec.target {:?}: {}", check.spec.target, messages(&errors)),
        )
    }

    /// Writes `verdict` as `check`'s status when the object says otherwise,
    /// and records an Event when it is a new refusal.
    fn write_accepted(&mut self, check: &SondeNodeCheck, (status, reason, message): Verdict) {
        let name = check.name_any();
        if status == "False" && self.accepted.noted.get(&name) != Some(&message) {
            tracing::warn!(check = %name, reason, message = %message, "SondeNodeCheck refused");
            self.events.record(check.object_ref(&()), true, "Refused", &message);
            self.accepted.noted.insert(name.clone(), message.clone());
        } else if status == "True" {
            self.accepted.noted.remove(&name);
        }
        let generation = check.metadata.generation;
        let old = check
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == ACCEPTED));
        let same = |c: &StatusCondition| c.status == status && c.reason == reason && c.message == message;
        let is = check.status.as_ref().map(|s| s.observed_generation);
        if is == Some(generation) && old.is_some_and(same) {
            return;
        }
        let last_transition_time = match old {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        let next = SondeNodeCheckStatus {
            observed_generation: generation,
            conditions: vec![StatusCondition {
                type_: ACCEPTED.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.clone(),
                last_transition_time,
                observed_generation: generation,
            }],
        };
        let sent_same = self
            .accepted
            .written
            .get(&name)
            .is_some_and(|w| w.observed_generation == generation && w.conditions.first().is_some_and(same));
        if sent_same || self.accepted.in_flight.contains(&name) {
            return;
        }
        self.accepted.in_flight.insert(name.clone());
        let api: Api<SondeNodeCheck> = Api::all(self.client.clone());
        let tx = self.writer.done_tx.clone();
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some(STATUS_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let body = serde_json::json!({ "status": next });
            let result = api.patch_status(&name, &params, &Patch::Merge(&body)).await.map(drop);
            let _ = tx.send(Done::Accepted {
                check: name,
                status: next,
                outcome: Outcome::of(&result),
            });
        });
    }

    /// A status write ended: remembered when written, tried again at the
    /// next evaluation when not.
    pub(super) fn accepted_done(&mut self, check: String, status: SondeNodeCheckStatus, outcome: Outcome) {
        self.accepted.in_flight.remove(&check);
        if outcome == Outcome::Written {
            self.stats
                .status_writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.accepted.written.insert(check, status);
        } else {
            self.stats
                .status_write_errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(%check, outcome = ?outcome, "cannot write a SondeNodeCheck's status (does the ClusterRole allow sondenodechecks/status patch?)");
        }
    }
}
