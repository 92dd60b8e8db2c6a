//! The executor: between the scheduler and the engine, it decides when a
//! probe's call may enter a sandbox, runs it apart from the agent's own
//! work, and counts what each tenant used.
//!
//! - **Permits.** A call first takes a permit of its tenant (at most its
//!   `max_concurrent_runs` at once) and one of the agent's global limit
//!   ([`ExecutorConfig::max_concurrent_runs`], no more than the engine's
//!   instance slots, so the engine never queues first-come).
//! - **Fairness.** Calls that must wait queue per tenant, and a freed slot
//!   goes to the tenants with waiters in turn (round robin), not to the
//!   call that asked first; so 500 queued calls of one tenant do not stand
//!   before another tenant's one. Each tenant also has a **reserved share**
//!   of the global limit (its `max_concurrent_runs`, but at most the global
//!   limit divided by the number of tenants) that others may not take: a
//!   tenant whose calls use their whole deadline cannot fill every slot and
//!   make the next tenant wait for one of them to end.
//! - **Isolation.** Runs execute on a runtime of their own
//!   (`sonde-sandbox` threads; the scheduler spawns each run there through
//!   [`Runner::runtime`](crate::scheduler::Runner::runtime), so a call
//!   costs no extra hand-off), which polls its timers and sockets every few
//!   task polls ([`ExecutorConfig::event_interval`]). A spinning guest
//!   yields at every epoch tick (1 ms) but is at once ready again; on the
//!   agent's runtime tokio would then look at its timers and sockets only
//!   every 61 polls. Measured with one tenant's spinning guests on 2 cores:
//!   on the agent's runtime the scheduler fell up to ~100 ms behind and
//!   another tenant's start lateness p99 was ~70 ms; on the sandbox runtime,
//!   under 10 ms and ~5 ms.
//! - **CPU share.** While several tenants have calls in flight, each may
//!   have at most its share of the sandbox threads polled at once (threads
//!   divided by those tenants, at least one); its other calls park until
//!   one of its polls ends. Without it, a tenant's spinning
//!   guests fill tokio's run queue and every other call waits behind them
//!   at each wake-up (measured: another tenant's http calls took 135-400 ms
//!   instead of ~2 ms).
//! - **Stats.** Per tenant: calls, errors by reason, fuel, time in the
//!   sandbox and time queued ([`TenantStats`]), for `/metrics` and billing.

use crate::engine::{Call, Engine};
use crate::registry::ProbeSpec;
use crate::tenants::{self, TenantId, Tenants};
use crate::verdict::{Reason, RunResult};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

thread_local! {
    /// The id of the executor whose sandbox runtime this thread belongs
    /// to; 0 for none.
    static IN_SANDBOX: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Executor ids, from 1.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Executor settings.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// Calls in sandboxes at once, all tenants together (default 256, the
    /// engine's instance slots; keep it no higher than
    /// [`EngineConfig::max_concurrent_calls`](crate::engine::EngineConfig)).
    pub max_concurrent_runs: usize,
    /// Threads of the sandbox runtime; 0 runs calls on the caller's
    /// runtime instead (for benchmarks that want no hand-off). Default: the
    /// number of CPUs.
    pub sandbox_threads: usize,
    /// How many task polls the sandbox runtime makes between two checks of
    /// its timers and sockets (tokio's default is 61). A spinning guest's
    /// poll lasts one epoch tick (1 ms), so this bounds how late a timer or
    /// a socket of another call is noticed. Default 8.
    pub event_interval: u32,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            max_concurrent_runs: crate::engine::EngineConfig::default().max_concurrent_calls as usize,
            sandbox_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            event_interval: 8,
        }
    }
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the sandbox runtime: {0}")]
pub struct ExecutorError(std::io::Error);

/// Upper bounds of the queue-wait histogram buckets, in microseconds.
pub const WAIT_BUCKETS_US: [u64; 10] = [
    100, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000,
];

const REASONS: [Reason; 9] = [
    Reason::Timeout,
    Reason::Trap,
    Reason::Fuel,
    Reason::Memory,
    Reason::Denied,
    Reason::InvalidConfig,
    Reason::Io,
    Reason::Internal,
    Reason::HostLimit,
];

