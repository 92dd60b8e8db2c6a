//! `sonde bench`: what a plugin costs. N runs through the engine's call path (a
//! fresh sandbox per run, grants enforced), C in flight, reporting runs/s,
//! latency percentiles, CPU per run, fuel per run and peak RSS; with
//! `--baseline`, the same probes made natively (tokio + hyper, same
//! connection policy) in the same process, so every figure is a ratio
//! measured in one run. `--scheduler` measures the scheduler instead: many
//! probes of one plugin on their period, reporting CPU, RSS and how late
//! runs start.

mod native;
mod scheduled;

use scheduled::run_scheduler;

use super::args::{SandboxArgs, parse_duration, parse_positive_duration};
use super::error::CliError;
use super::load::load_plugin;
use super::output::Output;
use clap::Args;
use serde::Serialize;
use sonde_core::catalog::{Catalog, ProbeSpec, TargetSpec};
use sonde_core::config::Kind;
use sonde_core::results::{DEFAULT_HISTORY, ResultCache};
use sonde_core::scheduler::{self, Observer};
use sonde_sandbox::engine::{Call, Engine, EngineConfig, Limits, Plugin};
use sonde_sandbox::host::{Grants, NetPattern};
use sonde_sandbox::verdict::{RunResult, Status};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Arguments of `sonde bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A built-in plugin name (`http`) or the path to a `.wasm` component.
    pub plugin: String,

    /// What to probe: HOST:PORT or a URL, as for `sonde check`.
    #[arg(long, short, default_value = "")]
    pub target: String,

    /// The plugin config, as JSON.
    #[arg(long, short, default_value = "{}", value_name = "JSON")]
    pub config: String,

    /// How many runs to measure (after a warm-up of a tenth of them, at most 2,000).
    #[arg(long, short = 'n', default_value_t = 10_000, value_name = "N")]
    pub count: u64,

    /// How many runs are in flight at once.
    #[arg(long, short = 'j', default_value_t = 16, value_name = "C")]
    pub concurrency: u32,

    /// Reuse connections from the host's keep-alive pool: sets `"keepalive": true` in the config (the http plugin), and keeps one connection per worker in the native baseline.
    #[arg(long)]
    pub keepalive: bool,

    /// Also make the same probes natively, without wasm (tcp: connect and reset; http: tokio + hyper GET, a new connection per probe closed with a reset, or keep-alive; exec: spawn the program), and print the ratio.
    #[arg(long)]
    pub baseline: bool,

    /// Which native probe `--baseline` makes for a plugin given by path (a
    /// locally built tcp plugin, say): tcp, http or exec. A built-in's
    /// name chooses its own.
    #[arg(long, value_name = "KIND", requires = "baseline", value_parser = ["tcp", "http", "exec"])]
    pub baseline_as: Option<String>,

    /// Each run's deadline, fuel, memory and grants (as `sonde check`).
    #[command(flatten)]
    pub sandbox: SandboxArgs,

    /// Instance slots the engine reserves address space for (at least --concurrency); a small pool fits under valgrind, whose address space is too small for the default 256.
    #[arg(long, default_value_t = sonde_sandbox::engine::EngineConfig::default().max_concurrent_calls, value_name = "N")]
    pub slots: u32,

    /// Bytes of each linear memory kept resident between runs by the pooling allocator (reset with memset instead of madvise), to compare reset strategies.
    #[arg(long, default_value_t = sonde_sandbox::engine::KEEP_RESIDENT, value_name = "BYTES")]
    pub keep_resident: usize,

    /// Measure the scheduler instead: register --probes probes of PLUGIN with --period and run them for --duration.
    #[arg(long)]
    pub scheduler: bool,

    /// With --scheduler: how many probes.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub probes: usize,

    /// With --scheduler: each probe's period (at least 100ms).
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub period: Duration,

    /// With --scheduler: how long to measure.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration, value_name = "DURATION")]
    pub duration: Duration,

    /// With --scheduler: how long to let the probes run before measuring, so the first runs, planned while the rest were still being registered, do not count.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub warmup: Duration,

    /// Output format.
    #[arg(long, short, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// What one side of a bench measured.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Measured {
    /// Runs measured.
    pub runs: u64,
    /// Runs completed per second of wall time.
    pub runs_per_sec: f64,
    /// Median latency of one run.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// Slowest run.
    pub max_ms: f64,
    /// Process CPU time (user + system) per run, in microseconds.
    pub cpu_us_per_run: f64,
    /// Runs that did not end in success or warning.
    pub errors: u64,
    /// What the first such run said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// The report of a plugin bench, `--output json`'s object.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    /// The plugin as named.
    pub plugin: String,
    /// The target.
    pub target: String,
    /// In flight at once.
    pub concurrency: u32,
    /// Whether keep-alive was on.
    pub keepalive: bool,
    /// The sandboxed runs.
    #[serde(flatten)]
    pub wasm: Measured,
    /// Mean fuel per run.
    pub fuel_per_run: f64,
    /// The process's peak resident set size.
    pub peak_rss_bytes: u64,
    /// The native baseline, with `--baseline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
}

