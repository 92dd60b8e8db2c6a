//! sonde's OpenTelemetry export (docs/opentelemetry.md): with `otlp:` set,
//! every series of `/metrics` goes to a collector over OTLP, gRPC or
//! HTTP/protobuf, every `interval`.
//!
//! **What is sent is what a scrape reads.** The export encodes the
//! operator's exposition, reads it back ([`exposition`]) and sends each
//! family under OpenTelemetry's naming ([`names`]) as cumulative data
//! ([`metrics`]): counters as monotonic sums, gauges, histograms with their
//! buckets. The OpenTelemetry Rust SDK aggregates what its own instruments
//! record; it cannot take series already aggregated (its data types are
//! sealed, and it has no asynchronous histogram), so the messages are the
//! OpenTelemetry Rust project's generated OTLP types
//! (`opentelemetry-proto`), encoded by prost, and sent by [`transport`].
//!
//! **Harmless when the collector is not.** The export is one task,
//! apart from the probes' runs: one request at a time, as large as one
//! scrape, never queued (a series is cumulative, so a missed export loses
//! nothing the next does not carry). A failure waits before the next try:
//! the interval, doubled after each failure in a row up to
//! [`MAX_BACKOFF_INTERVALS`] intervals, or what the collector's
//! `Retry-After` asks (at most [`MAX_RETRY_AFTER`]). Each export and
//! failure is counted (`sonde_otlp_exports_total`,
//! `sonde_otlp_export_failures_total{reason}`).

pub mod exposition;
pub mod metrics;
pub mod names;
pub mod transport;

use prost::Message as _;
use sonde_core::catalog::otlp::OtlpSettings;
use sonde_core::metrics::OtlpExports;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
pub use transport::{ExportError, Transport, TransportError};

/// The longest wait after failures in a row, in intervals.
pub const MAX_BACKOFF_INTERVALS: u32 = 8;
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// The exposition to send: the operator's `/metrics` (OpenMetrics text).
pub type Source = Arc<dyn Fn() -> String + Send + Sync>;

/// What the export did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    sent: AtomicU64,
    failed: Mutex<Vec<(&'static str, u64)>>,
}

impl Stats {
    fn failure(&self, reason: &'static str) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        match failed.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => failed.push((reason, 1)),
        }
    }

    /// The counters as `/metrics` shows them.
    pub fn snapshot(&self) -> OtlpExports {
        let failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        OtlpExports {
            sent: vec![("metrics", self.sent.load(Ordering::Relaxed))],
            failed: failed.iter().map(|(r, n)| ("metrics", *r, *n)).collect(),
        }
    }
}

/// The running export; dropping it stops it.
pub struct Exporter {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Exporter {
    /// Starts exporting `source` as `settings` say, the agent described by
    /// the resource attributes of [`resource`], counting into `stats`;
    /// series count from `started`. The first export is one interval in.
    pub fn spawn(
        settings: &OtlpSettings,
        source: Source,
        started: SystemTime,
        stats: Arc<Stats>,
    ) -> Result<Self, TransportError> {
        let transport = Transport::metrics(settings)?;
        let resource = resource(&settings.resource);
        tracing::info!(
            endpoint = %settings.endpoint,
            protocol = settings.protocol.as_str(),
            interval = ?settings.interval,
            "otlp: sending every series of /metrics"
        );
        let task = tokio::spawn(run(
            transport,
            source,
            resource,
            started,
            settings.interval,
            stats.clone(),
        ));
        Ok(Self { task, stats })
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// The export loop (see the crate's documentation).
async fn run(
    transport: Transport,
    source: Source,
    resource: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
    started: SystemTime,
    interval: Duration,
    stats: Arc<Stats>,
) {
    let mut failures: u32 = 0;
    let mut wait = interval;
    loop {
        tokio::time::sleep(wait).await;
        let source = source.clone();
        let Ok(text) = tokio::task::spawn_blocking(move || source()).await else {
            return;
        };
        let families = match exposition::parse(&text) {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(error = %e, "otlp: the exposition could not be read back; nothing sent");
                stats.failure("encode");
                wait = interval;
                continue;
            }
        };
        let times = metrics::Times {
            start: nanos(started),
            now: nanos(SystemTime::now()),
        };
        let message = metrics::request(&families, &resource, times).encode_to_vec();
        match transport.send(message).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(failures, "otlp: the collector takes exports again");
                }
                stats.sent.fetch_add(1, Ordering::Relaxed);
                failures = 0;
                wait = interval;
            }
            Err(e) => {
                stats.failure(e.reason());
                if failures == 0 {
                    tracing::warn!(error = %e, "otlp: an export did not land; trying again later");
                } else {
                    tracing::debug!(error = %e, failures, "otlp: an export did not land");
                }
                failures = failures.saturating_add(1);
                wait = backoff(interval, failures, &e);
            }
        }
    }
}

