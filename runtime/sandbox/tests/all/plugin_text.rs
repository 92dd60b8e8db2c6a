//! What a plugin writes is data: its log records, message and detail reach
//! the run's result escaped, with no control character that could forge a
//! log line or drive a terminal (the agent's log and the terminal are in
//! the sonde crate's tests).

use crate::support::{guest, run};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;
use sonde_tests::guests;
use std::time::Duration;

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
