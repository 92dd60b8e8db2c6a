//! What one scrape encodes: the series families, read from the result
//! cache, the executor, the scheduler and the agent's status at scrape time.

use super::runs::{KINDS, Pick};
use super::*;

#[derive(Debug)]
pub(super) struct Scrape(pub(super) Metrics, pub(super) Principal);

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
            "sonde_probe_failure_cause",
            "1 while the probe's last run failed, labelled with why (one of 15 causes)",
            None,
            MetricType::Gauge,
        )?;
        for r in rows {
            if let Some(cause) = r.last.as_ref().and_then(|o| o.cause) {
                let labels = r.labels(&[("probe", &*r.name), ("cause", cause.as_str())]);
                ConstGauge::new(1).encode(e.encode_family(&labels)?)?;
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
        self.0.node_problems.encode(enc)?;
        (self.0.kubernetes)().encode(enc)
    }

    /// The OTLP exports' counters: every export's for the operator, a
    /// tenant's own export's for the tenant.
    fn otlp_series(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let mut exports = (self.0.otlp)();
        exports.retain(|x| match (&self.1, &x.tenant) {
            (Principal::Operator, _) => true,
            (Principal::Tenant(who), Some(t)) => who == t,
            (Principal::Tenant(_), None) => false,
        });
        OtlpExports::encode(&exports, enc)
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
        self.otlp_series(&mut enc)?;
        if self.1 != Principal::Operator {
            return Ok(());
        }
        self.plugin_histograms(&mut enc)?;
        self.engine_series(&mut enc)?;
        self.agent_series(&mut enc)
    }
}
