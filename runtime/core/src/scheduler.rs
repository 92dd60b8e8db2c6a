//! The scheduler: when each probe runs, with the kubelet prober's semantics
//! (the life of one probe run is in `docs/architecture.md`).
//!
//! One task owns every probe's timing: a heap of due times, so a probe that
//! is waiting costs a heap entry and a small record — no task, no thread.
//! Each due run becomes a short-lived task that calls the [`Runner`]
//! (retrying errors up to [`MAX_ATTEMPTS`] times, as the kubelet's
//! `maxProbeRetries`) and reports back; the scheduler then applies the
//! [`thresholds`](crate::thresholds), records the outcome in the
//! [`ResultCache`], and plans the next run from the planned time, not the
//! finish, so the schedule does not drift. A run never overlaps the next
//! one of the same probe: a run longer than the period delays the next.
//!
//! Per target: readiness and liveness probes wait until its startup probe
//! succeeded, which then stops; after a liveness or startup failure the
//! target's `on_failure` action runs and its probes hold until it is done,
//! then start again from their initial state and initial delay.

use crate::config::Kind;
use crate::registry::{Delta, ProbeSpec, TargetSpec};
use crate::results::{ProbeMeta, ResultCache};
use crate::thresholds::Counter;
use sonde_sandbox::verdict::{RunResult, Status};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// The scheduler task makes a pass at least this often, even with nothing due.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);

/// Attempts per period when a run ends in an error (kubelet's maxProbeRetries).
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// How the outcome of an `on_failure` action is reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionOutcome {
    /// Whether it exited 0.
    pub ok: bool,
    /// What happened, for the log.
    pub message: String,
}

/// What runs probes and actions: the engine in production.
pub trait Runner: Send + Sync + 'static {
    /// One attempt of a probe.
    fn probe(&self, spec: &ProbeSpec, attempt: u32) -> impl Future<Output = RunResult> + Send;
    /// A target's `on_failure` action.
    fn act(&self, target: &TargetSpec) -> impl Future<Output = ActionOutcome> + Send;
    /// The runtime probe runs are spawned on; `None` (the default) for the
    /// scheduler's own. The engine's runner names its sandbox runtime, so a
    /// run goes there once instead of hopping back and forth.
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }
}

/// What the scheduler tells as it works: metrics and benchmarks listen.
/// Calls come from the scheduler task and from run tasks, so they must be
/// quick and must not block.
pub trait Observer: Send + Sync + 'static {
    /// A run of `spec` starts `late` after its planned time (manual runs,
    /// which have no planned time, are not reported).
    fn run_started(&self, spec: &ProbeSpec, late: Duration) {
        let _ = (spec, late);
    }
    /// A run of `spec` finished with `result` (after its retries).
    fn run_finished(&self, spec: &ProbeSpec, result: &RunResult) {
        let _ = (spec, result);
    }
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// Scheduler settings.
#[derive(Clone)]
pub struct Options {
    /// Start each probe at a random offset within its first period, so a
    /// restart does not run every probe at once. Off in tests.
    pub jitter: bool,
    /// Who is told about runs.
    pub observer: Arc<dyn Observer>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            jitter: true,
            observer: Arc::new(NoObserver),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}

/// Whether the scheduler keeps up, read by `/livez` and `/healthz` with
/// kube-proxy's rule: it is stalled when a run that is due has waited
/// longer than a timeout to start. Updated by the scheduler task; read
/// from anywhere without locks.
#[derive(Debug)]
pub struct Progress {
    base: Instant,
    /// Milliseconds since `base` of the last pass over due runs.
    last_pass: AtomicU64,
    /// Milliseconds since `base` of the earliest planned run, or `u64::MAX`.
    next_due: AtomicU64,
    in_flight: AtomicU64,
}

