//! The controller: one task that follows this node's Pods and every
//! SondeCheck, keeps one probe per (Pod, gate) in the registry through
//! incremental changes, turns probe state changes into gate conditions and
//! writes them through a per-Pod latest-wins queue under the agent-wide
//! rate limit.
//!
//! All state lives in the one task ([`Controller`]); API calls run in
//! spawned tasks that report back on a channel, so the task never waits on
//! the API server while it could be taking a watch event or a result.

use super::crd::{Mode, SondeCheck};
use super::events::{Recorder, Subject};
use super::mapping::{Cond, CondStatus, PodKey, PodView, Settings, condition_type, desired};
use super::writer::{Outcome, TokenBucket, backoff, patch_body};
use crate::config;
use crate::control::{ChangeError, Control};
use crate::registry::Change;
use crate::results::{ResultCache, StateChange};
use crate::verdict::{Reason, Status};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

/// The field manager of sonde's writes (`managedFields` shows it owning
/// its conditions only).
pub const FIELD_MANAGER: &str = "sonde";

/// Counters of what the controller did, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Condition patches that succeeded.
    pub patches: AtomicU64,
    /// Patch attempts of any outcome.
    pub patch_attempts: AtomicU64,
    /// Patches refused with 403.
    pub forbidden: AtomicU64,
    /// Patches to retry (409 conflict, 5xx, transport).
    pub retries: AtomicU64,
    /// Writes dropped because their Pod is gone (404, UID precondition).
    pub gone: AtomicU64,
    /// (Pod, gate) pairs refused (check outside its ceiling, allowlist, no tenant).
    pub refused: AtomicU64,
    /// Registry changes applied.
    pub changes: AtomicU64,
    /// Probes (Pod, gate) in the registry now.
    pub probes: AtomicU64,
}

/// A probe the controller keeps for one gate of one Pod.
#[derive(Clone, Debug)]
struct Binding {
    pod: PodKey,
    uid: String,
    check: String,
    target: serde_json::Value,
    mode: Mode,
}

/// The conditions waiting to be written on one Pod (latest wins).
#[derive(Debug)]
struct Pending {
    uid: String,
    conds: BTreeMap<String, Cond>,
    attempts: u32,
    not_before: Option<Instant>,
}

/// Why a registry change of the controller's was not applied.
enum Applied {
    /// Refused: the messages.
    Refused(String),
    /// Its plugin is being pulled: the text for the gate and the Event.
    Pulling(String),
}

/// What a spawned patch reports.
pub(super) struct Done {
    pod: PodKey,
    uid: String,
    sent: Vec<(String, Cond)>,
    outcome: Outcome,
}

/// The controller's state.
pub struct Controller {
    client: kube::Client,
    control: Arc<Control>,
    results: ResultCache,
    settings: Settings,
    stats: Arc<Stats>,
    checks: HashMap<PodKey, SondeCheck>,
    pods: HashMap<PodKey, PodView>,
    bindings: HashMap<String, Binding>,
    /// StartupOnly gates already True, by (Pod UID, check).
    done: HashSet<(String, String)>,
    /// The last refusal recorded on each SondeCheck, so it is recorded once.
    refusals: HashMap<PodKey, String>,
    /// Pods with a gate whose `oci://` plugin is being pulled, or failed to
    /// pull: reconciled again when a pull ends, never waited for.
    retry_pods: HashSet<PodKey>,
    /// Unknown override annotations already reported, by (Pod UID, key).
    overrides_reported: HashSet<(String, String)>,
    pending: HashMap<PodKey, Pending>,
    order: VecDeque<PodKey>,
    in_flight: HashSet<PodKey>,
    bucket: TokenBucket,
    wake: Option<Instant>,
    recorder: Recorder,
    done_tx: mpsc::UnboundedSender<Done>,
    pods_listed: Option<HashSet<PodKey>>,
    checks_listed: Option<HashSet<PodKey>>,
    pods_synced: bool,
    checks_synced: bool,
    synced: watch::Sender<bool>,
}

