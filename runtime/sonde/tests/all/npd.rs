//! node-problem-detector's custom plugin monitors under sonde: a monitor
//! file in NPD's format (`tests/cases/npd`, and with `SONDE_NPD_DIR`, NPD's
//! own `config/custom-plugin-monitor.json` from a checkout of its
//! repository) runs unchanged, its programs through the sandboxed `exec`
//! plugin, and what NPD would refuse (and what sonde adds: the exec grant,
//! the kubelet's conditions, one owner per condition) is refused at load
//! with the file and key path.

use crate::support::{call, repo, sonde, start_agent};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fixture() -> PathBuf {
    repo().join("tests/cases/npd").canonicalize().unwrap()
}

/// A config running the monitor `file`, relative paths from `workdir`,
/// its programs granted by `exec`, the flag files in `flags`.
fn config(dir: &Path, file: &Path, workdir: &Path, exec: &Path, flags: &Path) -> PathBuf {
    let path = dir.join("sonde.yaml");
    std::fs::write(
        &path,
        format!(
            "node_problem_detector:\n  - config: {}\n    workdir: {}\n    exec: [{}]\n    env: {{FLAG_DIR: {}}}\n",
            file.display(),
            workdir.display(),
            exec.display(),
            flags.display()
        ),
    )
    .unwrap();
    path
}

/// An agent running the fixture monitor, its flag files in a fresh
/// directory (`flags/flag` holding `flag` first, when given).
async fn fixture_agent(flag: Option<&str>) -> (tempfile::TempDir, PathBuf, sonde::agent::Agent, std::net::SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    if let Some(text) = flag {
        std::fs::write(flags.join("flag"), text).unwrap();
    }
    let path = config(
        dir.path(),
        &fixture().join("flag-monitor.json"),
        &fixture(),
        &fixture().join("plugin"),
        &flags,
    );
    let (agent, api) = start_agent(&path).await;
    (dir, flags, agent, api)
}

/// Polls `/metrics` until a line starts with `series` and ends with
/// ` value` (20 s at most).
async fn wait_for(api: std::net::SocketAddr, series: &str, value: &str) {
    wait_until(api, series, value, |v| v == value).await;
}

