//! SondeNodeChecks against the mocked API server: a real agent runs each
//! check that selects its Node with the built-in plugins against real
//! loopback servers, and writes its one condition on its own Node's
//! status (the mocked server refuses any other field, and the kubelet's
//! condition types), with a heartbeat, one Event per transition and, when
//! asked, a taint.

use crate::support::fake_api::*;
use crate::support::fake_nodes::{node, node_check};
use crate::support::node_agent::Agent;
use crate::support::node_agent::{NODE, start_gates};
use crate::support::rbac::{agent_may, agent_rules};
use serde_json::{Value, json};
use sonde_kubernetes::{self as kubernetes, GateSettings};
use sonde_tests::HttpServer;
use std::path::Path;
use std::time::Duration;

/// The agent's config: tenant `node` may reach the loopback only.
const CONFIG: &str = "tenants:\n  - id: node\n    quotas: {max_probes: 20, max_concurrent_runs: 4}\n    ceiling: {net: [\"127.0.0.0/8:*\"]}\ntargets: []\n";

/// An agent on [`NODE`] (address 127.0.0.1) heartbeating every `heartbeat`.
async fn node_agent(client: kube::Client, dir: &Path, heartbeat: Duration) -> (Agent, kubernetes::GateController) {
    let settings = crate::support::node_agent::node_settings(NODE, heartbeat, 200.0);
    start_gates(client, dir, CONFIG, settings, false).await
}

/// Condition `t` of Node `name`.
fn node_cond(api: &FakeApi, name: &str, t: &str) -> Option<Value> {
    let node = api.node(name);
    node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

/// Waits until condition `t` of [`NODE`] has status `status`.
async fn until_status(api: &FakeApi, t: &str, status: &str) -> Value {
    let name = t.to_string();
    api.wait(&format!("{t} {status}"), |_| {
        node_cond(api, NODE, &name).is_some_and(|c| c["status"] == status)
    })
    .await;
    node_cond(api, NODE, t).unwrap()
}

/// The `Accepted` condition of SondeNodeCheck `name`, once written.
fn accepted(api: &FakeApi, name: &str) -> Option<Value> {
    api.node_check(name)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Accepted")
        .cloned()
}

fn taints(api: &FakeApi) -> Value {
    api.node(NODE)["spec"]["taints"].clone()
}

/// Events recorded about [`NODE`]: each new one, and each repeat of a
/// reason that kube-runtime's recorder folds into the first one's series
/// (a patch of its count).
fn node_events(api: &FakeApi) -> Vec<Recorded> {
    api.requests()
        .into_iter()
        .filter(|r| r.path.contains("/events"))
        .filter(|e| {
            (e.method == "POST" && e.body["regarding"]["kind"] == "Node")
                || (e.method == "PATCH" && e.body["series"].is_object())
        })
        .collect()
}

/// A check whose http target flips sets and clears its condition (True
/// while the problem is present), with one Event on the Node per
/// transition and the taint on only while True; the kubelet's conditions
/// are never touched, every request is one `rbac.yaml` allows, and a
/// deleted check takes its condition and taint with it.
#[tokio::test]
async fn a_node_check_sets_and_clears_its_condition_and_taint() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    let mut taint_on_node = node(NODE, json!({"pool": "edge"}));
    taint_on_node["spec"]["taints"] = json!([{"key": "example.com/other", "effect": "NoSchedule"}]);
    api.put(taint_on_node, true);
    let mut check = node_check("web", &format!("$(NODE_IP):{}", server.addr.port()), "WebUnhealthy", 1);
    check["spec"]["plugin"] = "http".into();
    check["spec"]["config"] = json!({"path": "/health"});
    check["spec"]["taint"] = json!({"key": "sonde.dev/web", "effect": "NoSchedule"});
    api.put(check, true);
    let (agent, _controller) = node_agent(client, dir.path(), Duration::from_secs(300)).await;

    let ok = until_status(&api, "WebUnhealthy", "False").await;
    assert_eq!(ok["reason"], "PortOpen");
    assert!(ok["lastTransitionTime"].is_string() && ok["lastHeartbeatTime"].is_string());
    let ready = node_cond(&api, NODE, "Ready").unwrap();
    assert_eq!(
        (ready["reason"].as_str(), ready["lastHeartbeatTime"].as_str()),
        (Some("KubeletReady"), Some("2026-01-01T00:00:00Z")),
        "the kubelet's condition is not sonde's to write"
    );

    server.set_healthy(false);
    let bad = until_status(&api, "WebUnhealthy", "True").await;
    assert_eq!(bad["reason"], "PortClosed");
    assert!(bad["message"].as_str().unwrap().contains("500"), "{bad}");
    api.wait("the taint", |_| taints(&api).as_array().is_some_and(|t| t.len() == 2))
        .await;
    assert_eq!(
        taints(&api),
        json!([{"key": "example.com/other", "effect": "NoSchedule"}, {"key": "sonde.dev/web", "effect": "NoSchedule"}])
    );

    server.set_healthy(true);
    until_status(&api, "WebUnhealthy", "False").await;
    api.wait("the taint taken off", |_| {
        taints(&api) == json!([{"key": "example.com/other", "effect": "NoSchedule"}])
    })
    .await;

    let patches = api.node_patches();
    let transitions = patches
        .iter()
        .filter(|p| p.body["status"]["conditions"][0]["lastTransitionTime"].is_string())
        .count();
    assert_eq!(transitions, 3, "set, raised, cleared: {patches:#?}");
    assert_eq!(
        patches.len(),
        3,
        "no write but the transitions within a heartbeat period"
    );
    api.wait("an Event per transition", |_| node_events(&api).len() == 3)
        .await;
    let events = node_events(&api);
    let reasons: Vec<Value> = events[..2].iter().map(|e| e.body["reason"].clone()).collect();
    assert_eq!(reasons, [json!("PortOpen"), json!("PortClosed")]);
    assert_eq!(events[1].body["type"], "Warning");
    assert_eq!(events[1].body["regarding"]["name"], NODE);
    assert_eq!(
        events[2].body["series"]["count"], 2,
        "PortOpen again, in the first one's series"
    );

    // The check goes: its condition and its taint go with it.
    api.delete_node_check("web");
    api.wait("the condition removed", |_| {
        node_cond(&api, NODE, "WebUnhealthy").is_none()
    })
    .await;
    assert!(agent.results().get("k8snode_web").is_none(), "the probe is gone");
    assert!(node_cond(&api, NODE, "Ready").is_some());

    let rules = agent_rules();
    for r in api.requests() {
        assert!(
            agent_may(&rules, &r),
            "rbac.yaml does not allow {} {}",
            r.method,
            r.path
        );
    }
}