fn reason_index(r: Reason) -> usize {
    match r {
        Reason::Timeout => 0,
        Reason::Trap => 1,
        Reason::Fuel => 2,
        Reason::Memory => 3,
        Reason::Denied => 4,
        Reason::InvalidConfig => 5,
        Reason::Io => 6,
        Reason::Internal => 7,
        Reason::HostLimit => 8,
    }
}

/// One tenant's counters, updated as its calls end.
#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    errors: [AtomicU64; 9],
    fuel: AtomicU64,
    sandbox_us: AtomicU64,
    wait_us: AtomicU64,
    /// Time spent compiling the tenant's uploads.
    compile_us: AtomicU64,
    /// Non-cumulative counts per bucket of [`WAIT_BUCKETS_US`], then +Inf.
    wait_buckets: [AtomicU64; 11],
}

impl Counters {
    fn record(&self, waited: Duration, r: &RunResult) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = r.reason {
            self.errors[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
        }
        self.fuel.fetch_add(r.fuel_consumed, Ordering::Relaxed);
        self.sandbox_us
            .fetch_add(r.duration.as_micros() as u64, Ordering::Relaxed);
        let w = waited.as_micros() as u64;
        self.wait_us.fetch_add(w, Ordering::Relaxed);
        let i = WAIT_BUCKETS_US
            .iter()
            .position(|b| w <= *b)
            .unwrap_or(WAIT_BUCKETS_US.len());
        self.wait_buckets[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// What one tenant has used since the agent started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantStats {
    /// The tenant.
    pub tenant: TenantId,
    /// Sandboxed calls made (each attempt of a run is one).
    pub calls: u64,
    /// Calls that ended without the plugin's own verdict, by reason
    /// (every reason listed, zeros included).
    pub errors: Vec<(Reason, u64)>,
    /// Fuel consumed.
    pub fuel: u64,
    /// Wall time spent in sandboxes (instantiation to the end of the call).
    pub sandbox_time: Duration,
    /// Time calls waited for a permit, in total.
    pub queue_wait: Duration,
    /// Time spent compiling the plugins it uploaded (refused ones too).
    pub compile_time: Duration,
    /// The queue-wait histogram: (upper bound, calls that waited at most
    /// that long), cumulative as Prometheus has it; the last bound is
    /// `Duration::MAX` (+Inf).
    pub queue_wait_buckets: Vec<(Duration, u64)>,
    /// Calls in sandboxes now.
    pub running: usize,
    /// Calls waiting for a permit now.
    pub waiting: usize,
    /// Its `max_concurrent_runs`, as the executor applies it.
    pub limit: usize,
    /// The share of the global limit kept for it.
    pub reserved: usize,
}

/// One tenant's queue and permits.
struct Lane {
    limit: usize,
    reserved: usize,
    running: usize,
    waiters: VecDeque<oneshot::Sender<Permit>>,
    counters: Arc<Counters>,
    gate: Arc<Gate>,
    /// Gone from the config: nothing reserved; kept for its counters and
    /// its runs in flight.
    retired: bool,
}

impl Lane {
    fn committed(&self) -> usize {
        self.running.max(self.reserved)
    }
}

#[derive(Default)]
struct State {
    /// The global limit.
    global: usize,
    /// Tenants with calls in sandboxes, shared with the CPU gates.
    active: Arc<AtomicUsize>,
    lanes: HashMap<TenantId, Lane>,
    /// Tenants with waiters, in turn order.
    turns: VecDeque<TenantId>,
    /// Σ over lanes of max(running, reserved): slots in use or kept.
    committed: usize,
}

struct Inner {
    /// Unique in the process.
    id: u64,
    global: usize,
    /// Threads that run sandboxed calls.
    threads: usize,
    state: Mutex<State>,
    runtime: Option<tokio::runtime::Runtime>,
    handle: Option<tokio::runtime::Handle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async context forbids; calls
        // still in it are cancelled.
        if let Some(rt) = self.runtime.take() {
            if IN_SANDBOX.get() == self.id {
                // The last call in flight let go on a thread of the runtime
                // itself: shut it down from elsewhere.
                let _ = std::thread::Builder::new()
                    .name("sonde-sandbox-stop".into())
                    .spawn(move || rt.shutdown_background());
            } else {
                rt.shutdown_background();
            }
        }
    }
}

/// The fair executor. Clones share it.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("global", &self.inner.global)
            .finish_non_exhaustive()
    }
}

