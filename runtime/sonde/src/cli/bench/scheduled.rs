//! `sonde bench --scheduler`: many probes on their periods, measuring how
//! late the runs start, the CPU and the memory.

use super::*;

/// Start lateness of every planned run, and how runs ended.
#[derive(Default)]
pub(super) struct Watch {
    late_us: Mutex<Vec<u32>>,
    finished: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Runs before this are not counted (registration and warm-up).
    counting: std::sync::atomic::AtomicBool,
}

impl Observer for Watch {
    fn run_started(&self, _spec: &ProbeSpec, late: Duration) {
        if self.counting.load(Ordering::Relaxed) {
            let us = u32::try_from(late.as_micros()).unwrap_or(u32::MAX);
            self.late_us.lock().unwrap_or_else(|e| e.into_inner()).push(us);
        }
    }

    fn run_finished(&self, _spec: &ProbeSpec, result: &RunResult) {
        if !self.counting.load(Ordering::Relaxed) {
            return;
        }
        self.finished.fetch_add(1, Ordering::Relaxed);
        if !matches!(result.status, Status::Success | Status::Warning) {
            self.errors.fetch_add(1, Ordering::Relaxed);
            let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
            if first.is_none() {
                *first = Some(RunEnd::from_result(result).error.unwrap_or_default());
            }
        }
    }
}

/// The report of `sonde bench --scheduler`.
#[derive(Debug, Serialize)]
pub(super) struct SchedulerReport {
    /// The plugin as named.
    pub plugin: String,
    /// Probes registered.
    pub probes: usize,
    /// Their period.
    pub period_ms: f64,
    /// How long it took to build the probes and hand them to the scheduler.
    pub register_s: f64,
    /// How long they ran before the measurement.
    pub warmup_s: f64,
    /// How long the measurement lasted.
    pub duration_s: f64,
    /// Resident memory the probes added once registered, per probe.
    pub rss_per_probe_bytes: f64,
    /// Runs started in the measured window.
    pub runs: u64,
    /// Runs that did not end in success or warning.
    pub errors: u64,
    /// What the first such run said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Process CPU time over the window, in cores (1.0 = one core busy).
    pub cpu_cores: f64,
    /// Process CPU time per run, in microseconds.
    pub cpu_us_per_run: f64,
    /// Resident set size at the end.
    pub rss_bytes: u64,
    /// Peak resident set size.
    pub peak_rss_bytes: u64,
    /// Median start lateness (start time minus planned time).
    pub late_p50_ms: f64,
    /// 99th percentile start lateness.
    pub late_p99_ms: f64,
    /// Largest start lateness.
    pub late_max_ms: f64,
}

pub(super) async fn run_scheduler(config: EngineConfig, args: BenchArgs) -> Result<i32, CliError> {
    check_scheduler_args(&args)?;
    let plugin_config = config_with_keepalive(&args.config, args.keepalive)?;
    let address = if args.target.is_empty() {
        "127.0.0.1:9".to_string()
    } else {
        NetPattern::for_target(&args.target)?;
        args.target.clone()
    };
    let grants = args.sandbox.grants()?;
    let engine = Engine::new(config)?;
    let plugin = load_plugin(&engine, &args.plugin).await?;
    let watch = Arc::new(Watch::default());
    // Room for every run of the window, reserved before the baseline RSS.
    let expected = (args.probes as f64 * args.duration.as_secs_f64() / args.period.as_secs_f64() * 1.2) as usize;
    watch
        .late_us
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .reserve(expected.min(50_000_000));
    let rss_before = rss();
    let registering = Instant::now();

    let target: Arc<str> = "bench".into();
    let probes = bench_probes(&args, &target, &plugin, &plugin_config, &grants);
    let catalog = Catalog::from_specs(
        Arc::default(),
        vec![Arc::new(TargetSpec {
            name: target,
            address,
            on_failure: None,
            tenant: sonde_core::tenants::DEFAULT_TENANT.into(),
        })],
        probes,
    );
    let results = ResultCache::new(DEFAULT_HISTORY);
    let runner = Arc::new(sonde_core::executor::EngineRunner::new(engine.clone()));
    let handle = scheduler::spawn(
        runner,
        results,
        catalog,
        scheduler::Options {
            jitter: true,
            observer: watch.clone(),
        },
    );
    let register = registering.elapsed();
    let registered_rss = rss();
    let rss_per_probe = registered_rss.saturating_sub(rss_before) as f64 / args.probes as f64;

    tokio::time::sleep(args.warmup).await;
    watch.counting.store(true, Ordering::Relaxed);
    let cpu0 = cpu_time();
    let start = Instant::now();
    tokio::time::sleep(args.duration).await;
    watch.counting.store(false, Ordering::Relaxed);
    let wall = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let rss_end = rss();
    handle.shutdown(Duration::from_secs(2)).await;

    let mut late = std::mem::take(&mut *watch.late_us.lock().unwrap_or_else(|e| e.into_inner()));
    late.sort_unstable();
    let runs = late.len() as u64;
    let report = SchedulerReport {
        plugin: args.plugin.clone(),
        probes: args.probes,
        period_ms: args.period.as_secs_f64() * 1000.0,
        register_s: register.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        duration_s: wall.as_secs_f64(),
        rss_per_probe_bytes: rss_per_probe,
        runs,
        errors: watch.errors.load(Ordering::Relaxed),
        first_error: watch.first_error.lock().unwrap_or_else(|e| e.into_inner()).take(),
        cpu_cores: cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9),
        cpu_us_per_run: cpu.as_secs_f64() * 1e6 / runs.max(1) as f64,
        rss_bytes: rss_end,
        peak_rss_bytes: peak_rss(),
        late_p50_ms: percentile_ms(&late, 50.0),
        late_p99_ms: percentile_ms(&late, 99.0),
        late_max_ms: late.last().map_or(0.0, |&us| f64::from(us) / 1000.0),
    };
    print_scheduler_report(&report, &args);
    Ok(if report.errors == 0 { 0 } else { 3 })
}