impl Progress {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            last_pass: AtomicU64::new(0),
            next_due: AtomicU64::new(u64::MAX),
            in_flight: AtomicU64::new(0),
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64
    }

    fn record(&self, next: Option<Instant>, in_flight: usize) {
        self.in_flight.store(in_flight as u64, Ordering::Relaxed);
        self.last_pass.store(self.millis(Instant::now()), Ordering::Relaxed);
        let next = next.map_or(u64::MAX, |at| self.millis(at));
        self.next_due.store(next, Ordering::Relaxed);
    }

    /// Runs in progress (as of the scheduler's last pass).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// When the scheduler last went over its due runs.
    pub fn last_pass(&self) -> Instant {
        self.base + Duration::from_millis(self.last_pass.load(Ordering::Relaxed))
    }

    /// How far behind the scheduler is: how long the earliest due run has
    /// waited past its planned time, or, when the task has not made its
    /// [`HEARTBEAT`] pass, how long past that pass it is (zero when it keeps
    /// up).
    pub fn overdue(&self) -> Duration {
        let now = Instant::now();
        let due = match self.next_due.load(Ordering::Relaxed) {
            u64::MAX => Duration::ZERO,
            due => now.saturating_duration_since(self.base + Duration::from_millis(due)),
        };
        let beat = now.saturating_duration_since(self.last_pass() + HEARTBEAT);
        due.max(beat)
    }
}

/// Why a manual run was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TriggerError {
    /// No such probe.
    #[error("no probe named {0:?}")]
    NotFound(String),
    /// Its target is held while its `on_failure` action runs.
    #[error("probe {0:?} is held while its target's on_failure action runs")]
    Held(String),
    /// The agent is shutting down.
    #[error("the agent is shutting down")]
    ShuttingDown,
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Probes new in the config.
    pub added: Vec<String>,
    /// Probes whose spec changed: restarted from their initial state.
    pub changed: Vec<String>,
    /// Probes gone from the config.
    pub removed: Vec<String>,
    /// Probes left as they were, state and schedule kept.
    pub kept: usize,
}

enum Msg {
    Trigger(String, oneshot::Sender<Result<RunResult, TriggerError>>),
    Apply(Box<Delta>, oneshot::Sender<ReloadSummary>),
    Shutdown(Duration, oneshot::Sender<()>),
    RunDone {
        name: Arc<str>,
        epoch: u64,
        planned: Option<Instant>,
        result: RunResult,
    },
    ActionDone {
        target: Arc<str>,
        hold: u64,
        outcome: ActionOutcome,
    },
    Stall(Duration),
}

/// A running scheduler, as its users hold it: commands go to its task.
/// Clones share it.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: mpsc::UnboundedSender<Msg>,
    progress: Arc<Progress>,
}

impl SchedulerHandle {
    /// Whether the scheduler keeps up with its due runs.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Makes the scheduler task stop working for `d`, as if it were stuck:
    /// due runs wait. For testing what watches it (`/livez`).
    pub fn stall(&self, d: Duration) {
        let _ = self.tx.send(Msg::Stall(d));
    }

    /// Runs `probe` now, outside its schedule (or waits for the run in
    /// flight), and returns the outcome. The outcome counts as any other.
    pub async fn trigger(&self, probe: &str) -> Result<RunResult, TriggerError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Msg::Trigger(probe.to_string(), reply))
            .map_err(|_| TriggerError::ShuttingDown)?;
        rx.await.map_err(|_| TriggerError::ShuttingDown)?
    }

    /// Applies a registry change: unchanged probes keep their state and
    /// schedule, changed ones restart, removed ones go. A whole registry
    /// (`&Registry`, or a full [`Delta`]) replaces everything; a delta from
    /// [`Registry::commit`](crate::registry::Registry::commit) touches only
    /// what it names.
    pub async fn reload(&self, change: impl Into<Delta>) -> ReloadSummary {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Msg::Apply(Box::new(change.into()), reply)).is_err() {
            return ReloadSummary::default();
        }
        rx.await.unwrap_or_default()
    }

    /// Stops scheduling, lets runs in flight finish for up to `grace`, and
    /// returns when they have (or the grace is over).
    pub async fn shutdown(&self, grace: Duration) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Msg::Shutdown(grace, reply)).is_ok() {
            let _ = rx.await;
        }
    }
}

struct Entry {
    spec: Arc<ProbeSpec>,
    counter: Counter,
    /// Results of runs started under another epoch are dropped.
    epoch: u64,
    /// The next planned run, if any.
    planned: Option<Instant>,
    /// Which heap entry is current.
    heap_gen: u64,
    running: bool,
    /// Its planned time came while it was running.
    due: bool,
    waiters: Vec<oneshot::Sender<Result<RunResult, TriggerError>>>,
}

