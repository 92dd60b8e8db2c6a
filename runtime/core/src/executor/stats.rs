//! What each tenant's calls used: counters updated as a call ends, read by
//! `/metrics` (per-tenant series) and billing.

use crate::tenants::TenantId;
use prometheus_client::metrics::histogram::Histogram;
use sonde_sandbox::verdict::{Reason, RunResult};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the queue-wait histogram's buckets, in seconds: from
/// 100 µs (a free permit) to 5 s (a tenant starved behind whole deadlines).
pub const QUEUE_WAIT_BUCKETS: [f64; 10] = [0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0];

/// Every reason a call can end without the plugin's own verdict, in the
/// order [`TenantStats::errors`] lists them.
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
#[derive(Debug)]
pub(super) struct Counters {
    calls: AtomicU64,
    errors: [AtomicU64; 9],
    fuel: AtomicU64,
    sandbox_us: AtomicU64,
    wait_us: AtomicU64,
    /// How long each call waited for a permit, in seconds.
    queue_wait: Histogram,
    pull_bytes: AtomicU64,
    pull_us: AtomicU64,
    /// Time spent compiling the tenant's uploads.
    compile_us: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            calls: AtomicU64::default(),
            errors: Default::default(),
            fuel: AtomicU64::default(),
            sandbox_us: AtomicU64::default(),
            wait_us: AtomicU64::default(),
            queue_wait: Histogram::new(QUEUE_WAIT_BUCKETS),
            pull_bytes: AtomicU64::default(),
            pull_us: AtomicU64::default(),
            compile_us: AtomicU64::default(),
        }
    }
}

/// A tenant's share of the executor's slots at the time of a snapshot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slots {
    pub running: usize,
    pub waiting: usize,
    pub limit: usize,
    pub reserved: usize,
}

impl Counters {
    /// Counts one call that waited `waited` for its permit and ended as `r`.
    pub(super) fn record(&self, waited: Duration, r: &RunResult) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = r.reason {
            self.errors[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
        }
        self.fuel.fetch_add(r.fuel_consumed, Ordering::Relaxed);
        self.sandbox_us
            .fetch_add(r.duration.as_micros() as u64, Ordering::Relaxed);
        self.wait_us.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// Counts one `oci://` plugin resolved for the tenant: `bytes` from
    /// the registry in `elapsed`.
    pub(super) fn record_pull(&self, bytes: u64, elapsed: Duration) {
        self.pull_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.pull_us.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts `took` of compiling one of the tenant's uploads.
    pub(super) fn record_compile(&self, took: Duration) {
        self.compile_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// The counters as [`TenantStats`], with the tenant's `slots` now.
    pub(super) fn snapshot(&self, tenant: TenantId, slots: Slots) -> TenantStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TenantStats {
            tenant,
            calls: load(&self.calls),
            errors: REASONS
                .iter()
                .map(|r| (*r, load(&self.errors[reason_index(*r)])))
                .collect(),
            fuel: load(&self.fuel),
            sandbox_time: Duration::from_micros(load(&self.sandbox_us)),
            queue_wait: Duration::from_micros(load(&self.wait_us)),
            queue_wait_histogram: self.queue_wait.clone(),
            pull_bytes: load(&self.pull_bytes),
            pull_time: Duration::from_micros(load(&self.pull_us)),
            compile_time: Duration::from_micros(load(&self.compile_us)),
            running: slots.running,
            waiting: slots.waiting,
            limit: slots.limit,
            reserved: slots.reserved,
        }
    }
}

/// What one tenant has used since the agent started.
#[derive(Clone, Debug)]
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
    /// How long each call waited for a permit, in seconds, bucketed by
    /// [`QUEUE_WAIT_BUCKETS`]: the live histogram (a handle, not a copy),
    /// exposed in `/metrics` as `sonde_tenant_queue_wait_seconds`.
    pub queue_wait_histogram: Histogram,
    /// Bytes its probes' `oci://` plugins brought from registries.
    pub pull_bytes: u64,
    /// Time spent resolving its probes' `oci://` plugins.
    pub pull_time: Duration,
    /// Time spent compiling the plugins it uploaded (refused ones too).
    pub compile_time: Duration,
    /// Calls in sandboxes now.
    pub running: usize,
    /// Calls waiting for a permit now.
    pub waiting: usize,
    /// Its `max_concurrent_runs`, as the executor applies it.
    pub limit: usize,
    /// The share of the global limit kept for it.
    pub reserved: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_sandbox::verdict::RunResult;

    #[test]
    fn a_call_is_counted_with_its_reason_fuel_and_waits() {
        let c = Counters::default();
        let mut ok = RunResult::error(Reason::Fuel, "out of fuel");
        ok.fuel_consumed = 7;
        ok.duration = Duration::from_millis(3);
        c.record(Duration::from_millis(2), &ok);
        c.record(Duration::from_millis(30), &RunResult::error(Reason::Timeout, "late"));
        let slots = Slots {
            running: 1,
            waiting: 2,
            limit: 3,
            reserved: 1,
        };
        let s = c.snapshot("t".into(), slots);
        assert_eq!((s.calls, s.fuel, s.sandbox_time), (2, 7, Duration::from_millis(3)));
        let errors: Vec<_> = s.errors.iter().filter(|(_, n)| *n > 0).copied().collect();
        assert_eq!(errors, [(Reason::Timeout, 1), (Reason::Fuel, 1)]);
        assert_eq!(s.errors.len(), REASONS.len(), "zeros listed too");
        assert_eq!(s.queue_wait, Duration::from_millis(32));
        c.record_pull(1000, Duration::from_millis(5));
        c.record_pull(24, Duration::from_millis(1));
        let s = c.snapshot("t".into(), slots);
        assert_eq!((s.pull_bytes, s.pull_time), (1024, Duration::from_millis(6)));
        assert_eq!(s.calls, 2, "a pull is not a call");
        // The histogram as /metrics encodes it: one wait in the 5 ms
        // bucket, the other in the 50 ms one.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("wait_seconds", "waits", s.queue_wait_histogram.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "wait_seconds_count 2",
            "wait_seconds_bucket{le=\"0.001\"} 0",
            "wait_seconds_bucket{le=\"0.005\"} 1",
            "wait_seconds_bucket{le=\"0.02\"} 1",
            "wait_seconds_bucket{le=\"0.05\"} 2",
            "wait_seconds_bucket{le=\"+Inf\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert_eq!((s.running, s.waiting, s.limit, s.reserved), (1, 2, 3, 1));
    }
}
