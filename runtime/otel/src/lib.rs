//! sonde's OpenTelemetry export (docs/opentelemetry.md): with `otlp:` set,
//! every series of `/metrics` goes to a collector over OTLP, gRPC or
//! HTTP/protobuf, every `interval`, and a span per sampled run
//! ([`traces`]) every second.
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
//! **Harmless when the collector is not.** The export is two tasks apart
//! from the probes' runs, one request of each signal at a time: the
//! metrics as large as one scrape, never queued (a series is cumulative,
//! so a missed export loses nothing the next does not carry); the spans
//! from a bounded queue, dropped (and counted) when it is full or their
//! export does not land. A failure waits before the next try:
//! the interval, doubled after each failure in a row up to
//! [`MAX_BACKOFF_INTERVALS`] intervals, or what the collector's
//! `Retry-After` asks (at most [`MAX_RETRY_AFTER`]). Each export and
//! failure is counted (`sonde_otlp_exports_total`,
//! `sonde_otlp_export_failures_total{reason}`).

mod attributes;
pub mod exposition;
pub mod metrics;
pub mod names;
pub mod traces;
pub mod transport;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};
use prost::Message as _;
use sonde_core::catalog::otlp::OtlpSettings;
use sonde_core::metrics::OtlpExports;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
pub use traces::{RunTracer, Tracing};
pub use transport::{ExportError, Signal, Transport, TransportError};

/// The longest wait after failures in a row, in intervals.
pub const MAX_BACKOFF_INTERVALS: u32 = 8;
/// The longest `Retry-After` honoured.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// How often spans waiting are sent.
pub const SPAN_FLUSH: Duration = Duration::from_secs(1);
/// The most spans in one export.
pub const MAX_SPANS_PER_EXPORT: usize = 512;

/// The exposition to send: the operator's `/metrics` (OpenMetrics text).
pub type Source = Arc<dyn Fn() -> String + Send + Sync>;

/// One signal's counters.
#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    failed: Mutex<Vec<(&'static str, u64)>>,
    dropped: AtomicU64,
}

impl Counts {
    fn failure(&self, reason: &'static str) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        match failed.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => failed.push((reason, 1)),
        }
    }
}

/// What the export did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    metrics: Counts,
    traces: Counts,
    /// The runs' tracer, when traces are on: its spans are exported, its
    /// full queue's drops counted.
    tracer: Option<Arc<RunTracer>>,
}

impl Stats {
    /// The counters of an export whose spans come from `tracer`, if any.
    pub fn new(tracer: Option<Arc<RunTracer>>) -> Self {
        Self {
            tracer,
            ..Self::default()
        }
    }

    /// The runs' tracer, when traces are on.
    pub fn tracer(&self) -> Option<&Arc<RunTracer>> {
        self.tracer.as_ref()
    }

    fn of(&self, signal: Signal) -> &Counts {
        match signal {
            Signal::Metrics => &self.metrics,
            Signal::Traces => &self.traces,
        }
    }

    /// The counters as `/metrics` shows them.
    pub fn snapshot(&self) -> OtlpExports {
        let tracer = self.tracer.as_ref();
        let mut out = OtlpExports::default();
        let mut signals = vec![Signal::Metrics];
        if tracer.is_some() {
            signals.push(Signal::Traces);
        }
        for signal in signals {
            let c = self.of(signal);
            out.sent.push((signal.as_str(), c.sent.load(Ordering::Relaxed)));
            let failed = c.failed.lock().unwrap_or_else(|e| e.into_inner());
            out.failed.extend(failed.iter().map(|(r, n)| (signal.as_str(), *r, *n)));
        }
        if let Some(t) = tracer {
            let dropped = self.traces.dropped.load(Ordering::Relaxed) + t.dropped();
            out.dropped.push((Signal::Traces.as_str(), dropped));
        }
        out
    }
}

