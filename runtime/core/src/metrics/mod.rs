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
//! | `sonde_probe_metric` | gauge in base units ([`base_unit`]), at most [`MAX_PLUGIN_SERIES`] per probe | probe, metric, unit |
//! | `sonde_run_duration_seconds`, `sonde_run_fuel` | histogram | plugin, kind |
//! | `sonde_tenant_runs_total`, `_fuel_total`, `_sandbox_seconds_total`, `_errors_total` | counter | tenant (errors: reason) |
//! | `sonde_tenant_queue_wait_seconds` | histogram (`_sum` is the total wait) | tenant |
//! | `sonde_tenant_runs_running`, `_runs_waiting`, `_concurrency_limit` | gauge | tenant |
//! | `sonde_scheduler_start_lateness_seconds` | histogram | |
//! | `sonde_scheduler_runs_in_flight`, `sonde_scheduler_overdue_seconds` | gauge | |
//! | `sonde_config_last_reload_successful`, `sonde_config_last_reload_success_timestamp_seconds` | gauge | |
//! | `sonde_kubernetes_writes_total` | counter | kind (`pod_status`, `event`, `check_status`) |
//! | `sonde_kubernetes_write_errors_total` | counter | kind, reason |
//! | `sonde_plugin_cache_hits_total`, `_misses_total` | counter | |
//! | `sonde_pool_memories_in_use`, `sonde_pool_idle_memories`, `sonde_pool_idle_resident_bytes` | gauge (absent without an instance pool) | |
//!
//! Every per-probe series also carries the probe's extra `labels` (a
//! Kubernetes gate's probe: `namespace`, `pod` and `check`).

use crate::auth::Principal;
use crate::config::Kind;
use crate::executor::{Executor, TenantStats};
use crate::registry::ProbeSpec;
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

const LATENESS_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
const DURATION_BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
const FUEL_BUCKETS: [f64; 8] = [1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10];

/// What the scheduler's runs feed: the histograms. Give it to the
/// scheduler as its [`Observer`].
#[derive(Debug)]
pub struct RunMetrics {
    lateness: Histogram,
    /// By plugin, then kind (startup, readiness, liveness): looked up by
    /// `&str` on every run, with no allocation.
    by_plugin: RwLock<HashMap<Arc<str>, [PluginSeries; 3]>>,
}

/// Which histogram of a plugin's series a descriptor exposes.
type Pick = fn(&PluginSeries) -> &Histogram;

#[derive(Debug)]
struct PluginSeries {
    /// Observed at least once (unused kinds are not exposed).
    used: std::sync::atomic::AtomicBool,
    duration: Histogram,
    fuel: Histogram,
}

impl Default for RunMetrics {
    fn default() -> Self {
        Self {
            lateness: Histogram::new(LATENESS_BUCKETS),
            by_plugin: RwLock::default(),
        }
    }
}

const KINDS: [Kind; 3] = [Kind::Startup, Kind::Readiness, Kind::Liveness];

fn kind_index(kind: Kind) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Observer for RunMetrics {
    fn run_started(&self, _spec: &ProbeSpec, late: Duration) {
        self.lateness.observe(late.as_secs_f64());
    }

    fn run_finished(&self, spec: &ProbeSpec, result: &RunResult) {
        let observe = |s: &PluginSeries| {
            s.used.store(true, std::sync::atomic::Ordering::Relaxed);
            s.duration.observe(result.duration.as_secs_f64());
            s.fuel.observe(result.fuel_consumed as f64);
        };
        let kind = kind_index(spec.kind);
        if let Some(s) = self
            .by_plugin
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(spec.plugin_ref.as_str())
        {
            return observe(&s[kind]);
        }
        let mut map = self.by_plugin.write().unwrap_or_else(|e| e.into_inner());
        let series = map.entry(Arc::from(spec.plugin_ref.as_str())).or_insert_with(|| {
            std::array::from_fn(|_| PluginSeries {
                used: Default::default(),
                duration: Histogram::new(DURATION_BUCKETS),
                fuel: Histogram::new(FUEL_BUCKETS),
            })
        });
        observe(&series[kind]);
    }
}

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
    pub pulls: Arc<dyn Fn() -> (Vec<crate::registry::Waiting>, usize) + Send + Sync>,
    /// The agent's status: when the config in force was loaded, whether
    /// the last reload was refused.
    pub status: Arc<std::sync::Mutex<crate::control::AgentStatus>>,
    /// What the Kubernetes controller wrote, read from its own counters
    /// (all zero when it does not run).
    pub kubernetes: Arc<dyn Fn() -> KubernetesWrites + Send + Sync>,
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

