//! The result cache: each probe's current state, its last outcome and a
//! bounded history, each target's `started` / `ready` / `live`, and a
//! broadcast of state changes that any number of subscribers can follow
//! (the kubelet results manager's updates channel, widened).
//!
//! The scheduler is the only writer; the API and the CLI read. With a
//! `state_dir`, every state change is also written to disk ([`store`]) and
//! restored at start, marked `stale` until the probe runs again.

pub mod events;
pub mod store;
mod views;

use crate::config::Kind;
use crate::thresholds::Counter;
use serde::{Deserialize, Serialize};
use sonde_sandbox::verdict::{Cause, Reason, RunResult, Status};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;
use tokio::sync::broadcast;

pub use events::{EventLog, Reset};
use views::opt_rfc3339;
pub use views::{
    HistoryEntry, Observation, ProbeMeta, ProbeSample, ProbeView, RunCount, RunEvent, StateChange, TargetView,
};

/// How many outcomes each probe keeps by default.
pub const DEFAULT_HISTORY: usize = 32;
/// How many state changes the watch stream keeps for clients that reconnect.
pub(crate) const CHANGE_LOG: usize = 4096;
/// How many outcomes the `?all=1` watch stream keeps for clients that reconnect.
pub(crate) const RUN_LOG: usize = 8192;

/// What is kept on disk for a probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Persisted {
    /// State and consecutive count.
    pub counter: Counter,
    /// The last outcome.
    pub last: Option<Observation>,
    /// When the state last changed.
    #[serde(default, with = "opt_rfc3339")]
    pub last_transition: Option<SystemTime>,
}

/// What the cache knows of one probe.
#[derive(Clone, Debug)]
struct Record {
    target: Arc<str>,
    plugin: Arc<str>,
    kind: Kind,
    groups: Arc<[String]>,
    labels: Arc<[(String, String)]>,
    tenant: Arc<str>,
    counter: Counter,
    last: Option<Arc<Observation>>,
    last_transition: Option<SystemTime>,
    history: VecDeque<HistoryEntry>,
    stale: bool,
    runs: Vec<RunCount>,
}

struct Inner {
    probes: RwLock<BTreeMap<Arc<str>, Record>>,
    changes: broadcast::Sender<StateChange>,
    change_log: EventLog<StateChange>,
    run_log: EventLog<RunEvent>,
    history_len: usize,
    store: Option<store::Store>,
    restored: std::sync::Mutex<HashMap<String, Persisted>>,
}

/// The shared result cache. Clones share it.
#[derive(Clone)]
pub struct ResultCache {
    inner: Arc<Inner>,
}

impl Default for ResultCache {
    fn default() -> Self {
        Self::new(DEFAULT_HISTORY)
    }
}

impl ResultCache {
    /// A cache kept in memory only.
    pub fn new(history_len: usize) -> Self {
        Self::build(history_len, None, HashMap::new())
    }

    fn build(history_len: usize, store: Option<store::Store>, restored: HashMap<String, Persisted>) -> Self {
        Self {
            inner: Arc::new(Inner {
                probes: RwLock::new(BTreeMap::new()),
                changes: broadcast::channel(4096).0,
                change_log: EventLog::new(CHANGE_LOG),
                run_log: EventLog::new(RUN_LOG),
                history_len,
                store,
                restored: std::sync::Mutex::new(restored),
            }),
        }
    }

    /// A cache persisted in `state_dir`, with what it held restored. An
    /// unreadable file is moved aside (and logged), never fatal.
    pub fn open(state_dir: &Path, history_len: usize) -> Result<Self, store::StoreError> {
        let opened = store::open(state_dir)?;
        if let Some((aside, why)) = &opened.moved_aside {
            tracing::error!(moved_to = %aside.display(), error = %why, "the state file was unreadable; starting with no saved state");
        }
        tracing::info!(restored = opened.restored.len(), dir = %state_dir.display(), "probe state restored");
        Ok(Self::build(history_len, Some(opened.store), opened.restored))
    }