/// Steady state, the heartbeat is the only write: a check whose condition
/// is already on the Node (an agent restarted) writes one patch per
/// heartbeat period and nothing else — no transition, no Event, no taint
/// write — over ten heartbeat periods of paused time (the clock is paused
/// once the check has run: adding a probe compiles its plugin in a child
/// process, which paused time would skip past). At 5,000 nodes and the
/// default 5m heartbeat that is 5,000 / 300 s ≈ 17 writes a second
/// (docs/kubernetes.md).
#[tokio::test]
async fn heartbeats_are_the_only_steady_state_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (client, api) = FakeApi::start();
    let closed = sonde_tests::closed_port();
    let mut n = node(NODE, json!({}));
    n["status"]["conditions"].as_array_mut().unwrap().push(json!(
        {"type": "PortDown", "status": "True", "reason": "PortClosed", "message": "connection refused",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
    ));
    // The taint is already on: nothing to write for it either.
    n["spec"]["taints"] = json!([{"key": "sonde.dev/port", "effect": "NoExecute"}]);
    api.put(n, true);
    let mut check = node_check("port", &format!("$(NODE_IP):{}", closed.port()), "PortDown", 3600);
    check["spec"]["taint"] = json!({"key": "sonde.dev/port", "effect": "NoExecute"});
    api.put(check, true);
    let heartbeat = Duration::from_secs(60);
    let (agent, _controller) = node_agent(client, dir.path(), heartbeat).await;
    crate::support::node_agent::runs(&agent, "k8snode_port", 1).await;

    tokio::time::pause();
    let periods = 10;
    tokio::time::sleep(heartbeat * periods + heartbeat / 2).await;
    api.wait("the heartbeats", |_| api.node_patches().len() >= periods as usize)
        .await;
    let patches = api.node_patches();
    assert_eq!(patches.len(), periods as usize, "one write per heartbeat period");
    for p in &patches {
        let c = &p.body["status"]["conditions"];
        assert_eq!(c.as_array().unwrap().len(), 1);
        assert_eq!(
            (c[0]["type"].as_str(), c[0]["status"].as_str()),
            (Some("PortDown"), Some("True"))
        );
        assert!(c[0].get("lastTransitionTime").is_none(), "no transition: {c}");
    }
    let writes: Vec<Recorded> = api.requests().into_iter().filter(|r| r.method != "GET").collect();
    assert_eq!(
        writes.len(),
        periods as usize,
        "nothing but the heartbeats: {writes:#?}"
    );
    assert_eq!(api.world().taint_patches, 0);
    let cond = node_cond(&api, NODE, "PortDown").unwrap();
    assert_ne!(
        cond["lastHeartbeatTime"], "2026-01-01T00:00:00Z",
        "the heartbeat advanced"
    );
    assert_eq!(
        cond["lastTransitionTime"], "2026-01-01T00:00:00Z",
        "kept across the restart"
    );
}

