//! SondeChecks' `secretRefs` against the mocked API server, which serves
//! `GET` of one Secret (200, 403 by the RBAC rules applied from the shipped
//! manifests, 404) and fails the test on any list or watch of Secrets: a
//! real bearer-token server behind the Pod's port, the documented
//! SondeCheck, and the agent's own API. The gate is `Unknown` (with an Event
//! naming the Secret and key, or the RoleBinding to make) while the Secret
//! is missing or forbidden, `True` once it can be read, follows a rotated
//! value without a restart; the value is in no request the agent sent (the
//! Pod's conditions, Events, the check's status), no answer of its API, and
//! no line of its log at `trace`.

use super::*;
use crate::secrets::holds;
use crate::support::fake_api::*;
use serde_json::{Value, json};
use sonde::agent::{Agent, AgentOptions};
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use sonde_tests::secrets::{AuthServer, Expected};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The Secret's value: what the bearer server wants.
const TOKEN: &str = "k8s-tok-51d0e3a9c7f2b846";
/// A rotated value the server refuses.
const ROTATED: &str = "q7Zx-4Kp2Wm9c-J3vT";
/// The value of a key of the Secret no check names.
const UNRELATED: &str = "Xq3-9zLk-77Hw-pp0R";
/// The operator's token of the agent's API.
const OPERATOR: &str = "operator-token-of-the-agent-api";
const GATE: &str = "sonde.dev/api-ready";
const PROBE: &str = "k8s_shop_web-1_api-ready";

/// The SondeCheck of docs/kubernetes.md's "Secrets", as shipped, asking
/// the bearer server's `/bearer` every second, with the keys of `config`
/// merged into its config (a `null` removes one).
fn documented_check(config: Value) -> Value {
    let docs = sonde_tests::doc_documents("docs/kubernetes.md", "## Secrets\n", "yaml kubernetes");
    let objects: Vec<Value> = docs.iter().map(|d| serde_saphyr::from_str(d).unwrap()).collect();
    assert_eq!(objects[0]["kind"], "Secret");
    let mut check = objects
        .into_iter()
        .find(|o| o["kind"] == "SondeCheck")
        .expect("the SondeCheck");
    let typed: sonde_kubernetes::crd::SondeCheck = serde_json::from_value(check.clone()).unwrap();
    assert_eq!(typed.spec.secret_refs[0].secret_name, "api-token");
    check["metadata"]["uid"] = "check-api-ready".into();
    check["spec"]["config"]["path"] = "/bearer".into();
    let merged = check["spec"]["config"].as_object_mut().unwrap();
    for (k, v) in config.as_object().unwrap() {
        if v.is_null() {
            merged.remove(k);
        } else {
            merged.insert(k.clone(), v.clone());
        }
    }
    check["spec"]["periodSeconds"] = 1.into();
    check["spec"]["failureThreshold"] = 1.into();
    check
}

async fn bearer_server() -> AuthServer {
    AuthServer::start(Expected {
        user: "u".into(),
        password: "unused-password".into(),
        token: TOKEN.into(),
    })
    .await
}

/// An agent of tenant `shop` with its API on loopback (operator token
/// [`OPERATOR`]), and the controller on `client`, leading the status.
async fn start(client: kube::Client, dir: &Path) -> (Agent, kubernetes::GateController, SocketAddr) {
    crate::support::secret(dir, "op.token", OPERATOR);
    let config =
        "operator_token_file: op.token\ntenants:\n  - id: shop\n    ceiling: {net: [\"127.0.0.0/8:*\"]}\ntargets: []\n";
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, config).unwrap();
    let options = AgentOptions {
        config: Some(path),
        api: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        grace: Duration::from_secs(1),
        jitter: false,
        api_auth: sonde::api::ApiAuth::Auto,
    };
    let agent = Agent::start(crate::support::engine(), options).await.unwrap();
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&["http".to_string()]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: Default::default(),
    };
    let gates = kubernetes::spawn(
        client,
        agent.control().clone(),
        agent.results().clone(),
        settings,
        Default::default(),
        agent.node_problems().clone(),
    );
    gates.synced().await;
    let api = agent.api().unwrap();
    (agent, gates, api)
}

