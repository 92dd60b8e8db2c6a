//! Keeping the catalog in line with the SondeNodeChecks that select this
//! Node — one probe per check, added (seeded from the condition already on
//! the Node) or removed by incremental changes — and each probe's state
//! changes becoming the condition wanted on the Node, with an Event per
//! transition and a heartbeat.

use super::condition::{NodeCond, Write, seed};
use super::desired::{NodeIdentity, NodeProbe, claims, node_probe, selects};
use super::{NodeChecks, Owned};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use sonde_core::catalog::Change;
use sonde_core::config;
use sonde_core::control::ChangeError;
use sonde_core::results::StateChange;
use sonde_sandbox::verdict::Reason;
use std::collections::BTreeMap;
use std::path::Path;

impl NodeChecks {
    /// The probes the checks that select this Node map to, by condition
    /// type; a refused check is logged once (the status Lease's holder
    /// records it on the check).
    fn wanted(&mut self, node: &Node) -> BTreeMap<String, NodeProbe> {
        let all = self.checks.state();
        let claims = claims(all.iter().map(|c| &**c));
        let (name, ip) = (self.settings.node_name.clone(), self.settings.node.ip.clone());
        let identity = NodeIdentity {
            name: &name,
            ip: ip.as_deref(),
        };
        let tenant_known = self.tenant_known();
        let mut wanted = BTreeMap::new();
        for check in &all {
            if let Some(t) = &check.spec.taint {
                self.managed_taints
                    .insert((t.key.clone(), t.effect.as_str().to_string()));
            }
            if !selects(check.spec.node_selector.as_ref(), node.labels()) {
                continue;
            }
            match node_probe(check, &identity, &self.settings, &claims, tenant_known) {
                Ok(p) => {
                    self.refused.remove(&p.check);
                    wanted.insert(p.condition.type_.clone(), p);
                }
                Err(refusal) => self.log_refusal(&check.name_any(), &refusal.to_string()),
            }
        }
        wanted
    }

    /// Whether the config in force has the node tenant.
    pub(super) fn tenant_known(&self) -> bool {
        self.control.tenants().get(&self.settings.node.tenant).is_some()
    }

    pub(super) fn log_refusal(&mut self, check: &str, message: &str) {
        if self.refused.get(check).map(String::as_str) != Some(message) {
            tracing::warn!(check, message, "SondeNodeCheck not applied on this node");
            self.refused.insert(check.to_string(), message.to_string());
        }
    }