/// Refused, never applied: a plugin off the allowlist, a kubelet-owned
/// condition type, a target outside the node tenant's ceiling, and two
/// checks claiming one type (both, each message naming both). Each gets
/// `Accepted=False` with its reason and a `Refused` Event from the status
/// Lease's holder, and the Node gets nothing but the one good check's
/// condition.
#[tokio::test]
async fn bad_node_checks_are_refused_with_a_reason_and_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.open_leases();
    api.put(node(NODE, json!({})), true);
    let port = server.addr.port();
    let mut exec = node_check("uses-exec", "127.0.0.1:1", "ExecProblem", 1);
    exec["spec"]["plugin"] = "exec".into();
    let ready = node_check("claims-ready", &format!("127.0.0.1:{port}"), "Ready", 1);
    let outside = node_check("outside", "10.1.2.3:80", "FarAway", 1);
    let first = node_check("dup-a", &format!("127.0.0.1:{port}"), "Dup", 1);
    let second = node_check("dup-b", &format!("127.0.0.1:{port}"), "Dup", 1);
    let good = node_check("good", &format!("$(NODE_IP):{port}"), "GoodCheck", 1);
    for c in [exec, ready, outside, first, second, good] {
        api.put(c, true);
    }
    let (agent, _controller) = node_agent(client, dir.path(), Duration::from_secs(300)).await;

    let accepted = |name: &str| accepted(&api, name);
    let expected = [
        ("uses-exec", "PluginNotAllowed", "spec.plugin \"exec\""),
        ("claims-ready", "KubeletCondition", "spec.condition.type \"Ready\""),
        ("outside", "OutsideCeiling", "spec.target \"10.1.2.3:80\""),
        (
            "dup-a",
            "ConditionClaimed",
            "spec.condition.type \"Dup\" is claimed by more than one SondeNodeCheck: dup-a, dup-b",
        ),
        ("dup-b", "ConditionClaimed", "dup-a, dup-b"),
    ];
    for (name, reason, says) in expected {
        api.wait(&format!("{name} refused"), |_| {
            accepted(name).is_some_and(|c| c["status"] == "False")
        })
        .await;
        let c = accepted(name).unwrap();
        assert_eq!(c["reason"], reason, "{name}: {c}");
        assert!(c["message"].as_str().unwrap().contains(says), "{name}: {c}");
        assert_eq!(api.node_check(name)["status"]["observedGeneration"], 1);
    }
    api.wait("the good one accepted", |_| {
        accepted("good").is_some_and(|c| c["status"] == "True")
    })
    .await;
    until_status(&api, "GoodCheck", "False").await;
    api.wait("an Event on each refused check", |_| {
        let refused: Vec<String> = api
            .events()
            .iter()
            .filter(|e| e.body["reason"] == "Refused")
            .map(|e| e.body["regarding"]["name"].as_str().unwrap().to_string())
            .collect();
        expected.iter().all(|(n, _, _)| refused.iter().any(|r| r == n))
    })
    .await;
    for p in api.node_patches() {
        for c in p.body["status"]["conditions"].as_array().unwrap() {
            assert_eq!(c["type"], "GoodCheck", "only the good check's condition is written");
        }
    }
    for (name, _, _) in expected {
        assert!(agent.results().get(&format!("k8snode_{name}")).is_none(), "{name} runs");
    }
}