/// A call's right to run: one of its tenant's and one of the global
/// limit's. Dropping it hands the slot on.
struct Permit {
    inner: Arc<Inner>,
    tenant: TenantId,
    armed: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.inner.release(&self.tenant);
        }
    }
}

impl State {
    fn lane(&mut self, tenant: &TenantId) -> &mut Lane {
        if !self.lanes.contains_key(tenant) {
            // A tenant the executor was not configured with: it gets a
            // configured tenant's default quota and its share, so it can
            // never wait on slots reserved for others.
            tracing::warn!(tenant = %tenant, "a run of a tenant the executor was not configured with; default quotas");
            self.insert(tenant, tenants::DEFAULT_MAX_CONCURRENT_RUNS as usize);
            self.rebalance();
        }
        self.lanes.get_mut(tenant).expect("the lane was just inserted")
    }

    fn insert(&mut self, tenant: &TenantId, limit: usize) {
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane {
            limit,
            reserved: 0,
            retired: false,
            running: 0,
            waiters: VecDeque::new(),
            counters: Arc::default(),
            gate: Arc::default(),
        });
        lane.limit = limit.clamp(1, self.global);
        lane.retired = false;
    }

    /// Shares the global limit out: each tenant not retired keeps its
    /// limit, up to an equal part of the global one.
    fn rebalance(&mut self) {
        let tenants = self.lanes.values().filter(|l| !l.retired).count();
        let share = self.global / tenants.max(1);
        for l in self.lanes.values_mut() {
            l.reserved = if l.retired { 0 } else { l.limit.min(share) };
        }
        self.committed = self.lanes.values().map(Lane::committed).sum();
    }

    /// Whether `tenant` may start a call now without taking a slot another
    /// tenant has reserved.
    fn can_admit(&self, tenant: &str, global: usize) -> bool {
        let Some(l) = self.lanes.get(tenant) else { return false };
        let after = self.committed - l.committed() + (l.running + 1).max(l.reserved);
        l.running < l.limit && after <= global
    }

    fn admit(&mut self, tenant: &str) {
        if let Some(l) = self.lanes.get_mut(tenant) {
            let before = l.committed();
            l.running += 1;
            if l.running == 1 {
                self.active.fetch_add(1, Ordering::Relaxed);
            }
            self.committed = self.committed - before + l.committed();
        }
    }

    fn release(&mut self, tenant: &str) {
        if let Some(l) = self.lanes.get_mut(tenant) {
            let before = l.committed();
            if l.running == 1 {
                self.active.fetch_sub(1, Ordering::Relaxed);
            }
            l.running = l.running.saturating_sub(1);
            self.committed = self.committed - before + l.committed();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(self: &Arc<Self>, tenant: &TenantId) {
        let mut st = self.lock();
        st.release(tenant);
        self.dispatch(&mut st);
    }

    /// Hands free slots to waiting tenants in turn, until a whole round
    /// admits nobody.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        let mut idle = 0;
        while idle < st.turns.len() {
            let Some(tenant) = st.turns.pop_front() else { break };
            let Some(lane) = st.lanes.get_mut(&tenant) else {
                continue;
            };
            while lane.waiters.front().is_some_and(oneshot::Sender::is_closed) {
                lane.waiters.pop_front();
            }
            if lane.waiters.is_empty() {
                continue;
            }
            if !st.can_admit(&tenant, self.global) {
                st.turns.push_back(tenant);
                idle += 1;
                continue;
            }
            st.admit(&tenant);
            let lane = st.lanes.get_mut(&tenant).expect("the lane just admitted");
            let waiter = lane.waiters.pop_front().expect("a waiter");
            let more = !lane.waiters.is_empty();
            let permit = Permit {
                inner: self.clone(),
                tenant: tenant.clone(),
                armed: true,
            };
            if let Err(mut p) = waiter.send(permit) {
                // The caller gave up: undo here, not in its Drop, which
                // would take the lock we hold.
                p.armed = false;
                st.release(&tenant);
            } else {
                idle = 0;
            }
            if more {
                st.turns.push_back(tenant);
            }
        }
    }
}

/// How many of one tenant's calls are being polled (running wasm or host
/// code) at once, and the calls waiting for their turn to be.
#[derive(Default)]
struct Gate {
    in_poll: AtomicUsize,
    next_id: AtomicU64,
    parked: Mutex<VecDeque<(u64, Waker)>>,
}

impl Gate {
    fn try_enter(&self, limit: usize) -> bool {
        self.in_poll
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .is_ok()
    }