/// Polls `/metrics` until a line starts with `series` and its value passes
/// `test` (20 s at most); `want` says what was waited for.
async fn wait_until(api: std::net::SocketAddr, series: &str, want: &str, test: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = call(api, "GET", "/metrics", None, b"").await;
        let found = body
            .lines()
            .any(|l| l.starts_with(series) && l.rsplit(' ').next().is_some_and(&test));
        if found {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no `{series} {want}` in:\n{}",
            body.lines()
                .filter(|l| l.contains("node_problem"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `/v1/status` until the fixture's condition passes `test` (20 s
/// at most); returns it.
async fn wait_for_condition(api: std::net::SocketAddr, test: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = call(api, "GET", "/v1/status", None, b"").await;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        let condition = status["node_conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == "FlagProblem"))
            .cloned()
            .unwrap_or_default();
        if test(&condition) {
            return condition;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_npd_monitor_sets_its_condition_and_counts_its_events() {
    let (_dir, flags, agent, api) = fixture_agent(None).await;
    let gauge = |reason: &str| {
        format!("sonde_node_problem{{source=\"flag-plugin-monitor\",type=\"FlagProblem\",reason=\"{reason}\"}}")
    };
    // The default first, then the rule's verdict: no problem.
    wait_for(api, &gauge("FlagIsClear"), "0").await;
    std::fs::write(
        flags.join("flag"),
        "the disk under /var is 97% full, which is more than NPD's eighty\n",
    )
    .unwrap();
    wait_for(api, &gauge("FlagIsRaised"), "1").await;
    let condition = wait_for_condition(api, |c| c["status"] == "True").await;
    assert_eq!(
        condition["message"], "the disk under /var is 97% full, which i",
        "stdout, cut to max_output_length (40)"
    );
    assert_eq!(condition["source"], "flag-plugin-monitor");
    // A hung program is killed at the rule's timeout: unknown, with NPD's
    // words and the default reason.
    std::fs::write(flags.join("flag"), "hang").unwrap();
    std::fs::write(flags.join("wave"), "waved").unwrap();
    let condition = wait_for_condition(api, |c| c["status"] == "Unknown").await;
    assert_eq!(condition["reason"], "FlagIsClear", "{condition}");
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.starts_with("Timeout when running plugin \"/") && message.len() == 40,
        "NPD's words, cut to 40 bytes: {message:?}"
    );
    // The temporary rule ran beside it (concurrency 2): one Warning Event each run.
    wait_until(
        api,
        "sonde_node_problems_total{source=\"flag-plugin-monitor\",reason=\"FlagWaved\"}",
        ">= 1",
        |v| v.parse::<u64>().is_ok_and(|n| n >= 1),
    )
    .await;
    std::fs::remove_file(flags.join("wave")).unwrap();
    std::fs::remove_file(flags.join("flag")).unwrap();
    let condition = wait_for_condition(api, |c| c["status"] == "False").await;
    assert_eq!(condition["message"], "no flag file", "the default message: {condition}");
    std::fs::write(flags.join("flag"), "unknown").unwrap();
    let condition = wait_for_condition(api, |c| c["status"] == "Unknown").await;
    assert_eq!(condition["message"], "cannot tell", "the program's words: {condition}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_runs_through_the_exec_plugin_in_npd_mode() {
    // The file read as NPD reads it, and its rule's command line as
    // `sonde check` runs it: the message is cut to max_output_length.
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    std::fs::write(flags.join("flag"), "x".repeat(100)).unwrap();
    let monitor = sonde_core::config::NpdMonitor::read(&fixture().join("flag-monitor.json"), &fixture()).unwrap();
    assert_eq!(monitor.max_output_length, 40);
    assert_eq!(monitor.invoke_interval, Duration::from_millis(500));
    assert_eq!(monitor.rules[0].path, fixture().join("plugin/check_flag.sh"));
    assert_eq!(
        monitor.rules[1].timeout,
        Duration::from_secs(5),
        "the monitor's timeout"
    );
    let out = sonde(&[
        "check",
        "exec",
        "--allow-exec",
        &fixture().join("plugin/check_flag.sh").display().to_string(),
        "--exec-env",
        &format!("FLAG_DIR={}", flags.display()),
        "--config",
        &serde_json::json!({
            "command": [fixture().join("plugin/check_flag.sh"), "flag"],
            "mode": "npd",
            "max_output_length": 40
        })
        .to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(&format!("FAILURE: {} [", "x".repeat(40))), "{text}");
    assert!(!text.contains(&"x".repeat(41)), "{text}");
}

/// `sonde validate` on a config whose one monitor is `json` (written
/// beside a copy of the fixture's plugin): its stderr, which must be a
/// refusal.
fn refused(json: &str, exec: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("monitor.json");
    std::fs::write(&file, json).unwrap();
    let path = config(dir.path(), &file, &fixture(), Path::new(exec), dir.path());
    let out = sonde(&["validate", &path.display().to_string()]);
    assert!(!out.status.success(), "accepted:\n{json}");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains(&file.display().to_string()), "the file is named: {err}");
    err
}

fn monitor(rule: &str, conditions: &str) -> String {
    format!(
        r#"{{"plugin": "custom", "source": "m", "conditions": [{conditions}],
  "rules": [{rule}]}}"#
    )
}

const CONDITION: &str = r#"{"type": "FlagProblem", "reason": "FlagIsClear", "message": "fine"}"#;

#[test]
fn what_npd_refuses_sonde_refuses_with_the_file_and_key_path() {
    let plugin = fixture().join("plugin").display().to_string();
    let rule = |extra: &str| {
        format!(
            r#"{{"type": "permanent", "condition": "FlagProblem", "reason": "Up", "path": "./plugin/check_flag.sh"{extra}}}"#
        )
    };
    for (json, exec, said) in [
        (
            monitor(&rule(r#", "timout": "3s""#), CONDITION),
            plugin.as_str(),
            "monitor.json:2:120: rules[0].timout: unknown field `timout`",
        ),
        (
            monitor(&rule(""), CONDITION).replace(r#""plugin": "custom""#, r#""plugin": "syslog""#),
            &plugin,
            r#"plugin: "syslog": must be "custom" (a custom plugin monitor) or one of kmsg, filelog, journald"#,
        ),
        (
            monitor(
                &rule("").replace(r#""condition": "FlagProblem""#, r#""condition": "DiskProblem""#),
                CONDITION,
            ),
            &plugin,
            r#"rules[0].condition: "DiskProblem" is not one of the file's conditions (FlagProblem)"#,
        ),
        (
            monitor(&rule(r#", "timeout": "10s""#), CONDITION),
            &plugin,
            "rules[0].timeout: 10s is longer than pluginConfig.timeout (5s)",
        ),
        (
            monitor(&rule(r#", "timeout": "ten seconds""#), CONDITION),
            &plugin,
            r#"rules[0].timeout: "ten seconds" is not a duration"#,
        ),
        (
            monitor(&rule(r#", "invoke_interval": "1ns""#), CONDITION),
            &plugin,
            r#"rules[0].invoke_interval: "1ns" is outside 100ms-7days"#,
        ),
        (
            monitor(&rule(""), CONDITION).replace(
                r#""plugin": "custom","#,
                r#""plugin": "custom", "pluginConfig": {"invoke_interval": "9999999h"},"#,
            ),
            &plugin,
            r#"pluginConfig.invoke_interval: "9999999h" is outside 100ms-7days"#,
        ),
        (
            monitor(
                &rule("").replace("FlagProblem", "Ready"),
                &CONDITION.replace("FlagProblem", "Ready"),
            ),
            &plugin,
            r#"conditions[0].type: "Ready" is the kubelet's condition"#,
        ),
        (
            monitor(&rule("").replace("check_flag.sh", "missing.sh"), CONDITION),
            &plugin,
            "rules[0].path: ",
        ),
        (
            monitor(&rule(""), CONDITION),
            "/usr/lib/nagios/plugins",
            "rules[0].path ",
        ),
        (
            monitor(&rule(""), CONDITION).replace(r#""rules""#, r#""rules": [], "rulez""#),
            &plugin,
            "unknown field `rulez`",
        ),
        ("{\"plugin\": \"custom\",".into(), &plugin, "EOF while parsing"),
        // The bounds: 256 rules, 1 MiB (a padded file is refused before it is parsed).
        (
            monitor(&vec![rule(""); 257].join(","), CONDITION),
            &plugin,
            "rules: 257 rules: at most 256 per file",
        ),
        (
            format!("{}{}", " ".repeat(1024 * 1024), monitor(&rule(""), CONDITION)),
            &plugin,
            "larger than 1048576 bytes",
        ),
    ] {
        let err = refused(&json, exec);
        assert!(err.contains(said), "expected {said:?} in:\n{err}");
    }
    // The exec refusal names the program and the grant.
    let err = refused(&monitor(&rule(""), CONDITION), "/usr/lib/nagios/plugins");
    assert!(
        err.contains("check_flag.sh is not in the entry's exec grant (/usr/lib/nagios/plugins)"),
        "{err}"
    );
}

#[test]
fn one_condition_has_one_monitor() {
    let dir = tempfile::tempdir().unwrap();
    let file = fixture().join("flag-monitor.json");
    let path = dir.path().join("sonde.yaml");
    let entry = format!(
        "  - config: {}\n    workdir: {}\n    exec: [{}]\n",
        file.display(),
        fixture().display(),
        fixture().join("plugin").display()
    );
    std::fs::write(&path, format!("node_problem_detector:\n{entry}{entry}")).unwrap();
    let out = sonde(&["validate", &path.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "node_problem_detector[1]: condition \"FlagProblem\" is claimed by {} already",
            file.display()
        )),
        "{err}"
    );
    // The fixture alone is valid.
    std::fs::write(&path, format!("node_problem_detector:\n{entry}")).unwrap();
    let out = sonde(&["validate", &path.display().to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// node-problem-detector's own `config/custom-plugin-monitor.json` and its
/// `check_ntp.sh`, from a checkout named by `SONDE_NPD_DIR`, run unchanged:
/// the condition sonde reports is what the script, run as NPD runs it,
/// says. Skipped (and said so) without the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npds_own_ntp_monitor_runs_unchanged() {
    let Some(npd) = std::env::var_os("SONDE_NPD_DIR").map(PathBuf::from) else {
        eprintln!("skipped: set SONDE_NPD_DIR to a checkout of node-problem-detector");
        return;
    };
    let file = npd.join("config/custom-plugin-monitor.json");
    let script = npd.join("config/plugin/check_ntp.sh");
    // What NPD would see: the script's exit code and trimmed stdout.
    let direct = std::process::Command::new(&script).env_clear().output().unwrap();
    let (reason, status) = match direct.status.code() {
        Some(0) => ("NTPIsUp", "0"),
        Some(1) => ("NTPIsDown", "1"),
        _ => ("NTPIsUp", "0"),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &file, &npd, &npd.join("config/plugin"), dir.path());
    let (agent, api) = start_agent(&path).await;
    let series =
        format!("sonde_node_problem{{source=\"ntp-custom-plugin-monitor\",type=\"NTPProblem\",reason=\"{reason}\"}}");
    wait_for(api, &series, status).await;
    eprintln!(
        "check_ntp.sh said {:?} (exit {:?}); sonde: {series} {status}",
        String::from_utf8_lossy(&direct.stdout).trim(),
        direct.status.code()
    );
    agent.stop().await;
}

#[test]
fn a_rule_stays_inside_its_tenants_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    let write = |ceiling: &str| {
        std::fs::write(
            &path,
            format!(
                "tenants:\n  - id: nodes\n    ceiling: {{exec: [{ceiling}]}}\nnode_problem_detector:\n  - config: {}\n    workdir: {}\n    exec: [{}]\n    tenant: nodes\n",
                fixture().join("flag-monitor.json").display(),
                fixture().display(),
                fixture().join("plugin").display()
            ),
        )
        .unwrap();
        sonde(&["validate", &path.display().to_string()])
    };
    let out = write("/usr/lib/nagios/plugins");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "tenant \"nodes\": probe \"rule-0\": grants.exec {:?} is not in the tenant's exec ceiling",
            fixture().join("plugin/check_flag.sh")
        )),
        "{err}"
    );
    let out = write(&fixture().join("plugin").display().to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_monitor_and_its_conditions() {
    let (dir, flags, agent, api) = fixture_agent(Some("raised")).await;
    let before = wait_for_condition(api, |c| c["status"] == "True").await;
    agent.reload().await.unwrap();
    // Rounds run every 500ms: a monitor started again would report its
    // default (False) first, then True with a new transition.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = wait_for_condition(api, |_| true).await;
        assert_eq!(now, before, "the condition was reset by the reload");
    }
    // A changed entry (the programs' environment) starts the monitor again.
    let path = dir.path().join("sonde.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = text.replace("env: {FLAG_DIR:", "env: {LANG: C, FLAG_DIR:");
    std::fs::write(&path, text).unwrap();
    agent.reload().await.unwrap();
    let restarted = wait_for_condition(api, |c| {
        c["status"] == "True" && c["last_transition"] != before["last_transition"]
    })
    .await;
    assert_eq!(restarted["reason"], "FlagIsRaised");
    // A changed file starts the monitor again.
    let changed = dir.path().join("changed.json");
    let text = std::fs::read_to_string(fixture().join("flag-monitor.json")).unwrap();
    std::fs::write(&changed, text.replace("no flag file", "no flag file, changed")).unwrap();
    config(dir.path(), &changed, &fixture(), &fixture().join("plugin"), &flags);
    agent.reload().await.unwrap();
    let after = wait_for_condition(api, |c| {
        c["status"] == "True" && c["last_transition"] != before["last_transition"]
    })
    .await;
    assert_eq!(after["reason"], "FlagIsRaised");
    agent.stop().await;
}
