//! The node checks' writes: the conditions waiting for the next patch of
//! `nodes/<name>/status` (latest wins, a transition kept as one), the
//! taints (a JSON merge patch of `spec.taints` with the Node's
//! resourceVersion as precondition: the list has no merge key, so it is
//! replaced whole, and a `409` means someone changed it meanwhile), each
//! under the agent-wide rate limit with the gate writer's backoff.

use super::NodeChecks;
use super::condition::{Write, retaint, status_patch};
use super::crd::{NODE_FIELD_MANAGER, SondeNodeCheckStatus};
use crate::settings::GateSettings;
use crate::stats::Stats;
use crate::writer::{Outcome, TokenBucket, backoff};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a spawned write reports.
pub(super) enum Done {
    /// A status patch, with what it carried.
    Status {
        sent: BTreeMap<String, Write>,
        outcome: Outcome,
    },
    /// A taint patch made against the Node's resourceVersion `against`.
    Taint { against: String, outcome: Outcome },
    /// A SondeNodeCheck's status.
    Accepted {
        check: String,
        status: SondeNodeCheckStatus,
        outcome: Outcome,
    },
}

/// The writes waiting, in flight and backing off.
pub(super) struct Writer {
    client: kube::Client,
    node_name: String,
    stats: Arc<Stats>,
    pub(super) done_tx: mpsc::UnboundedSender<Done>,
    bucket: TokenBucket,
    pending: BTreeMap<String, Write>,
    /// Writes the API server answered 404 for (the Node does not exist):
    /// kept, latest per condition, until the Node comes ([`Writer::node_came`]).
    parked: BTreeMap<String, Write>,
    in_flight: bool,
    attempts: u32,
    not_before: Option<Instant>,
    taint_in_flight: bool,
    /// The Node's resourceVersion the last taint write succeeded against:
    /// nothing more is sent until the watch shows a newer Node.
    taint_against: Option<String>,
    taint_attempts: u32,
    taint_not_before: Option<Instant>,
}

impl Writer {
    pub(super) fn new(
        client: kube::Client,
        settings: &GateSettings,
        stats: Arc<Stats>,
        done_tx: mpsc::UnboundedSender<Done>,
    ) -> Self {
        Self {
            client,
            node_name: settings.node_name.clone(),
            stats,
            done_tx,
            bucket: TokenBucket::new(settings.qps, settings.burst),
            pending: BTreeMap::new(),
            parked: BTreeMap::new(),
            in_flight: false,
            attempts: 0,
            not_before: None,
            taint_in_flight: false,
            taint_against: None,
            taint_attempts: 0,
            taint_not_before: None,
        }
    }

    /// Queues `write` of condition `type_` for the next patch: the latest
    /// wins, but a transition waiting stays one.
    pub(super) fn queue(&mut self, type_: &str, write: Write) {
        newer(&mut self.pending, type_, write);
    }

    /// The Node came (again): what was parked by a 404 waits again, behind
    /// anything newer.
    pub(super) fn node_came(&mut self) {
        for (type_, write) in std::mem::take(&mut self.parked) {
            older(&mut self.pending, type_, write);
        }
    }

