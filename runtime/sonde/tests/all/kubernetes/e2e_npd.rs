//! A node-problem-detector monitor on a real API server (no kubelet: the
//! test creates the Node object): run by
//! [`e2e_npd_monitor_against_a_real_api_server`] when
//! `SONDE_E2E_KUBECONFIG` names a kubeconfig. The agent runs the fixture
//! monitor (`tests/cases/npd`) and the test follows its condition and
//! heartbeat on the Node, and its Events, as `kubectl describe node` reads
//! them, and the heartbeat going stale once the agent stops. It needs the CRDs (the node-check e2e applies them); it deletes
//! the Node it made.

use super::e2e::client;
use super::e2e_nodes::condition;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sonde_kubernetes as kubernetes;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(60);
/// The shortest heartbeat the agent takes.
const HEARTBEAT: Duration = Duration::from_secs(10);

fn fixture() -> PathBuf {
    crate::support::repo().join("tests/cases/npd").canonicalize().unwrap()
}

async fn until(nodes: &Api<Node>, name: &str, what: &str, f: impl Fn(&NodeCondition) -> bool) -> NodeCondition {
    let cond = move |n: Option<&Node>| n.and_then(|n| condition(n, "FlagProblem")).is_some_and(|c| f(&c));
    let node = tokio::time::timeout(
        PATIENCE,
        kube::runtime::wait::await_condition(nodes.clone(), name, cond),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: timed out waiting for {what}"))
    .expect("watch the Node")
    .unwrap_or_else(|| panic!("{name}: deleted while waiting for {what}"));
    condition(&node, "FlagProblem").unwrap()
}

async fn start_agent(
    client: Client,
    node: &str,
    dir: &Path,
    flags: &Path,
) -> (sonde::agent::Agent, kubernetes::GateController) {
    let config = format!(
        "node_problem_detector:\n  - config: {}\n    workdir: {}\n    exec: [{}]\n    env: {{FLAG_DIR: {}}}\n",
        fixture().join("flag-monitor.json").display(),
        fixture().display(),
        fixture().join("plugin").display(),
        flags.display()
    );
    let settings = crate::kubernetes::node_settings(node, HEARTBEAT, 5.0);
    crate::kubernetes::start_gates(client, dir, &config, settings, false).await
}

/// Creates an empty Node named `name` (no kubelet behind it: the agents
/// under test write its conditions).
pub(super) async fn create_node(nodes: &Api<Node>, name: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create the Node");
}

async fn run(kubeconfig: &Path) {
    let client = client(kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("sonde-npd-{}", fastrand::u32(..));
    create_node(&nodes, &name).await;
    let dir = tempfile::tempdir().unwrap();
    let flags = dir.path().join("flags");
    std::fs::create_dir(&flags).unwrap();
    let (agent, controller) = start_agent(client.clone(), &name, dir.path(), &flags).await;

    let ok = until(&nodes, &name, "FlagProblem False", |c| c.status == "False").await;
    assert_eq!(ok.reason.as_deref(), Some("FlagIsClear"));
    std::fs::write(flags.join("flag"), "the disk is full").unwrap();
    let bad = until(&nodes, &name, "FlagProblem True", |c| c.status == "True").await;
    assert_eq!(
        (bad.reason.as_deref(), bad.message.as_deref()),
        (Some("FlagIsRaised"), Some("the disk is full"))
    );
    let beat = bad.last_heartbeat_time.clone().expect("a heartbeat");
    let beaten = until(&nodes, &name, "a newer heartbeat", |c| {
        c.last_heartbeat_time.as_ref() != Some(&beat)
    })
    .await;
    assert_eq!(
        beaten.last_transition_time, bad.last_transition_time,
        "a heartbeat is no transition"
    );
    std::fs::remove_file(flags.join("flag")).unwrap();
    until(&nodes, &name, "FlagProblem False again", |c| c.status == "False").await;

    let events: Api<Event> = Api::all(client.clone());
    let about = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("list the Node's Events");
    let reasons: Vec<String> = about.items.iter().filter_map(|e| e.reason.clone()).collect();
    assert!(reasons.iter().any(|r| r == "FlagIsRaised"), "{reasons:?}");

    // The agent stops: its heartbeat goes stale, as `kubectl describe node`
    // then shows (no kubelet or controller marks it; a reader compares
    // lastHeartbeatTime with the heartbeat period).
    controller.stop();
    agent.stop().await;
    let last = nodes.get(&name).await.unwrap();
    let beat = condition(&last, "FlagProblem").unwrap().last_heartbeat_time.unwrap();
    tokio::time::sleep(HEARTBEAT * 2 + Duration::from_secs(2)).await;
    let later = condition(&nodes.get(&name).await.unwrap(), "FlagProblem").unwrap();
    assert_eq!(
        later.last_heartbeat_time.as_ref(),
        Some(&beat),
        "no heartbeat after the agent stopped"
    );
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(beat.0).as_secs();
    assert!(age >= (HEARTBEAT * 2).as_secs() as i64, "stale by {age}s");
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
    eprintln!(
        "e2e npd monitor: the condition came, beat and went on Node {name}; Events {reasons:?}; the heartbeat was {age}s stale after the agent stopped"
    );
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_npd_monitor_against_a_real_api_server() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_npd_monitor_against_a_real_api_server",
        "the CRDs of deploy/kubernetes/crd.yaml installed",
    ) else {
        return;
    };
    run(&path).await;
}
