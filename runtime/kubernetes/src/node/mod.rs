//! Node conditions from wasm checks — node-problem-detector's job,
//! sandboxed. A cluster-scoped [`SondeNodeCheck`] names a plugin, a target
//! on the node (`$(NODE_IP):9099`) and the Node condition it owns; every
//! agent whose Node its `nodeSelector` selects runs it as a probe of the
//! node tenant and writes that one condition on **its own** Node's status
//! (`True` while the problem is present), an Event on the Node per
//! transition, a heartbeat every `kubernetes.node_heartbeat`, and, when the
//! check asks, a taint while the condition is True (docs/kubernetes.md,
//! "Node conditions").
//!
//! - [`crd`]: the resource;
//! - `desired`: selection, refusals and the probe, pure;
//! - `condition`: the condition of a state, the status patch and the
//!   taints, pure;
//! - this module: the one task's state and loop over its own Node and the
//!   SondeNodeChecks (kube-runtime reflectors, the Node trimmed to its
//!   labels, taints and conditions); all state lives in the task, API calls
//!   run in spawned tasks that report back on a channel;
//! - `reconcile`: keeping the catalog in line with the checks that select
//!   the node, and probe states becoming conditions;
//! - `writes`: the status and taint writes and what their answers mean;
//! - `accepted`: each SondeNodeCheck's `Accepted` status and refusal Event,
//!   written by the agent that holds the status Lease.

mod accepted;
mod condition;
pub mod crd;
mod desired;
mod problems;
mod reconcile;
mod writes;

pub use crd::{
    KUBELET_CONDITIONS, NODE_FIELD_MANAGER, NodeConditionSpec, SondeNodeCheck, SondeNodeCheckSpec,
    SondeNodeCheckStatus, TaintEffect, TaintSpec,
};

use crate::events::EventSink;
use crate::settings::GateSettings;
use crate::stats::Stats;
use accepted::Accepted;
use condition::{NodeCond, TaintKey};
use desired::NodeProbe;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use sonde_core::control::Control;
use sonde_core::results::ResultCache;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use writes::Writer;

/// What the task needs.
pub(crate) struct Inputs {
    pub(crate) client: kube::Client,
    pub(crate) control: Arc<Control>,
    pub(crate) results: ResultCache,
    pub(crate) settings: GateSettings,
    pub(crate) stats: Arc<Stats>,
    /// Whether this agent holds the status Lease (and so writes the
    /// SondeNodeChecks' status and refusal Events).
    pub(crate) leading: watch::Receiver<bool>,
    /// What the agent's node-problem-detector monitors report.
    pub(crate) problems: Arc<sonde_core::npd::Board>,
}

/// A condition this agent owns on its Node.
struct Owned {
    /// The probe behind it.
    probe: NodeProbe,
    /// The condition as the Node has it, or will once written.
    current: Option<NodeCond>,
}

/// The task's state.
struct NodeChecks {
    client: kube::Client,
    control: Arc<Control>,
    results: ResultCache,
    settings: GateSettings,
    stats: Arc<Stats>,
    node: Store<Node>,
    checks: Store<SondeNodeCheck>,
    /// The conditions owned, by condition type.
    owned: BTreeMap<String, Owned>,
    /// The last refusal logged of each check, so it is logged once.
    refused: HashMap<String, String>,
    /// The Node's labels when last reconciled.
    labels: Option<BTreeMap<String, String>>,
    /// Every taint a check seen by this agent may put.
    managed_taints: BTreeSet<TaintKey>,
    writer: Writer,
    events: EventSink,
    accepted: Accepted,
    ready: bool,
    /// What the node-problem-detector monitors report.
    problems: Arc<sonde_core::npd::Board>,
    /// Their conditions as written (or to be), by type.
    npd: BTreeMap<String, NodeCond>,
}

/// Keeps of a Node what the task reads: name, UID, resourceVersion,
/// labels, taints and conditions (not its images, addresses or volumes).
fn trim_node(node: &mut Node) {
    let meta = std::mem::take(&mut node.metadata);
    node.metadata = ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        labels: meta.labels,
        ..ObjectMeta::default()
    };
    node.spec = Some(NodeSpec {
        taints: node.spec.take().and_then(|s| s.taints),
        ..NodeSpec::default()
    });
    node.status = Some(NodeStatus {
        conditions: node.status.take().and_then(|s| s.conditions),
        ..NodeStatus::default()
    });
}

/// A reflector's stream, which fills its store as it is polled.
type Reflected<K> = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