/// The running export; dropping it stops it.
pub struct Exporter {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What both loops need.
struct Loop {
    transport: Transport,
    signal: Signal,
    resource: Vec<KeyValue>,
    interval: Duration,
    stats: Arc<Stats>,
}

impl Loop {
    /// Sends `message`; the wait before the next export (see the crate's
    /// documentation), and whether it landed.
    async fn send(&self, message: Vec<u8>, failures: &mut u32) -> (Duration, bool) {
        let counts = self.stats.of(self.signal);
        match self.transport.send(message).await {
            Ok(()) => {
                if *failures > 0 {
                    tracing::info!(
                        signal = self.signal.as_str(),
                        failures = *failures,
                        "otlp: the collector takes exports again"
                    );
                }
                counts.sent.fetch_add(1, Ordering::Relaxed);
                *failures = 0;
                (self.interval, true)
            }
            Err(e) => {
                counts.failure(e.reason());
                if *failures == 0 {
                    tracing::warn!(signal = self.signal.as_str(), error = %e, "otlp: an export did not land; trying again later");
                } else {
                    tracing::debug!(signal = self.signal.as_str(), error = %e, failures = *failures, "otlp: an export did not land");
                }
                *failures = failures.saturating_add(1);
                (backoff(self.interval, *failures, &e), false)
            }
        }
    }
}

impl Exporter {
    /// Starts exporting `source` as `settings` say, the agent described by
    /// the resource attributes of [`resource`], counting into `stats`;
    /// series count from `started`. The first export is one interval in.
    /// With the tracer of `stats`, its spans go too, every [`SPAN_FLUSH`], and its runs
    /// are the run duration histogram's exemplars. A tenant's export never
    /// connects to `listeners`, the agent's own.
    pub fn spawn(
        settings: &OtlpSettings,
        source: Source,
        started: SystemTime,
        stats: Arc<Stats>,
        listeners: &Arc<sonde_policy::reach::OwnListeners>,
    ) -> Result<Self, TransportError> {
        let tracer = stats.tracer.clone();
        let resource = resource(&settings.resource);
        let metrics = Loop {
            transport: Transport::new(settings, Signal::Metrics, listeners)?,
            signal: Signal::Metrics,
            resource: resource.clone(),
            interval: settings.interval,
            stats: stats.clone(),
        };
        tracing::info!(
            tenant = settings.tenant.as_ref().map(|t| &*t.id),
            endpoint = %settings.endpoint,
            protocol = settings.protocol.as_str(),
            interval = ?settings.interval,
            traces = tracer.is_some(),
            "otlp: sending every series of /metrics"
        );
        let mut tasks = vec![tokio::spawn(export_metrics(metrics, source, started, tracer.clone()))];
        if let Some(tracer) = tracer {
            let traces = Loop {
                transport: Transport::new(settings, Signal::Traces, listeners)?,
                signal: Signal::Traces,
                resource,
                interval: SPAN_FLUSH,
                stats,
            };
            tasks.push(tokio::spawn(export_spans(traces, tracer)));
        }
        Ok(Self { tasks })
    }
}

/// The metrics loop (see the crate's documentation).
async fn export_metrics(l: Loop, source: Source, started: SystemTime, tracer: Option<Arc<RunTracer>>) {
    let mut failures: u32 = 0;
    let mut wait = l.interval;
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
                l.stats.metrics.failure("encode");
                wait = l.interval;
                continue;
            }
        };
        let times = metrics::Times {
            start: traces::nanos(started),
            now: traces::nanos(SystemTime::now()),
        };
        let exemplar = |family: &str, labels: &[(String, String)]| {
            let tracer = tracer.as_ref()?;
            if family != "sonde_run_duration_seconds" {
                return None;
            }
            let label = |k: &str| labels.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
            tracer.exemplar(label("plugin")?, label("kind")?)
        };
        let message = metrics::request(&families, &l.resource, times, &exemplar).encode_to_vec();
        wait = l.send(message, &mut failures).await.0;
    }
}

/// The spans loop: every [`SPAN_FLUSH`], what waits, [`MAX_SPANS_PER_EXPORT`]
/// at a time; an export that does not land drops its spans (counted), so
/// the queue stays bounded while the collector is away.
async fn export_spans(l: Loop, tracer: Arc<RunTracer>) {
    let mut failures: u32 = 0;
    let mut wait = l.interval;
    loop {
        tokio::time::sleep(wait).await;
        let spans = tracer.take(MAX_SPANS_PER_EXPORT);
        if spans.is_empty() {
            wait = l.interval;
            continue;
        }
        let n = spans.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: attributes::resource(&l.resource),
                scope_spans: vec![ScopeSpans {
                    scope: attributes::scope(),
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        };
        let (next, landed) = l.send(request.encode_to_vec(), &mut failures).await;
        if !landed {
            l.stats.traces.dropped.fetch_add(n, Ordering::Relaxed);
        }
        wait = next;
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
pub fn resource(given: &std::collections::BTreeMap<String, String>) -> Vec<KeyValue> {
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