/// The native side of a bench.
#[derive(Debug, Serialize)]
pub(super) struct Baseline {
    /// What it does.
    pub what: &'static str,
    /// Its figures.
    #[serde(flatten)]
    pub measured: Measured,
    /// wasm runs/s divided by native runs/s.
    pub ratio: f64,
}

/// How one run ended, as the driver counts it.
pub(crate) struct RunEnd {
    ok: bool,
    fuel: u64,
    error: Option<String>,
}

impl RunEnd {
    pub(crate) fn ok() -> Self {
        Self {
            ok: true,
            fuel: 0,
            error: None,
        }
    }

    pub(crate) fn failed(message: impl Into<String>) -> Self {
        Self {
            ok: false,
            fuel: 0,
            error: Some(message.into()),
        }
    }

    fn from_result(r: &RunResult) -> Self {
        let ok = matches!(r.status, Status::Success | Status::Warning);
        Self {
            ok,
            fuel: r.fuel_consumed,
            error: (!ok).then(|| match r.reason {
                Some(reason) => format!("{} ({reason}): {}", r.status, r.message),
                None => format!("{}: {}", r.status, r.message),
            }),
        }
    }
}

/// One worker's way of making a probe; each worker owns one, so it may keep
/// state such as a keep-alive connection.
pub(crate) trait Job: Send + 'static {
    fn run(&mut self) -> impl Future<Output = RunEnd> + Send;
}

/// A sandboxed run of the plugin.
struct WasmJob {
    engine: Engine,
    plugin: Arc<Plugin>,
    params: Arc<Params>,
}

struct Params {
    probe: String,
    target: String,
    config: String,
    limits: Limits,
    grants: Arc<Grants>,
}

impl Job for WasmJob {
    async fn run(&mut self) -> RunEnd {
        let p = &self.params;
        let call = Call {
            probe: &p.probe,
            target: &p.target,
            config: &p.config,
            limits: p.limits,
            grants: &p.grants,
            attempt: 1,
            observe: false,
        };
        RunEnd::from_result(&self.engine.run(&self.plugin, &call).await)
    }
}

/// CPU time, user plus system, of this process and of the children it has
/// reaped (what getrusage's ru_utime + ru_stime of RUSAGE_SELF and
/// RUSAGE_CHILDREN add up to): a program an exec probe runs is part of its
/// cost.
fn cpu_time() -> Duration {
    // Through libc rather than rustix: rustix finds the vDSO through the
    // auxiliary vector, which crashes under valgrind (callgrind is how the
    // per-phase instruction counts of docs/performance-notes.md are measured).
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec for the call's duration.
    #[allow(unsafe_code, reason = "clock_gettime of the process's CPU time")]
    let _ = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32) + children_cpu_time()
}

/// CPU time of reaped children, from `/proc/self/stat` (in clock ticks).
fn children_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses: the state is
    // field 3, cutime and cstime are fields 16 and 17.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = [13, 14]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code, reason = "sysconf(_SC_CLK_TCK)")]
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Duration::from_secs_f64(ticks as f64 / per_sec as f64)
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The resident set size now.
fn rss() -> u64 {
    status_kib("VmRSS:")
}