    /// When the task must wake to send what backs off.
    pub(super) fn wake(&self) -> Option<Instant> {
        let status = self.not_before.filter(|_| !self.pending.is_empty() && !self.in_flight);
        let taint = self.taint_not_before.filter(|_| !self.taint_in_flight);
        match (status, taint) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends the conditions waiting, in one patch, when nothing is in
    /// flight and the rate limit and backoff allow.
    fn send_status(&mut self, now: Instant) {
        if self.in_flight || self.pending.is_empty() || self.not_before.is_some_and(|t| now < t) {
            return;
        }
        if let Err(at) = self.bucket.take(now) {
            self.not_before = Some(at);
            return;
        }
        self.not_before = None;
        self.in_flight = true;
        let sent = std::mem::take(&mut self.pending);
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let body = status_patch(&sent, &stamp);
        let api: Api<Node> = Api::all(self.client.clone());
        let (name, tx) = (self.node_name.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some(NODE_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = api
                .patch_status(&name, &params, &Patch::Strategic(&body))
                .await
                .map(drop);
            // The task gone, nobody is left to tell.
            let _ = tx.send(Done::Status {
                sent,
                outcome: Outcome::of(&result),
            });
        });
    }

    /// A status patch ended: done, or what it carried waits again (behind
    /// anything newer) with backoff.
    fn status_done(&mut self, sent: BTreeMap<String, Write>, outcome: Outcome) {
        self.in_flight = false;
        match outcome {
            Outcome::Written => {
                self.attempts = 0;
                self.stats.node_patches.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Gone => {
                self.attempts = 0;
                tracing::warn!(node = %self.node_name, "this Node does not exist: its conditions are kept and written when it comes");
                for (type_, write) in sent {
                    newer(&mut self.parked, &type_, write);
                }
            }
            failed => {
                self.stats.node_patch_errors.fetch_add(1, Ordering::Relaxed);
                self.attempts += 1;
                let wait = backoff(&failed, self.attempts);
                tracing::warn!(node = %self.node_name, outcome = ?failed, retry_in_ms = wait.as_millis() as u64, "writing a Node condition failed (a 403: the ClusterRole needs nodes/status patch, and the admission policy allows this agent its own Node only)");
                self.not_before = Some(Instant::now() + wait);
                for (type_, write) in sent {
                    older(&mut self.pending, type_, write);
                }
            }
        }
    }
}

/// `write` for condition `type_` replaces what `writes` holds for it,
/// keeping the flip an older write carried.
fn newer(writes: &mut BTreeMap<String, Write>, type_: &str, write: Write) {
    let write = match (writes.remove(type_), write) {
        (Some(Write::Set { transition: true, .. } | Write::Delete), Write::Set { cond, .. }) => {
            Write::Set { cond, transition: true }
        }
        (_, w) => w,
    };
    writes.insert(type_.to_string(), write);
}

/// `write`, older than what `writes` holds for `type_`, waits there only
/// when nothing newer does; else the newer write carries its flip.
fn older(writes: &mut BTreeMap<String, Write>, type_: String, write: Write) {
    match (writes.get_mut(&type_), write) {
        (None, write) => {
            writes.insert(type_, write);
        }
        (Some(Write::Set { transition, .. }), Write::Set { transition: true, .. }) => *transition = true,
        _ => {}
    }
}

impl NodeChecks {
    /// Sends what is due.
    pub(super) fn pump(&mut self) {
        let now = Instant::now();
        self.writer.send_status(now);
        if self.writer.taint_not_before.is_some_and(|t| now >= t) {
            self.writer.taint_not_before = None;
            self.retaint();
        }
    }

    /// Puts the taints of the conditions that are True on this Node, and
    /// takes the others of sonde's off, when the Node differs.
    pub(super) fn retaint(&mut self) {
        let w = &self.writer;
        if w.taint_in_flight || w.taint_not_before.is_some() {
            return;
        }
        let Some(node) = self.this_node() else { return };
        let rv = node.metadata.resource_version.clone().unwrap_or_default();
        if w.taint_against.as_deref() == Some(rv.as_str()) {
            return;
        }
        let wanted: BTreeSet<_> = self
            .owned
            .values()
            .filter(|o| o.current.as_ref().is_some_and(|c| c.problem))
            .filter_map(|o| o.probe.taint.as_ref())
            .map(|t| (t.key.clone(), t.effect.as_str().to_string()))
            .collect();
        let current = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let Some(taints) = retaint(&current, &self.managed_taints, &wanted) else {
            return;
        };
        if let Err(at) = self.writer.bucket.take(Instant::now()) {
            self.writer.taint_not_before = Some(at);
            return;
        }
        self.writer.taint_in_flight = true;
        let body = serde_json::json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": taints}});
        let api: Api<Node> = Api::all(self.client.clone());
        let (name, tx) = (self.settings.node_name.clone(), self.writer.done_tx.clone());
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some(NODE_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = api.patch(&name, &params, &Patch::Merge(&body)).await.map(drop);
            let _ = tx.send(Done::Taint {
                against: rv,
                outcome: Outcome::of(&result),
            });
        });
    }

    /// A write ended.
    pub(super) fn on_done(&mut self, done: Done) {
        match done {
            Done::Status { sent, outcome } => self.writer.status_done(sent, outcome),
            Done::Taint { against, outcome } => {
                let w = &mut self.writer;
                w.taint_in_flight = false;
                if outcome == Outcome::Written {
                    w.stats.taint_patches.fetch_add(1, Ordering::Relaxed);
                    w.taint_attempts = 0;
                    w.taint_against = Some(against);
                    return;
                }
                // A 409 (the Node changed meanwhile) is tried again on the
                // newer Node, after backoff.
                w.stats.taint_patch_errors.fetch_add(1, Ordering::Relaxed);
                w.taint_attempts += 1;
                let wait = backoff(&outcome, w.taint_attempts);
                tracing::warn!(node = %self.settings.node_name, outcome = ?outcome, retry_in_ms = wait.as_millis() as u64, "writing this Node's taints failed (a 403: the ClusterRole needs nodes patch)");
                w.taint_not_before = Some(Instant::now() + wait);
            }
            Done::Accepted { check, status, outcome } => self.accepted_done(check, status, outcome),
        }
    }
}
