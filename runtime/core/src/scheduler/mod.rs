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

use crate::catalog::{Delta, ProbeSpec, TargetSpec};
use crate::config::Kind;
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

mod outcome;
mod reload;
mod run;
mod timers;

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

    /// Applies a catalog change: unchanged probes keep their state and
    /// schedule, changed ones restart, removed ones go. A whole catalog
    /// (`&Catalog`, or a full [`Delta`]) replaces everything; a delta from
    /// [`Catalog::commit`](crate::catalog::Catalog::commit) touches only
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

/// Starts the scheduler task with `catalog`'s probes and returns its handle.
pub fn spawn<R: Runner>(
    runner: Arc<R>,
    results: ResultCache,
    catalog: impl Into<Delta>,
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
    core.apply(catalog.into());
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
}
