//! issue 27: every `sandbox:` key has an effect. For each key, an agent
//! started on a config file that sets it to a non-default value, and a
//! hostile guest that runs into it: the run names the configured value,
//! not the default. The bounds are the engine's own (not the process's),
//! so each agent here runs on an engine of its own, and two engines in one
//! process enforce different bounds side by side.

use crate::support::{call, engine_with, start_agent_on};
use bytesize::ByteSize;
use sonde_sandbox::host::bounds::HostLimits;
use sonde_tests::guests;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// A config with `sandbox` (a flow mapping) and one target `t` probed by
/// `probes` (each a flow mapping), written in `dir`.
fn config(dir: &Path, sandbox: &str, address: &str, probes: &[String]) -> std::path::PathBuf {
    let mut text = format!("sandbox: {sandbox}\ntargets:\n  - name: t\n    address: {address}\n    probes:\n");
    for p in probes {
        text += &format!("      - {p}\n");
    }
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A probe `name` of the guest at `plugin` with `config`, run once at
/// start (the period is long) with a deadline of 10s.
fn probe(name: &str, plugin: &str, config: &str) -> String {
    format!("{{name: {name}, plugin: {plugin}, config: {config}, period: 1h, timeout: 10s}}")
}

/// The last run of `probe`, once it has one.
async fn last_run(api: SocketAddr, probe: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let (status, body) = call(api, "GET", &format!("/v1/probes/{probe}"), None, b"").await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if !v["last"].is_null() {
            return v["last"].clone();
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{probe} never ran: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's first run of `guest` with `config`, under `sandbox`.
async fn first_run(sandbox: &str, guest: &str, config: &str, address: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let path = self::config(dir.path(), sandbox, address, &[probe("p", guest, config)]);
    let (agent, api) = start_agent_on(engine_with(HostLimits::default()), &path).await;
    let last = last_run(api, "p").await;
    agent.stop().await;
    last
}

/// The run ended `unknown`, reason `host-limit`, naming `what`.
fn assert_host_limit(last: &serde_json::Value, what: &str) {
    assert_eq!(
        (last["status"].as_str(), last["reason"].as_str()),
        (Some("unknown"), Some("host-limit")),
        "{last}"
    );
    let message = last["message"].as_str().unwrap_or_default();
    assert!(message.contains(what), "not {what:?}: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_per_call() {
    let last = first_run("{sockets_per_call: 3}", guests::HOARD_SOCKETS, "{}", "127.0.0.1:9").await;
    assert_host_limit(&last, "more than 3 sockets");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_entries_per_call() {
    let last = first_run(
        "{table_entries_per_call: 100}",
        guests::HOARD_FIELDS,
        "{}",
        "127.0.0.1:9",
    )
    .await;
    assert_host_limit(&last, "more than 100 host resources");
}

/// Two fields of 2 KiB names and 2 KiB values: within the default 16 KiB
/// of one `fields`, past a bound of 4 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_bytes() {
    let config = r#"{via: fields, count: 2, bytes: 2048}"#;
    let last = first_run("{fields_bytes: 4KiB}", guests::ALIAS_ARGUMENTS, config, "127.0.0.1:9").await;
    assert_host_limit(&last, "more than 4096 bytes in one fields");
    let last = first_run("{}", guests::ALIAS_ARGUMENTS, config, "127.0.0.1:9").await;
    assert_eq!(last["status"], "success", "{last}");
}

/// 120 header names of 2 KiB (240 KiB) passed to one host call: within
/// the default 4 MiB, past a bound of 128 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_bytes() {
    let config = r#"{via: keep, count: 120, bytes: 2048}"#;
    let last = first_run(
        "{argument_bytes: 128KiB}",
        guests::ALIAS_ARGUMENTS,
        config,
        "127.0.0.1:9",
    )
    .await;
    assert_host_limit(&last, &format!("more than {} to one host call", ByteSize(128 * 1024)));
    let last = first_run("{}", guests::ALIAS_ARGUMENTS, config, "127.0.0.1:9").await;
    let message = last["message"].as_str().unwrap_or_default();
    assert!(message.contains("120 response headers to keep"), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_per_call() {
    let last = first_run(
        "{lookups_per_call: 2}",
        guests::FLOOD_WASI_LOOKUPS,
        "{}",
        "localhost:80",
    )
    .await;
    assert_host_limit(&last, "more than 2 name lookups in flight");
}

/// `sonde run` behind a resolver that never answers, with six probes
/// flooding it with lookups: the runs cut off waiting name the gate and
/// its configured size.
fn starved_lookups(sandbox: &str, resolver_ip: &str, gate: &str) {
    let dir = tempfile::tempdir().unwrap();
    let probes: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "{{name: flood{i}, plugin: {}, config: {{wait: true}}, period: 1s, timeout: 2s}}",
                guests::FLOOD_WASI_LOOKUPS
            )
        })
        .collect();
    let path = config(dir.path(), sandbox, "slow.sonde-test:80", &probes);
    let (resolver, mut child, _stderr, api) =
        super::containment::agent_with_silent_resolver(dir.path(), resolver_ip, &path);
    let waited = Instant::now();
    let mut probes = super::containment::get_text(&api, "/v1/probes");
    while !probes.contains(gate) && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
        probes = super::containment::get_text(&api, "/v1/probes");
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(resolver);
    assert!(
        probes.contains(&format!("cut off waiting for one of the agent's {gate}")),
        "no run named {gate:?}: {probes}"
    );
}

#[test]
fn lookups_in_flight() {
    starved_lookups("{lookups_in_flight: 3}", "127.0.0.71", "3 name-lookup slots");
}

/// Each lookup holds a blocking thread too: with 2 of them, the third
/// lookup waits for a thread, not a lookup slot.
#[test]
fn blocking_threads() {
    starved_lookups("{blocking_threads: 2}", "127.0.0.72", "2 blocking threads for plugins");
}

/// `keepalive_idle*`: with the bound at 0 no connection is kept, so every
/// run of a keep-alive probe opens its own; by default the runs share one.
async fn connections_per_run(sandbox: &str) -> (usize, usize) {
    let server = sonde_tests::HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let p = "{name: p, plugin: http, config: {path: /ok, keepalive: true}, period: 1h, timeout: 10s}".to_string();
    let path = config(dir.path(), sandbox, &server.addr.to_string(), &[p]);
    let (agent, api) = start_agent_on(engine_with(HostLimits::default()), &path).await;
    let last = last_run(api, "p").await;
    assert_eq!(last["status"], "success", "{last}");
    let runs = 4;
    for _ in 1..runs {
        let (status, body) = call(api, "POST", "/v1/probes/p/run", None, b"").await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("success"), "{body}");
    }
    let accepted = crate::support::accepted_before_now(server.addr, || server.accepted()).await;
    agent.stop().await;
    (runs, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_idle_per_host_per_tenant_and_in_all() {
    let (runs, accepted) = connections_per_run("{}").await;
    assert_eq!(accepted, 1, "by default {runs} keep-alive runs share one connection");
    for key in ["keepalive_idle_per_host", "keepalive_idle_per_tenant", "keepalive_idle"] {
        let (runs, accepted) = connections_per_run(&format!("{{{key}: 0}}")).await;
        assert_eq!(accepted, runs, "{key}: 0 keeps no connection: one per run");
    }
}

/// `exec_pids` bounds each exec'd program's cgroup (`pids.max`), where the
/// `pids` controller is delegated to sonde: a shell starting more
/// background processes than the bound fails to fork. Where it is not
/// (cgroup v1, an undelegated cgroup), the bound cannot be enforced and
/// `sonde run` logs the containment in force; the test says so and checks
/// nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_pids() {
    use sonde_sandbox::host::contain::Containment;
    match Containment::in_force() {
        Containment::Cgroup { limits, .. } if limits.contains(&"pids") => {}
        other => {
            eprintln!("exec_pids: not enforceable here ({}); skipped", other.describe());
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let script = "for i in 1 2 3 4 5 6; do sleep 5 & done; wait; echo all-started";
    let p = format!(
        "{{name: p, plugin: exec, config: {{command: [/bin/sh, -c, {script:?}]}}, grants: {{exec: [/bin/sh]}}, period: 1h, timeout: 10s}}"
    );
    let path = config(dir.path(), "{exec_pids: 3}", "127.0.0.1:9", &[p]);
    let (agent, api) = start_agent_on(engine_with(HostLimits::default()), &path).await;
    let last = last_run(api, "p").await;
    agent.stop().await;
    assert_ne!(last["status"], "success", "six children under pids.max 3: {last}");
}

/// The issue's own case, as a user meets it: `sonde run` with
/// `sandbox: {sockets_per_call: 2}`. It used to log "bounds already in
/// force in this process are kept" and let the plugin open 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sonde_run_enforces_the_files_sandbox_block() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        dir.path(),
        "{sockets_per_call: 2}",
        "127.0.0.1:9",
        &[probe("p", guests::HOARD_SOCKETS, "{}")],
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(crate::support::cache_dir())
        .args(["run", "--api", "127.0.0.1:0", "--no-jitter", "--config"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // The rest of its stderr is kept open (and read) while it runs.
    let (api, mut seen, mut lines) = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let mut lines = std::io::BufReader::new(stderr).lines();
        while let Some(Ok(line)) = lines.next() {
            seen.push(line.clone());
            if let Some(at) = line.find(" api=http://") {
                let api: SocketAddr = line[at + 12..].split(' ').next().unwrap().parse().unwrap();
                return (Some(api), seen, lines);
            }
        }
        (None, seen, lines)
    })
    .await
    .unwrap();
    let Some(api) = api else {
        let _ = child.kill();
        panic!("no start line:\n{}", seen.join("\n"));
    };
    let last = last_run(api, "p").await;
    let _ = child.kill();
    let _ = child.wait();
    seen.extend(lines.by_ref().map_while(Result::ok));
    assert!(!seen.iter().any(|l| l.contains("already in force")), "{seen:?}");
    assert_host_limit(&last, "more than 2 sockets");
}

/// A reload that changes `sandbox:` puts the new bounds in force for the
/// runs that start after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_a_changed_sandbox_block() {
    let dir = tempfile::tempdir().unwrap();
    let probes = [probe("p", guests::HOARD_SOCKETS, "{}")];
    let path = config(dir.path(), "{sockets_per_call: 3}", "127.0.0.1:9", &probes);
    let engine = engine_with(HostLimits::default());
    let (agent, api) = start_agent_on(engine.clone(), &path).await;
    assert_host_limit(&last_run(api, "p").await, "more than 3 sockets");
    config(dir.path(), "{sockets_per_call: 5}", "127.0.0.1:9", &probes);
    agent.reload().await.unwrap();
    assert_eq!(engine.host_limits().sockets_per_call, 5);
    let (status, body) = call(api, "POST", "/v1/probes/p/run", None, b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("more than 5 sockets"), "{body}");
    agent.stop().await;
}
