//! The multi-tenancy acceptance test, in real time (30 s), as a binary of
//! its own so that no other test shares its CPU: tenant A runs 500 probes
//! of a plugin that spins until its 1 s deadline, every 100 ms, asking for
//! all 256 sandbox slots; tenant B runs 50 http probes every second against
//! a local server. B's runs start on time, all succeed, the scheduler never
//! stalls and the process stays under 512 MiB.
//!
//! "On time" is bounded loosely on purpose. This is a real-time test on a
//! shared 2-core machine, and a timed assertion at the 20 ms target flakes
//! (CI once measured a p99 of 22 ms on a busy runner). What the test must
//! catch is a broken fairness design: when A can take B's slots, B's runs
//! wait for A's 1 s calls, so lateness and permit waits reach hundreds of
//! milliseconds. The 20 ms figure is a performance target. The scheduler
//! rows of `sonde bench --scheduler` measure it, and this test prints its
//! own figures for the closing notes.

use sonde_core::auth::Principal;
use sonde_core::catalog::{Catalog, ProbeSpec};
use sonde_core::executor::EngineRunner;
use sonde_core::executor::{Executor, ExecutorConfig};
use sonde_core::metrics::{Metrics, RunMetrics};
use sonde_core::results::ResultCache;
use sonde_core::scheduler::{self, Observer};
use sonde_sandbox::engine::{Engine, EngineConfig};
use sonde_sandbox::verdict::{RunResult, Status};
use sonde_tests::{HttpServer, guests};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Start lateness of tenant B's runs, and what both tenants' runs ended as.
#[derive(Default)]
struct Watch {
    b_late: Mutex<Vec<Duration>>,
    a_runs: AtomicU64,
    b_runs: AtomicU64,
    b_wrong: Mutex<Vec<String>>,
}

impl Observer for Watch {
    fn run_started(&self, spec: &ProbeSpec, late: Duration) {
        if &*spec.tenant == "b" {
            self.b_late.lock().unwrap().push(late);
        }
    }