/// The wait after `failures` failures in a row, the last `e`.
fn backoff(interval: Duration, failures: u32, e: &ExportError) -> Duration {
    let doubled = interval.saturating_mul(1 << failures.min(MAX_BACKOFF_INTERVALS.ilog2()));
    let wait = doubled.min(interval.saturating_mul(MAX_BACKOFF_INTERVALS));
    match e.retry_after() {
        Some(asked) => asked.min(MAX_RETRY_AFTER).max(interval),
        None if e.retryable() => wait,
        // Refused for good (a bad token, a bad path): asking again each
        // interval only repeats it, but the config may be fixed at the
        // collector's end.
        None => interval.saturating_mul(MAX_BACKOFF_INTERVALS),
    }
}

/// The resource attributes a collector expects of an agent:
/// `service.name`, `service.version`, `host.name`, and in a Pod
/// `k8s.node.name`, `k8s.pod.name` and `k8s.namespace.name` (from
/// `NODE_NAME`, `POD_NAME`, `POD_NAMESPACE`, as the shipped DaemonSet
/// sets them); then `given`, whose keys win.
pub fn resource(
    given: &std::collections::BTreeMap<String, String>,
) -> Vec<opentelemetry_proto::tonic::common::v1::KeyValue> {
    let mut all: Vec<(String, String)> = vec![
        ("service.name".into(), "sonde".into()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
    ];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|h| !h.is_empty());
    if let Some(host) = host {
        all.push(("host.name".into(), host));
    }
    for (key, var) in [
        ("k8s.node.name", "NODE_NAME"),
        ("k8s.pod.name", "POD_NAME"),
        ("k8s.namespace.name", "POD_NAMESPACE"),
    ] {
        if let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
            all.push((key.into(), v));
        }
    }
    for (k, v) in given {
        all.retain(|(key, _)| key != k);
        all.push((k.clone(), v.clone()));
    }
    all.iter().map(|(k, v)| metrics::attribute(k, v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_wait_longer_up_to_a_bound_and_as_long_as_asked() {
        let i = Duration::from_secs(10);
        let down = ExportError::Timeout(i);
        assert_eq!(backoff(i, 1, &down), Duration::from_secs(20));
        assert_eq!(backoff(i, 2, &down), Duration::from_secs(40));
        assert_eq!(backoff(i, 30, &down), Duration::from_secs(80));
        let busy = ExportError::Http {
            status: 429,
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(backoff(i, 1, &busy), Duration::from_secs(30));
        let greedy = ExportError::Http {
            status: 503,
            retry_after: Some(Duration::from_secs(86_400)),
        };
        assert_eq!(backoff(i, 1, &greedy), MAX_RETRY_AFTER);
        let refused = ExportError::Http {
            status: 401,
            retry_after: None,
        };
        assert!(!refused.retryable());
        assert_eq!(backoff(i, 1, &refused), Duration::from_secs(80));
    }

    #[test]
    fn the_resource_names_the_agent_and_the_file_wins() {
        let given = [("service.name".to_string(), "edge-sonde".to_string())].into();
        let r = resource(&given);
        let get = |k: &str| r.iter().filter(|kv| kv.key == k).count();
        assert_eq!(get("service.name"), 1);
        assert_eq!(r.last().unwrap(), &metrics::attribute("service.name", "edge-sonde"));
        assert_eq!(get("service.version"), 1);
    }
}
