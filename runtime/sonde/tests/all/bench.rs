//! `sonde bench` as a user runs it: the figures it reports and the runs it
//! really makes. No assertion on speed: benchmarks are not timed tests.

use crate::support::{accepted_before_now, json, sonde, sonde_async};
use sonde_tests::{CountingListener, HttpServer, closed_port, guests};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The figures every side of a bench reports, sane whatever the speed.
fn assert_figures(v: &serde_json::Value, runs: u64) {
    assert_eq!(v["runs"], runs, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v.get("first_error").is_none(), "{v}");
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"));
    assert!(f("runs_per_sec") > 0.0, "{v}");
    assert!(f("cpu_us_per_run") > 0.0, "{v}");
    assert!(
        f("p50_ms") > 0.0 && f("p50_ms") <= f("p99_ms") && f("p99_ms") <= f("max_ms"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_bench_reports_json_and_makes_every_run() {
    let server = HttpServer::start().await;
    let out = sonde_async(args(&[
        "bench",
        "http",
        "--target",
        &server.addr.to_string(),
        "--config",
        r#"{"path": "/health"}"#,
        "--count",
        "50",
        "--concurrency",
        "4",
        "--baseline",
        "--output",
        "json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert_figures(&v, 50);
    assert_eq!(v["plugin"], "http");
    assert_eq!(v["concurrency"], 4);
    assert_eq!(v["keepalive"], false);
    assert!(v["fuel_per_run"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 0, "{v}");
    let baseline = &v["baseline"];
    assert_figures(baseline, 50);
    assert!(baseline["ratio"].as_f64().unwrap() > 0.0, "{v}");
    assert!(baseline["what"].as_str().unwrap().contains("new connection"), "{v}");

    // 5 warm-up and 50 measured runs on each side, each a GET of /health
    // on a connection of its own.
    let requests = server.requests();
    assert_eq!(requests.len(), 110, "{requests:?}");
    assert!(requests.iter().all(|r| r == "/health"), "{requests:?}");
    assert_eq!(server.accepted(), 110);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_bench_reuses_connections() {
    let server = HttpServer::start().await;
    let out = sonde_async(args(&[
        "bench",
        "http",
        "--target",
        &server.addr.to_string(),
        "--config",
        r#"{"path": "/health"}"#,
        "--count",
        "50",
        "--concurrency",
        "2",
        "--keepalive",
        "--baseline",
        "-o",
        "json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert_figures(&v, 50);
    assert_eq!(v["keepalive"], true);
    assert_figures(&v["baseline"], 50);
    let requests = server.requests();
    assert_eq!(requests.len(), 110, "{requests:?}");
    assert!(requests.iter().all(|r| r == "/health"), "{requests:?}");
    // Two workers on each side: far fewer connections than requests.
    assert!(server.accepted() <= 8, "{} connections", server.accepted());
}

#[test]
fn errors_are_counted_and_set_the_exit_code() {
    let closed = closed_port().to_string();
    let out = sonde(&["bench", "tcp", "--target", &closed, "-n", "20", "-j", "2", "-o", "json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let v = json(&out);
    assert_eq!(v["runs"], 20);
    assert_eq!(v["errors"], 20);
    let first = v["first_error"].as_str().unwrap();
    assert!(first.contains("failure") && first.contains("refused"), "{first}");
}

#[test]
fn a_baseline_needs_a_native_equivalent() {
    let out = sonde(&["bench", guests::ALWAYS_UP, "-n", "5", "--baseline"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no native equivalent"), "{stderr}");
    assert!(stderr.contains("--baseline-as"), "{stderr}");
    let out = sonde(&["bench", guests::ALWAYS_UP, "-n", "5", "--baseline-as", "tcp"]);
    assert_eq!(out.status.code(), Some(2), "--baseline-as without --baseline: {out:?}");
}

/// A plugin given by path is compared with the native probe `--baseline-as`
/// names: here the tcp baseline's connects reach the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baseline_as_names_the_native_probe_for_a_plugin_by_path() {
    let listener = CountingListener::start().await;
    let out = sonde_async(args(&[
        "bench",
        guests::ALWAYS_UP,
        "--target",
        &listener.addr.to_string(),
        "-n",
        "20",
        "-j",
        "2",
        "--baseline",
        "--baseline-as",
        "tcp",
        "-o",
        "json",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert_figures(&v["baseline"], 20);
    assert!(v["baseline"]["what"].as_str().unwrap().contains("TCP connect"), "{v}");
    // always_up dials nothing: every connect is the baseline's (20 measured
    // and 2 warm-up).
    assert_eq!(accepted_before_now(listener.addr, || listener.accepted()).await, 22);
}

#[test]
fn scheduler_bench_reports_lateness_and_memory() {
    let out = sonde(&[
        "bench",
        guests::ALWAYS_UP,
        "--scheduler",
        "--probes",
        "200",
        "--period",
        "100ms",
        "--duration",
        "1s",
        "--warmup",
        "200ms",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert_eq!(v["probes"], 200);
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["runs"].as_u64().unwrap() > 0, "{v}");
    for k in [
        "register_s",
        "rss_per_probe_bytes",
        "cpu_cores",
        "cpu_us_per_run",
        "late_p50_ms",
        "late_p99_ms",
        "late_max_ms",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x >= 0.0), "{k} in {v}");
    }
    assert!(v["late_p50_ms"].as_f64() <= v["late_max_ms"].as_f64(), "{v}");
    assert!(v["rss_bytes"].as_u64().unwrap() > 0, "{v}");
}