impl Controller {
    /// A controller writing through `client` and changing the registry
    /// through `control`.
    pub(super) fn new(
        client: kube::Client,
        control: Arc<Control>,
        results: ResultCache,
        settings: Settings,
        stats: Arc<Stats>,
        synced: watch::Sender<bool>,
    ) -> (Self, mpsc::UnboundedReceiver<Done>) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let recorder = Recorder::new(client.clone(), &settings.node_name, settings.qps, settings.burst);
        let bucket = TokenBucket::new(settings.qps, settings.burst);
        (
            Self {
                client,
                control,
                results,
                settings,
                stats,
                checks: HashMap::new(),
                pods: HashMap::new(),
                bindings: HashMap::new(),
                done: HashSet::new(),
                refusals: HashMap::new(),
                retry_pods: HashSet::new(),
                overrides_reported: HashSet::new(),
                pending: HashMap::new(),
                order: VecDeque::new(),
                in_flight: HashSet::new(),
                bucket,
                wake: None,
                recorder,
                done_tx,
                pods_listed: None,
                checks_listed: None,
                pods_synced: false,
                checks_synced: false,
                synced,
            },
            done_rx,
        )
    }

    /// Runs until the watches end (never, unless the client goes away).
    pub(super) async fn run(mut self, mut done_rx: mpsc::UnboundedReceiver<Done>) {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("spec.nodeName={}", self.settings.node_name);
        let pod_events = watcher::watcher(pods, watcher::Config::default().fields(&selector)).default_backoff();
        let checks: Api<SondeCheck> = Api::all(self.client.clone());
        let check_events = watcher::watcher(checks, watcher::Config::default()).default_backoff();
        let mut pod_events = std::pin::pin!(pod_events);
        let mut check_events = std::pin::pin!(check_events);
        let mut changes = self.results.subscribe();
        let mut reloads = self.control.reloads();
        let mut pulls = self.control.pulls_ended();
        loop {
            let wake = self.wake.take();
            tokio::select! {
                ev = pod_events.next() => match ev {
                    Some(Ok(ev)) => self.on_pod(ev).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Pods failed; retrying with backoff (does the ClusterRole allow pods list and watch?)"),
                    None => break,
                },
                ev = check_events.next() => match ev {
                    Some(Ok(ev)) => self.on_check(ev).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching SondeChecks failed; retrying with backoff (is the CRD installed? does the ClusterRole allow sondechecks list and watch?)"),
                    None => break,
                },
                change = changes.recv() => match change {
                    Ok(c) => self.on_change(&c).await,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "fell behind the state changes; re-reading every gate's state");
                        self.resync_states();
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                r = reloads.changed() => {
                    if r.is_err() {
                        break;
                    }
                    // A reload replaced the registry without the gates' probes.
                    self.bindings.clear();
                    self.reconcile_all().await;
                }
                ended = pulls.recv() => match ended {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.on_pull_ended().await,
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                Some(done) = done_rx.recv() => self.on_done(done),
                _ = sleep_until(wake), if wake.is_some() => {}
            }
            self.pump();
        }
    }

    async fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => self.pods_listed = Some(HashSet::new()),
            Event::InitApply(pod) => {
                if let Some(view) = PodView::of(&pod) {
                    if let Some(l) = &mut self.pods_listed {
                        l.insert(view.key.clone());
                    }
                    self.upsert_pod(view);
                }
            }
            Event::InitDone => {
                let listed = self.pods_listed.take().unwrap_or_default();
                let gone: Vec<PodKey> = self.pods.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for key in gone {
                    self.pods.remove(&key);
                }
                self.pods_synced = true;
                self.reconcile_all().await;
            }
            Event::Apply(pod) => {
                if let Some(view) = PodView::of(&pod) {
                    let key = view.key.clone();
                    self.upsert_pod(view);
                    self.reconcile_pod(&key).await;
                }
            }
            Event::Delete(pod) => {
                if let Some(view) = PodView::of(&pod) {
                    self.pods.remove(&view.key);
                    self.reconcile_pod(&view.key).await;
                }
            }
        }
    }

    fn upsert_pod(&mut self, view: PodView) {
        if let Some(p) = self.pending.get(&view.key)
            && p.uid != view.uid
        {
            // Recreated under the same name: nothing of the old one's is written.
            self.pending.remove(&view.key);
        }
        self.pods.insert(view.key.clone(), view);
    }

    async fn on_check(&mut self, ev: Event<SondeCheck>) {
        let key_of = |c: &SondeCheck| Some((c.metadata.namespace.clone()?, c.metadata.name.clone()?));
        match ev {
            Event::Init => self.checks_listed = Some(HashSet::new()),
            Event::InitApply(c) => {
                if let Some(key) = key_of(&c) {
                    if let Some(l) = &mut self.checks_listed {
                        l.insert(key.clone());
                    }
                    self.checks.insert(key, c);
                }
            }
            Event::InitDone => {
                let listed = self.checks_listed.take().unwrap_or_default();
                self.checks.retain(|k, _| listed.contains(k));
                self.checks_synced = true;
                self.reconcile_all().await;
            }
            Event::Apply(c) => {
                if let Some(key) = key_of(&c) {
                    self.checks.insert(key.clone(), c);
                    self.reconcile_check(&key).await;
                }
            }
            Event::Delete(c) => {
                if let Some(key) = key_of(&c) {
                    self.checks.remove(&key);
                    self.refusals.remove(&key);
                    self.reconcile_check(&key).await;
                }
            }
        }
    }

    fn ready(&self) -> bool {
        self.pods_synced && self.checks_synced
    }

    async fn reconcile_all(&mut self) {
        if !self.ready() {
            return;
        }
        let mut keys: Vec<PodKey> = self.pods.keys().cloned().collect();
        keys.extend(self.bindings.values().map(|b| b.pod.clone()));
        keys.sort();
        keys.dedup();
        for key in keys {
            self.reconcile_pod(&key).await;
        }
        self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        self.synced.send_replace(true);
    }

    async fn reconcile_check(&mut self, (namespace, name): &PodKey) {
        let keys: Vec<PodKey> = self
            .pods
            .values()
            .filter(|p| &p.key.0 == namespace && p.gates.contains(name))
            .map(|p| p.key.clone())
            .collect();
        for key in keys {
            self.reconcile_pod(&key).await;
        }
    }

    /// Brings the probes of Pod `key` in line with its gates and checks:
    /// one registry change per gate whose probe is added, retargeted or
    /// removed; nothing for a gate whose probe is as it should be.
    async fn reconcile_pod(&mut self, key: &PodKey) {
        if !self.ready() {
            return;
        }
        let pod = self.pods.get(key).cloned();
        let mut want: BTreeMap<String, (super::mapping::Desired, String)> = BTreeMap::new();
        let mut unavailable: Vec<(String, String)> = Vec::new();
        if let Some(pod) = &pod {
            for check in &pod.gates {
                if self.done.contains(&(pod.uid.clone(), check.clone())) {
                    continue;
                }
                self.report_overrides(pod, check);
                let Some(c) = self.checks.get(&(key.0.clone(), check.clone())) else {
                    unavailable.push((
                        check.clone(),
                        format!("no SondeCheck {check:?} in namespace {:?}", key.0),
                    ));
                    continue;
                };
                match desired(pod, c, &self.settings) {
                    Ok(Some(d)) => {
                        let passed = pod
                            .conditions
                            .get(&condition_type(check))
                            .is_some_and(|c| c.status == CondStatus::True);
                        if d.mode == Mode::StartupOnly && passed {
                            self.done.insert((pod.uid.clone(), check.clone()));
                            continue;
                        }
                        want.insert(d.name.clone(), (d, check.clone()));
                    }
                    Ok(None) => {}
                    Err(r) => {
                        if r.of_check() {
                            let c = c.clone();
                            self.refuse(&c, &r.to_string());
                        }
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        unavailable.push((check.clone(), r.to_string()));
                    }
                }
            }
        }
        let uid = pod.as_ref().map(|p| p.uid.clone()).unwrap_or_default();
        let mine: Vec<String> = self
            .bindings
            .iter()
            .filter(|(_, b)| &b.pod == key)
            .map(|(n, _)| n.clone())
            .collect();
        for name in mine {
            let keep = want
                .get(&name)
                .is_some_and(|(d, _)| self.bindings[&name].target == d.target && self.bindings[&name].uid == uid);
            if keep {
                want.remove(&name);
            } else if !want.contains_key(&name) {
                self.apply(Change::remove([name.as_str()])).await.ok();
                self.bindings.remove(&name);
            }
        }
        for (name, (d, check)) in want {
            let Some(pod) = &pod else { break };
            let ctype = condition_type(&check);
            let mut replaces = self.bindings.contains_key(&name);
            if self.bindings.get(&name).is_some_and(|b| b.uid != uid) {
                // Another Pod under the same name: its probe starts afresh
                // (a replacement by an equal spec would keep the old state).
                self.apply(Change::remove([name.as_str()])).await.ok();
                self.bindings.remove(&name);
                replaces = false;
            }
            let add = self.target(&d, key, &check);
            let change = match add {
                Ok(t) => Change {
                    remove: if replaces { vec![name.as_str().into()] } else { vec![] },
                    add: vec![t],
                },
                Err(e) => {
                    self.refused(&check, key, e, replaces, &name).await;
                    unavailable.push((check.clone(), self.refusal_text(key, &check)));
                    continue;
                }
            };
            // The state already on the Pod: no write until a threshold is crossed again.
            self.results.seed(&name, Cond::seed(pod.conditions.get(&ctype)));
            let oci = crate::registry::resolve::is_oci(d.target["probes"][0]["plugin"].as_str().unwrap_or(""));
            match self.apply(change).await {
                Err(Applied::Pulling(message)) => {
                    // Never waited for: the gate says so, the pull goes on in
                    // the background, and its end brings this Pod back.
                    self.retry_pods.insert(key.clone());
                    if replaces {
                        self.apply(Change::remove([name.as_str()])).await.ok();
                        self.bindings.remove(&name);
                    }
                    if let Some(c) = self.checks.get(&(key.0.clone(), check.clone())).cloned() {
                        self.note(&c, "PluginPulling", false, &message);
                    }
                    unavailable.push((check.clone(), message));
                }
                Ok(()) => {
                    self.bindings.insert(
                        name.clone(),
                        Binding {
                            pod: key.clone(),
                            uid: uid.clone(),
                            check: check.clone(),
                            target: d.target.clone(),
                            mode: d.mode,
                        },
                    );
                }
                Err(Applied::Refused(e)) => {
                    if oci {
                        // A failed pull is tried again when its backoff passes.
                        self.retry_pods.insert(key.clone());
                    }
                    self.refused(&check, key, e, replaces, &name).await;
                    unavailable.push((check.clone(), self.refusal_text(key, &check)));
                }
            }
        }
        self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        if pod.as_ref().is_some_and(|p| !p.gone) {
            for (check, message) in unavailable {
                self.want(key, &uid, &condition_type(&check), Cond::unavailable(&message));
            }
        }
    }

    fn refusal_text(&self, key: &PodKey, check: &str) -> String {
        self.refusals
            .get(&(key.0.clone(), check.to_string()))
            .cloned()
            .unwrap_or_else(|| "refused".into())
    }

    /// A gate's probe the registry refused: the Event on its SondeCheck,
    /// and the old probe (if any) removed.
    async fn refused(&mut self, check: &str, key: &PodKey, message: String, replaces: bool, name: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if replaces {
            self.apply(Change::remove([name])).await.ok();
            self.bindings.remove(name);
        }
        if let Some(c) = self.checks.get(&(key.0.clone(), check.to_string())).cloned() {
            self.refuse(&c, &message);
        }
    }

    /// Records (once per message) that SondeCheck `c` is refused.
    fn refuse(&mut self, c: &SondeCheck, message: &str) {
        self.note(c, "Refused", true, message);
    }

    /// Records an Event on SondeCheck `c`, once per message.
    fn note(&mut self, c: &SondeCheck, reason: &str, warning: bool, message: &str) {
        let key = (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default(),
        );
        if self.refusals.get(&key).map(String::as_str) == Some(message) {
            return;
        }
        tracing::warn!(namespace = %key.0, check = %key.1, event = reason, message = %message, "SondeCheck not applied");
        self.refusals.insert(key.clone(), message.to_string());
        let subject = Subject {
            kind: super::crd::KIND,
            api_version: "sonde.dev/v1alpha1",
            namespace: key.0,
            name: key.1,
            uid: c.metadata.uid.clone().unwrap_or_default(),
        };
        self.recorder.record(&subject, warning, reason, message);
    }

    fn report_overrides(&mut self, pod: &PodView, check: &str) {
        for a in pod.unknown_overrides(check) {
            if self.overrides_reported.insert((pod.uid.clone(), a.clone())) {
                let message = format!(
                    "annotation {a} is ignored: a Pod may override only {}",
                    super::mapping::OVERRIDABLE
                        .iter()
                        .map(|f| format!("sonde.dev/{check}.{f}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                self.recorder
                    .record(&pod_subject(pod), true, "UnknownOverride", &message);
            }
        }
    }

    /// The config target of `d`, parsed as any config file's.
    fn target(&self, d: &super::mapping::Desired, key: &PodKey, check: &str) -> Result<config::Target, String> {
        let source = format!("SondeCheck {}/{check} for Pod {}", key.0, key.1);
        let text = serde_json::json!({ "targets": [d.target] }).to_string();
        config::parse(Path::new(&source), &text)
            .map(|f| f.targets.into_iter().next().expect("one target"))
            .map_err(|e| messages(&e))
    }

    async fn apply(&mut self, change: Change) -> Result<(), Applied> {
        match self.control.apply_change(change).await {
            Ok(_) => {
                self.stats.changes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(ChangeError::Invalid(e)) => Err(Applied::Refused(messages(&e))),
            Err(e @ ChangeError::Pulling(_)) => Err(Applied::Pulling(e.to_string())),
        }
    }

    /// A pull ended, or its backoff passed: the Pods whose gates waited on
    /// one, or whose pull failed, are reconciled again.
    async fn on_pull_ended(&mut self) {
        let pods: Vec<PodKey> = self.retry_pods.drain().collect();
        for key in pods {
            self.reconcile_pod(&key).await;
        }
    }

    async fn on_change(&mut self, c: &StateChange) {
        let Some(b) = self.bindings.get(&*c.probe).cloned() else {
            return;
        };
        let timed_out = self
            .results
            .get(&c.probe)
            .and_then(|v| v.last)
            .is_some_and(|o| o.result.reason == Some(Reason::Timeout));
        let cond = Cond::of_state(c.to, timed_out, &c.message);
        if let Some(pod) = self.pods.get(&b.pod)
            && c.to != Status::Unknown
        {
            let message = format!("{}: {}", b.check, cond.message);
            let subject = pod_subject(pod);
            self.recorder
                .record(&subject, cond.status == CondStatus::False, &cond.reason, &message);
        }
        let passed = cond.status == CondStatus::True;
        self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
        if b.mode == Mode::StartupOnly && passed {
            // Set once and left: the probe goes, the condition stays.
            self.done.insert((b.uid.clone(), b.check.clone()));
            self.apply(Change::remove([&*c.probe])).await.ok();
            self.bindings.remove(&*c.probe);
            self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        }
    }

    /// After missed state changes: every gate's condition from its probe's state.
    fn resync_states(&mut self) {
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

    /// Queues `cond` for gate `ctype` of Pod `key` (of `uid`), replacing
    /// what was queued; nothing when the Pod has it already.
    fn want(&mut self, key: &PodKey, uid: &str, ctype: &str, cond: Cond) {
        let on_pod = self
            .pods
            .get(key)
            .filter(|p| p.uid == uid)
            .and_then(|p| p.conditions.get(ctype));
        let same = on_pod == Some(&cond);
        let p = self.pending.entry(key.clone()).or_insert_with(|| Pending {
            uid: uid.to_string(),
            conds: BTreeMap::new(),
            attempts: 0,
            not_before: None,
        });
        if p.uid != uid {
            *p = Pending {
                uid: uid.to_string(),
                conds: BTreeMap::new(),
                attempts: 0,
                not_before: None,
            };
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

    /// Sends what is due, as the rate limit allows.
    fn pump(&mut self) {
        let now = Instant::now();
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
                self.wake = Some(self.wake.map_or(t, |w| w.min(t)));
                i += 1;
                continue;
            }
            let pod = self.pods.get(&key).filter(|pod| pod.uid == p.uid);
            let Some(pod) = pod else {
                // The Pod went (or came back as another): nothing to write.
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            };
            let diffs: Vec<(String, Cond, bool)> = p
                .conds
                .iter()
                .filter(|(t, c)| pod.conditions.get(*t) != Some(*c))
                .map(|(t, c)| {
                    let flip = pod.conditions.get(t).is_none_or(|old| old.status != c.status);
                    (t.clone(), c.clone(), flip)
                })
                .collect();
            if diffs.is_empty() {
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            }
            if let Err(at) = self.bucket.take(now) {
                self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
                break;
            }
            self.order.remove(i);
            self.in_flight.insert(key.clone());
            self.send(key, p.uid.clone(), diffs);
        }
    }

    fn send(&self, key: PodKey, uid: String, diffs: Vec<(String, Cond, bool)>) {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let conds: Vec<(&str, &Cond, bool)> = diffs.iter().map(|(t, c, f)| (t.as_str(), c, *f)).collect();
        let body = patch_body(&uid, &conds, &now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let tx = self.done_tx.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            stats.patch_attempts.fetch_add(1, Ordering::Relaxed);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = api
                .patch_status(&key.1, &params, &Patch::Strategic(&body))
                .await
                .map(|_| ());
            let outcome = Outcome::of(&result);
            let writes = crate::metrics::kubernetes_writes();
            match &outcome {
                Outcome::Written => writes.written("pod_status"),
                Outcome::Gone => writes.failed("pod_status", "gone"),
                Outcome::Forbidden(_) => writes.failed("pod_status", "forbidden"),
                Outcome::Retry(_) => writes.failed("pod_status", "retry"),
            }
            let sent = diffs.into_iter().map(|(t, c, _)| (t, c)).collect();
            let _ = tx.send(Done {
                pod: key,
                uid,
                sent,
                outcome,
            });
        });
    }

    fn on_done(&mut self, done: Done) {
        self.in_flight.remove(&done.pod);
        let (namespace, name) = &done.pod;
        match &done.outcome {
            Outcome::Written => {
                self.stats.patches.fetch_add(1, Ordering::Relaxed);
                if let Some(pod) = self.pods.get_mut(&done.pod).filter(|p| p.uid == done.uid) {
                    for (t, c) in &done.sent {
                        pod.conditions.insert(t.clone(), c.clone());
                    }
                }
                if let Some(p) = self.pending.get_mut(&done.pod) {
                    p.attempts = 0;
                    p.not_before = None;
                    // What changed meanwhile stays queued (latest wins).
                    p.conds
                        .retain(|t, c| !done.sent.iter().any(|(st, sc)| st == t && sc == c));
                }
            }
            Outcome::Gone => {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%namespace, pod = %name, "the Pod is gone (or was recreated); its condition is not written");
                if self.pending.get(&done.pod).is_some_and(|p| p.uid == done.uid) {
                    self.pending.remove(&done.pod);
                }
            }
            Outcome::Forbidden(m) | Outcome::Retry(m) => {
                let forbidden = matches!(done.outcome, Outcome::Forbidden(_));
                if forbidden {
                    self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.stats.retries.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(p) = self.pending.get_mut(&done.pod) {
                    p.attempts += 1;
                    let wait = backoff(&done.outcome, p.attempts);
                    p.not_before = Some(Instant::now() + wait);
                    if forbidden {
                        tracing::error!(%namespace, pod = %name, error = %m, retry_in_s = wait.as_secs(), "writing the gate condition was forbidden: check the ClusterRole (pods/status patch) and the admission policy (own node only)");
                    } else {
                        tracing::warn!(%namespace, pod = %name, error = %m, retry_in_ms = wait.as_millis() as u64, "writing the gate condition failed; retrying");
                    }
                }
            }
        }
        if let Some(p) = self.pending.get(&done.pod) {
            if p.conds.is_empty() {
                self.pending.remove(&done.pod);
            } else if !self.order.contains(&done.pod) {
                self.order.push_back(done.pod.clone());
            }
        }
    }
}

fn pod_subject(pod: &PodView) -> Subject {
    Subject {
        kind: "Pod",
        api_version: "v1",
        namespace: pod.key.0.clone(),
        name: pod.key.1.clone(),
        uid: pod.uid.clone(),
    }
}

/// The messages of `errors`, joined (their place is the SondeCheck's
/// name, which the text says already).
/// The problems of a refused probe, for an Event and a condition that the
/// namespace's users read: what is wrong, not where the agent keeps its
/// config (a path on the node is none of their business).
fn messages(errors: &crate::config::ConfigErrors) -> String {
    errors
        .0
        .iter()
        .map(|e| e.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