    /// Brings the catalog and the owned conditions in line with the checks
    /// that select this Node.
    pub(super) async fn reconcile(&mut self) {
        if !self.ready {
            return;
        }
        let node = self.this_node();
        let mut wanted = match &node {
            Some(node) => self.wanted(node),
            // No Node object (yet): nothing can be written.
            None => BTreeMap::new(),
        };
        let gone: Vec<String> = self
            .owned
            .iter()
            .filter(|(t, o)| wanted.get(*t) != Some(&o.probe))
            .map(|(t, _)| t.clone())
            .collect();
        for type_ in gone {
            let old = self.owned.remove(&type_).expect("owned");
            self.remove_probe(&old.probe.name).await;
            if !wanted.contains_key(&type_) && old.current.is_some() {
                self.writer.queue(&type_, Write::Delete);
            }
        }
        let on_node = |t: &str| {
            node.as_ref()
                .and_then(|n| {
                    n.status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == t)
                        .cloned()
                })
                .and_then(|c| NodeCond::on_node(&c))
        };
        let new: Vec<NodeProbe> = std::mem::take(&mut wanted)
            .into_values()
            .filter(|p| !self.owned.contains_key(&p.condition.type_))
            .collect();
        for probe in new {
            let current = on_node(&probe.condition.type_);
            if self.add_probe(&probe, current.as_ref()).await {
                self.owned
                    .insert(probe.condition.type_.clone(), Owned { probe, current });
            }
        }
        self.retaint();
    }

    /// Adds the probe of a check to the catalog, seeded from the condition
    /// already on the Node; whether it was.
    async fn add_probe(&mut self, probe: &NodeProbe, on_node: Option<&NodeCond>) -> bool {
        let source = format!("SondeNodeCheck {}", probe.check);
        let text = serde_json::json!({ "targets": [probe.target] }).to_string();
        let target = match config::parse(Path::new(&source), &text) {
            Ok(file) => file.targets.into_iter().next().expect("one target"),
            Err(errors) => {
                self.log_refusal(&probe.check, &crate::desired::messages(&errors));
                return false;
            }
        };
        self.results.seed(&probe.name, seed(on_node));
        let change = Change {
            remove: vec![probe.name.as_str().into()],
            add: vec![target],
            ..Change::default()
        };
        match self.control.apply_change(change).await {
            Ok(_) => true,
            Err(ChangeError::Invalid(errors)) => {
                self.log_refusal(&probe.check, &crate::desired::messages(&errors));
                false
            }
            Err(e @ ChangeError::Pulling(_)) => {
                // Tried again on the next reconcile (a check or Node event).
                self.log_refusal(&probe.check, &e.to_string());
                false
            }
        }
    }

    async fn remove_probe(&mut self, name: &str) {
        if let Err(e) = self.control.apply_change(Change::remove([name])).await {
            tracing::warn!(probe = name, error = %e, "kubernetes: cannot remove a node check's probe");
        }
    }

    /// A probe's state changed: a transition of its condition is written at
    /// once, with an Event on the Node; the taint follows.
    pub(super) fn on_change(&mut self, c: &StateChange) {
        let Some(type_) = self.type_of(&c.probe) else { return };
        self.follow(&type_, c.to, &c.message);
    }

    /// The condition type whose probe is `probe`.
    fn type_of(&self, probe: &str) -> Option<String> {
        self.owned
            .iter()
            .find(|(_, o)| o.probe.name == probe)
            .map(|(t, _)| t.clone())
    }

    /// Condition `type_` follows its probe's state `state`, reached by a
    /// run that said `message`.
    fn follow(&mut self, type_: &str, state: sonde_sandbox::verdict::Status, message: &str) {
        let Some(owned) = self.owned.get(type_) else { return };
        let timed_out = self
            .results
            .get(&owned.probe.name)
            .and_then(|v| v.last)
            .is_some_and(|o| o.result.reason == Some(Reason::Timeout));
        let Some(cond) = NodeCond::of_state(state, timed_out, message, &owned.probe.condition) else {
            return;
        };
        let owned = self.owned.get_mut(type_).expect("owned");
        let flipped = owned.current.as_ref().is_none_or(|old| old.problem != cond.problem);
        owned.current = Some(cond.clone());
        if !flipped {
            return;
        }
        if let Some(node) = self.this_node() {
            let message = format!("{type_}: {}", cond.message);
            let about = node_reference(&node);
            self.events.record(about, cond.problem, &cond.reason, &message);
        }
        self.writer.queue(type_, Write::Set { cond, transition: true });
        self.retaint();
    }

    /// After missed state changes: each condition from its probe's state.
    pub(super) fn resync(&mut self) {
        let probes: Vec<(String, String)> = self
            .owned
            .iter()
            .map(|(t, o)| (t.clone(), o.probe.name.clone()))
            .collect();
        for (type_, name) in probes {
            let Some(view) = self.results.get(&name).filter(|v| !v.stale) else {
                continue;
            };
            let message = view.last.map(|o| o.result.message).unwrap_or_default();
            self.follow(&type_, view.state, &message);
        }
    }

    /// Every owned condition written again, with its probe's latest
    /// message when that run agrees with the status: the heartbeat.
    pub(super) fn heartbeat(&mut self) {
        self.problems_heartbeat();
        for (type_, owned) in &mut self.owned {
            let Some(current) = &mut owned.current else { continue };
            if let Some(run) = self.results.get(&owned.probe.name).and_then(|v| v.last)
                && let Some(latest) =
                    NodeCond::of_state(run.result.status, false, &run.result.message, &owned.probe.condition)
                && latest.problem == current.problem
            {
                current.message = latest.message;
            }
            let cond = current.clone();
            self.writer.queue(
                type_,
                Write::Set {
                    cond,
                    transition: false,
                },
            );
        }
    }
}

/// The reference to a Node an Event is about.
pub(super) fn node_reference(node: &Node) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: node.metadata.name.clone(),
        uid: node.metadata.uid.clone(),
        ..Default::default()
    }
}