impl NodeChecks {
    /// The task's state on `inputs`, reporting writes on `done_tx`, and the
    /// streams of its own Node and of the SondeNodeChecks.
    fn new(
        inputs: Inputs,
        done_tx: mpsc::UnboundedSender<writes::Done>,
    ) -> (Self, Reflected<Node>, Reflected<SondeNodeCheck>) {
        let Inputs {
            client,
            control,
            results,
            settings,
            stats,
            leading: _,
            problems,
        } = inputs;
        let (node, node_writer) = reflector::store();
        let node_events = watcher::watcher(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={}", settings.node_name)),
        )
        .default_backoff()
        .modify(trim_node)
        .reflect(node_writer);
        let (checks, check_writer) = reflector::store();
        let check_events = watcher::watcher(Api::<SondeNodeCheck>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(|c: &mut SondeNodeCheck| c.managed_fields_mut().clear())
            .reflect(check_writer);
        let events = EventSink::new(
            client.clone(),
            &settings.node_name,
            settings.qps,
            settings.burst,
            stats.clone(),
        );
        let writer = Writer::new(client.clone(), &settings, stats.clone(), done_tx);
        let this = Self {
            client,
            control,
            results,
            settings,
            stats,
            node,
            checks,
            owned: BTreeMap::new(),
            refused: HashMap::new(),
            labels: None,
            managed_taints: BTreeSet::new(),
            writer,
            events,
            accepted: Accepted::default(),
            ready: false,
            problems,
            npd: BTreeMap::new(),
        };
        (this, Box::pin(node_events), Box::pin(check_events))
    }
}

/// Runs the node checks of `inputs.settings.node_name` until the watches
/// end (never, unless the client goes away).
pub(crate) async fn run(inputs: Inputs) {
    let mut leading = inputs.leading.clone();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (mut this, mut node_events, mut check_events) = NodeChecks::new(inputs, done_tx);
    let heartbeat = this.settings.node.heartbeat;
    let mut reported = this.problems.follow();
    // What the monitors reported before this task started is written too.
    reported.mark_changed();
    let mut changes = this.results.subscribe();
    let mut reloads = this.control.reloads();
    // A check whose oci:// plugin was being pulled is added once it ends.
    let mut pulls = this.control.pulls_ended();
    let mut pulls_open = true;
    let mut beats = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut evaluate = tokio::time::interval(accepted::EVALUATE_EVERY);
    evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wake = this.writer.wake();
        tokio::select! {
            ev = node_events.next() => match ev {
                Some(Ok(ev)) => this.on_node(ev).await,
                Some(Err(e)) => tracing::warn!(error = %e, "watching this Node failed; retrying with backoff (does the ClusterRole allow nodes list and watch?)"),
                None => break,
            },
            ev = check_events.next() => match ev {
                Some(Ok(ev)) => this.on_check(ev).await,
                Some(Err(e)) => tracing::warn!(error = %e, "watching SondeNodeChecks failed; retrying with backoff (is the CRD installed? does the ClusterRole allow sondenodechecks list and watch?)"),
                None => break,
            },
            change = changes.recv() => match change {
                Ok(c) => this.on_change(&c),
                Err(broadcast::error::RecvError::Lagged(_)) => this.resync(),
                Err(broadcast::error::RecvError::Closed) => break,
            },
            r = reloads.changed() => {
                if r.is_err() {
                    break;
                }
                // A reload replaced the catalog without the node checks' probes.
                this.owned.clear();
                this.reconcile().await;
            }
            ended = pulls.recv(), if pulls_open => match ended {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => this.reconcile().await,
                Err(broadcast::error::RecvError::Closed) => pulls_open = false,
            },
            _ = beats.tick() => this.heartbeat(),
            // The board lives as long as the agent: this never ends.
            Ok(()) = reported.changed(), if this.ready => this.on_problems(),
            _ = evaluate.tick(), if *leading.borrow() && this.ready => this.evaluate().await,
            r = leading.changed() => {
                if r.is_err() {
                    break;
                }
                this.accepted = Accepted::default();
            }
            Some(done) = done_rx.recv() => this.on_done(done),
            () = crate::writer::sleep_until(wake), if wake.is_some() => {}
        }
        this.pump();
    }
}

impl NodeChecks {
    async fn on_node(&mut self, ev: Event<Node>) {
        match ev {
            Event::Init | Event::InitApply(_) | Event::Delete(_) => {}
            Event::InitDone | Event::Apply(_) => {
                let labels = self.this_node().map(|n| n.labels().clone());
                let came = self.labels.is_none() && labels.is_some();
                if labels != self.labels {
                    self.labels = labels;
                    self.reconcile().await;
                }
                if self.labels.is_some() {
                    // The Node exists: what a 404 parked is written now, and
                    // the Events the monitors made while it was not listed
                    // go on it.
                    self.writer.node_came();
                    if came && self.ready {
                        self.on_problems();
                    }
                }
                // A newer Node: the taints wanted while the last write's
                // answer was not seen yet, or changed by someone else.
                self.retaint();
            }
        }
    }

    async fn on_check(&mut self, ev: Event<SondeNodeCheck>) {
        match ev {
            Event::Init | Event::InitApply(_) => {}
            Event::InitDone => {
                self.ready = true;
                self.reconcile().await;
            }
            Event::Apply(_) | Event::Delete(_) => self.reconcile().await,
        }
    }

    /// This agent's Node, as the store has it.
    fn this_node(&self) -> Option<Arc<Node>> {
        self.node.get(&ObjectRef::new(&self.settings.node_name))
    }
}
