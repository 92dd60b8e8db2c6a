//! The `sonde` binary, as a user runs it: exit codes, output, bad input.

use crate::support::{accepted_before_now, json, sonde, sonde_async};
use sonde_tests::{CountingListener, closed_port, guests};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_open_port_exits_0_closed_port_exits_2() {
    let listener = CountingListener::start().await;
    let out = sonde_async(vec![
        "check".into(),
        "tcp".into(),
        "--target".into(),
        listener.addr.to_string(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("SUCCESS"), "{out:?}");

    let closed = closed_port().to_string();
    let out = sonde(&["check", "tcp", "--target", &closed, "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json(&out);
    assert_eq!(v["status"], "failure");
    assert!(v["reason"].is_null());
    assert!(v["message"].as_str().unwrap().contains("connection refused"));
    assert!(v["duration_ms"].as_f64().unwrap() > 0.0);
    assert!(v["fuel_consumed"].as_u64().unwrap() > 0);
    assert!(v["metrics"].is_array());
}

#[test]
fn a_spinning_plugin_times_out_promptly() {
    let started = Instant::now();
    let out = sonde(&["check", guests::SPIN_FOREVER, "--timeout", "200ms", "-o", "json"]);
    let wall = started.elapsed();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json(&out);
    assert_eq!(v["reason"], "timeout");
    assert!(v["duration_ms"].as_f64().unwrap() < 1000.0, "{v}");
    // Generous: the process also starts an engine and loads the plugin.
    assert!(wall < Duration::from_secs(10), "{wall:?}");
}

#[test]
fn burning_fuel_exits_3_with_reason_fuel() {
    let out = sonde(&[
        "check",
        guests::BURN_FUEL,
        "--fuel",
        "1000000",
        "--timeout",
        "30s",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(json(&out)["reason"], "fuel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn std_net_to_another_port_is_denied_and_unseen() {
    let target = CountingListener::start().await;
    let other = CountingListener::start().await;
    let out = sonde_async(vec![
        "check".into(),
        guests::CONNECT_ELSEWHERE.into(),
        "--target".into(),
        target.addr.to_string(),
        "--config".into(),
        format!(r#"{{"addr":"{}"}}"#, other.addr),
        "-o".into(),
        "json".into(),
    ])
    .await;
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out)["reason"], "denied");
    assert_eq!(accepted_before_now(other.addr, || other.accepted()).await, 0);
}

#[test]
fn allow_net_grants_another_address() {
    let out = sonde(&["check", "tcp", "--allow-net", "not a pattern"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("net grant \"not a pattern\""), "{err}");
}

#[test]
fn bad_input_gets_one_line_and_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not wasm").unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let cases: [(&str, &str); 5] = [
        ("/nonexistent/x.wasm", "No such file"),
        (text.to_str().unwrap(), "not a WebAssembly file"),
        (core.to_str().unwrap(), "core WebAssembly module, not a component"),
        (guests::NOT_A_PLUGIN, "not a sonde plugin"),
        ("nosuchbuiltin", "unknown built-in plugin \"nosuchbuiltin\""),
    ];
    for (plugin, expected) in cases {
        let out = sonde(&["check", plugin]);
        assert_eq!(out.status.code(), Some(3), "{plugin}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{plugin}: {err}");
        assert!(err.contains(expected), "{plugin}: {err}");
    }
    let out = sonde(&["check", "tcp", "--config", "{oops"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config is not valid JSON"));
}

#[test]
fn inspect_shows_describe_imports_and_digest() {
    let out = sonde(&["plugin", "inspect", "tcp", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json(&out);
    assert_eq!(v["info"]["name"], "sonde-plugin-tcp");
    assert!(v["digest"].as_str().unwrap().starts_with("sha256:"));
    assert!(
        v["imports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i.as_str().unwrap().starts_with("sonde:probe/tcp")),
        "{v}"
    );
    let schema: serde_json::Value = serde_json::from_str(v["info"]["config_schema"].as_str().unwrap()).unwrap();
    assert_eq!(schema["type"], "object");

    let out = sonde(&["plugin", "inspect", guests::ALWAYS_UP]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("name:         always_up"));
}

#[test]
fn exec_check_dummy_in_nagios_mode_exits_1_and_ungranted_exits_3() {
    let config = r#"{"command": ["/usr/lib/nagios/plugins/check_dummy", "1", "hi"], "mode": "nagios"}"#;
    let out = sonde(&[
        "check",
        "exec",
        "--config",
        config,
        "--allow-exec",
        "/usr/lib/nagios/plugins/check_dummy",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = sonde(&["check", "exec", "--config", config, "-o", "json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(json(&out)["reason"], "denied");
    let out = sonde(&["check", "exec", "--config", config, "--allow-exec", "bin/sh"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-exec bin/sh: must be an absolute path"));
}

#[test]
fn tcp_send_expect_against_redis_exits_0() {
    let redis = sonde_tests::RedisServer::start();
    let target = redis.addr.to_string();
    let out = sonde(&[
        "check",
        "tcp",
        "--target",
        &target,
        "--config",
        r#"{"send": "PING\r\n", "expect": "\\+PONG"}"#,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_exit_codes_follow_the_server() {
    let server = sonde_tests::HttpServer::start().await;
    let other = sonde_tests::HttpServer::start().await;
    let target = server.addr.to_string();
    let cases = [
        ("/ok".to_string(), 0),
        ("/redirect".to_string(), 0),
        (format!("/away?to={}", other.addr), 1),
        ("/fail".to_string(), 2),
    ];
    for (path, code) in cases {
        let config = serde_json::json!({ "path": path }).to_string();
        let args = vec![
            "check".into(),
            "http".into(),
            "--target".into(),
            target.clone(),
            "--config".into(),
            config,
        ];
        let out = sonde_async(args).await;
        assert_eq!(out.status.code(), Some(code), "{path}: {out:?}");
    }
    assert!(other.requests().is_empty(), "the other host was reached");
    let config = serde_json::json!({ "path": "/hang" }).to_string();
    let args = [
        "check",
        "http",
        "--target",
        &target,
        "--config",
        &config,
        "--timeout",
        "300ms",
        "-o",
        "json",
    ];
    let out = sonde_async(args.iter().map(|s| s.to_string()).collect()).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json(&out);
    assert_eq!(v["reason"], "timeout");
    assert!(v["duration_ms"].as_f64().unwrap() < 1000.0, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_serving_exits_0_not_serving_exits_2() {
    let server = sonde_tests::GrpcHealthServer::start().await;
    let args = |service: &str| {
        vec![
            "check".to_string(),
            "grpc".into(),
            "--target".into(),
            server.addr.to_string(),
            "--config".into(),
            serde_json::json!({ "service": service }).to_string(),
        ]
    };
    let out = sonde_async(args("")).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("SUCCESS"), "{out:?}");

    server.set("", sonde_tests::ServingStatus::NotServing).await;
    let out = sonde_async(args("")).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("NOT_SERVING"), "{out:?}");

    let out = sonde_async(args("nope")).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SERVICE_UNKNOWN"),
        "{out:?}"
    );
}

/// issue 16: a plugin path must name a regular file of bounded size.
/// `/dev/zero` would be read forever, a FIFO would block the reader until
/// a writer comes, and a huge file would be held whole in memory; each is
/// refused at once, naming the file, from the command line and the config.
#[test]
fn a_plugin_path_that_is_no_regular_file_or_too_large_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("plugin.wasm");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let huge = dir.path().join("huge.wasm");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(sonde_policy::identity::MAX_PLUGIN_BYTES + 1)
        .unwrap();
    let cases = [
        ("/dev/zero".to_string(), "not a regular file (a character device)"),
        (fifo.display().to_string(), "not a regular file (a FIFO)"),
        (
            huge.display().to_string(),
            "more than the 33554432 bytes a plugin file may have",
        ),
    ];
    for (path, why) in &cases {
        let started = Instant::now();
        let out = sonde(&["check", path, "--target", "127.0.0.1:1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{path}: {out:?}");
        assert!(
            stderr.contains(path.as_str()) && stderr.contains(why),
            "{path}: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{path}: took {:?}",
            started.elapsed()
        );

        let config = dir.path().join("sonde.yaml");
        std::fs::write(
            &config,
            format!("targets:\n  - name: t\n    address: 127.0.0.1:1\n    probes:\n      - {{kind: readiness, plugin: {path}}}\n"),
        )
        .unwrap();
        let out = sonde(&["validate", config.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{path}: {out:?}");
        assert!(stderr.contains(why), "{path}: {stderr}");
    }
}

/// `sonde … | head`: a reader that has closed the pipe ends the command
/// quietly (exit 0, nothing on stderr) instead of a panic with a
/// backtrace; `examples/oci-vendor/vendor-flow.sh` failed so in CI.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    // No reader at all: the first write fails with EPIPE.
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(crate::support::cache_dir())
        .args(["plugin", "inspect", "http"])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
