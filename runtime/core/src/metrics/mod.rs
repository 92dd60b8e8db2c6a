//! `GET /metrics`: Prometheus text exposition, encoded with
//! prometheus-client.
//!
//! Per-probe series (state, runs by status and reason, the last run's
//! duration and fuel, and the metrics plugins return) are read from the
//! [`ResultCache`] at scrape time, so nothing is stored twice and a probe
//! removed by a reload disappears from the next scrape. Distributions
//! (run duration and fuel by plugin and kind, scheduler start lateness) are
//! histograms fed by the scheduler's [`Observer`].
//!
//! | series | type | labels |
//! | --- | --- | --- |
//! | `sonde_build_info` | gauge, always 1 | version, commit |
//! | `sonde_probe_state` | gauge, a state set: 1 for the probe's state, 0 for the three others | probe, target, kind, tenant, state |
//! | `sonde_probe_stale` | gauge: 1 while restored state has not been confirmed by a run | probe |
//! | `sonde_probe_runs_total` | counter | probe, status, reason |
//! | `sonde_probe_last_duration_seconds`, `sonde_probe_last_fuel` | gauge | probe |
//! | `sonde_probe_failure_cause` | gauge, 1 while the last run failed (absent otherwise) | probe, cause ([`Cause`](sonde_sandbox::verdict::Cause), 15 values) |
//! | `sonde_probe_metric` | gauge in base units ([`base_unit`]), at most [`MAX_PLUGIN_SERIES`] per probe | probe, metric, unit |
//! | `sonde_run_duration_seconds`, `sonde_run_fuel` | histogram | plugin, kind |
//! | `sonde_tenant_runs_total`, `_fuel_total`, `_sandbox_seconds_total`, `_errors_total` | counter | tenant (errors: reason) |
//! | `sonde_tenant_queue_wait_seconds` | histogram (`_sum` is the total wait) | tenant |
//! | `sonde_tenant_runs_running`, `_runs_waiting`, `_concurrency_limit` | gauge | tenant |
//! | `sonde_scheduler_start_lateness_seconds` | histogram | |
//! | `sonde_scheduler_runs_in_flight`, `sonde_scheduler_overdue_seconds` | gauge | |
//! | `sonde_config_last_reload_successful`, `sonde_config_last_reload_success_timestamp_seconds` | gauge | |
//! | `sonde_kubernetes_writes_total` | counter | kind (`pod_status`, `event`, `check_status`, `node_status`, `node_taints`) |
//! | `sonde_kubernetes_write_errors_total` | counter | kind, reason |
//! | `sonde_otlp_exports_total` | counter (only with `otlp:`) | signal (a tenant's export: tenant) |
//! | `sonde_otlp_export_failures_total` | counter (only with `otlp:`) | signal, reason (a tenant's export: tenant) |
//! | `sonde_otlp_dropped_total` | counter (only with `otlp:` and traces) | signal (a tenant's export: tenant) |
//! | `sonde_plugin_cache_hits_total`, `_misses_total` | counter | |
//! | `sonde_pool_memories_in_use`, `sonde_pool_idle_memories`, `sonde_pool_idle_resident_bytes` | gauge (absent without an instance pool) | |
//!
//! Every per-probe series also carries the probe's extra `labels` (a
//! Kubernetes gate's probe: `namespace`, `pod` and `check`).

use crate::auth::Principal;
use crate::catalog::ProbeSpec;
use crate::config::Kind;
use crate::executor::{Executor, TenantStats};
use crate::results::{Observation, ResultCache, RunCount};
use crate::scheduler::{self, Observer};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use sonde_sandbox::engine::PoolStats;
use sonde_sandbox::verdict::{RunResult, Status};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

mod runs;
mod scrape;

pub use runs::RunMetrics;
use scrape::Scrape;

/// The most plugin-returned metrics exposed per probe.
pub const MAX_PLUGIN_SERIES: usize = 32;

