//! node-problem-detector's system-log monitors under the agent: NPD's own
//! `kernel-monitor.json` (and with `SONDE_NPD_DIR`, every system-log
//! monitor NPD's module ships) loads unchanged; a file monitor's lines set
//! its condition and count its problems, and what is cut or dropped by
//! the bounds is counted on `/metrics`; what NPD would refuse, and what
//! breaks sonde's bounds, `sonde validate` refuses with the file and key.

use crate::support::{call, repo, sonde, start_agent};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A config of one `node_problem_detector:` entry for `file`, with `extra`
/// keys.
fn config(dir: &Path, file: &Path, extra: &str) -> PathBuf {
    let path = dir.join("sonde.yaml");
    std::fs::write(
        &path,
        format!("node_problem_detector:\n  - config: {}\n{extra}", file.display()),
    )
    .unwrap();
    path
}

fn validate(path: &Path) -> std::process::Output {
    sonde(&["validate", &path.display().to_string()])
}

#[test]
fn npds_shipped_system_log_monitors_load_unchanged() {
    let mut files = vec![repo().join("tests/cases/npd/npd-v1.36.0/kernel-monitor.json")];
    match std::env::var_os("SONDE_NPD_DIR").map(PathBuf::from) {
        Some(npd) => {
            for entry in std::fs::read_dir(npd.join("config")).unwrap() {
                let path = entry.unwrap().path();
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                let plugin = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v["plugin"].as_str().map(String::from));
                if matches!(plugin.as_deref(), Some("kmsg" | "filelog" | "journald")) {
                    files.push(path);
                }
            }
            assert!(
                files.len() >= 8,
                "NPD ships kernel, docker, systemd, disk... monitors: {files:?}"
            );
        }
        None => eprintln!(
            "only the fixture: set SONDE_NPD_DIR (scripts/kube.sh's ensure_npd) to load every system-log monitor NPD ships"
        ),
    }
    let dir = tempfile::tempdir().unwrap();
    for file in &files {
        let out = validate(&config(dir.path(), file, ""));
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!("{} of NPD's system-log monitors load unchanged", files.len());
}