    fn run_finished(&self, spec: &ProbeSpec, result: &RunResult) {
        match &*spec.tenant {
            "a" => {
                self.a_runs.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.b_runs.fetch_add(1, Ordering::Relaxed);
                if result.status != Status::Success || !result.message.contains("/ok: 200") {
                    self.b_wrong
                        .lock()
                        .unwrap()
                        .push(format!("{}: {} {}", spec.name, result.status, result.message));
                }
            }
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// A tenant's `sonde_tenant_queue_wait_seconds` buckets in an OpenMetrics
/// exposition: (upper bound, calls that waited at most that long), the
/// last bound `Duration::MAX` (+Inf).
fn queue_wait_buckets(exposition: &str, tenant: &str) -> Vec<(Duration, u64)> {
    let tenant = format!("tenant=\"{tenant}\"");
    exposition
        .lines()
        .filter_map(|l| {
            let (labels, n) = l
                .strip_prefix("sonde_tenant_queue_wait_seconds_bucket{")?
                .split_once("} ")?;
            let labels: Vec<&str> = labels.split(',').collect();
            if !labels.contains(&tenant.as_str()) {
                return None;
            }
            let le = labels.iter().find_map(|l| l.strip_prefix("le=\"")?.strip_suffix('"'))?;
            let bound = match le {
                "+Inf" => Duration::MAX,
                s => Duration::from_secs_f64(s.parse().unwrap()),
            };
            Some((bound, n.parse().unwrap()))
        })
        .collect()
}

/// The acceptance test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_does_not_delay_another() {
    const SECONDS: u64 = 30;
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = format!(
        "tenants:
  - id: a
    quotas: {{ max_probes: 500, max_concurrent_runs: 256, timeout: 1s }}
    ceiling: {{ net: [\"127.0.0.1:*\"] }}
  - id: b
    quotas: {{ max_probes: 50, max_concurrent_runs: 8 }}
    ceiling: {{ net: [\"{addr}\"] }}
targets:
  - name: spinner
    tenant: a
    address: 127.0.0.1:9
    probes:
",
        addr = server.addr
    );
    for i in 0..500 {
        yaml.push_str(&format!(
            "      - {{ name: spin-{i}, plugin: {}, period: 100ms, timeout: 1s }}\n",
            guests::SPIN_FOREVER
        ));
    }
    yaml.push_str(&format!(
        "  - name: web\n    tenant: b\n    address: {}\n    probes:\n",
        server.addr
    ));
    for i in 0..50 {
        yaml.push_str(&format!(
            "      - {{ name: web-{i}, plugin: http, config: {{ path: /ok }}, period: 1s }}\n"
        ));
    }
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let engine = Engine::new(EngineConfig {
        // The compile cache the `all` tests use.
        cache_dir: Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")),
        ..EngineConfig::default()
    })
    .unwrap();
    let reg = Catalog::load_file(&engine, &path)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let executor = Executor::new(ExecutorConfig::default()).unwrap();
    executor.configure(&reg.tenants);
    let runner = Arc::new(EngineRunner::with_executor(engine, executor.clone()));
    let watch = Arc::new(Watch::default());
    let results = ResultCache::default();
    let handle = scheduler::spawn(
        runner,
        results.clone(),
        reg,
        scheduler::Options {
            jitter: true,
            observer: watch.clone(),
        },
    );

    let started = Instant::now();
    let (mut overdue_max, mut rss_max) = (Duration::ZERO, 0);
    while started.elapsed() < Duration::from_secs(SECONDS) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        overdue_max = overdue_max.max(handle.progress().overdue());
        rss_max = rss_max.max(sonde_tests::rss());
    }
    handle.shutdown(Duration::from_secs(2)).await;
    let metrics = Metrics {
        build: sonde::build::INFO,
        runs: Arc::new(RunMetrics::default()),
        results,
        scheduler: handle.clone(),
        cache: Arc::new(|| (0, 0)),
        pool: Arc::new(|| None),
        executor: executor.clone(),
        pulls: Arc::new(|| (Vec::new(), 0)),
        status: Arc::default(),
        kubernetes: Arc::new(Default::default),
        node_problems: Arc::default(),
        otlp: Arc::new(Vec::new),
    };
    let exposition = metrics.encode(&Principal::Operator);

    let mut late = watch.b_late.lock().unwrap().clone();
    late.sort();
    let (p50, p99, max) = (percentile(&late, 0.5), percentile(&late, 0.99), late[late.len() - 1]);
    let stats = executor.stats();
    let b = stats.iter().find(|s| &*s.tenant == "b").unwrap();
    let a = stats.iter().find(|s| &*s.tenant == "a").unwrap();
    // Time B's calls waited for a permit after the scheduler started them,
    // as `/metrics` exposes it.
    let b_wait = queue_wait_buckets(&exposition, "b");
    let b_waits = b_wait.last().map_or(0, |(_, n)| *n);
    assert!(
        b_waits >= 50 * (SECONDS - 2),
        "B's permit waits in /metrics: {b_waits}\n{exposition}"
    );
    let b_wait_p99 = b_wait
        .iter()
        .find(|(_, n)| *n as f64 >= b_waits as f64 * 0.99)
        .map(|(d, _)| *d)
        .unwrap();
    let b_call = b.sandbox_time / b.calls.max(1) as u32;
    eprintln!(
        "hostile tenant: B {} runs started, lateness p50 {p50:?} p99 {p99:?} max {max:?}; \
         B permit wait p99 <= {b_wait_p99:?}, mean {:?}; B time in sandbox, mean {b_call:?}; A {} runs ({} calls, errors {:?}, \
         {:?} in sandboxes); scheduler overdue max {overdue_max:?}; RSS max {} MiB",
        late.len(),
        b.queue_wait / b.calls.max(1) as u32,
        watch.a_runs.load(Ordering::Relaxed),
        a.calls,
        a.errors.iter().filter(|(_, n)| *n > 0).collect::<Vec<_>>(),
        a.sandbox_time,
        rss_max >> 20,
    );

    let wrong = watch.b_wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "{} of B's runs went wrong: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    // 50 probes at 1 s for 30 s, the first within a second (jitter).
    assert!(late.len() >= 50 * (SECONDS as usize - 2), "B ran {} times", late.len());
    assert!(watch.b_runs.load(Ordering::Relaxed) >= 50 * (SECONDS - 2));
    // A kept many slots busy: it asked for every one of the engine's 256
    // and got what the other tenants' reserved shares leave (256 - 85 - 8).
    assert!(a.calls >= 100 * (SECONDS - 2), "A made {} calls", a.calls);
    assert_eq!(a.limit, 256);
    assert_eq!((b.reserved, a.reserved), (8, 85));
    // Fair: a few ms on a quiet machine, ~100 ms on one whose both cores
    // build beside it (seen: p99 100.2 ms). Starved behind A's 1 s calls:
    // most of a second.
    assert!(p99 < Duration::from_millis(250), "B's start lateness p99 is {p99:?}");
    // A permit wait starved behind A's 1 s calls lands in the 500 ms or
    // 1 s bucket; a fair one in the 10-50 ms buckets on a quiet machine,
    // and 100 ms on one whose other core compiles (seen twice).
    assert!(
        b_wait_p99 <= Duration::from_millis(250),
        "B's calls waited for a permit: p99 <= {b_wait_p99:?}"
    );
    // B's calls get their share of the sandbox threads: a few ms each
    // alone; a generous bound that a first-come pool (over 100 ms) fails.
    assert!(
        b_call < Duration::from_millis(50),
        "B's calls took {b_call:?} on average"
    );
    assert!(
        overdue_max < Duration::from_millis(250),
        "the scheduler fell {overdue_max:?} behind"
    );
    assert!(rss_max < 512 << 20, "RSS reached {} MiB", rss_max >> 20);
}