/// A plugin's measurement in base units, by the documented rule
/// (docs/prometheus.md, "Units"): durations (`s`, `ms`, `us`, `µs`, `ns`)
/// become `seconds`; `%` becomes a `ratio` (divided by 100); sizes (`B`,
/// `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`, `TB`/`TiB`, powers of 1024 as
/// Nagios plugins mean them) become `bytes`; a Nagios counter (`c`) is a
/// plain number (no unit). Any other unit is passed through, unchanged,
/// in the `unit` label.
pub fn base_unit(value: f64, unit: &str) -> (f64, std::borrow::Cow<'_, str>) {
    let scaled = |factor: f64, base: &'static str| (value * factor, std::borrow::Cow::Borrowed(base));
    match unit {
        "s" | "seconds" => scaled(1.0, "seconds"),
        "ms" => scaled(1e-3, "seconds"),
        "us" | "µs" => scaled(1e-6, "seconds"),
        "ns" => scaled(1e-9, "seconds"),
        "%" => scaled(0.01, "ratio"),
        "B" | "bytes" => scaled(1.0, "bytes"),
        "KB" | "KiB" | "kB" => scaled(1024.0, "bytes"),
        "MB" | "MiB" => scaled(1024.0 * 1024.0, "bytes"),
        "GB" | "GiB" => scaled(1024.0 * 1024.0 * 1024.0, "bytes"),
        "TB" | "TiB" => scaled(1024.0 * 1024.0 * 1024.0 * 1024.0, "bytes"),
        "c" => scaled(1.0, ""),
        other => (value, std::borrow::Cow::Borrowed(other)),
    }
}

/// The content type of the OpenMetrics exposition.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text exposition.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which build is running, for `sonde_build_info`: given by the binary
/// crate, the one that knows its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The release, `CARGO_PKG_VERSION`.
    pub version: &'static str,
    /// The commit it was built from, or `unknown`.
    pub commit: &'static str,
}

