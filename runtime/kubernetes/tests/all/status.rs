//! The Lease that elects one agent to write SondeCheck status, against
//! the mocked API server on tokio's paused clock: one leader at a time,
//! and a holder that cannot renew stops writing before its lease expires.
//!
//! And the SondeCheck `status` subresource: the elected agent's counts,
//! `Accepted` verdicts and writes (real agents, real probes against
//! loopback servers, on the real clock).

use crate::support::fake_api::{FakeApi, Recorded, check, pod};
use crate::support::node_agent::agent_configured;
use serde_json::{Value, json};
use sonde_kubernetes::status::{self, LeaseTiming};
use sonde_tests::HttpServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The node of the agents `agent_configured` starts.
const NODE: &str = "node-1";
const PATIENCE: Duration = Duration::from_secs(60);

/// Watches two electors and sets `both` if they ever lead at once.
fn never_both(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>, both: Arc<AtomicBool>) {
    tokio::spawn(async move {
        loop {
            if *a.borrow_and_update() && *b.borrow_and_update() {
                both.store(true, Ordering::SeqCst);
            }
            tokio::select! {
                r = a.changed() => if r.is_err() { return },
                r = b.changed() => if r.is_err() { return },
            }
        }
    });
}

/// Two electors on one API server: `node-a`, leading once this returns,
/// then `node-b`; and the flag [`never_both`] sets.
async fn two_electors(api: &FakeApi) -> (status::Election, status::Election, Arc<AtomicBool>) {
    api.open_leases();
    let a = status::elect(api.client(), "sonde-system", "node-a", LeaseTiming::default());
    let mut leads_a = a.leading.clone();
    tokio::time::timeout(PATIENCE, leads_a.wait_for(|l| *l))
        .await
        .expect("the first agent creates the Lease")
        .unwrap();
    let b = status::elect(api.client(), "sonde-system", "node-b", LeaseTiming::default());
    let both = Arc::new(AtomicBool::new(false));
    never_both(a.leading.clone(), b.leading.clone(), both.clone());
    (a, b, both)
}