    fn parked(&self) -> MutexGuard<'_, VecDeque<(u64, Waker)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unpark(&self, id: u64) {
        self.parked().retain(|(i, _)| *i != id);
    }

    fn wake_next(&self) {
        let next = self.parked().pop_front();
        if let Some((_, w)) = next {
            w.wake();
        }
    }
}

/// A sandboxed call that takes its tenant's CPU share: while several
/// tenants have calls in flight, each may have at most
/// `threads / tenants` (at least one) of its calls polled at once, so a
/// tenant's spinning guests, ready again after every epoch tick, cannot
/// take every sandbox thread. A call over the share parks until one of its
/// tenant's polls ends. Alone, a tenant may use every thread.
struct Fair<F> {
    call: Pin<Box<F>>,
    gate: Arc<Gate>,
    active: Arc<AtomicUsize>,
    threads: usize,
    id: u64,
}

impl<F: Future> Fair<F> {
    fn new(call: F, gate: Arc<Gate>, active: Arc<AtomicUsize>, threads: usize) -> Self {
        let id = gate.next_id.fetch_add(1, Ordering::Relaxed);
        Self {
            call: Box::pin(call),
            gate,
            active,
            threads,
            id,
        }
    }
}

impl<F: Future> Future for Fair<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let limit = this.threads.div_ceil(this.active.load(Ordering::Relaxed).max(1));
        if !this.gate.try_enter(limit) {
            {
                let mut parked = this.gate.parked();
                match parked.iter_mut().find(|(i, _)| *i == this.id) {
                    Some((_, w)) => w.clone_from(cx.waker()),
                    None => parked.push_back((this.id, cx.waker().clone())),
                }
            }
            // A poll may have ended between the try and the parking.
            if !this.gate.try_enter(limit) {
                return Poll::Pending;
            }
        }
        this.gate.unpark(this.id);
        let out = this.call.as_mut().poll(cx);
        this.gate.in_poll.fetch_sub(1, Ordering::AcqRel);
        this.gate.wake_next();
        out
    }
}

impl<F> Drop for Fair<F> {
    fn drop(&mut self) {
        // Woken for a turn it will not take: hand the turn on.
        let was_parked = {
            let mut parked = self.gate.parked();
            let before = parked.len();
            parked.retain(|(i, _)| *i != self.id);
            parked.len() != before
        };
        if !was_parked {
            self.gate.wake_next();
        }
    }
}