/// Refuses a period the scheduler would not run and a bench of no probes.
pub(super) fn check_scheduler_args(args: &BenchArgs) -> Result<(), CliError> {
    if args.period < sonde_core::catalog::MIN_PERIOD {
        return Err(CliError::Message(
            "--period must be at least 100ms (the scheduler's shortest period); give --period 100ms or more".into(),
        ));
    }
    if args.probes == 0 {
        return Err(CliError::Message(
            "--probes must be at least 1; give a positive number".into(),
        ));
    }
    Ok(())
}

/// Each probe as the catalog would resolve it from a config file, with
/// strings and grants of its own; the config parser is not measured.
pub(super) fn bench_probes(
    args: &BenchArgs,
    target: &Arc<str>,
    plugin: &Arc<Plugin>,
    plugin_config: &str,
    grants: &Grants,
) -> Vec<Arc<ProbeSpec>> {
    (0..args.probes)
        .map(|i| {
            Arc::new(ProbeSpec {
                name: format!("bench-{i}").into(),
                target: target.clone(),
                kind: Kind::Readiness,
                plugin_ref: args.plugin.clone(),
                plugin: plugin.clone(),
                address: args.target.clone(),
                config: plugin_config.to_string(),
                period: args.period,
                initial_delay: Duration::ZERO,
                propagate: false,
                success_threshold: 1,
                failure_threshold: sonde_core::catalog::DEFAULT_FAILURE_THRESHOLD,
                limits: args.sandbox.limits(),
                grants: Arc::new(grants.clone()),
                groups: Arc::from(Vec::<String>::new()),
                labels: Arc::from(Vec::new()),
                tenant: sonde_core::tenants::DEFAULT_TENANT.into(),
            })
        })
        .collect()
}

/// The scheduler bench's report, as `--output` asks.
pub(super) fn print_scheduler_report(report: &SchedulerReport, args: &BenchArgs) {
    match args.output {
        Output::Json => out!("{}", serde_json::to_string(report).unwrap_or_default()),
        Output::Text => {
            out!(
                "{} probes of {} every {}, registered in {:.2}s, measured for {:.1}s after {:.0}s: {} runs, {} errors",
                report.probes,
                report.plugin,
                humantime::format_duration(args.period),
                report.register_s,
                report.duration_s,
                report.warmup_s,
                report.runs,
                report.errors
            );
            if let Some(e) = &report.first_error {
                out!("  first error: {e}");
            }
            out!(
                "  CPU {:.3} cores ({:.1}µs/run)  RSS {} (peak {}), {:.0} bytes/probe registered",
                report.cpu_cores,
                report.cpu_us_per_run,
                bytesize::ByteSize(report.rss_bytes),
                bytesize::ByteSize(report.peak_rss_bytes),
                report.rss_per_probe_bytes
            );
            out!(
                "  start lateness p50 {:.3}ms  p99 {:.3}ms  max {:.3}ms",
                report.late_p50_ms,
                report.late_p99_ms,
                report.late_max_ms
            );
        }
    }
}