#[tokio::test(start_paused = true)]
async fn one_agent_leads_and_another_takes_over_only_after_it_stops_renewing() {
    let api = FakeApi::new();
    let (a, b, both) = two_electors(&api).await;
    let leads_a = a.leading.clone();
    let mut leads_b = b.leading.clone();

    // Ten minutes of renewals: the second agent reads the Lease now and
    // then and never takes it.
    let taken = tokio::time::timeout(Duration::from_secs(600), leads_b.wait_for(|l| *l))
        .await
        .is_ok();
    assert!(!taken, "b took a Lease that a renews");
    assert!(*leads_a.borrow(), "a still leads");
    let reads_by_b = api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/leases/"))
        .count();
    assert!(
        (10..=22).contains(&reads_by_b),
        "a non-holder reads every 30-50 s, so 12-20 times in 10 minutes: {reads_by_b}"
    );
    let lease_requests: Vec<Recorded> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/leases"))
        .collect();
    assert!(
        lease_requests
            .iter()
            .all(|r| r.method != "GET" || r.query.contains("resourceVersion=0")),
        "reads come from the API server's cache"
    );
    assert!(
        lease_requests.iter().all(|r| !r.query.contains("watch")),
        "nobody watches the Lease"
    );

    // The holder's agent goes: it renews no more.
    drop(a);
    tokio::time::timeout(Duration::from_secs(120), leads_b.wait_for(|l| *l))
        .await
        .expect("b takes over")
        .unwrap();
    let holders = api.lease_holders();
    let first_b = holders.iter().position(|(h, _)| h == "node-b").unwrap();
    assert!(
        holders[..first_b].iter().all(|(h, _)| h == "node-a") && holders[first_b..].iter().all(|(h, _)| h == "node-b"),
        "one holder after the other: {holders:?}"
    );
    let expired = holders[first_b].1 - holders[first_b - 1].1;
    assert!(
        expired >= LeaseTiming::default().duration,
        "taken only once a's last renewal was a lease duration old: {expired:?}"
    );
    assert!(!both.load(Ordering::SeqCst), "never two leaders at once");
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_cannot_renew_stops_writing_before_its_lease_expires() {
    let api = FakeApi::new();
    let (a, b, both) = two_electors(&api).await;
    let mut leads_a = a.leading.clone();
    let leads_b = b.leading.clone();
    let renewed = Instant::now();
    api.fail_lease_writes(true);
    tokio::time::timeout(PATIENCE, leads_a.wait_for(|l| !*l))
        .await
        .expect("a steps down")
        .unwrap();
    let led_for = renewed.elapsed();
    assert!(
        led_for < LeaseTiming::default().duration,
        "a stopped within its renew deadline, before anyone may take over: {led_for:?}"
    );
    // Writes work again: exactly one of them leads again, never both.
    api.fail_lease_writes(false);
    let mut any = leads_a.clone();
    let mut other = leads_b.clone();
    tokio::time::timeout(Duration::from_secs(300), async {
        tokio::select! {
            _ = any.wait_for(|l| *l) => {}
            _ = other.wait_for(|l| *l) => {}
        }
    })
    .await
    .expect("someone leads again");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(
        *leads_a.borrow() != *leads_b.borrow(),
        "one leader after five more minutes"
    );
    assert!(!both.load(Ordering::SeqCst), "never two leaders at once");
}

/// The status writes (patches of `sondechecks/*/status`).
fn status_writes(log: &[Recorded]) -> impl Iterator<Item = &Recorded> {
    log.iter()
        .filter(|r| r.method == "PATCH" && r.path.starts_with("/apis/sonde.dev/"))
}

fn accepted(check: &Value) -> &Value {
    check["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Accepted"))
        .unwrap_or_else(|| panic!("no Accepted condition: {check}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_pods_pass_is_accepted_and_counted_and_its_status_follows_its_spec() {
    let good = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.open_leases();
    let mut c = check("shop", "ready", 1, 3);
    c["metadata"]["generation"] = 1.into();
    api.put(c, false);
    let port = good.addr.port();
    for name in ["web-1", "web-2"] {
        api.put(
            pod("shop", name, &format!("uid-{name}"), NODE, port, &["ready"], json!([])),
            false,
        );
    }
    // Another node's Pod, failing there; and a Pod of another check.
    let failing = json!([{"type": "sonde.dev/ready", "status": "False", "reason": "CheckFailed", "message": "503"}]);
    api.put(
        pod("shop", "web-3", "uid-3", "node-2", port, &["ready"], failing),
        false,
    );
    api.put(pod("shop", "db-1", "uid-4", "node-2", port, &["db"], json!([])), false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent_configured(client, dir.path(), "", "", &["http", "tcp"]).await;
    gates.synced().await;

    api.wait("two Pods counted ready", |log| {
        status_writes(log).any(|r| r.body["status"]["podsReady"] == 2)
    })
    .await;
    let stored = api.check("shop", "ready");
    let s = &stored["status"];
    assert_eq!(s["observedGeneration"], 1);
    assert_eq!(
        (&s["podsReady"], &s["podsNotReady"], &s["podsUnknown"]),
        (&json!(2), &json!(1), &json!(0))
    );
    let a = accepted(&stored);
    assert_eq!(
        (&a["status"], &a["reason"]),
        (&json!("True"), &json!("Accepted")),
        "{a}"
    );
    assert!(a["lastTransitionTime"].is_string());
    assert!(
        api.requests()
            .iter()
            .any(|r| r.path == "/api/v1/pods" && !r.query.contains("fieldSelector")),
        "the leader watches every node's Pods"
    );

    // Steady state: evaluations go on, writes do not (for longer than
    // the shortest time between two writes of a check).
    let writes = status_writes(&api.requests()).count();
    let evaluations = || gates.stats.status_evaluations.load(Ordering::Relaxed);
    let until = evaluations() + 8;
    tokio::time::timeout(PATIENCE, async {
        while evaluations() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the leader keeps evaluating");
    assert_eq!(
        status_writes(&api.requests()).count(),
        writes,
        "nothing changed, nothing written"
    );

    // A spec change: the new generation, refused by the allowlist.
    let mut c = api.check("shop", "ready");
    c["metadata"]["generation"] = 2.into();
    c["spec"]["plugin"] = "grpc".into();
    api.put(c, false);
    api.wait("the new generation's status", |log| {
        status_writes(log).any(|r| r.body["status"]["observedGeneration"] == 2)
    })
    .await;
    let stored = api.check("shop", "ready");
    let a = accepted(&stored);
    assert_eq!(
        (&a["status"], &a["reason"]),
        (&json!("False"), &json!("PluginNotAllowed")),
        "{a}"
    );
    assert!(a["message"].as_str().unwrap().contains("grpc"), "{a}");
    assert_eq!(a["observedGeneration"], 2);
    assert_eq!(gates.stats.status_write_errors.load(Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_outside_the_ceiling_without_a_tenant_or_with_a_bad_config_say_why() {
    let (client, api) = FakeApi::start();
    api.open_leases();
    // Tenant poor's ceiling is 10.0.0.0/8; its Pod is on 127.0.0.1.
    api.put(check("poor", "ready", 1, 3), false);
    api.put(
        pod("poor", "web-1", "uid-1", "node-2", 8080, &["ready"], json!([])),
        false,
    );
    // No Pod names these.
    let mut bad = check("shop", "bad-config", 1, 3);
    bad["spec"]["config"] = json!({"path": 42});
    api.put(bad, false);
    api.put(check("shop", "no-pods", 1, 3), false);
    api.put(check("default", "ready", 1, 3), false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent_configured(client, dir.path(), "", "", &["http", "tcp"]).await;
    gates.synced().await;
    let checks = [
        ("poor", "ready"),
        ("shop", "bad-config"),
        ("shop", "no-pods"),
        ("default", "ready"),
    ];
    api.wait("every check's status", |log| {
        checks.iter().all(|(ns, name)| {
            let path = format!("/apis/sonde.dev/v1alpha1/namespaces/{ns}/sondechecks/{name}/status");
            status_writes(log).any(|r| r.path == path)
        })
    })
    .await;
    let verdict = |ns: &str, name: &str| {
        let c = api.check(ns, name);
        let a = accepted(&c);
        (
            a["status"].as_str().unwrap().to_string(),
            a["reason"].as_str().unwrap().to_string(),
            a["message"].as_str().unwrap().to_string(),
        )
    };
    let (s, reason, message) = verdict("poor", "ready");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "OutsideCeiling"), "{message}");
    assert!(
        message.contains("net ceiling") && message.contains("127.0.0.1"),
        "{message}"
    );
    let (s, reason, message) = verdict("shop", "bad-config");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "InvalidConfig"), "{message}");
    assert!(message.contains("path"), "names the key: {message}");
    let (s, reason, message) = verdict("shop", "no-pods");
    assert_eq!(
        (s.as_str(), reason.as_str()),
        ("True", "Accepted"),
        "the stand-in's address is not held to the ceiling: {message}"
    );
    assert!(message.contains("no Pod"), "{message}");
    let (s, reason, message) = verdict("default", "ready");
    assert_eq!((s.as_str(), reason.as_str()), ("False", "NoTenant"), "{message}");
    let poor = api.check("poor", "ready");
    assert_eq!(poor["status"]["podsUnknown"], 1, "{poor}");
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_does_not_hold_the_lease_writes_no_status_and_watches_no_other_node() {
    let good = HttpServer::start().await;
    // Another agent holds the status Lease and renews it.
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, good.addr.port(), &["ready"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent_configured(client, dir.path(), "", "", &["http", "tcp"]).await;
    gates.synced().await;
    api.wait("the Lease read and the gate written", |log| {
        log.iter()
            .any(|r| r.method == "GET" && r.path.ends_with("/leases/sonde-status"))
            && log
                .iter()
                .any(|r| r.method == "PATCH" && r.path.ends_with("/pods/web-1/status"))
    })
    .await;
    let log = api.requests();
    assert_eq!(status_writes(&log).count(), 0, "a non-holder writes no status");
    assert!(
        log.iter()
            .filter(|r| r.path == "/api/v1/pods")
            .all(|r| r.query.contains("fieldSelector=spec.nodeName")),
        "only its own node's Pods"
    );
    let read = log.iter().find(|r| r.path.ends_with("/leases/sonde-status")).unwrap();
    assert_eq!(
        read.path, "/apis/coordination.k8s.io/v1/namespaces/sonde-system/leases/sonde-status",
        "the Lease in the agent's namespace"
    );
    assert!(!log.iter().any(|r| r.path.contains("/leases") && r.method != "GET"));
    assert_eq!(gates.stats.status_leader.load(Ordering::Relaxed), 0);
    assert_eq!(gates.stats.status_evaluations.load(Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}
