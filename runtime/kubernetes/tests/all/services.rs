//! Checks through a Service: the egress-proxy rollout case. The Service's
//! "ClusterIP" is a round-robin balancer on loopback in front of three Pod
//! backends, each answering with its own `Pod-IPv4`; only the API server
//! is mocked, the traffic is real.

use crate::support::fake_api::*;
use crate::support::node_agent::Agent;
use crate::support::node_agent::*;
use serde_json::{Value, json};
use sonde_sandbox::verdict::Status;
use sonde_tests::HttpServer;
use sonde_tests::{PodBackend, RoundRobin};

/// The Service `name` at `ip:port` (its port named `http`).
fn service(ns: &str, name: &str, ip: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                 "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}]}
    })
}

/// The EndpointSlice of Service `name` with `ready` ready endpoints and
/// one that is not.
fn slice(ns: &str, name: &str, ready: usize) -> Value {
    let mut endpoints: Vec<Value> = (0..ready)
        .map(|i| json!({"addresses": [format!("10.1.0.{i}")], "conditions": {"ready": true}}))
        .collect();
    endpoints.push(json!({"addresses": ["10.1.0.99"], "conditions": {"ready": false}}));
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": format!("{name}-abcde"),
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "http", "port": 8080}]
    })
}

/// A gated Pod at `ip` with gate `routed`.
fn proxy(name: &str, uid: &str, ip: &str) -> Value {
    let mut p = pod("shop", name, uid, NODE, 8080, &["routed"], json!([]));
    p["status"]["podIP"] = ip.into();
    p["status"]["podIPs"] = json!([{"ip": ip}]);
    p
}

/// SondeCheck `routed`: http through Service `egress` port `http`,
/// requiring the answer from the Pod itself.
fn routed(mode: &str, backend: Value) -> Value {
    json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
        "metadata": {"namespace": "shop", "name": "routed", "uid": "check-routed", "generation": 1},
        "spec": {"plugin": "http", "service": {"name": "egress", "port": "http"},
                 "config": {"path": "/healthz", "backend": backend},
                 "periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2, "mode": mode}
    })
}

fn gate_of(api: &FakeApi, pod: &str) -> Option<Value> {
    cond(&api.pod("shop", pod), "sonde.dev/routed").cloned()
}

