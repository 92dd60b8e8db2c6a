//! What a plugin writes is data: its log records, message and detail reach
//! the agent's log, the terminal and the API with no control character
//! that could forge a log line or drive a terminal.

use crate::support::{json, sonde};
use sonde_tests::guests;

/// The start of the line the guest forges.
const FORGED_START: &str = "2026-11-24T04:00:00.000000Z";

fn has_control(s: &str) -> bool {
    s.chars().any(|c| c.is_control() && c != '\n')
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
