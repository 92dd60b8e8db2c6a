//! What the controller and its Event sink count, for `/metrics` and tests.

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Catalog changes applied.
    pub changes: AtomicU64,
    /// Catalog changes that failed where none should (a probe's removal).
    pub change_errors: AtomicU64,
    /// Probes (Pod, gate) in the catalog now.
    pub probes: AtomicU64,
    /// Events recorded.
    pub events_sent: AtomicU64,
    /// Events the API server refused or that could not be sent.
    pub events_failed: AtomicU64,
    /// Events dropped past the rate.
    pub events_dropped: AtomicU64,
    /// 1 while this agent holds the status Lease and writes SondeCheck statuses.
    pub status_leader: AtomicU64,
    /// Times the status writer compared every check's status with what it counts.
    pub status_evaluations: AtomicU64,
    /// SondeCheck status patches that succeeded.
    pub status_writes: AtomicU64,
    /// SondeCheck status patches that failed.
    pub status_write_errors: AtomicU64,
    /// Node condition patches (`nodes/status`) that succeeded.
    pub node_patches: AtomicU64,
    /// Node condition patches that failed (retried with backoff).
    pub node_patch_errors: AtomicU64,
    /// Node taint patches that succeeded.
    pub taint_patches: AtomicU64,
    /// Node taint patches that failed (a 409 is tried again on the newer Node).
    pub taint_patch_errors: AtomicU64,
    /// Reads of a check's Secret that found it (`GET` answered 200).
    pub secret_reads: AtomicU64,
    /// Reads of a check's Secret that did not (404, 403, errors).
    pub secret_read_errors: AtomicU64,
}

impl Stats {
    /// The writes to the API server, as `/metrics` shows them
    /// (`sonde_kubernetes_writes_total`, `sonde_kubernetes_write_errors_total`).
    pub fn writes(&self) -> sonde_core::metrics::KubernetesWrites {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        sonde_core::metrics::KubernetesWrites {
            written: vec![
                ("pod_status", n(&self.patches)),
                ("event", n(&self.events_sent)),
                ("check_status", n(&self.status_writes)),
                ("node_status", n(&self.node_patches)),
                ("node_taints", n(&self.taint_patches)),
            ],
            failed: vec![
                ("pod_status", "forbidden", n(&self.forbidden)),
                ("pod_status", "gone", n(&self.gone)),
                ("pod_status", "retry", n(&self.retries)),
                ("event", "error", n(&self.events_failed)),
                ("event", "dropped", n(&self.events_dropped)),
                ("check_status", "error", n(&self.status_write_errors)),
                ("node_status", "error", n(&self.node_patch_errors)),
                ("node_taints", "error", n(&self.taint_patch_errors)),
            ],
        }
    }
}