impl Executor {
    /// An executor with `config`, knowing only the operator's tenant until
    /// [`configure`](Self::configure)d.
    pub fn new(config: ExecutorConfig) -> Result<Self, ExecutorError> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let runtime = match config.sandbox_threads {
            0 => None,
            n => Some(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n)
                    .thread_name("sonde-sandbox")
                    .on_thread_start(move || IN_SANDBOX.set(id))
                    .event_interval(config.event_interval.max(1))
                    .enable_all()
                    .build()
                    .map_err(ExecutorError)?,
            ),
        };
        let handle = runtime.as_ref().map(|rt| rt.handle().clone());
        let executor = Self {
            inner: Arc::new(Inner {
                id,
                global: config.max_concurrent_runs.max(1),
                threads: match config.sandbox_threads {
                    0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
                    n => n,
                },
                state: Mutex::new(State {
                    global: config.max_concurrent_runs.max(1),
                    ..State::default()
                }),
                runtime,
                handle,
            }),
        };
        executor.configure(&Tenants::default());
        Ok(executor)
    }

    /// The sandbox runtime, where run tasks belong (`None` when calls run
    /// on the caller's runtime).
    pub fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.inner.handle.clone()
    }

    /// The global limit.
    pub fn max_concurrent_runs(&self) -> usize {
        self.inner.global
    }

    /// Applies the tenants of a (re)loaded config: their limits and
    /// reserved shares. Calls in flight keep their permits; a tenant gone
    /// from the config keeps its counters.
    pub fn configure(&self, tenants: &Tenants) {
        let mut st = self.inner.lock();
        for lane in st.lanes.values_mut() {
            lane.retired = true;
        }
        for t in tenants.iter() {
            let limit = usize::try_from(t.quotas.max_concurrent_runs).unwrap_or(usize::MAX);
            st.insert(&t.id, limit);
        }
        st.rebalance();
        self.inner.dispatch(&mut st);
    }

    async fn acquire(&self, tenant: TenantId) -> Permit {
        let tenant = &tenant;
        let rx = {
            let mut st = self.inner.lock();
            let lane = st.lane(tenant);
            if lane.waiters.is_empty() && st.can_admit(tenant, self.inner.global) {
                st.admit(tenant);
                return Permit {
                    inner: self.inner.clone(),
                    tenant: tenant.clone(),
                    armed: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            let lane = st.lane(tenant);
            let first = lane.waiters.is_empty();
            lane.waiters.push_back(tx);
            if first && !st.turns.contains(tenant) {
                st.turns.push_back(tenant.clone());
            }
            rx
        };
        // The sender lives in the executor's state, which outlives `self`.
        rx.await.expect("a waiting call is always answered")
    }

    /// Runs one attempt of `spec` on `engine`: waits for a permit, then
    /// calls the plugin in a fresh sandbox on the sandbox runtime. Never
    /// fails: whatever happens is in the [`RunResult`].
    pub async fn run(&self, engine: &Engine, spec: &ProbeSpec, attempt: u32) -> RunResult {
        let queued = Instant::now();
        let permit = self.acquire(spec.tenant.clone()).await;
        let waited = queued.elapsed();
        let (counters, gate, active) = {
            let mut st = self.inner.lock();
            let active = st.active.clone();
            let lane = st.lane(&spec.tenant);
            (lane.counters.clone(), lane.gate.clone(), active)
        };
        let threads = self.inner.threads;
        let (engine, plugin, grants) = (engine.clone(), spec.plugin.clone(), spec.grants.clone());
        let tenant = spec.tenant.clone();
        let (probe, target, config, limits) = (
            spec.name.clone(),
            spec.address.clone(),
            spec.config.clone(),
            spec.limits,
        );
        let call = async move {
            let call = Call {
                probe: &probe,
                target: &target,
                config: &config,
                limits,
                grants: &grants,
                attempt,
            };
            let result = Fair::new(engine.run_for(&tenant, &plugin, &call), gate, active, threads).await;
            drop(permit);
            counters.record(waited, &result);
            result
        };
        match &self.inner.handle {
            // Already on the sandbox runtime (the scheduler spawned the run
            // there): no hand-off.
            Some(_) if IN_SANDBOX.get() == self.inner.id => call.await,
            None => call.await,
            Some(h) => match h.spawn(call).await {
                Ok(r) => r,
                Err(e) => RunResult::error(Reason::Internal, format!("the sandbox task failed: {e}")),
            },
        }
    }

    /// Every tenant's stats, the operator's included, sorted by tenant.
    pub fn stats(&self) -> Vec<TenantStats> {
        let st = self.inner.lock();
        let mut out: Vec<TenantStats> = st
            .lanes
            .iter()
            .map(|(tenant, l)| {
                let c = &l.counters;
                let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
                let mut cumulative = 0;
                let queue_wait_buckets = c
                    .wait_buckets
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        cumulative += load(n);
                        let bound = WAIT_BUCKETS_US
                            .get(i)
                            .map_or(Duration::MAX, |us| Duration::from_micros(*us));
                        (bound, cumulative)
                    })
                    .collect();
                TenantStats {
                    tenant: tenant.clone(),
                    calls: load(&c.calls),
                    errors: REASONS
                        .iter()
                        .map(|r| (*r, load(&c.errors[reason_index(*r)])))
                        .collect(),
                    fuel: load(&c.fuel),
                    sandbox_time: Duration::from_micros(load(&c.sandbox_us)),
                    queue_wait: Duration::from_micros(load(&c.wait_us)),
                    compile_time: Duration::from_micros(load(&c.compile_us)),
                    queue_wait_buckets,
                    running: l.running,
                    waiting: l.waiters.iter().filter(|w| !w.is_closed()).count(),
                    limit: l.limit,
                    reserved: l.reserved,
                }
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// Counts `took` of compiling against `tenant` (an upload of its
    /// plugin, accepted or refused). A tenant without a lane (not
    /// configured) is not counted.
    pub fn record_compile(&self, tenant: &str, took: Duration) {
        let st = self.inner.lock();
        if let Some(lane) = st.lanes.get(tenant) {
            lane.counters
                .compile_us
                .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// One tenant's stats.
    pub fn tenant_stats(&self, tenant: &str) -> Option<TenantStats> {
        self.stats().into_iter().find(|s| &*s.tenant == tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{Ceiling, Quotas, Tenant};

    fn executor(global: usize, tenants: &[(&str, u32)]) -> Executor {
        let e = Executor::new(ExecutorConfig {
            max_concurrent_runs: global,
            sandbox_threads: 0,
            event_interval: 8,
        })
        .unwrap();
        let list = tenants
            .iter()
            .map(|(id, runs)| {
                Tenant::new(
                    id,
                    Quotas {
                        max_concurrent_runs: *runs,
                        ..Quotas::default()
                    },
                    Ceiling::default(),
                )
            })
            .collect();
        e.configure(&Tenants::new(list, None));
        e
    }

    fn id(s: &str) -> TenantId {
        s.into()
    }

    #[tokio::test]
    async fn a_tenant_never_exceeds_its_permits() {
        let e = executor(100, &[("a", 2)]);
        let p1 = e.acquire(id("a")).await;
        let _p2 = e.acquire(id("a")).await;
        let mut third = std::pin::pin!(e.acquire(id("a")));
        assert!(futures_poll(&mut third).is_none(), "a third run waits");
        assert_eq!(e.tenant_stats("a").unwrap().waiting, 1);
        drop(p1);
        assert!(futures_poll(&mut third).is_some(), "and starts when one ends");
    }

    /// Polls a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    /// Polls each future still pending once; returns what became ready.
    fn poll_all<F: std::future::Future + Unpin>(fs: &mut [Option<F>]) -> Vec<F::Output> {
        let mut ready = Vec::new();
        for slot in fs.iter_mut() {
            if let Some(f) = slot
                && let Some(v) = futures_poll(f)
            {
                ready.push(v);
                *slot = None;
            }
        }
        ready
    }

    #[tokio::test]
    async fn freed_slots_go_to_tenants_in_turn_not_first_come() {
        // Global 4 among three tenants (a, b and the operator): each keeps
        // one slot (4 / 3) that the others may not take.
        let e = executor(4, &[("a", 4), ("b", 4)]);
        let mut a_held = vec![e.acquire(id("a")).await, e.acquire(id("a")).await];
        // The operator's and b's slots are kept: a's third call waits.
        let mut a_waiting: Vec<_> = (0..5).map(|_| Some(Box::pin(e.acquire(id("a"))))).collect();
        assert!(poll_all(&mut a_waiting).is_empty());
        // b starts at once, though five of a's calls asked first.
        let _b1 = e.acquire(id("b")).await;
        let mut b2 = [Some(Box::pin(e.acquire(id("b"))))];
        assert!(poll_all(&mut b2).is_empty());
        // A slot frees: a queued first, so it is a's turn...
        drop(a_held.pop());
        let got_a = poll_all(&mut a_waiting);
        assert_eq!(got_a.len(), 1);
        assert!(poll_all(&mut b2).is_empty());
        // ...and the next is b's, though four of a's calls still wait
        // from before b asked.
        drop(a_held.pop());
        let got_b = poll_all(&mut b2);
        assert_eq!(got_b.len(), 1, "b's turn");
        assert!(poll_all(&mut a_waiting).is_empty());
        let s = e.tenant_stats("a").unwrap();
        assert_eq!((s.running, s.waiting, s.limit, s.reserved), (1, 4, 4, 1));
        drop((got_a, got_b));
    }

    #[tokio::test]
    async fn a_tenant_it_was_not_told_of_still_runs() {
        // Alone, the operator's tenant keeps every slot for itself...
        let e = executor(4, &[]);
        assert_eq!(e.tenant_stats("default").unwrap().reserved, 4);
        // ...until another tenant shows up: then they share.
        let p = e.acquire(id("stranger")).await;
        let s = e.tenant_stats("stranger").unwrap();
        assert_eq!((s.running, s.limit, s.reserved), (1, 4, 2));
        assert_eq!(e.tenant_stats("default").unwrap().reserved, 2);
        drop(p);
    }

    #[tokio::test]
    async fn a_reload_changes_limits_and_keeps_counters() {
        let e = executor(8, &[("a", 2), ("b", 2)]);
        let p = e.acquire(id("a")).await;
        // `a` leaves the config with a call in flight; `b` may now run 3.
        e.configure(&Tenants::new(
            vec![Tenant::new(
                "b",
                Quotas {
                    max_concurrent_runs: 3,
                    ..Quotas::default()
                },
                Ceiling::default(),
            )],
            None,
        ));
        let a = e.tenant_stats("a").unwrap();
        assert_eq!((a.running, a.reserved), (1, 0), "retired, its call still counted");
        let b = e.tenant_stats("b").unwrap();
        assert_eq!((b.limit, b.reserved), (3, 3));
        let held: Vec<_> = [
            e.acquire(id("b")).await,
            e.acquire(id("b")).await,
            e.acquire(id("b")).await,
        ]
        .into();
        let mut fourth = [Some(Box::pin(e.acquire(id("b"))))];
        assert!(poll_all(&mut fourth).is_empty());
        drop((p, held));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn calls_run_on_the_sandbox_runtime_and_it_stops_when_dropped() {
        let e = Executor::new(ExecutorConfig {
            sandbox_threads: 1,
            ..ExecutorConfig::default()
        })
        .unwrap();
        let rt = e.runtime().unwrap();
        let name = rt
            .spawn(async { std::thread::current().name().map(str::to_string) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("sonde-sandbox"));
        // Dropped in an async context, and from the runtime's own thread.
        let e2 = e.clone();
        drop(e);
        if let Err(e) = rt.spawn(async move { drop(e2) }).await {
            // Its shutdown may beat the task's end; it must not panic.
            assert!(e.is_cancelled(), "{e}");
        }
    }

    /// A future whose polls are counted, and each blocks until `go` says.
    struct Blocking {
        polls: Arc<AtomicUsize>,
        go: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    }

    impl Future for Blocking {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            let _ = self.go.lock().unwrap().recv();
            Poll::Pending
        }
    }

    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Two calls of one tenant; the first is in a poll (on another
    /// thread) when the second is polled. Returns whether the second's
    /// inner future was polled then, and whether it was parked, then woken
    /// and polled once the first's poll ended.
    fn second_call_while_first_polls(tenants_active: usize) -> (bool, bool) {
        let gate = Arc::new(Gate::default());
        let active = Arc::new(AtomicUsize::new(tenants_active));
        let (tx, rx) = std::sync::mpsc::channel();
        let go = Arc::new(Mutex::new(rx));
        let (p1, p2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let first = Blocking {
            polls: p1.clone(),
            go: go.clone(),
        };
        let (gate1, active1) = (gate.clone(), active.clone());
        let t = std::thread::spawn(move || {
            let mut f = Fair::new(first, gate1, active1, 2);
            let mut cx = Context::from_waker(Waker::noop());
            let _ = Pin::new(&mut f).poll(&mut cx);
        });
        while p1.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // The first call is inside its poll now.
        let (tx2, rx2) = std::sync::mpsc::channel();
        let second = Blocking {
            polls: p2.clone(),
            go: Arc::new(Mutex::new(rx2)),
        };
        tx2.send(()).unwrap();
        tx2.send(()).unwrap();
        let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut f2 = Fair::new(second, gate.clone(), active, 2);
        let _ = Pin::new(&mut f2).poll(&mut Context::from_waker(&waker));
        let ran_alongside = p2.load(Ordering::SeqCst) == 1;
        tx.send(()).unwrap();
        t.join().unwrap();
        let was_woken = woken.0.load(Ordering::SeqCst) >= 1;
        let _ = Pin::new(&mut f2).poll(&mut Context::from_waker(&waker));
        let ran_after = was_woken && p2.load(Ordering::SeqCst) >= 1;
        (ran_alongside, ran_after)
    }

    #[test]
    fn a_tenant_takes_its_share_of_the_threads_not_all_of_them() {
        // Two tenants with calls in flight, two threads: one poll each.
        assert_eq!(second_call_while_first_polls(2), (false, true));
        // Alone, a tenant may use every thread: the second never parks.
        assert_eq!(second_call_while_first_polls(1), (true, false));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_turn_back() {
        let e = executor(1, &[]);
        let p = e.acquire(id("default")).await;
        let mut w1 = Box::pin(e.acquire(id("default")));
        assert!(futures_poll(&mut w1).is_none());
        drop(w1);
        let mut w2 = Box::pin(e.acquire(id("default")));
        assert!(futures_poll(&mut w2).is_none());
        drop(p);
        let got = futures_poll(&mut w2);
        assert!(got.is_some());
        let s = e.tenant_stats("default").unwrap();
        assert_eq!((s.running, s.waiting), (1, 0));
    }
}