/// Waits until the Pod's gate has `status`, and returns its condition.
async fn gate(api: &FakeApi, status: &str) -> Value {
    api.wait(&format!("the gate {status}"), |_| {
        cond(&api.pod("shop", "web-1"), GATE).is_some_and(|c| c["status"] == status)
    })
    .await;
    cond(&api.pod("shop", "web-1"), GATE).unwrap().clone()
}

/// The Events on SondeCheck `api-ready` with `reason`, created or counted
/// again (a repeat is a patch of the first one's series).
fn events(api: &FakeApi, reason: &str) -> Vec<Value> {
    api.requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/events.k8s.io/v1/namespaces/shop/events"))
        .filter(|r| r.body["reason"] == reason && r.body["regarding"]["name"] == "api-ready")
        .map(|r| r.body)
        .collect()
}

async fn until_events(api: &FakeApi, reason: &str, n: usize) -> Vec<Value> {
    api.wait(&format!("{n} {reason} Events"), |_| events(api, reason).len() >= n)
        .await;
    events(api, reason)
}

/// Everything the agent told anyone: every request it sent the API server
/// (Pod conditions, Events, the check's status), and its own API's answers.
async fn all_it_said(api: &FakeApi, agent_api: SocketAddr) -> String {
    let mut seen: String = api
        .requests()
        .iter()
        .map(|r| format!("{} {}?{} {}\n", r.method, r.path, r.query, r.body))
        .collect();
    for path in [
        "/v1/probes",
        &format!("/v1/probes/{PROBE}"),
        "/v1/targets",
        &format!("/v1/targets/{PROBE}"),
        "/v1/status",
        "/metrics",
    ] {
        let (status, body) = crate::support::call(agent_api, "GET", path, Some(OPERATOR), b"").await;
        assert_eq!(status, 200, "{path}: {body}");
        seen += &format!("== GET {path}\n{body}\n");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_holds_the_gate_unknown_until_it_appears_and_a_rotation_follows() {
    let server = bearer_server().await;
    let (client, api) = FakeApi::start();
    // Another agent writes the checks' statuses: no status write comes
    // back as a change of the check, which would have its Secret read
    // again at once.
    api.apply_rbac("examples/secret-reader-rolebinding.yaml", None);
    api.put(documented_check(json!({})), false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["api-ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates, agent_api) = start(client, dir.path()).await;

    // No Secret: Unknown, naming it; an Event on the check says so.
    let c = gate(&api, "Unknown").await;
    assert_eq!(c["reason"], "CheckUnavailable");
    let message = c["message"].as_str().unwrap();
    assert!(message.contains("Secret \"api-token\""), "{message}");
    assert!(message.contains("does not exist"), "{message}");
    let missing = until_events(&api, "SecretMissing", 1).await;
    let note = missing[0]["note"].as_str().unwrap();
    assert!(
        note.contains("secretRef \"token\"") && note.contains("key \"token\"") && note.contains("api-token"),
        "{note}"
    );
    assert_eq!(missing[0]["type"], "Warning");
    assert!(agent.results().get(PROBE).is_none(), "no probe runs without its secret");

    // The Secret appears: read again within seconds, the gate recovers.
    api.put_secret("shop", "api-token", &[("token", TOKEN), ("unrelated", UNRELATED)]);
    let c = gate(&api, "True").await;
    assert_eq!(c["reason"], "CheckPassed");
    until_events(&api, "SecretAvailable", 1).await;
    assert!(
        server
            .received()
            .iter()
            .any(|r| r.headers.contains(&format!("Bearer {TOKEN}"))),
        "the host sent the token"
    );
    // Rotated: the periodic re-read (every 30 s) hands the running probe
    // the new value, which the server refuses.
    let rotated = tokio::time::Instant::now();
    api.put_secret("shop", "api-token", &[("token", ROTATED)]);
    let c = gate(&api, "False").await;
    assert!(c["message"].as_str().unwrap().contains("401"), "{c}");
    assert!(server.received().iter().any(|r| r.headers.contains(ROTATED)));
    assert!(rotated.elapsed() > Duration::from_secs(5), "not before it was due");
    let mut seen = all_it_said(&api, agent_api).await;

    // Deleted, and the check touched: read again at once, Unknown again.
    api.delete_secret("shop", "api-token");
    let mut touched = api.check("shop", "api-ready");
    touched["metadata"]["labels"] = json!({"touched": "yes"});
    api.put(touched, false);
    gate(&api, "Unknown").await;
    until_events(&api, "SecretMissing", 2).await;

    seen += &format!("{:?}", api.requests());
    assert!(seen.contains("SecretMissing") && seen.contains(PROBE), "{seen}");
    for value in [TOKEN, ROTATED, UNRELATED] {
        assert!(!holds(&seen, value), "the agent said a secret's value: {seen}");
    }
    drop(gates);
    agent.stop().await;
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Forbidden (no RoleBinding yet): `Unknown` and an Event saying which
/// RoleBinding to make; the shipped narrowed Role applied, the named
/// Secret is read and the gate recovers, while a Secret the Role does not
/// name stays forbidden. The check uses the `headers` form of the handle.
/// Everything runs on this thread, whose log is kept at `trace`: the value
/// is in no line of it.
#[tokio::test]
async fn a_forbidden_secret_names_the_rolebinding_and_the_narrowed_role_lets_only_its_secrets_through() {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // With one dispatcher registered, tracing decides whether a callsite
    // is enabled by the default of the thread that reaches it first, and
    // keeps that answer: another test's thread would disable for all what
    // it reaches first. A second one (alive until the end) makes it ask
    // every dispatcher, this thread's included.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());

    let server = bearer_server().await;
    let (client, api) = FakeApi::start();
    api.open_leases();
    api.put_secret("shop", "api-token", &[("token", TOKEN)]);
    api.put_secret("shop", "other-token", &[("token", TOKEN)]);
    let headers = json!({"bearer_token": null, "headers": {"authorization": "Bearer $(secret:token)"}});
    api.put(documented_check(headers), false);
    let mut other = documented_check(json!({}));
    other["metadata"] = json!({"namespace": "shop", "name": "other-ready", "uid": "check-other"});
    other["spec"]["secretRefs"][0]["secretName"] = "other-token".into();
    api.put(other, false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["api-ready", "other-ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates, agent_api) = start(client, dir.path()).await;

    let c = gate(&api, "Unknown").await;
    assert!(c["message"].as_str().unwrap().contains("403"), "{c}");
    let forbidden = until_events(&api, "SecretForbidden", 1).await;
    let note = forbidden[0]["note"].as_str().unwrap();
    assert!(
        note.contains("ClusterRole sonde-secret-reader") && note.contains("RoleBinding in namespace \"shop\""),
        "{note}"
    );
    assert!(
        note.contains("deploy/kubernetes/examples/secret-reader-rolebinding.yaml"),
        "{note}"
    );

    api.apply_rbac("examples/secret-reader-role-narrowed.yaml", None);
    gate(&api, "True").await;
    let other_gate = cond(&api.pod("shop", "web-1"), "sonde.dev/other-ready")
        .unwrap()
        .clone();
    assert_eq!(other_gate["status"], "Unknown", "{other_gate}");
    assert!(
        other_gate["message"].as_str().unwrap().contains("other-token"),
        "{other_gate}"
    );
    assert!(
        server.received().iter().any(|r| r.headers.contains(TOKEN)),
        "sent as a header"
    );
    // The status writer accepts the check (its dry run needs the grant).
    api.wait("the check's status", |_| {
        api.check("shop", "api-ready")["status"]["conditions"][0]["status"] == "True"
    })
    .await;

    let seen = all_it_said(&api, agent_api).await;
    drop(gates);
    agent.stop().await;
    let log = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    assert!(
        log.contains("TRACE") && log.contains("SecretForbidden"),
        "a log at trace, of the agent's dealings with the Secret too: {log}"
    );
    assert!(!holds(&log, TOKEN), "the log holds the secret");
    assert!(!holds(&seen, TOKEN), "the agent said the secret: {seen}");
}