fn metric(agent: &Agent, probe: &str, name: &str) -> Option<f64> {
    let last = agent.results().get(probe)?.last?;
    last.result.metrics.iter().find(|m| m.name == name).map(|m| m.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_stays_unset_until_the_service_routes_to_its_pod_then_is_left() {
    let me = PodBackend::start("127.0.0.11", true).await;
    let other1 = PodBackend::start("127.0.0.12", true).await;
    let other2 = PodBackend::start("127.0.0.13", true).await;
    // A rollout: the Service does not route to the new Pod yet.
    let balancer = RoundRobin::start(&[other1.addr, other2.addr]).await;
    let (client, api) = FakeApi::start();
    api.put(service("shop", "egress", "127.0.0.1", balancer.addr.port()), false);
    api.put(slice("shop", "egress", 3), false);
    api.put(
        routed("StartupOnly", json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)"})),
        false,
    );
    api.put(proxy("proxy-0", "uid-p0", "127.0.0.11"), false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    let probe = "k8s_shop_proxy-0_routed";
    runs(&agent, probe, 2).await;
    // Three attempts per ready endpoint (3; the not-ready one is not
    // counted), each a fresh connection the balancer routes elsewhere.
    assert_eq!(metric(&agent, probe, "backend_attempts"), Some(9.0));
    let last = agent.results().get(probe).unwrap().last.unwrap().result;
    assert!(
        last.message
            .contains("not routed to this backend (Pod-IPv4: 127.0.0.11) in 9 attempts")
            && last.message.contains("127.0.0.12 ×")
            && last.message.contains("127.0.0.13 ×"),
        "says which backends answered: {}",
        last.message
    );
    assert!(
        gate_of(&api, "proxy-0").is_none_or(|c| c["status"] != "True"),
        "not True while another Pod answers: {:?}",
        gate_of(&api, "proxy-0")
    );
    // kube-proxy now routes to the new Pod too: the next run passes.
    let seq = *agent.results().run_log().follow().borrow();
    balancer.route_to(&[me.addr, other1.addr, other2.addr]);
    api.wait("the gate True", |r| {
        r.iter()
            .any(|r| r.method == "PATCH" && r.body["status"]["conditions"][0]["status"] == "True")
    })
    .await;
    let since: Vec<Status> = agent
        .results()
        .run_log()
        .after(seq)
        .unwrap()
        .into_iter()
        .filter(|(_, e)| &*e.probe == probe)
        .map(|(_, e)| e.state)
        .collect();
    assert!(
        since.len() <= 2 && since.last() == Some(&Status::Success),
        "True within one run of the route changing (the run in flight, then one): {since:?}"
    );
    let c = gate_of(&api, "proxy-0").unwrap();
    assert_eq!(c["reason"], "CheckPassed");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("from this backend (Pod-IPv4: 127.0.0.11"),
        "{c}"
    );
    // StartupOnly: set once and left. The probe is gone; the Service
    // dropping the Pod again writes nothing.
    api.wait("the probe removed", |_| agent.results().get(probe).is_none())
        .await;
    let patches = api.patches().len();
    balancer.route_to(&[other1.addr]);
    api.put(slice("shop", "egress", 1), false);
    api.put(
        routed(
            "StartupOnly",
            json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)", "missing": "fail"}),
        ),
        false,
    );
    // A second Pod's gate runs meanwhile: the controller took both
    // events, and wrote nothing for the first.
    api.put(proxy("proxy-1", "uid-p1", "127.0.0.14"), false);
    runs(&agent, "k8s_shop_proxy-1_routed", 1).await;
    assert!(agent.results().get(probe).is_none(), "never checked again");
    assert_eq!(
        api.patches()
            .iter()
            .filter(|p| p.path.contains("/pods/proxy-0/"))
            .count(),
        patches,
        "nothing written on the started Pod again"
    );
    drop(gates);
    agent.stop().await;
}

/// Behind the Service, an older backend that does not say who it is:
/// "cannot verify" passes by default, and fails when so configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_the_header_passes_as_unverified_or_fails_when_configured() {
    let old = PodBackend::start("127.0.0.21", false).await;
    let balancer = RoundRobin::start(&[old.addr]).await;
    let (client, api) = FakeApi::start();
    api.put(service("shop", "egress", "127.0.0.1", balancer.addr.port()), false);
    api.put(slice("shop", "egress", 1), false);
    api.put(
        routed("Continuous", json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)"})),
        false,
    );
    api.put(proxy("proxy-0", "uid-p0", "127.0.0.21"), false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    api.wait("the gate True, unverified", |_| {
        gate_of(&api, "proxy-0").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let c = gate_of(&api, "proxy-0").unwrap();
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("backend not verified (no Pod-IPv4 header)"),
        "{c}"
    );
    assert_eq!(metric(&agent, "k8s_shop_proxy-0_routed", "backend_attempts"), Some(1.0));
    api.put(
        routed(
            "Continuous",
            json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)", "missing": "fail"}),
        ),
        false,
    );
    api.wait("the gate False, unverifiable", |_| {
        gate_of(&api, "proxy-0").is_some_and(|c| c["status"] == "False")
    })
    .await;
    let c = gate_of(&api, "proxy-0").unwrap();
    assert_eq!(c["reason"], "CheckFailed");
    assert!(
        c["message"].as_str().unwrap().contains("cannot verify the backend"),
        "{c}"
    );
    drop(gates);
    agent.stop().await;
}

/// A Service outside the namespace's ceiling, a missing one (though
/// another namespace has it), a headless one and a port it lacks: each
/// refused with an Event on the SondeCheck naming it, the gate
/// Unknown/CheckUnavailable; nothing is dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_outside_the_ceiling_missing_headless_or_without_the_port_is_refused() {
    let (client, api) = FakeApi::start();
    // The Service CIDR is not in tenant shop's ceiling (loopback only).
    api.put(service("shop", "egress", "10.96.0.10", 80), false);
    // Another namespace's Service of that name, inside the ceiling:
    // a check finds Services of its own namespace only.
    api.put(service("other", "nowhere", "127.0.0.1", 80), false);
    let mut headless = service("shop", "headless", "None", 80);
    headless["spec"]["clusterIPs"] = json!(["None"]);
    api.put(headless, false);
    let cases = [
        ("routed", json!({"name": "egress", "port": "http"}), "10.96.0.10:80"),
        (
            "missing",
            json!({"name": "nowhere", "port": 80}),
            "service \"nowhere\" does not exist in namespace \"shop\"",
        ),
        (
            "headless",
            json!({"name": "headless", "port": 80}),
            "service \"headless\" has no cluster IP (headless, clusterIP: None)",
        ),
        (
            "noport",
            json!({"name": "egress", "port": "grpc"}),
            "service \"egress\" has no port \"grpc\" (it has http (80))",
        ),
    ];
    let gates_of: Vec<&str> = cases.iter().map(|(g, _, _)| *g).collect();
    for (gate, target, _) in &cases {
        let mut c = routed("Continuous", json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)"}));
        c["metadata"]["name"] = (*gate).into();
        c["metadata"]["uid"] = format!("check-{gate}").into();
        c["spec"]["service"] = target.clone();
        api.put(c, false);
    }
    let mut p = proxy("proxy-0", "uid-p0", "127.0.0.31");
    p["spec"]["readinessGates"] = gates_of
        .iter()
        .map(|g| json!({"conditionType": format!("sonde.dev/{g}")}))
        .collect();
    api.put(p, false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    api.wait("four refusals", |r| {
        r.iter()
            .filter(|r| r.method == "POST" && r.body["reason"] == "Refused")
            .count()
            == 4
    })
    .await;
    for (gate, _, says) in &cases {
        let event = api
            .events()
            .into_iter()
            .find(|e| e.body["regarding"]["name"] == *gate)
            .unwrap_or_else(|| panic!("an Event on SondeCheck {gate}"));
        assert_eq!(event.body["regarding"]["kind"], "SondeCheck");
        assert_eq!(event.body["type"], "Warning");
        let note = event.body["note"].as_str().unwrap();
        assert!(note.contains(says), "{gate}: {note}");
        assert!(agent.results().get(&format!("k8s_shop_proxy-0_{gate}")).is_none());
    }
    let ceiling = api
        .events()
        .into_iter()
        .find(|e| e.body["regarding"]["name"] == "routed")
        .unwrap();
    assert!(
        ceiling.body["note"].as_str().unwrap().contains("ceiling"),
        "{}",
        ceiling.body
    );
    api.wait("every gate Unknown", |_| {
        gates_of.iter().all(|g| {
            cond(&api.pod("shop", "proxy-0"), &format!("sonde.dev/{g}"))
                .is_some_and(|c| c["status"] == "Unknown" && c["reason"] == "CheckUnavailable")
        })
    })
    .await;
    // The Service appears: the missing check's gate gets its probe.
    api.put(service("shop", "nowhere", "127.0.0.1", 80), false);
    api.wait("the probe through the new Service", |_| {
        agent.results().get("k8s_shop_proxy-0_missing").is_some()
    })
    .await;
    // And goes with it.
    api.delete_other(&service("shop", "nowhere", "127.0.0.1", 80));
    api.wait("the probe gone with the Service", |_| {
        agent.results().get("k8s_shop_proxy-0_missing").is_none()
    })
    .await;
    drop(gates);
    agent.stop().await;
}

/// An install whose ClusterRole predates checks through a Service:
/// checks at Pods work as before, a check through a Service is
/// `Unknown` with an Event that says what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_rbac_for_services_checks_at_pods_still_work() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.world().forbid_services = true;
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
    api.put(
        routed("Continuous", json!({"header": "Pod-IPv4", "equals": "$(POD_IPV4)"})),
        false,
    );
    api.put(proxy("proxy-0", "uid-p0", "127.0.0.51"), false);
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    api.wait("the Pod's gate True and the Service's Unknown", |_| {
        cond(&api.pod("shop", "web-1"), "sonde.dev/ready").is_some_and(|c| c["status"] == "True")
            && gate_of(&api, "proxy-0").is_some_and(|c| c["status"] == "Unknown")
    })
    .await;
    let event = api
        .events()
        .into_iter()
        .find(|e| e.body["regarding"]["name"] == "routed")
        .expect("an Event on the SondeCheck");
    assert!(
        event.body["note"]
            .as_str()
            .unwrap()
            .contains("endpointslices list and watch"),
        "{}",
        event.body
    );
    drop(gates);
    agent.stop().await;
}