struct TargetState {
    spec: Arc<TargetSpec>,
    probes: Vec<Arc<str>>,
    has_startup: bool,
    started: bool,
    held: bool,
    hold: u64,
    /// When it (re)started: initial delays count from here.
    since: Instant,
}

struct Core<R: Runner> {
    runner: Arc<R>,
    results: ResultCache,
    options: Options,
    tx: mpsc::UnboundedSender<Msg>,
    entries: HashMap<Arc<str>, Entry>,
    targets: HashMap<Arc<str>, TargetState>,
    heap: BinaryHeap<Reverse<(Instant, u64, Arc<str>)>>,
    next_epoch: u64,
    stopping: bool,
    in_flight: usize,
    progress: Arc<Progress>,
}

/// Starts the scheduler task with `registry`'s probes and returns its handle.
pub fn spawn<R: Runner>(
    runner: Arc<R>,
    results: ResultCache,
    registry: impl Into<Delta>,
    options: Options,
) -> SchedulerHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut core = Core {
        runner,
        results,
        options,
        tx: tx.clone(),
        entries: HashMap::new(),
        targets: HashMap::new(),
        heap: BinaryHeap::new(),
        next_epoch: 0,
        stopping: false,
        in_flight: 0,
        progress: Arc::new(Progress::new()),
    };
    core.apply(registry.into());
    let progress = core.progress.clone();
    tokio::spawn(core.run(rx));
    SchedulerHandle { tx, progress }
}

fn eligible(kind: Kind, t: &TargetState) -> bool {
    !t.held && (kind == Kind::Startup) != t.started
}

