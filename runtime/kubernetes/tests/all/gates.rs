//! Readiness gates against the mocked API server: a gate follows its Pod,
//! writes only on transitions, retries conflicts, refuses what its
//! namespace's ceiling or the allowlist does not admit.

use crate::support::fake_api::*;
use crate::support::node_agent::*;
use serde_json::json;
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use sonde_tests::HttpServer;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_follows_its_pod_added_retargeted_and_removed() {
    let good = HttpServer::start().await;
    let bad = HttpServer::start().await;
    bad.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 2), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, good.addr.port(), &["ready"], json!([])),
        false,
    );
    // Another node's Pod: never listed, never written.
    api.put(
        pod(
            "shop",
            "web-2",
            "uid-2",
            "node-2",
            good.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    let name = "k8s_shop_web-1_ready";
    let view = agent.results().get(name).expect("one probe for the (Pod, gate)");
    assert_eq!(view.target, name);
    assert_eq!(view.tenant, "shop");
    let labels: Vec<(&str, &str)> = view.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, [("check", "ready"), ("namespace", "shop"), ("pod", "web-1")]);
    assert!(
        agent.results().get("k8s_shop_web-2_ready").is_none(),
        "another node's Pod"
    );

    api.wait("the True condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    let p = &api.patches()[0];
    assert_eq!(p.path, "/api/v1/namespaces/shop/pods/web-1/status");
    assert_eq!(p.body["metadata"]["uid"], "uid-1");
    let c = &p.body["status"]["conditions"][0];
    assert_eq!(
        (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
        (Some("sonde.dev/ready"), Some("True"), Some("CheckPassed"))
    );
    assert!(c["lastTransitionTime"].is_string(), "a flip stamps the transition");
    let stored = api.pod("shop", "web-1");
    assert!(
        cond(&stored, "Ready").is_some() && cond(&stored, "ContainersReady").is_some(),
        "the kubelet's conditions stay"
    );

    // Retarget: the Pod's port annotation moves the probe to the failing server.
    let mut moved = api.pod("shop", "web-1");
    moved["metadata"]["annotations"] = json!({"sonde.dev/ready.port": bad.addr.port().to_string()});
    api.put(moved, false);
    api.wait("the False condition", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    let p = &api.patches()[1];
    let c = &p.body["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("CheckFailed"))
    );
    assert!(c["message"].as_str().unwrap().contains("500"), "{c}");
    let view = agent.results().get(name).unwrap();
    assert!(
        view.history.unwrap().len() >= 2,
        "two failures in a row before the write (failureThreshold 2)"
    );

    // Removed with its Pod.
    api.delete_pod("shop", "web-1", false);
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        while agent.results().get(name).is_some() {
            let _ = tokio::time::timeout(Duration::from_millis(200), follow.changed()).await;
        }
    })
    .await
    .expect("the probe goes with its Pod");
    assert!(api.patches().iter().all(|p| !p.path.contains("web-2")));
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_writes_nothing_while_the_condition_on_the_pod_holds() {
    let good = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, good.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    runs(&agent, "k8s_shop_web-1_ready", 3).await;
    assert_eq!(api.patches().len(), 0, "seeded True, still passing: no write");
    assert_eq!(gates.stats.patch_attempts.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_patch_comes_only_after_failure_threshold_failures() {
    let server = HttpServer::start().await;
    server.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    let name = "k8s_shop_web-1_ready";
    // Two failures: below the threshold, the Pod keeps True.
    runs(&agent, name, 2).await;
    let v = agent.results().get(name).unwrap();
    if v.consecutive < 3 {
        assert_eq!(api.patches().len(), 0, "no write before the third failure");
    }
    api.wait("the False condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    assert!(agent.results().get(name).unwrap().consecutive >= 3);
    assert_eq!(api.patches().len(), 1);
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "False");
    drop(gates);
    agent.stop().await;
}

/// A gate whose status holds takes its probe's latest message at each
/// `message_refresh`: a Pod that keeps failing, for another reason, says
/// the new reason without a flip (no `lastTransitionTime`, no Event), and
/// nothing more is written while the message stays the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_gate_message_follows_the_latest_reason_without_a_flip() {
    let server = HttpServer::start().await;
    server.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 1), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = "tenants:\n  - id: shop\n    ceiling: {net: [\"127.0.0.0/8:*\"]}\ntargets: []\n";
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&["http".to_string()]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: Duration::from_secs(1),
        node: Default::default(),
    };
    let (agent, gates) = start_gates(client, dir.path(), config, settings, false).await;
    gates.synced().await;
    api.wait("the False condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    let first = cond(&api.pod("shop", "web-1"), "sonde.dev/ready").unwrap().clone();
    assert_eq!(first["status"], "False");
    assert!(first["message"].as_str().unwrap().contains("500"), "{first}");

    // From now on the connection is refused: still failing, another reason.
    drop(server);
    api.wait("the refused connection's message", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() >= 2
    })
    .await;
    let second = api.patches()[1].body["status"]["conditions"][0].clone();
    assert_eq!(second["status"], "False");
    assert_eq!(second["reason"], "CheckFailed");
    assert!(
        second.get("lastTransitionTime").is_none(),
        "the status did not flip: {second}"
    );
    assert_ne!(second["message"], first["message"]);
    let stored = cond(&api.pod("shop", "web-1"), "sonde.dev/ready").unwrap().clone();
    assert_eq!(stored["message"], second["message"]);
    assert_eq!(stored["lastTransitionTime"], first["lastTransitionTime"]);

    // Three more runs of a 1 s check span two more refreshes: the message
    // is the same, so nothing more is written, and no Event but the flip's.
    runs(&agent, "k8s_shop_web-1_ready", 3).await;
    assert_eq!(api.patches().len(), 2, "{:#?}", api.patches());
    let events = api.events();
    let reasons: Vec<&str> = events.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckFailed"], "{events:#?}");
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_recreated_under_the_same_name_is_not_written_for_the_old_one() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    let mut delayed = check("shop", "ready", 1, 1);
    delayed["spec"]["initialDelaySeconds"] = 1.into();
    api.put(delayed, false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-old",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    // Before the first run (a second away), the Pod is deleted and created
    // again under its name; the agent's watch has not said so yet, so its
    // write carries the old UID, which the API server must refuse.
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-new",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        true,
    );
    api.wait("the old UID's write", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    assert_eq!(api.patches()[0].body["metadata"]["uid"], "uid-old");
    let stored = api.pod("shop", "web-1");
    assert!(
        cond(&stored, "sonde.dev/ready").is_none(),
        "the new Pod was not written"
    );
    // Now the watch tells: a new probe, a write with the new UID.
    let mut fresh = stored.clone();
    fresh["metadata"]["labels"] = json!({"v": "2"});
    api.put(fresh, false);
    api.wait("the new Pod's write", |r| {
        r.iter()
            .any(|r| r.method == "PATCH" && r.body["metadata"]["uid"] == "uid-new")
    })
    .await;
    let old = api
        .patches()
        .iter()
        .filter(|p| p.body["metadata"]["uid"] == "uid-old")
        .count();
    assert_eq!(old, 1, "the old UID's write is dropped, not retried");
    assert_eq!(gates.stats.gone.load(std::sync::atomic::Ordering::Relaxed), 1);
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "True");
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_retried_and_a_forbidden_write_is_not_hammered() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.world()
        .patch_script
        .push_back((409, "the object has been modified".into()));
    api.put(check("shop", "ready", 1, 1), false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    api.wait("the retried write", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "True");
    assert_eq!(gates.stats.retries.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Forbidden: reported and retried no sooner than the forbidden backoff.
    api.world()
        .patch_script
        .push_back((403, "pods \"web-1\" is forbidden".into()));
    server.set_healthy(false);
    api.wait("the forbidden write", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 3
    })
    .await;
    runs(&agent, "k8s_shop_web-1_ready", 4).await;
    assert_eq!(api.patches().len(), 3, "no retry within seconds of a 403");
    assert_eq!(gates.stats.forbidden.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_outside_its_namespace_ceiling_is_refused_with_an_event() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("poor", "ready", 1, 1), false);
    api.put(
        pod(
            "poor",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let mut tcp = check("shop", "raw", 1, 1);
    tcp["spec"]["plugin"] = "exec".into();
    api.put(tcp, false);
    api.put(
        pod("shop", "web-2", "uid-2", NODE, server.addr.port(), &["raw"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert!(
        agent.results().get("k8s_poor_web-1_ready").is_none(),
        "refused, not run"
    );
    api.wait("two refusal events", |r| {
        r.iter()
            .filter(|r| r.method == "POST" && r.body["reason"] == "Refused")
            .count()
            == 2
    })
    .await;
    let events = api.events();
    let ceiling = events
        .iter()
        .find(|e| e.body["regarding"]["namespace"] == "poor")
        .unwrap();
    assert_eq!(ceiling.path, "/apis/events.k8s.io/v1/namespaces/poor/events");
    assert_eq!(ceiling.body["regarding"]["kind"], "SondeCheck");
    assert_eq!(ceiling.body["type"], "Warning");
    let message = ceiling.body["note"].as_str().unwrap();
    assert!(
        message.contains("127.0.0.1") && message.contains("ceiling"),
        "names the grant: {message}"
    );
    assert!(
        !message.contains(dir.path().to_str().unwrap()),
        "the agent's config path is not the namespace's business: {message}"
    );
    let allow = events
        .iter()
        .find(|e| e.body["regarding"]["namespace"] == "shop")
        .unwrap();
    assert!(
        allow.body["note"].as_str().unwrap().contains("allowlist"),
        "{}",
        allow.body
    );
    api.wait("the Unknown conditions", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    for p in api.patches() {
        let c = &p.body["status"]["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("Unknown"), Some("CheckUnavailable"))
        );
    }
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_gone_watch_relists_and_drops_pods_deleted_meanwhile() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    api.put(
        pod("shop", "web-2", "uid-2", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert!(agent.results().get("k8s_shop_web-2_ready").is_some());
    let lists = |r: &[Recorded]| {
        r.iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch="))
            .count()
    };
    assert_eq!(lists(&api.requests()), 1);
    // The Pod goes while the watch is down; the next watch is too old.
    api.delete_pod("shop", "web-2", true);
    {
        let mut w = api.world();
        w.gone_next_pod_watch = true;
        w.pod_watches.clear(); // ends the open watch
    }
    api.wait("a re-list", |r| lists(r) >= 2).await;
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        while agent.results().get("k8s_shop_web-2_ready").is_some() {
            let _ = tokio::time::timeout(Duration::from_millis(200), follow.changed()).await;
        }
    })
    .await
    .expect("the deleted Pod's probe goes after the re-list");
    assert!(agent.results().get("k8s_shop_web-1_ready").is_some());
    assert_eq!(api.patches().len(), 0);
    drop(gates);
    agent.stop().await;
}

/// The acceptance figure: 110 Pods on the node, one gate each, a 1 s
/// check: no write at all in steady state, and one patch per transition
/// when one target flaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_110_steady_state_writes_nothing_and_a_flap_writes_once_per_transition() {
    let mut servers = Vec::new();
    for _ in 0..110 {
        servers.push(HttpServer::start().await);
    }
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    for (i, s) in servers.iter().enumerate() {
        api.put(
            pod(
                "shop",
                &format!("web-{i}"),
                &format!("uid-{i}"),
                NODE,
                s.addr.port(),
                &["ready"],
                passed(),
            ),
            false,
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert_eq!(gates.stats.probes.load(std::sync::atomic::Ordering::Relaxed), 110);
    // Steady state: every probe runs three more times, no write.
    for i in 0..110 {
        runs(&agent, &format!("k8s_shop_web-{i}_ready"), 3).await;
    }
    let writes = |api: &FakeApi| api.requests().into_iter().filter(|r| r.method != "GET").count();
    let steady = writes(&api);
    assert_eq!(steady, 0, "writes (patches or Events) in steady state");
    let reads = api.requests().len();

    servers[7].set_healthy(false);
    api.wait("the down transition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    servers[7].set_healthy(true);
    api.wait("the up transition", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() >= 2
    })
    .await;
    // Steady again: three more runs of the flapped probe, nothing more.
    runs(&agent, "k8s_shop_web-7_ready", 3).await;
    let patches = api.patches();
    assert_eq!(patches.len(), 2, "one patch per transition: {patches:#?}");
    assert!(
        patches
            .iter()
            .all(|p| p.path == "/api/v1/namespaces/shop/pods/web-7/status")
    );
    let statuses: Vec<&str> = patches
        .iter()
        .map(|p| p.body["status"]["conditions"][0]["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["False", "True"]);
    api.wait("one Event per transition", |r| {
        r.iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .count()
            >= 2
    })
    .await;
    let events = api.events();
    let reasons: Vec<&str> = events.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckFailed", "CheckPassed"], "{events:#?}");
    eprintln!(
        "110 Pods, 1 s checks: {steady} writes and {reads} reads (lists and watches) up to steady state; flap of one target: {} patches and {} Events for 2 transitions, {} requests in all",
        patches.len(),
        events.len(),
        api.requests().len()
    );
    drop(gates);
    agent.stop().await;
}

/// A SondeCheck may name its plugin by `oci://…@sha256:` reference when a
/// registry scope on the allowlist covers it: the namespace's tenant pulls
/// it from a real registry, runs the pinned digest and the gate turns True.
/// The same component under a repository the scope does not cover is
/// refused with an Event, and nothing is pulled for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_check_covered_by_the_allowlist_drives_its_gate_and_another_is_refused() {
    let Some(registry) = crate::support::registry::Registry::start(Default::default()) else {
        return;
    };
    let pusher = tempfile::tempdir().unwrap();
    let tcp = sonde_builtins::get("tcp").unwrap();
    let mut pinned = Vec::new();
    for repo in ["acme/tcp-check:1.0", "stray/tcp-check:1.0"] {
        let pushed = registry
            .client(pusher.path())
            .push(&registry.reference(repo), tcp, &crate::support::registry::info())
            .await
            .unwrap();
        pinned.push(pushed.reference.to_string());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepting = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });
    let (client, api) = FakeApi::start();
    for (name, plugin, pod_name, uid) in [
        ("ready", &pinned[0], "web-1", "uid-1"),
        ("stray", &pinned[1], "web-2", "uid-2"),
    ] {
        let mut c = check("shop", name, 1, 1);
        c["spec"]["plugin"] = plugin.as_str().into();
        c["spec"]["config"] = json!({});
        api.put(c, false);
        api.put(pod("shop", pod_name, uid, NODE, port, &[name], json!([])), false);
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "state_dir: {}\noci:\n  registries:\n    \"{}\": {{ insecure: true }}\n  timeout: 5s\n",
        dir.path().join("state").display(),
        registry.addr
    );
    let scope = format!("oci://{}/acme/*", registry.addr);
    // The tenant's own ceiling lets it pull from the whole registry; the
    // allowlist narrows that to acme/.
    let ceiling = format!(", registries: [\"{}/*\"]", registry.addr);
    let (agent, gates) = agent_configured(client, dir.path(), &extra, &ceiling, &["tcp", &scope]).await;
    gates.synced().await;
    api.wait("the gate of the covered check turns True", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/shop/pods/web-1/status"
                && r.body["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;
    let view = agent.results().get("k8s_shop_web-1_ready").unwrap();
    assert_eq!(view.plugin, pinned[0], "runs the pinned digest");
    assert_eq!(view.tenant, "shop");
    let pulled = agent.executor().tenant_stats("shop").unwrap().pull_bytes;
    assert!(
        (tcp.len() as u64..2 * tcp.len() as u64).contains(&pulled),
        "one pull, the namespace's tenant's: {pulled} bytes for a {} byte component",
        tcp.len()
    );
    api.wait("a refusal Event on the stray check", |r| {
        r.iter()
            .any(|r| r.method == "POST" && r.body["reason"] == "Refused" && r.body["regarding"]["name"] == "stray")
    })
    .await;
    let refusal = api
        .events()
        .into_iter()
        .find(|e| e.body["regarding"]["name"] == "stray")
        .unwrap();
    assert!(
        refusal.body["note"].as_str().unwrap().contains("allowlist"),
        "{}",
        refusal.body
    );
    assert!(
        agent.results().get("k8s_shop_web-2_stray").is_none(),
        "refused, not run"
    );
    drop(gates);
    agent.stop().await;
    accepting.abort();
}

/// The fourth finding: namespace A's SondeCheck names a pinned
/// `oci://` plugin on a silent registry; namespace B then adds a plain
/// `tcp` check and a Pod with its gate. No reconcile waits on A's pull:
/// B's gate turns True while A's pull still hangs, and A's gate says that
/// its plugin is being pulled (`Unknown`/`CheckUnavailable`, one Event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_registry_in_one_namespace_holds_up_no_other() {
    use crate::support::hostile_registry::{Hostile, Server, accepting, pinned_on};
    let silent = Server::start(Hostile::Silent).await;
    let (target, accepting) = accepting().await;
    let (client, api) = FakeApi::start();
    let mut a = check("shop", "pulled", 1, 1);
    a["spec"]["plugin"] = pinned_on(&silent).into();
    a["spec"]["config"] = json!({});
    api.put(a, false);
    api.put(
        pod("shop", "a-1", "uid-a", NODE, target.port(), &["pulled"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\ntenants:\n  - id: shop\n    ceiling: {{net: [\"127.0.0.0/8:*\"], registries: [\"{addr}/*\"]}}\n  - id: other\n    ceiling: {{net: [\"127.0.0.0/8:*\"]}}\ntargets: []\n",
        state = dir.path().join("state").display(),
        addr = silent.addr,
    );
    let scope = format!("oci://{}/acme/*", silent.addr);
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&["tcp".to_string(), scope]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: Default::default(),
    };
    let (agent, gates) = start_gates(client, dir.path(), &config, settings, false).await;
    gates.synced().await;
    api.wait("A's gate says its plugin is being pulled", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/shop/pods/a-1/status"
                && r.body["status"]["conditions"][0]["status"] == "Unknown"
                && r.body["status"]["conditions"][0]["reason"] == "CheckUnavailable"
                && r.body["status"]["conditions"][0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("being pulled"))
        })
    })
    .await;
    // Namespace B comes while A's pull hangs.
    let started = std::time::Instant::now();
    let mut b = check("other", "ready", 1, 1);
    b["spec"]["plugin"] = "tcp".into();
    b["spec"]["config"] = json!({});
    api.put(b, false);
    api.put(
        pod("other", "b-1", "uid-b", NODE, target.port(), &["ready"], json!([])),
        false,
    );
    api.wait("B's gate turns True", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/other/pods/b-1/status"
                && r.body["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;
    let took = started.elapsed();
    eprintln!("B's gate True {} ms after its Pod came", took.as_millis());
    // Not a wall-clock bound (a loaded machine stretches any): that no
    // reconcile waited on A's pull is that B's gate turned True while the
    // pull is still in flight, unanswered.
    assert_eq!(agent.control().pulls_in_flight(), 1, "A's pull ended first: {took:?}");
    let pulling: Vec<Recorded> = api
        .events()
        .into_iter()
        .filter(|e| e.body["reason"] == "PluginPulling")
        .collect();
    assert_eq!(pulling.len(), 1, "one Event for the pull: {pulling:#?}");
    assert_eq!(pulling[0].body["regarding"]["name"], "pulled");
    assert!(
        agent.results().get("k8s_shop_a-1_pulled").is_none(),
        "A's probe waits, not run"
    );
    drop(gates);
    agent.stop().await;
    accepting.abort();
}

/// Events go through kube-runtime's recorder (events.k8s.io/v1): each
/// transition of a gate records one on the Pod, and a repeat of the same
/// reason on the same Pod within the recorder's window is counted on the
/// first Event's series (a patch) rather than created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_transition_is_counted_on_the_first_event() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 1), false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    for (n, healthy) in [(1, true), (2, false), (3, true)] {
        server.set_healthy(healthy);
        api.wait("the next transition", |r| {
            r.iter()
                .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
                .count()
                >= n
        })
        .await;
    }
    api.wait("the repeat patched into the series", |r| {
        r.iter()
            .any(|r| r.method == "PATCH" && r.path.starts_with("/apis/events.k8s.io/v1/namespaces/shop/events/"))
    })
    .await;
    let created = api.events();
    let reasons: Vec<&str> = created.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckPassed", "CheckFailed"], "{created:#?}");
    let series: Vec<Recorded> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/events/"))
        .collect();
    assert_eq!(series.len(), 1, "{series:#?}");
    assert_eq!(series[0].body["reason"], "CheckPassed");
    assert_eq!(series[0].body["series"]["count"], 2);
    assert_eq!(series[0].body["regarding"]["uid"], "uid-1");
    let first = created[0].body["metadata"]["name"].as_str().unwrap();
    assert!(
        series[0].path.ends_with(&format!("/events/{first}")),
        "{}",
        series[0].path
    );
    assert_eq!(gates.stats.events_failed.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}
