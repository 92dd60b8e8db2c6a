//! The executor: between the scheduler and the engine, it decides when a
//! probe's call may enter a sandbox, runs it apart from the agent's own
//! work, and counts what each tenant used. Each concern is a file:
//!
//! - **Admission** ([`admission`]): a call takes a permit of its tenant and
//!   one of the agent's global limit ([`ExecutorConfig::max_concurrent_runs`],
//!   no more than the engine's instance slots, so the engine never queues
//!   first-come); waiting calls queue per tenant and freed slots go to the
//!   tenants in turn; each tenant keeps a reserved share of the global limit.
//! - **Isolation** (here). Runs execute on a runtime of their own
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
//! - **CPU share** ([`share`]): while several tenants have calls in flight,
//!   each may have at most its share of the sandbox threads polled at once.
//! - **Stats** ([`stats`]): per tenant, calls, errors by reason, fuel, time
//!   in the sandbox and a histogram of time queued ([`TenantStats`]), for
//!   `/metrics` and billing.

mod admission;
mod runner;
mod share;
mod stats;

pub use runner::EngineRunner;
pub use stats::{QUEUE_WAIT_BUCKETS, TenantStats};

use crate::catalog::ProbeSpec;
use crate::tenants::Tenants;
use admission::Admission;
use share::Fair;
use sonde_sandbox::engine::{Call, Engine};
use sonde_sandbox::verdict::observed::TraceContext;
use sonde_sandbox::verdict::{Reason, RunResult};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
    /// [`EngineConfig::max_concurrent_calls`](sonde_sandbox::engine::EngineConfig)).
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
            max_concurrent_runs: sonde_sandbox::engine::EngineConfig::default().max_concurrent_calls as usize,
            sandbox_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            event_interval: 8,
        }
    }
}

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the sandbox runtime: {0}")]
pub struct ExecutorError(std::io::Error);

struct Inner {
    /// Unique in the process.
    id: u64,
    /// Threads that run sandboxed calls.
    threads: usize,
    admission: Arc<Admission>,
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
            .field("global", &self.inner.admission.global())
            .finish_non_exhaustive()
    }
}

/// A new trace for one run of `spec`, when it propagates one
/// (`propagate: true`): what its HTTP and gRPC requests carry.
fn trace_of(spec: &ProbeSpec) -> Option<TraceContext> {
    spec.propagate.then(|| TraceContext {
        trace_id: fastrand::u128(1..).to_be_bytes(),
        span_id: fastrand::u64(1..).to_be_bytes(),
    })
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
        Ok(Self {
            inner: Arc::new(Inner {
                id,
                threads: match config.sandbox_threads {
                    0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
                    n => n,
                },
                admission: Admission::new(config.max_concurrent_runs),
                runtime,
                handle,
            }),
        })
    }

    /// The sandbox runtime, where run tasks belong (`None` when calls run
    /// on the caller's runtime).
    pub fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.inner.handle.clone()
    }

    /// The global limit.
    pub fn max_concurrent_runs(&self) -> usize {
        self.inner.admission.global()
    }

    /// Applies the tenants of a (re)loaded config: their limits and
    /// reserved shares. Calls in flight keep their permits; a tenant gone
    /// from the config keeps its counters.
    pub fn configure(&self, tenants: &Tenants) {
        self.inner.admission.configure(tenants);
    }

    /// Runs one attempt of `spec` on `engine`: waits for a permit, then
    /// calls the plugin in a fresh sandbox on the sandbox runtime. Never
    /// fails: whatever happens is in the [`RunResult`].
    pub async fn run(&self, engine: &Engine, spec: &ProbeSpec, attempt: u32) -> RunResult {
        let queued = Instant::now();
        let permit = self.inner.admission.acquire(spec.tenant.clone()).await;
        let waited = queued.elapsed();
        let (counters, gate, active) = (permit.counters.clone(), permit.gate.clone(), permit.active.clone());
        let threads = self.inner.threads;
        // The sandbox runtime outlives the calls in it: a call holds the
        // executor until it ends.
        let executor = self.clone();
        let (engine, plugin, grants) = (engine.clone(), spec.plugin.clone(), spec.grants.clone());
        let tenant = spec.tenant.clone();
        let (probe, target, config, limits) = (
            spec.name.clone(),
            spec.address.clone(),
            spec.config.clone(),
            spec.limits,
        );
        let trace = trace_of(spec);
        let call = async move {
            let call = Call {
                probe: &probe,
                target: &target,
                config: &config,
                limits,
                grants: &grants,
                attempt,
                observe: false,
            };
            let result = Fair::new(engine.run_traced(&tenant, &plugin, &call, trace), gate, active, threads).await;
            drop(permit);
            counters.record(waited, &result);
            drop(executor);
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

    /// Runs `call` of `spec`'s plugin on the caller's own runtime instead
    /// of handing it to the sandbox threads, with the same permit, CPU
    /// share and stats as [`Executor::run`]. For a caller that does nothing
    /// but wait for the answer (`GET /probe`): the hand-off costs two
    /// thread wake-ups per run, about a fifth of such a request's CPU. The
    /// caller bounds how many such runs it has in flight.
    pub async fn run_here(&self, engine: &Engine, spec: &ProbeSpec, call: &Call<'_>) -> RunResult {
        let queued = Instant::now();
        let permit = self.inner.admission.acquire(spec.tenant.clone()).await;
        let waited = queued.elapsed();
        let (gate, active) = (permit.gate.clone(), permit.active.clone());
        let result = Fair::new(
            engine.run_traced(&spec.tenant, &spec.plugin, call, trace_of(spec)),
            gate,
            active,
            self.inner.threads,
        )
        .await;
        permit.counters.record(waited, &result);
        result
    }

    /// Charges `pulls` (what resolving a change's `oci://` plugins cost)
    /// to their tenants. A tenant the executor does not know (refused by
    /// the same change) is not charged.
    pub fn record_pulls(&self, pulls: &[crate::catalog::Pull]) {
        for p in pulls {
            if let Some(c) = self.inner.admission.counters(&p.tenant) {
                c.record_pull(p.cost.bytes, p.cost.elapsed);
            }
        }
    }

    /// Counts `took` of compiling against `tenant` (an upload of its
    /// plugin, accepted or refused). A tenant the executor does not know
    /// is not counted.
    pub(crate) fn record_compile(&self, tenant: &str, took: std::time::Duration) {
        if let Some(c) = self.inner.admission.counters(&tenant.into()) {
            c.record_compile(took);
        }
    }

    /// Every tenant's stats, the operator's included, sorted by tenant.
    pub fn stats(&self) -> Vec<TenantStats> {
        let mut out = self.inner.admission.stats();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// One tenant's stats.
    pub fn tenant_stats(&self, tenant: &str) -> Option<TenantStats> {
        self.stats().into_iter().find(|s| &*s.tenant == tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
