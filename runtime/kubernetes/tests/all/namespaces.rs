//! Namespaces without hand-written tenants (docs/kubernetes.md): the
//! example config of that section, read from the shipped page, run by an
//! agent whose controller talks to the mocked API server of
//! `kubernetes.rs`, with Namespaces labelled `sonde.dev/tenant-template`.
//! The probes are real: the built-in http plugin against a loopback server.
//!
//! The page's template covers the Pod CIDR `10.244.0.0/16`; the test's
//! Pods are on the loopback, so that one range (and nothing else) is
//! replaced by `127.0.0.0/8` before the agent reads the config.

use crate::support::fake_api::{FakeApi, check, cond, pod};
use crate::support::node_agent::Agent;
use crate::support::node_agent::start_gates;
use serde_json::{Value, json};
use sonde_kubernetes::GateSettings;
use sonde_tests::HttpServer;
use std::time::Duration;

const NODE: &str = "node-1";
const PATIENCE: Duration = Duration::from_secs(60);
/// The Pod CIDR of the documented template, and what the test puts there.
const POD_CIDR: (&str, &str) = ("10.244.0.0/16:*", "127.0.0.0/8:*");

/// The config block of docs/kubernetes.md's section on namespace
/// templates, as shipped.
fn documented_config() -> String {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/kubernetes.md")).unwrap();
    let section = doc
        .split("## Namespaces without hand-written tenants")
        .nth(1)
        .expect("the section");
    section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its config")
        .to_string()
}

fn namespace(name: &str, template: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/metadata.name": name});
    if let Some(t) = template {
        labels["sonde.dev/tenant-template"] = t.into();
    }
    json!({"metadata": {"name": name, "uid": format!("ns-{name}"), "labels": labels}})
}

/// The agent on `config` with the controller on `client`; the settings
/// are the file's, on this test's node and with room for many writes.
async fn agent(client: kube::Client, dir: &std::path::Path, config: &str) -> (Agent, sonde_kubernetes::GateController) {
    let file = sonde_core::config::parse(std::path::Path::new("sonde.yaml"), config).unwrap();
    let mut settings = GateSettings::new(file.kubernetes.as_ref(), Some(NODE.into())).unwrap();
    settings.node_name = NODE.into();
    settings.qps = 200.0;
    settings.burst = 200;
    start_gates(client, dir, config, settings, false).await
}

