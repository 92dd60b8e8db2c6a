//! The agent and `sonde check` under a hostile registry (the registry is
//! in sonde-oci's tests, `support/hostile_registry.rs`, with the client's
//! own contract against it): a typed error within a bound of memory, and
//! no effect on anything else the agent runs.

use crate::support;
use crate::support::hostile_registry::{Hostile, Server, accepting, pinned_on};
use sonde_oci::Reference;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Runs `sonde check REFERENCE` and returns its exit, stderr, peak RSS
/// (VmHWM, read from /proc while it runs) and run time.
fn check_peak_rss(reference: &str) -> (std::process::ExitStatus, String, u64, Duration) {
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(support::cache_dir())
        .args(["check", reference, "--insecure-registry", "--oci-cache"])
        .arg(cache.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0);
            peak = peak.max(hwm * 1024);
        }
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(90), "sonde check did not end");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr, peak, started.elapsed())
}

/// The first finding: `sonde check` against an endless manifest
/// held 14 GB after 60 s. Its peak RSS now stays within the manifest cap
/// plus a constant of what the same check takes against a registry that
/// answers 404 at once, and it ends in seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sonde_check_under_an_endless_manifest_stays_within_the_cap_in_memory() {
    let missing = Server::start(Hostile::NotFound).await;
    let endless = Server::start(Hostile::EndlessManifest).await;
    let run = |r: Reference| tokio::task::spawn_blocking(move || check_peak_rss(&r.to_string()));
    let (status, stderr, baseline, _) = run(missing.reference()).await.unwrap();
    assert!(!status.success() && stderr.contains("not found"), "{stderr}");
    let (status, stderr, peak, took) = run(endless.reference()).await.unwrap();
    let cap = sonde_oci::MAX_MANIFEST_BYTES;
    eprintln!(
        "sonde check peak RSS: {} KiB against a 404, {} KiB under an endless manifest ({} ms, {} bytes sent)",
        baseline >> 10,
        peak >> 10,
        took.as_millis(),
        endless.sent()
    );
    assert!(!status.success());
    assert!(stderr.contains("manifest") && stderr.contains("limit"), "{stderr}");
    assert!(
        peak < baseline + cap + (32 << 20),
        "peak RSS {peak} under an endless manifest, {baseline} against a 404: more than the {cap}-byte cap + 32 MiB"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// The third finding: `sonde run` with one probe on a silent
/// registry served `/livez` after 60.1 s and ran nothing until then. Now
/// the agent starts, serves, and runs its other probes at once; the probe
/// that waits shows it in `/v1/probes`, `/v1/status` and the metrics.
/// A config (written in `dir`) with two probes of one target: `plain`, the
/// built-in tcp, and `pulled`, the plugin `pulled` from the registry at
/// `registry` (plain HTTP); both every 100 ms.
fn plain_and_pulled(
    dir: &std::path::Path,
    registry: SocketAddr,
    target: SocketAddr,
    pulled: &str,
) -> std::path::PathBuf {
    let config = dir.join("sonde.yaml");
    std::fs::write(
        &config,
        format!(
            "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\ntargets:\n  - name: svc\n    address: {target}\n    probes:\n      - {{ name: plain, plugin: tcp, period: 100ms }}\n      - {{ name: pulled, plugin: \"{pulled}\", period: 100ms }}\n",
            state = dir.join("state").display(),
            addr = registry,
        ),
    )
    .unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_a_silent_registry_serves_livez_and_runs_unrelated_probes_within_a_second() {
    let silent = Server::start(Hostile::Silent).await;
    let (target, accepting) = accepting().await;
    // The built-in is compiled before the clock starts (a cold compile
    // cache is not what this measures).
    support::builtin("tcp").await;
    let dir = tempfile::tempdir().unwrap();
    let pulled = pinned_on(&silent);
    let config = plain_and_pulled(dir.path(), silent.addr, target, &pulled);
    let started = Instant::now();
    let (agent, api) = support::start_agent(&config).await;
    eprintln!("Agent::start returned after {} ms", started.elapsed().as_millis());
    let (code, _) = support::call(api, "GET", "/livez", None, b"").await;
    assert_eq!(code, 200);
    let probes = loop {
        let probes: serde_json::Value =
            serde_json::from_str(&support::call(api, "GET", "/v1/probes", None, b"").await.1).unwrap();
        let ran = probes
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "plain" && p["last"]["status"] == "success");
        if ran {
            break probes;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{probes:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    eprintln!(
        "/livez and an unrelated probe's first success {} ms after start",
        took.as_millis()
    );
    // Not a wall-clock bound (a loaded machine stretches any): that the
    // agent did not wait for the registry is that the pull is still in
    // flight, unanswered, now that the unrelated probe has passed (below).
    let waiting = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .unwrap_or_else(|| panic!("{probes:#}"));
    assert_eq!(waiting["state"], "unknown", "{waiting:#}");
    assert_eq!(waiting["pulling"]["plugin"], pulled.as_str(), "{waiting:#}");
    let status: serde_json::Value =
        serde_json::from_str(&support::call(api, "GET", "/v1/status", None, b"").await.1).unwrap();
    assert_eq!(status["pulling"][0]["probe"], "pulled", "{status:#}");
    let metrics = support::call(api, "GET", "/metrics", None, b"").await.1;
    assert!(
        metrics.contains("sonde_probe_waiting_for_plugin{probe=\"pulled\"")
            && metrics.contains("sonde_oci_pulls_in_flight 1"),
        "{metrics}"
    );
    // `sonde status` says so too.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .args(["status", "--api", &format!("http://{api}")])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("pulled") && l.contains("pulling") && l.contains("being pulled")),
        "{table}"
    );
    agent.stop().await;
    accepting.abort();
}

/// A probe whose plugin is being pulled waits, visibly, and runs when the
/// pull lands: `pulling` in `/v1/probes` and the metrics until then, gone
/// after; the unrelated probe ran all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_waits_for_its_pull_visibly_and_runs_when_it_lands() {
    let slow = Server::start(Hostile::Honest(1500)).await;
    let (target, accepting) = accepting().await;
    let dir = tempfile::tempdir().unwrap();
    let pulled = slow.reference().to_string();
    let config = plain_and_pulled(dir.path(), slow.addr, target, &pulled);
    let (agent, api) = support::start_agent(&config).await;
    let get = |path: &'static str| async move { support::call(api, "GET", path, None, b"").await.1 };
    let probes: serde_json::Value = serde_json::from_str(&get("/v1/probes").await).unwrap();
    let waiting = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .cloned();
    assert!(
        waiting
            .as_ref()
            .is_some_and(|p| p["pulling"]["plugin"] == pulled.as_str()),
        "{probes:#}"
    );
    let started = Instant::now();
    let probes = loop {
        let probes: serde_json::Value = serde_json::from_str(&get("/v1/probes").await).unwrap();
        let ran = |n: &str| {
            probes
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == n && p["last"]["status"] == "success")
        };
        if ran("pulled") {
            assert!(ran("plain"), "{probes:#}");
            break probes;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{probes:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let landed = probes
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "pulled")
        .unwrap();
    assert!(landed["pulling"].is_null(), "{landed:#}");
    assert!(
        landed["plugin"].as_str().unwrap().contains("@sha256:"),
        "runs the digest: {landed:#}"
    );
    let status: serde_json::Value = serde_json::from_str(&get("/v1/status").await).unwrap();
    assert_eq!(status["pulling"], serde_json::json!([]), "{status:#}");
    let metrics = get("/metrics").await;
    assert!(!metrics.contains("sonde_probe_waiting_for_plugin{"), "{metrics}");
    assert!(metrics.contains("sonde_oci_pulls_in_flight 0"), "{metrics}");
    let charged = agent.executor().tenant_stats("default").unwrap().pull_bytes;
    assert!(
        charged >= sonde_builtins::get("tcp").unwrap().len() as u64,
        "the pull is charged to the tenant once it is taken up: {charged}"
    );
    agent.stop().await;
    accepting.abort();
}