#[derive(Debug)]
struct Scrape(Metrics, Principal);

/// A gauge's value from a probe's last outcome.
type LastValue = fn(&Observation) -> f64;

/// One probe as a scrape reads it.
struct Row {
    name: Arc<str>,
    target: Arc<str>,
    tenant: Arc<str>,
    labels: Arc<[(String, String)]>,
    kind: Kind,
    state: Status,
    stale: bool,
    runs: Vec<RunCount>,
    last: Option<Arc<Observation>>,
}

impl Row {
    /// `own` then the probe's extra labels (which never shadow `own`: the
    /// registry refuses sonde's own label names).
    fn labels<'a>(&'a self, own: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let extra = self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        own.iter().copied().chain(extra).collect()
    }
}

impl Scrape {
    /// Per-tenant run stats: the basis for billing and for spotting abuse.
    fn tenant_series(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let stats: Vec<TenantStats> = self
            .0
            .executor
            .stats()
            .into_iter()
            .filter(|s| self.1.sees(&s.tenant))
            .collect();
        let counter = |enc: &mut DescriptorEncoder, name: &str, help: &str, f: &dyn Fn(&TenantStats) -> f64| {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &stats {
                ConstCounter::new(f(s)).encode(e.encode_family(&[("tenant", &*s.tenant)])?)?;
            }
            Ok::<_, fmt::Error>(())
        };
        counter(enc, "sonde_tenant_runs", "Sandboxed calls run for the tenant", &|s| {
            s.calls as f64
        })?;
        counter(enc, "sonde_tenant_fuel", "Fuel the tenant's calls consumed", &|s| {
            s.fuel as f64
        })?;
        counter(
            enc,
            "sonde_tenant_oci_pull_bytes",
            "Bytes the tenant's oci:// plugins brought from registries",
            &|s| s.pull_bytes as f64,
        )?;
        counter(
            enc,
            "sonde_tenant_oci_pull_seconds",
            "Time spent resolving the tenant's oci:// plugins",
            &|s| s.pull_time.as_secs_f64(),
        )?;
        counter(
            enc,
            "sonde_tenant_sandbox_seconds",
            "Time the tenant's calls spent in the sandbox",
            &|s| s.sandbox_time.as_secs_f64(),
        )?;
        counter(
            enc,
            "sonde_tenant_compile_seconds",
            "Time spent compiling the plugins the tenant uploaded",
            &|s| s.compile_time.as_secs_f64(),
        )?;
        let mut e = enc.encode_descriptor(
            "sonde_tenant_errors",
            "The tenant's calls that ended in an error, by reason",
            None,
            MetricType::Counter,
        )?;
        for s in &stats {
            for (reason, n) in &s.errors {
                let labels = [("tenant", &*s.tenant), ("reason", reason.as_str())];
                ConstCounter::new(*n).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "sonde_tenant_queue_wait_seconds",
            "How long each of the tenant's calls waited for a run permit",
            None,
            MetricType::Histogram,
        )?;
        for s in &stats {
            s.queue_wait_histogram
                .encode(e.encode_family(&[("tenant", &*s.tenant)])?)?;
        }
        let gauge = |enc: &mut DescriptorEncoder, name: &str, help: &str, f: &dyn Fn(&TenantStats) -> i64| {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &stats {
                ConstGauge::new(f(s)).encode(e.encode_family(&[("tenant", &*s.tenant)])?)?;
            }
            Ok::<_, fmt::Error>(())
        };
        gauge(
            enc,
            "sonde_tenant_runs_running",
            "The tenant's calls running now",
            &|s| s.running as i64,
        )?;
        gauge(
            enc,
            "sonde_tenant_runs_waiting",
            "The tenant's calls waiting for a permit",
            &|s| s.waiting as i64,
        )?;
        gauge(
            enc,
            "sonde_tenant_concurrency_limit",
            "The tenant's concurrent-call limit",
            &|s| s.limit as i64,
        )?;
        Ok(())
    }
}

impl Scrape {
    /// The probes `who` sees, copied out (names and the last outcome are
    /// shared, not cloned) so encoding does not hold the cache's lock.
    fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        self.0.results.sample(|p| {
            if self.1.sees(p.tenant) {
                rows.push(Row {
                    name: p.name.clone(),
                    target: p.target.clone(),
                    tenant: p.tenant.clone(),
                    labels: p.labels.clone(),
                    kind: p.kind,
                    state: p.state,
                    stale: p.stale,
                    runs: p.runs.to_vec(),
                    last: p.last.cloned(),
                });
            }
        });
        rows
    }