/// A check whose `nodeSelector` does not select the Node runs nothing and
/// writes nothing on it, while one that does is written; once the Node's
/// labels change so that it is selected, it runs too.
#[tokio::test]
async fn a_node_the_selector_does_not_select_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(node(NODE, json!({"pool": "cpu"})), true);
    let target = format!("$(NODE_IP):{}", server.addr.port());
    let mut gpu = node_check("gpu-only", &target, "GpuProblem", 1);
    gpu["spec"]["nodeSelector"] = json!({"matchLabels": {"pool": "gpu"}});
    let mut cpu = node_check("cpu-only", &target, "CpuProblem", 1);
    cpu["spec"]["nodeSelector"] =
        json!({"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu", "gpu"]}]});
    api.put(gpu, true);
    api.put(cpu, true);
    let (agent, _controller) = node_agent(client, dir.path(), Duration::from_secs(300)).await;

    // The check that selects the Node is written: the other was decided on
    // the same reconcile.
    until_status(&api, "CpuProblem", "False").await;
    assert!(node_cond(&api, NODE, "GpuProblem").is_none());
    assert!(agent.results().get("k8snode_gpu-only").is_none(), "no probe");
    assert!(
        api.node_patches()
            .iter()
            .all(|p| p.body["status"]["conditions"][0]["type"] == "CpuProblem")
    );

    let mut relabelled = api.node(NODE);
    relabelled["metadata"]["labels"] = json!({"pool": "gpu"});
    api.put(relabelled, false);
    until_status(&api, "GpuProblem", "False").await;
    assert!(node_cond(&api, NODE, "CpuProblem").is_some(), "still selected by In");
}

/// The shipped example (`deploy/kubernetes/examples/sondenodecheck.yaml`,
/// which docs/kubernetes.md shows) as it is, but for its port and path: a
/// calico-node style felix check against a local HTTP server.
#[tokio::test]
async fn the_shipped_node_check_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(node(NODE, json!({"kubernetes.io/os": "linux"})), true);
    let path = crate::support::repo().join("deploy/kubernetes/examples/sondenodecheck.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let documented = sonde_tests::doc_documents("docs/kubernetes.md", "## Node conditions", "yaml kubernetes");
    assert_eq!(
        serde_saphyr::from_str::<Value>(&documented[0]).unwrap(),
        serde_saphyr::from_str::<Value>(&text).unwrap(),
        "docs/kubernetes.md shows the shipped example"
    );
    for must in [":9099", "/liveness"] {
        assert!(text.contains(must), "the example no longer says {must}");
    }
    let text = text
        .replace(":9099", &format!(":{}", server.addr.port()))
        .replace("/liveness", "/health");
    let example: Value = serde_saphyr::from_str(&text).unwrap();
    let typed: kubernetes::node::SondeNodeCheck = serde_json::from_value(example.clone()).unwrap();
    assert!(typed.spec.taint.is_some(), "the example shows the taint");
    let mut example = example;
    example["metadata"]["generation"] = 1.into();
    api.put(example, true);
    let (_agent, _controller) = node_agent(client, dir.path(), Duration::from_secs(300)).await;
    let cond = until_status(&api, &typed.spec.condition.type_, "False").await;
    assert_eq!(cond["reason"], typed.spec.condition.ok_reason.as_str());
}

