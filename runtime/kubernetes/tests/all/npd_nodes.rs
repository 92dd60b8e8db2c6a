//! node-problem-detector monitors on the Node, against the mocked API
//! server: the agent runs the fixture monitor (`tests/cases/npd`) and
//! writes its condition on its own Node as NPD would (`True`, `False` and
//! `Unknown`, the reason and the program's message), only that condition,
//! one patch per change, and its Events on the Node; a condition type a
//! SondeNodeCheck claims is left to the check.

use crate::support::fake_api::*;
use crate::support::fake_nodes::{node, node_check};
use crate::support::node_agent::{NODE, start_gates};
use serde_json::{Value, json};
use sonde_tests::HttpServer;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn fixture() -> PathBuf {
    crate::support::repo().join("tests/cases/npd").canonicalize().unwrap()
}

/// The agent's config: the fixture monitor, its flags in `flags`, and a
/// node tenant for SondeNodeChecks.
fn config(flags: &Path) -> String {
    format!(
        "tenants:\n  - id: node\n    ceiling: {{net: [\"127.0.0.0/8:*\"]}}\nnode_problem_detector:\n  - config: {}\n    workdir: {}\n    exec: [{}]\n    env: {{FLAG_DIR: {}}}\n",
        fixture().join("flag-monitor.json").display(),
        fixture().display(),
        fixture().join("plugin").display(),
        flags.display()
    )
}

fn settings() -> sonde_kubernetes::GateSettings {
    crate::support::node_agent::node_settings(NODE, Duration::from_secs(300), 200.0)
}

/// Condition `t` of [`NODE`].
fn cond(api: &FakeApi, t: &str) -> Option<Value> {
    api.node(NODE)["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

/// Waits until condition `t` of [`NODE`] passes `test`.
async fn until(api: &FakeApi, t: &str, what: &str, test: impl Fn(&Value) -> bool) -> Value {
    api.wait(what, |_| cond(api, t).is_some_and(|c| test(&c))).await;
    cond(api, t).unwrap()
}

/// Events about [`NODE`] with reason `reason` (new ones, and repeats folded
/// into a series).
fn events(api: &FakeApi, reason: &str) -> usize {
    api.requests()
        .into_iter()
        .filter(|r| r.path.contains("/events") && (r.method == "POST" || r.method == "PATCH"))
        .filter(|r| r.body["reason"] == reason || r.body["series"].is_object())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_npd_monitor_writes_its_condition_and_events_on_its_own_node() {
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    let (client, api) = FakeApi::start();
    api.put(node(NODE, json!({})), true);
    let (_agent, _controller) = start_gates(client, dir.path(), &config(&flags), settings(), false).await;

    let ok = until(&api, "FlagProblem", "FlagProblem False", |c| c["status"] == "False").await;
    assert_eq!(
        (ok["reason"].as_str(), ok["message"].as_str()),
        (Some("FlagIsClear"), Some("no flag file"))
    );
    assert!(
        ok["lastHeartbeatTime"].is_string() && ok["lastTransitionTime"].is_string(),
        "{ok}"
    );

    std::fs::write(flags.join("flag"), "the disk is full").unwrap();
    let bad = until(&api, "FlagProblem", "FlagProblem True", |c| c["status"] == "True").await;
    assert_eq!(
        (bad["reason"].as_str(), bad["message"].as_str()),
        (Some("FlagIsRaised"), Some("the disk is full"))
    );
    api.wait("a Warning Event on the Node", |_| events(&api, "FlagIsRaised") >= 1)
        .await;

    std::fs::write(flags.join("flag"), "unknown").unwrap();
    let unknown = until(&api, "FlagProblem", "FlagProblem Unknown", |c| c["status"] == "Unknown").await;
    assert_eq!(
        (unknown["reason"].as_str(), unknown["message"].as_str()),
        (Some("FlagIsClear"), Some("cannot tell"))
    );

    std::fs::write(flags.join("wave"), "waved").unwrap();
    api.wait("the temporary rule's Event", |_| events(&api, "FlagWaved") >= 1)
        .await;
    std::fs::remove_file(flags.join("wave")).unwrap();

    std::fs::remove_file(flags.join("flag")).unwrap();
    until(&api, "FlagProblem", "FlagProblem False again", |c| {
        c["status"] == "False"
    })
    .await;

    let ready = cond(&api, "Ready").unwrap();
    assert_eq!(
        ready["lastHeartbeatTime"], "2026-01-01T00:00:00Z",
        "the kubelet's condition is untouched"
    );
    let patches = api.node_patches();
    for p in &patches {
        let conditions = p.body["status"]["conditions"].as_array().unwrap();
        assert!(
            conditions.iter().all(|c| c["type"] == "FlagProblem"),
            "only the monitor's condition: {p:#?}"
        );
    }
    assert_eq!(
        patches.len(),
        4,
        "one patch per change (False, True, Unknown, False): {patches:#?}"
    );
}

/// A monitor's Event made while this agent's Node is not in the store
/// (not created yet, or not listed yet) is kept on the board and goes on
/// the Node once it comes, with the monitor's condition; it is not taken
/// and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_made_before_the_node_exists_goes_on_it_when_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    let (client, api) = FakeApi::start();
    let (agent, _controller) = start_gates(client, dir.path(), &config(&flags), settings(), false).await;
    // Two reports of the monitor after the wave is raised: the temporary
    // rule has seen it and made its Event, with no Node to put it on.
    let mut reports = agent.node_problems().follow();
    std::fs::write(flags.join("wave"), "waved").unwrap();
    let raised = *reports.borrow_and_update();
    tokio::time::timeout(Duration::from_secs(60), reports.wait_for(|n| *n >= raised + 2))
        .await
        .expect("the monitor reports")
        .unwrap();
    std::fs::remove_file(flags.join("wave")).unwrap();
    assert_eq!(events(&api, "FlagWaved"), 0, "no Node yet: nowhere to put it");

    api.put(node(NODE, json!({})), false);
    api.wait("the Event made before the Node came, on it", |_| {
        events(&api, "FlagWaved") >= 1
    })
    .await;
    until(&api, "FlagProblem", "FlagProblem False on the Node that came", |c| {
        c["status"] == "False"
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_a_sonde_node_check_claims_is_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    std::fs::write(flags.join("flag"), "raised").unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(node(NODE, json!({})), true);
    api.put(
        node_check("owner", &format!("$(NODE_IP):{}", server.addr.port()), "FlagProblem", 1),
        true,
    );
    let (agent, _controller) = start_gates(client, dir.path(), &config(&flags), settings(), false).await;
    let owned = until(&api, "FlagProblem", "the check's condition", |c| c["status"] == "False").await;
    assert_eq!(owned["reason"], "PortOpen", "the check's reasons: {owned}");
    // The monitor ran (its condition is True on the board) and wrote nothing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !agent
        .node_problems()
        .conditions()
        .iter()
        .any(|(_, c)| c.reason == "FlagIsRaised")
    {
        assert!(tokio::time::Instant::now() < deadline, "the monitor never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for p in api.node_patches() {
        let text = p.body.to_string();
        assert!(
            !text.contains("FlagIsRaised") && !text.contains("FlagIsClear"),
            "{text}"
        );
    }
}