    /// Per-probe series: the state set, staleness, runs, the last run's
    /// duration and fuel, and what the plugin measured.
    fn probe_series(&self, enc: &mut DescriptorEncoder, rows: &[Row]) -> fmt::Result {
        let mut e = enc.encode_descriptor(
            "sonde_probe_state",
            "Probe state as a state set: 1 for the state the probe is in, 0 for the others",
            None,
            MetricType::Gauge,
        )?;
        for r in rows {
            for state in STATES {
                let labels = r.labels(&[
                    ("probe", &*r.name),
                    ("target", &*r.target),
                    ("kind", r.kind.as_str()),
                    ("tenant", &*r.tenant),
                    ("state", state.as_str()),
                ]);
                ConstGauge::new(i64::from(r.state == state)).encode(e.encode_family(&labels)?)?;
            }
        }
        let mut e = enc.encode_descriptor(
            "sonde_probe_stale",
            "1 while a probe's state is restored from disk and not yet confirmed by a run",
            None,
            MetricType::Gauge,
        )?;
        for r in rows {
            ConstGauge::new(i64::from(r.stale)).encode(e.encode_family(&r.labels(&[("probe", &*r.name)]))?)?;
        }
        let mut e = enc.encode_descriptor(
            "sonde_probe_runs",
            "Probe runs since the agent started, by status and reason",
            None,
            MetricType::Counter,
        )?;
        for r in rows {
            for c in &r.runs {
                let labels = r.labels(&[
                    ("probe", &*r.name),
                    ("status", c.status.as_str()),
                    ("reason", c.reason.map_or("", |r| r.as_str())),
                ]);
                ConstCounter::new(c.runs).encode(e.encode_family(&labels)?)?;
            }
        }
        let last: [(&str, &str, LastValue); 2] = [
            (
                "sonde_probe_last_duration_seconds",
                "How long the probe's last run took",
                |o| o.result.duration.as_secs_f64(),
            ),
            ("sonde_probe_last_fuel", "Fuel the probe's last run consumed", |o| {
                o.result.fuel_consumed as f64
            }),
        ];
        for (name, help, value) in last {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for r in rows {
                if let Some(o) = &r.last {
                    ConstGauge::new(value(o)).encode(e.encode_family(&r.labels(&[("probe", &*r.name)]))?)?;
                }
            }
        }
        let mut e = enc.encode_descriptor(
            "sonde_probe_metric",
            "A measurement the probe's plugin returned in its last run, in base units",
            None,
            MetricType::Gauge,
        )?;
        for r in rows {
            let metrics = r
                .last
                .iter()
                .flat_map(|o| o.result.metrics.iter().take(MAX_PLUGIN_SERIES));
            for x in metrics {
                let (value, unit) = base_unit(x.value, &x.unit);
                let labels = r.labels(&[("probe", &*r.name), ("metric", x.name.as_str()), ("unit", &unit)]);
                ConstGauge::new(value).encode(e.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }

    /// The probes waiting for their `oci://` plugin (those `who` sees), and
    /// for the operator the pulls in flight.
    fn pull_series(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let (waiting, in_flight) = (self.0.pulls)();
        let mut e = enc.encode_descriptor(
            "sonde_probe_waiting_for_plugin",
            "1 for each probe left out until its oci:// plugin, being pulled in the background, lands",
            None,
            MetricType::Gauge,
        )?;
        for w in waiting.iter().filter(|w| self.1.sees(&w.tenant)) {
            let kind = format!("{:?}", w.kind).to_lowercase();
            let labels = [
                ("probe", &*w.probe),
                ("target", &*w.target),
                ("kind", kind.as_str()),
                ("tenant", &*w.tenant),
                ("plugin", w.plugin.as_str()),
            ];
            ConstGauge::new(1).encode(e.encode_family(&labels)?)?;
        }
        if self.1 != Principal::Operator {
            return Ok(());
        }
        let e = enc.encode_descriptor(
            "sonde_oci_pulls_in_flight",
            "Background pulls of oci:// plugins running or waiting for a slot",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(in_flight as i64).encode(e)
    }

    /// Run duration and fuel histograms by plugin and kind.
    fn plugin_histograms(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let plugins = self.0.runs.by_plugin.read().unwrap_or_else(|e| e.into_inner());
        let histograms: [(&str, &str, Pick); 2] = [
            (
                "sonde_run_duration_seconds",
                "Run durations, by plugin and probe kind",
                |s| &s.duration,
            ),
            (
                "sonde_run_fuel",
                "Fuel consumed per run, by plugin and probe kind",
                |s| &s.fuel,
            ),
        ];
        for (name, help, pick) in histograms {
            let mut e = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (plugin, kinds) in plugins.iter() {
                for (kind, s) in KINDS.iter().zip(kinds) {
                    if s.used.load(std::sync::atomic::Ordering::Relaxed) {
                        let labels = [("plugin", &**plugin), ("kind", kind.as_str())];
                        pick(s).encode(e.encode_family(&labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The scheduler, the compile cache and the instance pool.
    fn engine_series(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let m = &self.0;
        let e = enc.encode_descriptor(
            "sonde_scheduler_start_lateness_seconds",
            "How long after its planned time each scheduled run started",
            None,
            MetricType::Histogram,
        )?;
        m.runs.lateness.encode(e)?;
        let e = enc.encode_descriptor(
            "sonde_scheduler_runs_in_flight",
            "Probe runs in progress",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(m.scheduler.progress().in_flight() as i64).encode(e)?;
        let e = enc.encode_descriptor(
            "sonde_scheduler_overdue_seconds",
            "How long the most overdue due run has waited to start (0 when none waits)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(m.scheduler.progress().overdue().as_secs_f64()).encode(e)?;
        let (hits, misses) = (m.cache)();
        let counters = [
            (
                "sonde_plugin_cache_hits",
                "Plugin loads served from the compiled-component cache",
                hits,
            ),
            ("sonde_plugin_cache_misses", "Plugin loads that had to compile", misses),
        ];
        for (name, help, value) in counters {
            let e = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(e)?;
        }
        let Some(pool) = (m.pool)() else {
            return Ok(());
        };
        let gauges: [(&str, &str, u64); 3] = [
            (
                "sonde_pool_memories_in_use",
                "Linear memories of the instance pool that calls use now",
                pool.memories_in_use,
            ),
            (
                "sonde_pool_idle_memories",
                "Memory slots of the instance pool that calls have used and that are idle now",
                pool.idle_memories,
            ),
            (
                "sonde_pool_idle_resident_bytes",
                "Bytes the idle memory slots keep resident for the next call",
                pool.idle_bytes_resident,
            ),
        ];
        for (name, help, value) in gauges {
            let e = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(e)?;
        }
        Ok(())
    }

    /// The agent itself: its build, its config's last reload, its writes
    /// to the Kubernetes API.
    fn agent_series(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let (loaded_at, failed) = {
            let s = self.0.status.lock().unwrap_or_else(|e| e.into_inner());
            (s.loaded_at, s.reload_error.is_some())
        };
        let e = enc.encode_descriptor(
            "sonde_config_last_reload_successful",
            "Whether the last reload of the config succeeded (1) or was refused (0; the previous config stays in force)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(!failed)).encode(e)?;
        let e = enc.encode_descriptor(
            "sonde_config_last_reload_success_timestamp_seconds",
            "When the config in force was loaded, in seconds since the Unix epoch",
            None,
            MetricType::Gauge,
        )?;
        let at = loaded_at
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        ConstGauge::new(at).encode(e)?;
        (self.0.kubernetes)().encode(enc)
    }
}

/// The states of the `sonde_probe_state` state set, in order.
const STATES: [Status; 4] = [Status::Success, Status::Warning, Status::Failure, Status::Unknown];

impl Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let mut e = enc.encode_descriptor(
            "sonde_build_info",
            "1, labelled with the version and commit of the running sonde",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("version", self.0.build.version), ("commit", self.0.build.commit)];
        ConstGauge::new(1).encode(e.encode_family(&labels)?)?;
        let rows = self.rows();
        self.probe_series(&mut enc, &rows)?;
        self.tenant_series(&mut enc)?;
        self.pull_series(&mut enc)?;
        if self.1 != Principal::Operator {
            return Ok(());
        }
        self.plugin_histograms(&mut enc)?;
        self.engine_series(&mut enc)?;
        self.agent_series(&mut enc)
    }
}

/// What the agent wrote to the Kubernetes API, by kind of object
/// (`pod_status`: a readiness gate's condition; `event`; `check_status`:
/// a SondeCheck's status, by the elected agent), and the writes
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