/// The Events with reason `Refused` on SondeCheck `check` of `namespace`.
fn refusals(api: &FakeApi, namespace: &str, check: &str) -> Vec<String> {
    api.events()
        .iter()
        .filter(|e| {
            e.body["reason"] == "Refused"
                && e.body["regarding"]["namespace"] == namespace
                && e.body["regarding"]["name"] == check
        })
        .map(|e| e.body["note"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The last condition written for gate `gate` of Pod `namespace/name`.
fn last_written(api: &FakeApi, namespace: &str, name: &str, gate: &str) -> Option<Value> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
    api.patches()
        .iter()
        .rev()
        .filter(|p| p.path == path)
        .filter_map(|p| {
            p.body["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == format!("sonde.dev/{gate}"))
                .cloned()
        })
        .next()
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn outcomes(agent: &Agent) -> Vec<(String, String, String)> {
    let status = agent.status();
    let v = serde_json::to_value(&status).unwrap();
    v["namespace_tenants"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    (
                        n["namespace"].as_str().unwrap().to_string(),
                        n["template"].as_str().unwrap().to_string(),
                        n["outcome"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A namespace labelled with the documented template gets a tenant of its
/// name with the template's quotas (in the executor's lanes too) and
/// ceiling: a gate inside them turns True, a check over the quota and a
/// Pod outside the ceiling are refused with Events. The explicit tenant of
/// the same name wins (its ceiling refuses what the template would let
/// through); a label naming no template gives no tenant. A reload keeps
/// the templated tenants; removing the label removes the tenant, and its
/// gate turns Unknown with an Event saying it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labelled_namespace_runs_its_gates_under_the_template_until_unlabelled() {
    let doc = documented_config();
    assert!(
        doc.contains(POD_CIDR.0),
        "the page's template covers the Pod CIDR: {doc}"
    );
    let config = doc.replace(POD_CIDR.0, POD_CIDR.1);
    assert!(
        config.contains("id: payments"),
        "the page's explicit tenant for namespace payments: {doc}"
    );
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    for (ns, template) in [
        ("team-a", Some("standard")),
        ("team-b", Some("standard")),
        ("payments", Some("standard")),
        ("team-x", Some("no-such-template")),
        ("plain", None),
    ] {
        api.put_namespace(namespace(ns, template));
        api.put(check(ns, "ready", 1, 1), false);
    }
    // Over the template's quota (timeout 5s).
    let mut slow = check("team-a", "slow", 10, 1);
    slow["spec"]["timeoutSeconds"] = 6.into();
    api.put(slow, false);
    let port = server.addr.port();
    api.put(
        pod("team-a", "web", "uid-a", NODE, port, &["ready", "slow"], json!([])),
        false,
    );
    // A Pod outside the template's ceiling (not on the Pod CIDR).
    let mut far = pod("team-b", "far", "uid-b", NODE, port, &["ready"], json!([]));
    far["status"]["podIP"] = "192.0.2.5".into();
    far["status"]["podIPs"] = json!([{"ip": "192.0.2.5"}]);
    api.put(far, false);
    api.put(
        pod("payments", "pay", "uid-p", NODE, port, &["ready"], json!([])),
        false,
    );
    api.put(pod("team-x", "x", "uid-x", NODE, port, &["ready"], json!([])), false);
    api.put(pod("plain", "p", "uid-plain", NODE, port, &["ready"], json!([])), false);

    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path(), &config).await;
    gates.synced().await;

    // Listed (by label: the mocked API server refuses anything else)
    // before any gate was served.
    assert_eq!(
        outcomes(&agent),
        [
            ("payments".into(), "standard".into(), "explicit_tenant".into()),
            ("team-a".into(), "standard".into(), "templated".into()),
            ("team-b".into(), "standard".into(), "templated".into()),
            ("team-x".into(), "no-such-template".into(), "unknown_template".into()),
        ],
        "the unlabelled namespace is not even seen"
    );

    // Inside the template: the gate turns True under tenant team-a.
    let name = "k8s_team-a_web_ready";
    assert_eq!(agent.results().get(name).expect("its probe").tenant, "team-a");
    wait_until("team-a's gate True", || {
        last_written(&api, "team-a", "web", "ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let tenant = agent
        .control()
        .tenants()
        .get("team-a")
        .cloned()
        .expect("the templated tenant");
    assert_eq!(
        (
            tenant.quotas.max_probes,
            tenant.quotas.max_concurrent_runs,
            tenant.quotas.timeout
        ),
        (50, 2, Duration::from_secs(5)),
        "the template's quotas"
    );
    assert!(tenant.token.is_none(), "a templated tenant has no API token");
    assert_eq!(
        agent.executor().tenant_stats("team-a").map(|s| s.limit),
        Some(2),
        "its runs are held to the template's max_concurrent_runs"
    );

    // Over the quota, outside the ceiling, the explicit tenant's ceiling,
    // and no tenant: refused, each with an Event naming why.
    wait_until("the four refusals", || {
        [
            ("team-a", "slow"),
            ("team-b", "ready"),
            ("payments", "ready"),
            ("team-x", "ready"),
        ]
        .iter()
        .all(|(ns, c)| !refusals(&api, ns, c).is_empty())
    })
    .await;
    let slow = &refusals(&api, "team-a", "slow")[0];
    assert!(slow.contains("timeout") && slow.contains("quota"), "{slow}");
    let far = &refusals(&api, "team-b", "ready")[0];
    assert!(far.contains("192.0.2.5") && far.contains("ceiling"), "{far}");
    let pay = &refusals(&api, "payments", "ready")[0];
    assert!(
        pay.contains("\"payments\"") && pay.contains("127.0.0.1") && pay.contains("ceiling"),
        "the explicit tenant's ceiling decides, not the template's: {pay}"
    );
    let x = &refusals(&api, "team-x", "ready")[0];
    assert!(x.contains("no tenant \"team-x\""), "{x}");
    assert!(
        !x.contains("payments") && !x.contains("team-a"),
        "other tenants' names are not team-x's business: {x}"
    );
    assert!(agent.results().get("k8s_team-x_x_ready").is_none());
    assert!(agent.control().tenants().get("team-x").is_none());

    // The gates waited for the Namespaces: team-a's was never refused nor
    // Unknown on the way to True (a restart does not flap it).
    assert!(
        refusals(&api, "team-a", "ready").is_empty(),
        "{:?}",
        refusals(&api, "team-a", "ready")
    );
    let path = "/api/v1/namespaces/team-a/pods/web/status";
    let ready: Vec<Value> = api
        .patches()
        .iter()
        .filter(|p| p.path == path)
        .flat_map(|p| p.body["status"]["conditions"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "sonde.dev/ready")
        .collect();
    assert!(ready.iter().all(|c| c["status"] == "True"), "{ready:?}");

    // A reload of the file keeps the templated tenants and the gate's probe.
    agent.reload().await.unwrap();
    assert!(
        agent.control().tenants().get("team-a").is_some(),
        "kept across a reload"
    );
    wait_until("the gate's probe back after the reload", || {
        agent.results().get(name).is_some()
    })
    .await;

    // Unlabelled: the tenant goes, the gate is refused and turns Unknown.
    api.put_namespace(namespace("team-a", None));
    wait_until("team-a's gate Unknown", || {
        last_written(&api, "team-a", "web", "ready").is_some_and(|c| c["status"] == "Unknown")
    })
    .await;
    assert!(agent.control().tenants().get("team-a").is_none());
    assert!(agent.results().get(name).is_none(), "its probe went with its tenant");
    let gone = refusals(&api, "team-a", "ready");
    assert!(
        gone.iter().any(|m| m.contains("no tenant \"team-a\"")),
        "the Event says the namespace has no tenant: {gone:?}"
    );
    let stored = api.pod("team-a", "web");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["reason"], "CheckUnavailable");
    // Everything the agent asked of the API server, Namespaces included,
    // the shipped ClusterRole allows.
    let rules = crate::support::rbac::agent_rules();
    for r in api.requests() {
        assert!(
            crate::support::rbac::agent_may(&rules, &r),
            "rbac.yaml does not let sonde's ServiceAccount make {} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }
    assert!(
        api.requests().iter().any(|r| r.path == "/api/v1/namespaces"),
        "the Namespaces were listed"
    );
    drop(gates);
    agent.stop().await;
}

/// A burst of labels (a cluster admin opting in forty namespaces at once)
/// is put in force by a few loads, not one per Namespace event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_labels_costs_a_few_loads() {
    let config = documented_config().replace(POD_CIDR.0, POD_CIDR.1);
    let (client, api) = FakeApi::start();
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path(), &config).await;
    gates.synced().await;
    let reloads = agent.control().reloads();
    let before = *reloads.borrow();
    for i in 0..40 {
        api.put_namespace(namespace(&format!("burst-{i:02}"), Some("standard")));
    }
    wait_until("forty templated tenants", || {
        (0..40).all(|i| agent.control().tenants().get(&format!("burst-{i:02}")).is_some())
    })
    .await;
    let loads = *reloads.borrow() - before;
    assert!(loads <= 5, "{loads} loads for 40 Namespace events");
    drop(gates);
    agent.stop().await;
}

/// Without a template the agent never watches Namespaces (and so needs
/// no RBAC for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_template_no_namespace_is_watched() {
    let (client, api) = FakeApi::start();
    let dir = tempfile::tempdir().unwrap();
    let config = "kubernetes: {namespaces: {}}\ntargets: []\n";
    let (agent, gates) = agent(client, dir.path(), config).await;
    gates.synced().await;
    api.wait("the Pods and SondeChecks listed", |r| {
        r.iter().any(|r| r.path == "/api/v1/pods") && r.iter().any(|r| r.path.contains("sondechecks"))
    })
    .await;
    assert!(
        api.requests().iter().all(|r| r.path != "/api/v1/namespaces"),
        "no Namespace request"
    );
    drop(gates);
    agent.stop().await;
}

/// A namespace whose checks were refused for want of a tenant gets its
/// gates True once the cluster admin labels it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_a_refused_namespace_brings_its_gate_true() {
    let config = documented_config().replace(POD_CIDR.0, POD_CIDR.1);
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put_namespace(namespace("late", None));
    api.put(check("late", "ready", 1, 1), false);
    api.put(
        pod("late", "web", "uid-l", NODE, server.addr.port(), &["ready"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path(), &config).await;
    gates.synced().await;
    wait_until("the gate Unknown, without a tenant", || {
        last_written(&api, "late", "web", "ready").is_some_and(|c| c["status"] == "Unknown")
    })
    .await;
    api.put_namespace(namespace("late", Some("standard")));
    wait_until("the gate True once labelled", || {
        last_written(&api, "late", "web", "ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(agent.results().get("k8s_late_web_ready").unwrap().tenant, "late");
    drop(gates);
    agent.stop().await;
}
