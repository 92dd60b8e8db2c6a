//! What a plugin writes is data: its log records, message and detail reach
//! the agent's log, the terminal and the API with no control character
//! that could forge a log line or drive a terminal.

use crate::support::{guest, json, run, sonde};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;
use sonde_tests::guests;
use std::time::Duration;

/// The start of the line the guest forges.
const FORGED_START: &str = "2026-11-24T04:00:00.000000Z";

fn has_control(s: &str) -> bool {
    s.chars().any(|c| c.is_control() && c != '\n')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_lines_and_escapes_reach_results_escaped() {
    let r = run(
        &guest(guests::FORGE_LOG_LINES).await,
        "",
        "{}",
        &Grants::default(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let detail = r.detail.clone().unwrap_or_default();
    for text in [&r.message, &detail] {
        assert!(!text.chars().any(char::is_control), "{text:?}");
        // Kept as text, escaped.
        assert!(text.contains("\\n2026-11-24T04:00:00.000000Z  INFO"), "{text:?}");
        assert!(text.contains("\\u{1b}[2J"), "{text:?}");
    }
    // The API shows what the cache holds: the same escaped text.
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["message"], r.message.as_str());
}

#[test]
fn sonde_check_prints_and_logs_no_forged_line_and_no_escape() {
    for output in ["text", "json"] {
        let out = sonde(&[
            "--log-level",
            "sonde::plugin=trace",
            "check",
            guests::FORGE_LOG_LINES,
            "-o",
            output,
        ]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let stdout = String::from_utf8(out.stdout.clone()).unwrap();
        let stderr = String::from_utf8(out.stderr.clone()).unwrap();
        // The records were logged, on one line each…
        let records: Vec<&str> = stderr.lines().filter(|l| l.contains("record")).collect();
        assert_eq!(records.len(), 2, "{stderr}");
        for text in [&stdout, &stderr] {
            // …and nothing the plugin wrote starts a line or moves the cursor.
            assert!(!has_control(text), "{text:?}");
            assert!(!text.lines().any(|l| l.starts_with(FORGED_START)), "{text}");
        }
        if output == "json" {
            let v = json(&out);
            assert!(v["message"].as_str().unwrap().starts_with("message\\n"), "{v}");
        } else {
            assert!(stdout.lines().next().unwrap().contains("message\\n"), "{stdout}");
        }
    }
}