impl<R: Runner> Core<R> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut shutdown: Option<(Instant, oneshot::Sender<()>)> = None;
        loop {
            if let Some((deadline, _)) = &shutdown
                && (self.in_flight == 0 || Instant::now() >= *deadline)
            {
                if let Some((_, reply)) = shutdown.take() {
                    let _ = reply.send(());
                }
                return;
            }
            let next = match (&shutdown, self.heap.peek()) {
                (Some((deadline, _)), _) => Some(*deadline),
                (None, Some(Reverse((at, _, _)))) => Some(*at),
                (None, None) => None,
            };
            self.progress
                .record(next.filter(|_| shutdown.is_none()), self.in_flight);
            // Wake at least every HEARTBEAT, so a pass that is long
            // overdue means the task is stuck, not merely idle.
            let heartbeat = Instant::now() + HEARTBEAT;
            let wake = next.map_or(heartbeat, |at| at.min(heartbeat));
            let msg = tokio::select! {
                biased;
                m = rx.recv() => m,
                () = tokio::time::sleep_until(wake) => {
                    if shutdown.is_none() {
                        self.start_due();
                    }
                    continue;
                }
            };
            let Some(msg) = msg else { return };
            match msg {
                Msg::Trigger(name, reply) => self.trigger(&name, reply),
                Msg::Apply(delta, reply) => {
                    let summary = self.apply(*delta);
                    let _ = reply.send(summary);
                }
                Msg::Shutdown(grace, reply) => {
                    self.stopping = true;
                    self.heap.clear();
                    shutdown = Some((Instant::now() + grace, reply));
                }
                Msg::RunDone {
                    name,
                    epoch,
                    planned,
                    result,
                } => self.done(name, epoch, planned, result),
                Msg::ActionDone { target, hold, outcome } => self.action_done(&target, hold, outcome),
                Msg::Stall(d) => {
                    tracing::warn!(for_ = %humantime::format_duration(d), "scheduler stalled on request");
                    tokio::time::sleep(d).await;
                }
            }
        }
    }

    fn schedule(&mut self, name: &Arc<str>, at: Instant) {
        let Some(e) = self.entries.get_mut(name) else { return };
        e.heap_gen += 1;
        e.planned = Some(at);
        self.heap.push(Reverse((at, e.heap_gen, name.clone())));
    }

    fn unschedule(&mut self, name: &str) {
        if let Some(e) = self.entries.get_mut(name) {
            e.heap_gen += 1;
            e.planned = None;
            e.due = false;
        }
    }

    /// The first run of a probe whose target (re)started at `since`.
    fn schedule_first(&mut self, name: &Arc<str>, since: Instant) {
        let Some(e) = self.entries.get(name) else { return };
        let now = Instant::now();
        let mut at = (since + e.spec.initial_delay).max(now);
        if self.options.jitter {
            let period = e.spec.period.as_millis().max(1) as u64;
            at = at.max(now + Duration::from_millis(fastrand::u64(0..period)));
        }
        self.schedule(name, at);
    }

    fn start_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((at, gen_, _))) = self.heap.peek() {
            if *at > now {
                break;
            }
            let (at, gen_) = (*at, *gen_);
            let Some(Reverse((_, _, name))) = self.heap.pop() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&name) else { continue };
            if e.heap_gen != gen_ || e.planned != Some(at) {
                continue;
            }
            e.planned = None;
            if e.running {
                e.due = true;
            } else {
                self.start(&name, Some(at));
            }
        }
    }

    fn start(&mut self, name: &Arc<str>, planned: Option<Instant>) {
        let Some(e) = self.entries.get_mut(name) else { return };
        e.running = true;
        self.in_flight += 1;
        let (spec, epoch) = (e.spec.clone(), e.epoch);
        let (runner, tx, name) = (self.runner.clone(), self.tx.clone(), name.clone());
        if let Some(p) = planned {
            let late = Instant::now().saturating_duration_since(p);
            tracing::trace!(probe = %name, late_us = late.as_micros() as u64, "run starts");
            self.options.observer.run_started(&spec, late);
        }
        let observer = self.options.observer.clone();
        let on = self.runner.runtime();
        let run = async move {
            let mut attempt = 1;
            let result = loop {
                let r = runner.probe(&spec, attempt).await;
                if !r.is_error() || attempt >= MAX_ATTEMPTS {
                    break r;
                }
                tracing::debug!(probe = %name, attempt, reason = ?r.reason, message = %r.message, "probe error; retrying");
                attempt += 1;
            };
            observer.run_finished(&spec, &result);
            let _ = tx.send(Msg::RunDone {
                name,
                epoch,
                planned,
                result,
            });
        };
        match on {
            Some(rt) => drop(rt.spawn(run)),
            None => drop(tokio::spawn(run)),
        }
    }

    fn done(&mut self, name: Arc<str>, epoch: u64, planned: Option<Instant>, result: RunResult) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(e) = self.entries.get_mut(&name) else { return };
        // One run per probe at a time, whatever its epoch.
        e.running = false;
        let due = std::mem::take(&mut e.due);
        for w in e.waiters.drain(..) {
            let _ = w.send(Ok(result.clone()));
        }
        let (kind, period, target) = (e.spec.kind, e.spec.period, e.spec.target.clone());
        // A run from before a reset or a change counts for nothing.
        let current = e.epoch == epoch;
        if current {
            let before = e.counter.state;
            let changed = e
                .counter
                .observe(&result, e.spec.success_threshold, e.spec.failure_threshold);
            if result.is_error() {
                tracing::warn!(probe = %name, reason = ?result.reason, message = %result.message, "probe could not run");
            }
            if let Some(new) = changed {
                // Greppable: `probe=web target=web from=success to=failure reason=timeout`;
                // without a typed reason, the run's own message (quoted) says why.
                let reason = result
                    .reason
                    .map_or_else(|| format!("{:?}", result.message), |r| r.to_string());
                tracing::info!(probe = %name, target = %target, kind = %kind, from = %before, to = %new, reason = %reason, "state changed");
            }
            self.results.record(&name, result, e.counter);
            if !self.stopping {
                if kind == Kind::Startup && changed == Some(Status::Success) {
                    self.target_started(&target);
                } else if matches!(kind, Kind::Liveness | Kind::Startup)
                    && changed == Some(Status::Failure)
                    && self.targets.get(&target).is_some_and(|t| t.spec.on_failure.is_some())
                {
                    self.hold(&target);
                }
            }
        }
        if self.stopping || !self.targets.get(&target).is_some_and(|t| eligible(kind, t)) {
            return;
        }
        let Some(e) = self.entries.get(&name) else { return };
        if e.planned.is_some() {
            return; // the next run is planned already (after a manual run or a reset)
        }
        let now = Instant::now();
        let at = match planned {
            _ if due => now,
            Some(p) if current => (p + period).max(now),
            _ => return,
        };
        self.schedule(&name, at);
    }

    fn target_started(&mut self, target: &Arc<str>) {
        let Some(t) = self.targets.get_mut(target) else { return };
        t.started = true;
        tracing::info!(target = %target, "startup probe succeeded; starting the other probes");
        let (probes, since) = (t.probes.clone(), t.since);
        for p in &probes {
            match self.entries.get(p).map(|e| e.spec.kind) {
                Some(Kind::Startup) => self.unschedule(p),
                Some(_) => self.schedule_first(p, since),
                None => {}
            }
        }
    }

    fn hold(&mut self, target: &Arc<str>) {
        let Some(t) = self.targets.get_mut(target) else { return };
        t.held = true;
        t.hold += 1;
        let hold = t.hold;
        let spec = t.spec.clone();
        let probes = t.probes.clone();
        for p in &probes {
            self.unschedule(p);
            self.next_epoch += 1;
            let epoch = self.next_epoch;
            if let Some(e) = self.entries.get_mut(p) {
                e.epoch = epoch;
            }
        }
        tracing::warn!(target = %target, "probe failed; running on_failure and holding the target's probes");
        let (runner, tx, target) = (self.runner.clone(), self.tx.clone(), target.clone());
        tokio::spawn(async move {
            let outcome = runner.act(&spec).await;
            let _ = tx.send(Msg::ActionDone { target, hold, outcome });
        });
    }

    fn action_done(&mut self, target: &Arc<str>, hold: u64, outcome: ActionOutcome) {
        let Some(t) = self.targets.get_mut(target) else { return };
        if t.hold != hold || !t.held {
            return;
        }
        if outcome.ok {
            tracing::info!(target = %target, message = %outcome.message, "on_failure action done; probes start again");
        } else {
            tracing::error!(target = %target, message = %outcome.message, "on_failure action failed; probes start again");
        }
        t.held = false;
        t.since = Instant::now();
        t.started = !t.has_startup;
        let (probes, since) = (t.probes.clone(), t.since);
        for p in &probes {
            self.reset(p);
            let Some(kind) = self.entries.get(p).map(|e| e.spec.kind) else {
                continue;
            };
            if self.targets.get(target).is_some_and(|t| eligible(kind, t)) {
                self.schedule_first(p, since);
            }
        }
    }

    /// Back to the initial state; runs in flight no longer count.
    fn reset(&mut self, name: &Arc<str>) {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let Some(e) = self.entries.get_mut(name) else { return };
        e.epoch = epoch;
        e.counter = Counter::initial(e.spec.kind);
        self.results.reset(name, e.counter);
    }

    fn trigger(&mut self, name: &str, reply: oneshot::Sender<Result<RunResult, TriggerError>>) {
        if self.stopping {
            let _ = reply.send(Err(TriggerError::ShuttingDown));
            return;
        }
        let Some((key, e)) = self.entries.get_key_value(name) else {
            let _ = reply.send(Err(TriggerError::NotFound(name.to_string())));
            return;
        };
        if self.targets.get(&e.spec.target).is_some_and(|t| t.held) {
            let _ = reply.send(Err(TriggerError::Held(name.to_string())));
            return;
        }
        let key = key.clone();
        let running = e.running;
        if !running {
            self.start(&key, None);
        }
        if let Some(e) = self.entries.get_mut(&key) {
            e.waiters.push(reply);
        }
    }

    fn apply(&mut self, d: Delta) -> ReloadSummary {
        let mut summary = ReloadSummary::default();
        self.remove_gone_probes(&d, &mut summary);
        self.apply_targets(d.full, &d.removed_targets, d.targets);
        for p in &d.probes {
            self.apply_probe(p, &mut summary);
        }
        self.start_restored_targets(&d.probes);
        summary
    }

    /// Removes the probes gone: those `d` names, or for a whole registry,
    /// those not in it. Their waiters learn they are gone.
    fn remove_gone_probes(&mut self, d: &Delta, summary: &mut ReloadSummary) {
        let gone: Vec<Arc<str>> = if d.full {
            let keep: std::collections::HashSet<&Arc<str>> = d.probes.iter().map(|p| &p.name).collect();
            self.entries.keys().filter(|n| !keep.contains(n)).cloned().collect()
        } else {
            d.removed_probes.clone()
        };
        for name in gone {
            self.unschedule(&name);
            if let Some(e) = self.entries.remove(&name) {
                for w in e.waiters {
                    let _ = w.send(Err(TriggerError::NotFound(name.to_string())));
                }
                self.results.remove(&name);
                summary.removed.push(name.to_string());
            }
        }
    }

    /// Drops the targets gone (`removed`, or with `full` every one not in
    /// `updated`) and puts in the new and changed ones; a target already
    /// started stays started, and keeps its hold.
    fn apply_targets(&mut self, full: bool, removed: &[Arc<str>], updated: Vec<crate::registry::TargetUpdate>) {
        let now = Instant::now();
        if full {
            let keep: std::collections::HashSet<&Arc<str>> = updated.iter().map(|t| &t.spec.name).collect();
            self.targets.retain(|n, _| keep.contains(n));
        } else {
            for t in removed {
                self.targets.remove(t);
            }
        }
        for t in updated {
            let has_startup = t.has_startup;
            let state = match self.targets.remove(&t.spec.name) {
                Some(old) => TargetState {
                    spec: t.spec,
                    probes: t.probes,
                    // A target already started stays started.
                    started: old.started || !has_startup,
                    has_startup,
                    held: old.held,
                    hold: old.hold,
                    since: old.since,
                },
                None => TargetState {
                    spec: t.spec,
                    probes: t.probes,
                    has_startup,
                    started: !has_startup,
                    held: false,
                    hold: 0,
                    since: now,
                },
            };
            self.targets.insert(state.spec.name.clone(), state);
        }
    }

    /// Puts in the probe `p` if it is new or changed (counted in
    /// `summary`), and schedules its first run if its target lets it run.
    fn apply_probe(&mut self, p: &Arc<ProbeSpec>, summary: &mut ReloadSummary) {
        match self.entries.get(&p.name) {
            Some(e) if *e.spec == **p => {
                summary.kept += 1;
                return;
            }
            Some(_) => {
                self.unschedule(&p.name);
                // Replaced below by `insert`, never removed in between:
                // a reader of the API sees the old record, then the new.
                self.results.forget_saved(&p.name);
                summary.changed.push(p.name.to_string());
            }
            None => summary.added.push(p.name.to_string()),
        }
        let meta = ProbeMeta {
            name: p.name.clone(),
            target: p.target.clone(),
            kind: p.kind,
            groups: p.groups.clone(),
            labels: p.labels.clone(),
            tenant: p.tenant.clone(),
            plugin: p.plugin_ref.as_str().into(),
        };
        let counter = self.results.insert(&meta, Counter::initial(p.kind));
        self.next_epoch += 1;
        // A run of the old spec may still be in flight: keep its flag so
        // the new spec's first run waits for it.
        let (waiters, running) = self
            .entries
            .remove(&p.name)
            .map(|e| (e.waiters, e.running))
            .unwrap_or_default();
        self.entries.insert(
            p.name.clone(),
            Entry {
                spec: p.clone(),
                counter,
                epoch: self.next_epoch,
                planned: None,
                heap_gen: 0,
                running,
                due: false,
                waiters,
            },
        );
        if let Some(t) = self.targets.get(&p.target)
            && eligible(p.kind, t)
        {
            let since = t.since;
            self.schedule_first(&p.name, since);
        }
    }

    /// Starts the targets whose startup probe (among `probes`) was
    /// restored as succeeded.
    fn start_restored_targets(&mut self, probes: &[Arc<ProbeSpec>]) {
        let restored_started: Vec<Arc<str>> = probes
            .iter()
            .filter_map(|p| self.entries.get(&p.name))
            .filter(|e| e.spec.kind == Kind::Startup && e.counter.state == Status::Success)
            .map(|e| e.spec.target.clone())
            .filter(|t| self.targets.get(t).is_some_and(|t| !t.started))
            .collect();
        for t in restored_started {
            self.target_started(&t);
        }
    }
}