/// The peak resident set size.
fn peak_rss() -> u64 {
    status_kib("VmHWM:")
}

/// The value at `pct` percent of sorted `v` (nearest rank), in ms.
fn percentile_ms(sorted_us: &[u32], pct: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((pct / 100.0) * sorted_us.len() as f64).ceil() as usize;
    f64::from(sorted_us[rank.clamp(1, sorted_us.len()) - 1]) / 1000.0
}

struct WorkerTally {
    latencies_us: Vec<u32>,
    fuel: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Makes `count` runs, `concurrency` at a time, each worker with its own job
/// from `make`; returns the figures and the total fuel.
async fn drive<J: Job>(count: u64, concurrency: u32, mut make: impl FnMut() -> J) -> (Measured, u64) {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    let cpu0 = cpu_time();
    let start = Instant::now();
    for _ in 0..concurrency.max(1) {
        let mut job = make();
        let next = next.clone();
        let per_worker = (count / u64::from(concurrency.max(1)) + 1) as usize;
        workers.spawn(async move {
            let mut t = WorkerTally {
                latencies_us: Vec::with_capacity(per_worker),
                fuel: 0,
                errors: 0,
                first_error: None,
            };
            while next.fetch_add(1, Ordering::Relaxed) < count {
                let begun = Instant::now();
                let end = job.run().await;
                t.latencies_us
                    .push(u32::try_from(begun.elapsed().as_micros()).unwrap_or(u32::MAX));
                t.fuel += end.fuel;
                if !end.ok {
                    t.errors += 1;
                    if t.first_error.is_none() {
                        t.first_error = end.error;
                    }
                }
            }
            t
        });
    }
    let mut all = Vec::with_capacity(count as usize);
    let (mut fuel, mut errors, mut first_error) = (0, 0, None);
    while let Some(t) = workers.join_next().await {
        let Ok(t) = t else { continue };
        all.extend_from_slice(&t.latencies_us);
        fuel += t.fuel;
        errors += t.errors;
        first_error = first_error.or(t.first_error);
    }
    let wall = start.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    all.sort_unstable();
    let runs = all.len() as u64;
    let measured = Measured {
        runs,
        runs_per_sec: runs as f64 / wall.as_secs_f64().max(1e-9),
        p50_ms: percentile_ms(&all, 50.0),
        p99_ms: percentile_ms(&all, 99.0),
        max_ms: all.last().map_or(0.0, |&us| f64::from(us) / 1000.0),
        cpu_us_per_run: cpu.as_secs_f64() * 1e6 / runs.max(1) as f64,
        errors,
        first_error,
    };
    (measured, fuel)
}

/// Warm-up runs before a measurement: a tenth, at most 2,000.
fn warmup(count: u64) -> u64 {
    (count / 10).min(2_000)
}

fn config_with_keepalive(config: &str, keepalive: bool) -> Result<String, CliError> {
    let mut value: serde_json::Value = serde_json::from_str(config).map_err(|e| {
        CliError::Message(format!(
            "--config is not valid JSON: {e}; write a JSON object, such as --config '{{\"path\": \"/healthz\"}}'"
        ))
    })?;
    if keepalive {
        match value.as_object_mut() {
            Some(o) => {
                o.insert("keepalive".into(), serde_json::Value::Bool(true));
            }
            None => {
                return Err(CliError::Message(
                    "--keepalive needs --config to be a JSON object, such as --config '{}'".into(),
                ));
            }
        }
    }
    Ok(value.to_string())
}

pub(super) async fn run(mut config: EngineConfig, args: BenchArgs) -> Result<i32, CliError> {
    config.max_concurrent_calls = args.slots.max(1);
    config.memory_keep_resident = args.keep_resident;
    if args.scheduler {
        return run_scheduler(config, args).await;
    }
    if args.count == 0 || args.concurrency == 0 {
        return Err(CliError::Message(
            "--count and --concurrency must be at least 1; give each a positive number".into(),
        ));
    }
    let plugin_config = config_with_keepalive(&args.config, args.keepalive)?;
    if !args.target.is_empty() {
        NetPattern::for_target(&args.target)?;
    }
    let grants = Arc::new(args.sandbox.grants()?);
    // The native side is set up first: a baseline that cannot run is a
    // usage error, found before the long part.
    let native = if args.baseline {
        let kind = args.baseline_as.as_deref().unwrap_or(&args.plugin);
        Some(native::Native::new(kind, &args.target, &plugin_config, args.keepalive).await?)
    } else {
        None
    };
    let engine = Engine::new(config)?;
    let plugin = load_plugin(&engine, &args.plugin).await?;
    let params = Arc::new(Params {
        probe: "bench".into(),
        target: args.target.clone(),
        config: plugin_config,
        limits: args.sandbox.limits(),
        grants,
    });
    let wasm_job = || WasmJob {
        engine: engine.clone(),
        plugin: plugin.clone(),
        params: params.clone(),
    };
    drive(warmup(args.count), args.concurrency, wasm_job).await;
    let (wasm, fuel) = drive(args.count, args.concurrency, wasm_job).await;
    let fuel_per_run = fuel as f64 / wasm.runs.max(1) as f64;
    let peak_rss_bytes = peak_rss();
    let baseline = match &native {
        Some(n) => {
            drive(warmup(args.count), args.concurrency, || n.job()).await;
            let (measured, _) = drive(args.count, args.concurrency, || n.job()).await;
            Some(Baseline {
                what: n.what(),
                ratio: wasm.runs_per_sec / measured.runs_per_sec.max(1e-9),
                measured,
            })
        }
        None => None,
    };
    let report = Report {
        plugin: args.plugin.clone(),
        target: args.target.clone(),
        concurrency: args.concurrency,
        keepalive: args.keepalive,
        wasm,
        fuel_per_run,
        peak_rss_bytes,
        baseline,
    };
    print_report(&report, args.output);
    let errors = report.wasm.errors + report.baseline.as_ref().map_or(0, |b| b.measured.errors);
    Ok(if errors == 0 { 0 } else { 3 })
}

fn print_measured(label: &str, m: &Measured) {
    out!(
        "{label:<7} {:>10.0} runs/s  p50 {:.3}ms  p99 {:.3}ms  max {:.3}ms  cpu {:.1}µs/run  errors {}",
        m.runs_per_sec,
        m.p50_ms,
        m.p99_ms,
        m.max_ms,
        m.cpu_us_per_run,
        m.errors
    );
    if let Some(e) = &m.first_error {
        out!("        first error: {e}");
    }
}

fn print_report(r: &Report, output: Output) {
    match output {
        Output::Json => out!("{}", serde_json::to_string(r).unwrap_or_default()),
        Output::Text => {
            out!(
                "{} → {} ({} runs, {} in flight{})",
                r.plugin,
                if r.target.is_empty() { "no target" } else { &r.target },
                r.wasm.runs,
                r.concurrency,
                if r.keepalive { ", keep-alive" } else { "" }
            );
            print_measured("wasm", &r.wasm);
            out!(
                "        fuel {:.0}/run  peak RSS {}",
                r.fuel_per_run,
                bytesize::ByteSize(r.peak_rss_bytes)
            );
            if let Some(b) = &r.baseline {
                print_measured("native", &b.measured);
                out!("        ({}); wasm/native = {:.2}", b.what, b.ratio);
            }
        }
    }
}

// The scheduler bench.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u32> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&v, 50.0), 50.0);
        assert_eq!(percentile_ms(&v, 99.0), 99.0);
        assert_eq!(percentile_ms(&v, 100.0), 100.0);
        assert_eq!(percentile_ms(&[], 50.0), 0.0);
        assert_eq!(percentile_ms(&[7000], 99.0), 7.0);
    }

    #[test]
    fn keepalive_goes_into_the_config() {
        assert_eq!(config_with_keepalive("{}", true).unwrap(), r#"{"keepalive":true}"#);
        assert_eq!(
            config_with_keepalive(r#"{"path":"/x"}"#, false).unwrap(),
            r#"{"path":"/x"}"#
        );
        assert!(config_with_keepalive("[]", true).is_err());
        assert!(config_with_keepalive("{", false).is_err());
    }
}