#[test]
fn a_bad_system_log_monitor_is_refused_with_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("monitor.json");
    let rule = r#"{"type": "temporary", "reason": "R", "pattern": "x"}"#;
    let monitor = |head: &str, rule: &str| {
        format!(r#"{{"plugin": "kmsg", "source": "m", {head} "conditions": [], "rules": [{rule}]}}"#)
    };
    for (json, extra, said) in [
        (monitor("", r#"{"type": "temporary", "reason": "R", "pattern": "a(b"}"#), "", r#"rules[0].pattern: "a(b": "#),
        (monitor(r#""bufferSize": 5000,"#, rule), "", "bufferSize: 5000: must be 0 (NPD's default, 10) to 1000"),
        (monitor(r#""bufferSize": -1,"#, rule), "", "bufferSize: -1: must be 0"),
        (monitor(r#""lookback": "5 minutes","#, rule), "", r#"lookback: "5 minutes" is not a duration"#),
        (monitor(r#""pluginConfig": {"source": "x"},"#, rule), "", "pluginConfig.source: not a key of the kmsg plugin"),
        (monitor("", r#"{"type": "permanent", "condition": "Gone", "reason": "R", "pattern": "x"}"#), "", r#"rules[0].condition: "Gone" is not one of the file's conditions"#),
        (monitor(r#""logpath": "/dev/kmsg","#, rule), "", "unknown field `logpath`"),
        (
            monitor("", rule).replace(r#""plugin": "kmsg""#, r#""plugin": "filelog", "logPath": "/var/log/kern.log", "pluginConfig": {"timestamp": "^.{15}", "message": "(.*)", "timestampFormat": "yyyy"}"#),
            "",
            r#"pluginConfig.timestampFormat: "yyyy": no element of Go's reference time"#,
        ),
        (
            monitor("", rule).replace(r#""plugin": "kmsg""#, r#""plugin": "journald""#),
            "",
            "pluginConfig.source: missing: the SYSLOG_IDENTIFIER whose entries are read",
        ),
        (monitor("", rule), "    max_line_bytes: 10\n", "max_line_bytes: 10 is outside 64-65536"),
        (monitor("", rule), "    max_lines_per_second: 0\n", "max_lines_per_second: 0 is outside 1-100000"),
        (monitor("", rule), "    exec: [/bin]\n", "exec: a system-log monitor runs no program"),
    ] {
        std::fs::write(&file, &json).unwrap();
        let out = validate(&config(dir.path(), &file, extra));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted:\n{json}\n{extra}");
        assert!(err.contains(said), "{json}\n{extra}: wanted {said:?} in:\n{err}");
        let named = if extra.is_empty() { file.display().to_string() } else { "sonde.yaml".to_string() };
        assert!(err.contains(&named), "the file is named: {err}");
    }
    // A custom plugin monitor takes no line bounds.
    let custom = repo().join("tests/cases/npd/flag-monitor.json");
    let out = validate(&config(
        dir.path(),
        &custom,
        &format!(
            "    workdir: {}\n    max_line_bytes: 100\n",
            custom.parent().unwrap().display()
        ),
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("max_line_bytes: only a system-log monitor"), "{err}");
}

/// The value of the series starting with `series` on `/metrics`, once
/// `test` passes (20 s at most).
async fn metric(api: std::net::SocketAddr, series: &str, test: impl Fn(u64) -> bool) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = call(api, "GET", "/metrics", None, b"").await;
        let value = body
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok());
        if let Some(v) = value.filter(|v| test(*v)) {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series}: {value:?} in:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_file_monitor_sets_its_condition_and_counts_what_its_bounds_cut_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    std::fs::write(&log, "").unwrap();
    let file = dir.path().join("monitor.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"plugin": "filelog",
  "pluginConfig": {{"timestamp": "^time=\"(\\S*)\"", "message": "msg=\"([^\"]*)", "timestampFormat": "2006-01-02T15:04:05.999999999Z07:00"}},
  "logPath": "{}", "lookback": "5m", "source": "app-monitor",
  "conditions": [{{"type": "AppBroken", "reason": "AppIsFine", "message": "app is fine"}}],
  "rules": [
    {{"type": "permanent", "condition": "AppBroken", "reason": "AppCorrupt", "pattern": "corrupt .*"}},
    {{"type": "temporary", "reason": "AppSlow", "pattern": "slow .*"}}
  ]}}"#,
            log.display()
        ),
    )
    .unwrap();
    let path = config(
        dir.path(),
        &file,
        "    max_line_bytes: 64\n    max_lines_per_second: 3\n",
    );
    let (agent, api) = start_agent(&path).await;
    let gauge =
        |reason: &str| format!("sonde_node_problem{{source=\"app-monitor\",type=\"AppBroken\",reason=\"{reason}\"}}");
    metric(api, &gauge("AppIsFine"), |v| v == 0).await;
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    // A long line, cut to 64 bytes (its message is what is left of it),
    // then a burst past the 3 a second: the rest dropped.
    let long = format!("time=\"{}\" msg=\"slow {}\"\n", now(), "x".repeat(200));
    let corrupt = format!("time=\"{}\" msg=\"corrupt index\"\n", now());
    let mut text = long + &corrupt;
    for _ in 0..20 {
        text += &format!("time=\"{}\" msg=\"noise\"\n", now());
    }
    std::fs::write(&log, text).unwrap();
    metric(api, &gauge("AppCorrupt"), |v| v == 1).await;
    let lines = |outcome: &str| format!("sonde_node_log_lines_total{{source=\"app-monitor\",outcome=\"{outcome}\"}}");
    let dropped = metric(api, &lines("dropped"), |v| v >= 1).await;
    let cut = metric(api, &lines("cut"), |v| v == 1).await;
    let read = metric(api, &lines("read"), |v| v >= 1).await;
    assert_eq!(read + cut + dropped, 22, "every line counted once");
    assert!(read + cut <= 4, "a burst of about 3 lines a second: {read} + {cut}");
    let (_, body) = call(api, "GET", "/v1/status", None, b"").await;
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let condition = status["node_conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "AppBroken"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&condition["status"], &condition["reason"], &condition["message"]),
        (&"True".into(), &"AppCorrupt".into(), &"corrupt index".into()),
        "{status}"
    );
    // The cut line matched as what was left: a slow problem counted.
    metric(
        api,
        "sonde_node_problems_total{source=\"app-monitor\",reason=\"AppSlow\"}",
        |v| v == 1,
    )
    .await;
    agent.stop().await;
}