/// A condition write the API server fails (a 500) is tried again after
/// backoff and still carries its transition; the Event is not repeated.
#[tokio::test]
async fn a_failed_condition_write_is_retried_as_a_transition() {
    let dir = tempfile::tempdir().unwrap();
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(node(NODE, json!({})), true);
    api.put(
        node_check("web", &format!("$(NODE_IP):{}", server.addr.port()), "WebDown", 1),
        true,
    );
    api.world()
        .patch_script
        .push_back((500, "etcdserver: request timed out".into()));
    let (_agent, _controller) = node_agent(client, dir.path(), Duration::from_secs(300)).await;
    let cond = until_status(&api, "WebDown", "False").await;
    assert!(cond["lastTransitionTime"].is_string());
    let patches = api.node_patches();
    assert_eq!(patches.len(), 2, "the failed write and its retry");
    for p in &patches {
        assert!(
            p.body["status"]["conditions"][0]["lastTransitionTime"].is_string(),
            "{}",
            p.body
        );
    }
    api.wait("the Event", |_| !node_events(&api).is_empty()).await;
    assert_eq!(node_events(&api).len(), 1, "one transition, one Event");
}

/// An agent whose config has no node tenant applies no node check, and
/// says why on the check (`NoTenant`).
#[tokio::test]
async fn without_the_node_tenant_no_node_check_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (client, api) = FakeApi::start();
    api.open_leases();
    api.put(node(NODE, json!({})), true);
    api.put(node_check("port", "$(NODE_IP):1", "PortDown", 1), true);
    let mut settings = GateSettings::new(None, Some(NODE.into())).unwrap();
    settings.node.ip = Some("127.0.0.1".into());
    let (agent, _controller) = start_gates(client, dir.path(), "targets: []\n", settings, false).await;
    api.wait("NoTenant", |_| {
        api.node_check("port")["status"]["conditions"][0]["reason"] == "NoTenant"
    })
    .await;
    let message = api.node_check("port")["status"]["conditions"][0]["message"].clone();
    assert!(
        message.as_str().unwrap().contains("kubernetes.node_tenant \"node\""),
        "{message}"
    );
    assert!(agent.results().get("k8snode_port").is_none());
    assert!(api.node_patches().is_empty());
}

/// The shipped ConfigMap's node tenant, read from the file, admits the
/// shipped example SondeNodeCheck (`$(NODE_IP):9099`) on a node of any
/// address, IPv6 included: its ceiling is the node's own address. A
/// target elsewhere stays `OutsideCeiling`.
#[tokio::test]
async fn the_shipped_configmap_admits_the_shipped_node_check_on_any_node_address() {
    let read = |path: &str| -> Value {
        let text = std::fs::read_to_string(crate::support::repo().join(path)).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    };
    let configmap = read("deploy/kubernetes/configmap.yaml");
    let shipped: Value = serde_saphyr::from_str(configmap["data"]["sonde.yaml"].as_str().unwrap()).unwrap();
    let tenants = shipped["tenants"].as_array().unwrap();
    let node_tenant = tenants
        .iter()
        .find(|t| t["id"] == "node")
        .expect("the shipped node tenant");
    let mut example = read("deploy/kubernetes/examples/sondenodecheck.yaml");
    example["metadata"]["generation"] = 1.into();
    let name = example["metadata"]["name"].as_str().unwrap().to_string();
    for ip in ["10.1.2.3", "192.168.7.9", "172.31.0.4", "2001:db8::7"] {
        let dir = tempfile::tempdir().unwrap();
        let (client, api) = FakeApi::start();
        api.open_leases();
        api.put(node(NODE, json!({"kubernetes.io/os": "linux"})), true);
        api.put(example.clone(), true);
        api.put(node_check("elsewhere", "10.9.9.9:9099", "Elsewhere", 1), true);
        // JSON is YAML: the shipped tenant as it is, on a node at `ip`.
        let config = json!({"kubernetes": {"node_ip": ip}, "tenants": [node_tenant], "targets": []}).to_string();
        let mut settings = crate::support::node_agent::node_settings(NODE, Duration::from_secs(300), 200.0);
        settings.node.ip = Some(ip.into());
        let (_agent, _controller) = start_gates(client, dir.path(), &config, settings, false).await;
        let accepted = |check: &str| accepted(&api, check);
        api.wait(&format!("{name} accepted on a node at {ip}"), |_| {
            accepted(&name).is_some_and(|c| c["status"] == "True")
        })
        .await;
        api.wait(&format!("elsewhere refused on a node at {ip}"), |_| {
            accepted("elsewhere").is_some_and(|c| c["status"] == "False")
        })
        .await;
        assert_eq!(accepted("elsewhere").unwrap()["reason"], "OutsideCeiling", "{ip}");
    }
}