    /// Follows every state change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<StateChange> {
        self.inner.changes.subscribe()
    }

    /// The recent state changes, with ids, for the watch stream.
    pub fn change_log(&self) -> &EventLog<StateChange> {
        &self.inner.change_log
    }

    /// The recent outcomes, with ids, for the `?all=1` watch stream.
    pub fn run_log(&self) -> &EventLog<RunEvent> {
        &self.inner.run_log
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Arc<str>, Record>> {
        self.inner.probes.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Arc<str>, Record>> {
        self.inner.probes.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a probe and returns its counter: the one saved on disk, if any
    /// (then the probe shows as stale), else `initial`.
    pub fn insert(&self, meta: &ProbeMeta, initial: Counter) -> Counter {
        let saved = self
            .inner
            .restored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&*meta.name);
        let record = match saved {
            Some(p) => Record {
                target: meta.target.clone(),
                plugin: meta.plugin.clone(),
                kind: meta.kind,
                groups: meta.groups.clone(),
                labels: meta.labels.clone(),
                tenant: meta.tenant.clone(),
                counter: p.counter,
                last: p.last.map(Arc::new),
                last_transition: p.last_transition,
                history: VecDeque::new(),
                stale: true,
                runs: Vec::new(),
            },
            None => Record {
                target: meta.target.clone(),
                plugin: meta.plugin.clone(),
                kind: meta.kind,
                groups: meta.groups.clone(),
                labels: meta.labels.clone(),
                tenant: meta.tenant.clone(),
                counter: initial,
                last: None,
                last_transition: None,
                history: VecDeque::new(),
                stale: false,
                runs: Vec::new(),
            },
        };
        let counter = record.counter;
        self.write().insert(meta.name.clone(), record);
        counter
    }

    /// Seeds the state a probe not yet added starts in (as a restored one
    /// would): the Kubernetes controller seeds each gate's probe from the
    /// condition already on the Pod, so a restart writes nothing until a
    /// threshold is crossed again. Taken by the next [`ResultCache::insert`]
    /// of `name`.
    pub fn seed(&self, name: &str, counter: Counter) {
        self.inner.restored.lock().unwrap_or_else(|e| e.into_inner()).insert(
            name.to_string(),
            Persisted {
                counter,
                last: None,
                last_transition: None,
            },
        );
    }

    /// Forgets what is saved of probe `name` on disk, keeping its record in
    /// memory until [`ResultCache::insert`] replaces it: a probe changed by
    /// a reload starts afresh without ever being missing from the API.
    pub(crate) fn forget_saved(&self, name: &str) {
        if let Some(store) = &self.inner.store {
            let _ = store.tx.send(store::Write::Delete(name.to_string()));
        }
    }

    /// Drops a probe (removed from the config), in memory and on disk.
    pub fn remove(&self, name: &str) {
        self.write().remove(name);
        self.forget_saved(name);
    }

    /// Records a run: its outcome, the counter after it, and, when the
    /// state changed, broadcasts the change and saves it.
    pub fn record(&self, name: &Arc<str>, mut result: RunResult, counter: Counter) {
        // What the host saw of the run's connections is for `/probe`'s
        // answer, not kept: a probe's last outcome would hold it (and the
        // TLS chain served) for as long as the probe exists.
        let cause = result.cause();
        result.observed = None;
        let now = SystemTime::now();
        let mut probes = self.write();
        let Some(r) = probes.get_mut(name) else { return };
        let from = r.counter.state;
        r.history.push_back(HistoryEntry {
            status: result.status,
            reason: result.reason,
            duration_ms: result.duration.as_secs_f64() * 1000.0,
            at: now,
        });
        while r.history.len() > self.inner.history_len {
            r.history.pop_front();
        }
        r.stale = false;
        r.counter = counter;
        match r
            .runs
            .iter_mut()
            .find(|c| c.status == result.status && c.reason == result.reason)
        {
            Some(c) => c.runs += 1,
            None => r.runs.push(RunCount {
                status: result.status,
                reason: result.reason,
                runs: 1,
            }),
        }
        // The message goes into the change event only when there is one.
        let message = if from == counter.state {
            String::new()
        } else {
            result.message.clone()
        };
        let outcome = Arc::new(Observation { result, at: now, cause });
        r.last = Some(outcome.clone());
        let (target, tenant, plugin, kind) = (r.target.clone(), r.tenant.clone(), r.plugin.clone(), r.kind);
        self.transition(name, r, from, message, now);
        drop(probes);
        self.inner.run_log.push(RunEvent {
            probe: name.clone(),
            target,
            tenant,
            plugin,
            kind,
            state: counter.state,
            consecutive: counter.consecutive,
            outcome,
        });
    }

    /// When `r`'s state is no longer `from`: stamps, saves and broadcasts.
    fn transition(&self, name: &Arc<str>, r: &mut Record, from: Status, message: String, now: SystemTime) {
        if from == r.counter.state {
            return;
        }
        r.last_transition = Some(now);
        self.save(name, r);
        let change = StateChange {
            probe: name.clone(),
            target: r.target.clone(),
            tenant: r.tenant.clone(),
            plugin: r.plugin.clone(),
            kind: r.kind,
            from,
            to: r.counter.state,
            message,
            at: now,
        };
        self.inner.change_log.push(change.clone());
        let _ = self.inner.changes.send(change);
    }

    /// Sets a probe's counter back (a restart after a hold, a reload),
    /// broadcasting if its state changes.
    pub fn reset(&self, name: &Arc<str>, counter: Counter) {
        let now = SystemTime::now();
        let mut probes = self.write();
        let Some(r) = probes.get_mut(name) else { return };
        let from = r.counter.state;
        r.counter = counter;
        self.transition(name, r, from, String::new(), now);
    }

    fn save(&self, name: &str, r: &Record) {
        if let Some(store) = &self.inner.store
            && let Ok(bytes) = serde_json::to_vec(&persisted(r))
        {
            let _ = store.tx.send(store::Write::Put(name.to_string(), bytes));
        }
    }

    /// Writes every probe's record to disk and waits until it is there
    /// (at shutdown, so consecutive counts survive too).
    pub fn flush(&self) {
        let Some(store) = &self.inner.store else { return };
        for (name, r) in self.read().iter() {
            if let Ok(bytes) = serde_json::to_vec(&persisted(r)) {
                let _ = store.tx.send(store::Write::Put(name.to_string(), bytes));
            }
        }
        let (ack, done) = std::sync::mpsc::channel();
        if store.tx.send(store::Write::Flush(ack)).is_ok() {
            let _ = done.recv();
        }
    }

    /// Every probe, by name.
    pub fn list(&self) -> Vec<ProbeView> {
        self.read().iter().map(|(n, r)| view(n, r, false)).collect()
    }

    /// Every probe, each with its history.
    pub fn list_with_history(&self) -> Vec<ProbeView> {
        self.read().iter().map(|(n, r)| view(n, r, true)).collect()
    }

    /// One probe, with its history.
    pub fn get(&self, name: &str) -> Option<ProbeView> {
        self.read().get_key_value(name).map(|(n, r)| view(n, r, true))
    }

    /// Calls `f` with every probe, under the read lock: for a metrics
    /// scrape, which must not copy 100,000 records.
    pub fn sample(&self, mut f: impl FnMut(ProbeSample<'_>)) {
        for (name, r) in self.read().iter() {
            f(ProbeSample {
                name,
                target: &r.target,
                kind: r.kind,
                groups: &r.groups,
                labels: &r.labels,
                tenant: &r.tenant,
                state: r.counter.state,
                stale: r.stale,
                last: r.last.as_ref(),
                runs: &r.runs,
            });
        }
    }

    /// A probe's groups.
    pub fn groups(&self, name: &str) -> Option<Arc<[String]>> {
        self.read().get(name).map(|r| r.groups.clone())
    }

    /// A probe's state.
    pub fn state(&self, name: &str) -> Option<Status> {
        self.read().get(name).map(|r| r.counter.state)
    }

    /// Every target, by name.
    pub fn targets(&self) -> Vec<TargetView> {
        let mut targets: BTreeMap<&str, TargetView> = BTreeMap::new();
        let probes = self.read();
        for (name, r) in probes.iter() {
            let t = targets.entry(&r.target).or_insert_with(|| TargetView {
                name: r.target.to_string(),
                tenant: r.tenant.to_string(),
                started: true,
                ready: true,
                live: true,
                probes: Vec::new(),
            });
            t.probes.push(name.to_string());
            let pass = matches!(r.counter.state, Status::Success | Status::Warning);
            match r.kind {
                Kind::Startup => t.started &= pass,
                Kind::Readiness => t.ready &= pass,
                Kind::Liveness => t.live &= r.counter.state != Status::Failure,
            }
        }
        targets
            .into_values()
            .map(|mut t| {
                t.ready &= t.started;
                t
            })
            .collect()
    }
}

fn persisted(r: &Record) -> Persisted {
    Persisted {
        counter: r.counter,
        last: r.last.as_deref().cloned(),
        last_transition: r.last_transition,
    }
}

fn view(name: &str, r: &Record, with_history: bool) -> ProbeView {
    ProbeView {
        name: name.to_string(),
        target: r.target.to_string(),
        kind: r.kind,
        groups: r.groups.to_vec(),
        labels: r.labels.iter().cloned().collect(),
        tenant: r.tenant.to_string(),
        plugin: r.plugin.to_string(),
        state: r.counter.state,
        stale: r.stale,
        consecutive: r.counter.consecutive,
        last: r.last.as_deref().cloned(),
        last_transition: r.last_transition,
        history: with_history.then(|| r.history.iter().cloned().collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, target: &str, kind: Kind) -> ProbeMeta {
        ProbeMeta {
            name: name.into(),
            target: target.into(),
            kind,
            groups: Arc::from(vec![]),
            labels: Arc::from(vec![]),
            tenant: "default".into(),
            plugin: "tcp".into(),
        }
    }

    fn ok() -> RunResult {
        RunResult {
            status: Status::Success,
            ..RunResult::error(Reason::Io, "fine")
        }
        .without_reason()
    }

    #[test]
    fn changes_are_broadcast_once_and_history_is_bounded() {
        let cache = ResultCache::new(4);
        let mut rx = cache.subscribe();
        let c = cache.insert(&meta("a", "t", Kind::Readiness), Counter::initial(Kind::Readiness));
        let mut next = c;
        for _ in 0..10 {
            next.observe(&ok(), 1, 3);
            cache.record(&"a".into(), ok(), next);
        }
        let change = rx.try_recv().unwrap();
        assert_eq!((change.from, change.to), (Status::Failure, Status::Success));
        assert!(rx.try_recv().is_err(), "one change, one event");
        let v = cache.get("a").unwrap();
        assert_eq!(v.history.unwrap().len(), 4);
        assert_eq!(v.consecutive, 10);
    }

    #[test]
    fn what_the_host_observed_is_not_kept() {
        let cache = ResultCache::new(4);
        let c = cache.insert(&meta("a", "t", Kind::Readiness), Counter::initial(Kind::Readiness));
        let mut seen = ok();
        seen.observed = Some(Box::default());
        cache.record(&"a".into(), seen, c);
        assert_eq!(cache.get("a").unwrap().last.unwrap().result.observed, None);
    }

    #[test]
    fn target_readiness_needs_startup() {
        let cache = ResultCache::default();
        let mut s = cache.insert(&meta("s", "t", Kind::Startup), Counter::initial(Kind::Startup));
        let mut r = cache.insert(&meta("r", "t", Kind::Readiness), Counter::initial(Kind::Readiness));
        r.observe(&ok(), 1, 3);
        cache.record(&"r".into(), ok(), r);
        let t = &cache.targets()[0];
        assert!(!t.started && !t.ready && t.live);
        s.observe(&ok(), 1, 3);
        cache.record(&"s".into(), ok(), s);
        let t = &cache.targets()[0];
        assert!(t.started && t.ready && t.live);
    }

    #[test]
    fn state_survives_a_restart_marked_stale() {
        let dir = tempfile::tempdir().unwrap();
        {
            let cache = ResultCache::open(dir.path(), 8).unwrap();
            let mut c = cache.insert(&meta("a", "t", Kind::Readiness), Counter::initial(Kind::Readiness));
            c.observe(&ok(), 1, 3);
            cache.record(&"a".into(), ok(), c);
            cache.flush();
        }
        let cache = ResultCache::open(dir.path(), 8).unwrap();
        let c = cache.insert(&meta("a", "t", Kind::Readiness), Counter::initial(Kind::Readiness));
        assert_eq!(c.state, Status::Success);
        let v = cache.get("a").unwrap();
        assert!(v.stale);
        assert_eq!(v.last.unwrap().result.message, "fine");
    }

    #[test]
    fn a_state_file_in_use_is_refused_not_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let _first = ResultCache::open(dir.path(), 8).unwrap();
        let second = ResultCache::open(dir.path(), 8);
        assert!(matches!(second, Err(store::StoreError::InUse { .. })));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing moved aside");
    }

    #[test]
    fn a_corrupt_state_file_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(store::FILE_NAME), b"this is not a database").unwrap();
        let cache = ResultCache::open(dir.path(), 8).unwrap();
        assert!(cache.list().is_empty());
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1);
    }
}