/// Everything a scrape reads.
#[derive(Clone)]
pub struct Metrics {
    /// The running build.
    pub build: BuildInfo,
    /// The histograms.
    pub runs: Arc<RunMetrics>,
    /// Per-probe state and counts.
    pub results: ResultCache,
    /// The scheduler, for runs in flight.
    pub scheduler: scheduler::SchedulerHandle,
    /// The compile cache's hits and misses.
    pub cache: Arc<dyn Fn() -> (u64, u64) + Send + Sync>,
    /// What the engine's instance pool holds, if it has one.
    pub pool: Arc<dyn Fn() -> Option<PoolStats> + Send + Sync>,
    /// Per-tenant run stats.
    pub executor: Executor,
    /// The probes waiting for their `oci://` plugin's background pull, and
    /// the pulls in flight.
    pub pulls: Arc<dyn Fn() -> (Vec<crate::catalog::Waiting>, usize) + Send + Sync>,
    /// The agent's status: when the config in force was loaded, whether
    /// the last reload was refused.
    pub status: Arc<std::sync::Mutex<crate::control::AgentStatus>>,
    /// What the Kubernetes controller wrote, read from its own counters
    /// (all zero when it does not run).
    pub kubernetes: Arc<dyn Fn() -> KubernetesWrites + Send + Sync>,
    /// What the node-problem-detector monitors last reported.
    pub node_problems: Arc<crate::npd::Board>,
    /// What each OTLP export (the operator's, the tenants') sent and
    /// failed to send, read from its own counters (none when none runs).
    pub otlp: Arc<dyn Fn() -> Vec<OtlpExports> + Send + Sync>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The exposition, in OpenMetrics when `accept` asks for it (as
    /// Prometheus does), else in the Prometheus text format 0.0.4 (curl,
    /// promtool, older scrapers). Returns the content type and the text.
    pub fn render(&self, accept: &str, who: &Principal) -> (&'static str, String) {
        let text = self.encode(who);
        if accept.contains("application/openmetrics-text") {
            (OPENMETRICS, text)
        } else {
            (PROMETHEUS_TEXT, to_prometheus_text(&text))
        }
    }

    /// The OpenMetrics text of what `who` may see: a tenant gets its own
    /// probes' and its own tenant series; agent-wide series are the
    /// operator's.
    pub fn encode(&self, who: &Principal) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(Scrape(self.clone(), who.clone())));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Rewrites OpenMetrics text as the Prometheus text format: a counter
/// family's `HELP` and `TYPE` name its `_total` series, and `UNIT` and `EOF`
/// lines go.
fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
        });
        match meta {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// What the agent wrote to the Kubernetes API, by kind of object
/// (`pod_status`: a readiness gate's condition; `event`; `check_status`:
/// a SondeCheck's or SondeNodeCheck's status, by the elected agent;
/// `node_status`: a SondeNodeCheck's condition on the agent's Node;
/// `node_taints`: its taint), and the writes
/// that failed, by kind and reason (`forbidden`, `gone`, `retry`; for
/// Events `error` and `dropped`). A snapshot of the controller's own
/// counters, taken at scrape time.
#[derive(Debug, Default, Clone)]
pub struct KubernetesWrites {
    /// Writes that succeeded: (kind, count).
    pub written: Vec<(&'static str, u64)>,
    /// Writes that failed: (kind, reason, count).
    pub failed: Vec<(&'static str, &'static str, u64)>,
}

impl KubernetesWrites {
    fn encode(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let mut e = enc.encode_descriptor(
            "sonde_kubernetes_writes",
            "Writes to the Kubernetes API that succeeded, by kind of object",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in &self.written {
            ConstCounter::new(*n).encode(e.encode_family(&[("kind", *kind)])?)?;
        }
        let mut e = enc.encode_descriptor(
            "sonde_kubernetes_write_errors",
            "Writes to the Kubernetes API that failed, by kind of object and reason",
            None,
            MetricType::Counter,
        )?;
        for (kind, reason, n) in &self.failed {
            ConstCounter::new(*n).encode(e.encode_family(&[("kind", *kind), ("reason", *reason)])?)?;
        }
        Ok(())
    }
}

/// What one OTLP export did, by signal (`metrics`): exports the collector
/// took, and those that failed, by reason (`unreachable`, `timeout`,
/// `answer`, `busy`: 429, 502-504 or a retryable gRPC status, `refused`:
/// any other, `denied`: a tenant's endpoint outside its grants). A
/// snapshot of the exporter's own counters, taken at scrape time.
#[derive(Debug, Default, Clone)]
pub struct OtlpExports {
    /// The tenant whose export this is (its series carry a `tenant`
    /// label, and the tenant sees them); `None`: the operator's.
    pub tenant: Option<Arc<str>>,
    /// Exports that landed: (signal, count).
    pub sent: Vec<(&'static str, u64)>,
    /// Exports that did not: (signal, reason, count).
    pub failed: Vec<(&'static str, &'static str, u64)>,
    /// Items dropped before they were sent (spans: the queue was full, or
    /// their export did not land): (signal, count).
    pub dropped: Vec<(&'static str, u64)>,
}

impl OtlpExports {
    /// The series of `exports`, one family each, a tenant's export's with
    /// its `tenant` label.
    fn encode(exports: &[OtlpExports], enc: &mut DescriptorEncoder) -> fmt::Result {
        if exports.is_empty() {
            return Ok(());
        }
        let labels = |x: &'_ OtlpExports, own: &[(&'static str, &'static str)]| {
            let mut l: Vec<(&str, String)> = own.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
            if let Some(t) = &x.tenant {
                l.push(("tenant", t.to_string()));
            }
            l
        };
        let mut e = enc.encode_descriptor(
            "sonde_otlp_exports",
            "OTLP exports the collector took, by signal",
            None,
            MetricType::Counter,
        )?;
        for x in exports {
            for (signal, n) in &x.sent {
                ConstCounter::new(*n).encode(e.encode_family(&labels(x, &[("signal", signal)]))?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "sonde_otlp_export_failures",
            "OTLP exports that did not land, by signal and reason",
            None,
            MetricType::Counter,
        )?;
        for x in exports {
            for (signal, reason, n) in &x.failed {
                ConstCounter::new(*n)
                    .encode(e.encode_family(&labels(x, &[("signal", signal), ("reason", reason)]))?)?;
            }
        }
        if exports.iter().all(|x| x.dropped.is_empty()) {
            return Ok(());
        }
        let mut e = enc.encode_descriptor(
            "sonde_otlp_dropped",
            "Items dropped before the OTLP export sent them, by signal (spans: a full queue, or an export that did not land)",
            None,
            MetricType::Counter,
        )?;
        for x in exports {
            for (signal, n) in &x.dropped {
                ConstCounter::new(*n).encode(e.encode_family(&labels(x, &[("signal", signal)]))?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::to_prometheus_text;

    #[test]
    fn counters_are_renamed_and_openmetrics_only_lines_dropped() {
        let om = "# HELP runs Runs.\n# TYPE runs counter\nruns_total{a=\"b\"} 3\n# HELP up Up.\n# TYPE up gauge\n# UNIT up seconds\nup 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP runs_total Runs.\n# TYPE runs_total counter\nruns_total{a=\"b\"} 3\n# HELP up Up.\n# TYPE up gauge\nup 1\n"
        );
    }
}
