//! The readiness-gate controller against a real API server (no kubelet
//! needed): run by [`e2e_against_a_real_api_server`] when
//! `SONDE_E2E_KUBECONFIG` names a kubeconfig. The cluster needs the CRD
//! (`kubectl apply -f deploy/kubernetes/crd.yaml`); the test makes its own
//! namespace and deletes it at the end.
//!
//! Pods are created with `spec.nodeName` set to a node that does not
//! exist, so no kubelet touches them; the test plays the kubelet, patching
//! `status.podIP`/`podIPs` to the loopback where it serves the target and
//! seeding the kubelet's own conditions, which must survive sonde's writes.

use super::e2e_injection::namespace as create_namespace;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};
use sonde::agent::Agent;
use sonde_kubernetes::crd::SondeCheck;
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use sonde_tests::HttpServer;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const NODE: &str = "sonde-e2e-node";
const PATIENCE: Duration = Duration::from_secs(60);

pub(super) async fn client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

pub(super) fn condition(pod: &Pod, t: &str) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .cloned()
}

/// Waits until Pod `name` satisfies `f`, watching it (kube's
/// `await_condition`: a list, then the watch's events, no polling).
async fn until(pods: &Api<Pod>, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Pod {
    let cond = move |p: Option<&Pod>| p.is_some_and(&f);
    tokio::time::timeout(PATIENCE, kube::runtime::wait::await_condition(pods.clone(), name, cond))
        .await
        .unwrap_or_else(|_| panic!("{name}: timed out waiting for {what}"))
        .expect("watch the Pod")
        .unwrap_or_else(|| panic!("{name}: deleted while waiting for {what}"))
}

/// Creates Pod `name` on `node` and plays the kubelet: the loopback IP and
/// the kubelet's conditions.
async fn make_pod(pods: &Api<Pod>, name: &str, node: &str, port: u16) {
    make_gated_pod(pods, name, node, port, "ready").await;
}

/// [`make_pod`] with gate `sonde.dev/<gate>`.
async fn make_gated_pod(pods: &Api<Pod>, name: &str, node: &str, port: u16, gate: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "readinessGates": [{"conditionType": format!("sonde.dev/{gate}")}],
                 "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                 "ports": [{"name": "http", "containerPort": port}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.expect("create the Pod");
    let status = json!({"status": {
    "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
    "conditions": [
        {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}});
    let params = PatchParams {
        field_manager: Some("e2e-kubelet".into()),
        ..PatchParams::default()
    };
    pods.patch_status(name, &params, &Patch::Merge(&status))
        .await
        .expect("play the kubelet");
}

async fn start_agent(namespace: &str, client: Client, dir: &Path) -> (Agent, kubernetes::GateController) {
    start_agent_on(NODE, namespace, client, dir).await
}

/// [`start_agent`], as the agent of `node`.
async fn start_agent_on(
    node: &str,
    namespace: &str,
    client: Client,
    dir: &Path,
) -> (Agent, kubernetes::GateController) {
    let config = format!("tenants:\n  - id: {namespace}\n    ceiling: {{net: [\"127.0.0.0/8:*\"]}}\ntargets: []\n");
    let settings = GateSettings {
        node_name: node.into(),
        plugins: Allowlist::parse(&["http".into()]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 5.0,
        burst: 10,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: Default::default(),
    };
    let (agent, handle) = crate::kubernetes::start_gates(client, dir, &config, settings, true).await;
    handle.synced().await;
    (agent, handle)
}

async fn run(kubeconfig: &Path) {
    let client = client(kubeconfig).await;
    let namespace = format!("sonde-e2e-{}", fastrand::u32(..));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create_namespace(&client, &namespace, json!({})).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let checks: Api<SondeCheck> = Api::namespaced(client.clone(), &namespace);
    let server = HttpServer::start().await;
    let check: SondeCheck = serde_json::from_value(json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
        "metadata": {"name": "ready"},
        "spec": {"plugin": "http", "config": {"path": "/health"}, "port": "http",
                 "periodSeconds": 1, "failureThreshold": 2}
    }))
    .unwrap();
    checks
        .create(&PostParams::default(), &check)
        .await
        .expect("create the SondeCheck (is the CRD installed?)");
    make_pod(&pods, "web-1", NODE, server.addr.port()).await;
    make_pod(&pods, "elsewhere", "another-node", server.addr.port()).await;

    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = start_agent(&namespace, client.clone(), dir.path()).await;
    let p = until(&pods, "web-1", "the gate True", |p| {
        condition(p, "sonde.dev/ready").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        condition(&p, "sonde.dev/ready").unwrap().reason.as_deref(),
        Some("CheckPassed")
    );
    assert!(
        condition(&p, "ContainersReady").is_some(),
        "the kubelet's conditions survive"
    );
    assert_eq!(
        condition(&p, "Ready").unwrap().reason.as_deref(),
        Some("ReadinessGatesNotReady")
    );
    let managed: Vec<Value> = p
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some("sonde"))
        .map(|m| serde_json::to_value(&m.fields_v1).unwrap())
        .collect();
    assert_eq!(managed.len(), 1, "{managed:?}");
    let fields = managed[0].to_string();
    assert!(fields.contains(r#"k:{\"type\":\"sonde.dev/ready\"}"#), "{fields}");
    assert!(
        !fields.contains("ContainersReady") && !fields.contains(r#"\"type\":\"Ready\""#),
        "sonde owns only its condition: {fields}"
    );

    the_check_says_how_it_is_doing(&client, &checks).await;

    // Steady: no write while the result holds.
    let rv = p.metadata.resource_version.clone();
    crate::kubernetes::runs(&agent, &format!("k8s_{namespace}_web-1_ready"), 3).await;
    assert_eq!(
        pods.get("web-1").await.unwrap().metadata.resource_version,
        rv,
        "no write in steady state"
    );

    // Thresholds: two failures, then False.
    server.set_healthy(false);
    until(&pods, "web-1", "the gate False", |p| {
        condition(p, "sonde.dev/ready").is_some_and(|c| c.status == "False")
    })
    .await;
    server.set_healthy(true);
    let p = until(&pods, "web-1", "the gate True again", |p| {
        condition(p, "sonde.dev/ready").is_some_and(|c| c.status == "True")
    })
    .await;

    // Restart without flips: a new agent, the same Pod, no write.
    drop(gates);
    agent.stop().await;
    let rv = p.metadata.resource_version.clone();
    let (agent, gates) = start_agent(&namespace, client.clone(), dir.path()).await;
    crate::kubernetes::runs(&agent, &format!("k8s_{namespace}_web-1_ready"), 3).await;
    assert_eq!(
        pods.get("web-1").await.unwrap().metadata.resource_version,
        rv,
        "a restart writes nothing"
    );

    let other = pods.get("elsewhere").await.unwrap();
    assert!(
        condition(&other, "sonde.dev/ready").is_none(),
        "another node's Pod is untouched"
    );
    through_a_service(&client, &namespace, &pods).await;
    dry_run_the_rollout_example(&client, &namespace).await;
    drop(gates);
    agent.stop().await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
}

/// A check through a Service: the agent finds the ClusterIP the API server
/// allocated, and refuses it when the namespace's ceiling (loopback here)
/// does not cover it, with an Event naming the address; a headless Service
/// is refused as having no cluster IP. Both gates are `Unknown`.
async fn through_a_service(client: &Client, namespace: &str, pods: &Api<Pod>) {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let checks: Api<SondeCheck> = Api::namespaced(client.clone(), namespace);
    for (name, cluster_ip) in [("egress", None), ("headless", Some("None"))] {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": "egress"}, "clusterIP": cluster_ip,
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        }))
        .unwrap();
        services
            .create(&PostParams::default(), &service)
            .await
            .expect("create the Service");
        let check: SondeCheck = serde_json::from_value(json!({
            "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
            "metadata": {"name": format!("via-{name}")},
            "spec": {"plugin": "http", "service": {"name": name, "port": "http"},
                     "config": {"path": "/healthz", "backend": {"header": "Pod-IPv4", "equals": "$(POD_IPV4)"}},
                     "periodSeconds": 1}
        }))
        .unwrap();
        checks
            .create(&PostParams::default(), &check)
            .await
            .expect("create the SondeCheck (is the CRD as shipped installed?)");
        make_gated_pod(pods, &format!("proxy-{name}"), NODE, 8080, &format!("via-{name}")).await;
    }
    let ip = services.get("egress").await.unwrap().spec.unwrap().cluster_ip.unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let notes = tokio::time::timeout(PATIENCE, async {
        loop {
            let list = events.list(&Default::default()).await.expect("list Events");
            let notes: BTreeMap<String, String> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Refused"))
                .filter_map(|e| Some((e.regarding?.name?, e.note?)))
                .collect();
            if notes.len() == 2 {
                return notes;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("two Refused Events");
    assert!(
        notes["via-egress"].contains(&format!("{ip}:80")) && notes["via-egress"].contains("ceiling"),
        "names the ClusterIP outside the ceiling: {notes:?}"
    );
    assert!(notes["via-headless"].contains("headless"), "{notes:?}");
    // And each SondeCheck's status says why, for `kubectl get`.
    for (name, reason) in [
        ("via-egress", "OutsideCeiling"),
        ("via-headless", "ServiceWithoutClusterIP"),
    ] {
        let refused = move |c: Option<&SondeCheck>| {
            c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|k| k.type_ == "Accepted" && k.status == "False" && k.reason == reason)
            })
        };
        tokio::time::timeout(
            PATIENCE,
            kube::runtime::wait::await_condition(checks.clone(), name, refused),
        )
        .await
        .unwrap_or_else(|_| panic!("{name}: Accepted False, {reason}"))
        .expect("watch the SondeCheck");
    }
    for name in ["egress", "headless"] {
        let gate = format!("sonde.dev/via-{name}");
        until(pods, &format!("proxy-{name}"), "the gate Unknown", |p| {
            condition(p, &gate)
                .is_some_and(|c| c.status == "Unknown" && c.reason.as_deref() == Some("CheckUnavailable"))
        })
        .await;
    }
}

/// Every object of docs/kubernetes.md's "Gate a rollout on Service
/// routing", as shipped, applies with a server-side dry run (in the test's
/// namespace).
async fn dry_run_the_rollout_example(client: &Client, namespace: &str) {
    // A namespace of its own: the example's names are its own too.
    let namespace = &format!("{namespace}-rollout");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create_namespace(client, namespace, json!({})).await;
    let documents = sonde_tests::doc_documents(
        "docs/kubernetes.md",
        "## Gate a rollout on Service routing",
        "yaml kubernetes",
    );
    let mut kinds = Vec::new();
    for text in &documents {
        let mut object: DynamicObject = serde_saphyr::from_str(text).expect("an object");
        object.metadata.namespace = Some(namespace.to_string());
        let gvk = GroupVersionKind::try_from(object.types.as_ref().expect("apiVersion and kind")).unwrap();
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.expect("a known kind");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let name = object.metadata.name.clone().expect("a name");
        let params = PatchParams::apply("sonde-e2e").dry_run();
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{} {name}: the server refuses it in a dry run: {e}", gvk.kind));
        kinds.push(gvk.kind);
    }
    assert_eq!(kinds, ["SondeCheck", "Service", "ConfigMap", "StatefulSet"]);
    let _ = namespaces.delete(namespace, &DeleteParams::default()).await;
}

/// The SondeCheck's status, written by the one agent elected through the
/// Lease `sonde-status` in `sonde-system` (created here when the cluster
/// has no such namespace): Accepted True for the current generation, and
/// the one Pod of this node whose gate is True counted (the other Pod, on
/// a node with no agent, counted as Unknown).
async fn the_check_says_how_it_is_doing(client: &Client, checks: &Api<SondeCheck>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt("sonde-system").await.unwrap().is_none() {
        create_namespace(client, "sonde-system", json!({})).await;
    }
    let cond = |c: Option<&SondeCheck>| {
        c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.pods_ready == 1
                && s.pods_unknown == 1
                && s.observed_generation == c.and_then(|c| c.metadata.generation)
                && s.conditions.iter().any(|k| k.type_ == "Accepted" && k.status == "True")
        })
    };
    // The Lease is taken on the first try when no agent holds it; a
    // leftover holder from an earlier run expires within a minute.
    tokio::time::timeout(
        Duration::from_secs(150),
        kube::runtime::wait::await_condition(checks.clone(), "ready", cond),
    )
    .await
    .expect("the status: Accepted, 1 ready, 1 unknown")
    .expect("watch the SondeCheck");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), "sonde-system");
    let lease = leases.get("sonde-status").await.expect("the Lease");
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(NODE),
        "the agent of this test leads"
    );
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_against_a_real_api_server() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_against_a_real_api_server",
        "the CRDs of deploy/kubernetes/crd.yaml installed",
    ) else {
        return;
    };
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    run(&path).await;
}

/// The tests of this file one at a time: each runs an agent that may take
/// the status Lease, and the first wants its own agent to hold it.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of the e2e Secret: what the bearer server wants.
const E2E_TOKEN: &str = "e2e-tok-8c41f09a2b7d53e6";

/// A client of the cluster acting as sonde's agent: its ServiceAccount
/// (impersonated by the kubeconfig's admin), held to the shipped RBAC.
async fn as_agent(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    config.auth_info.impersonate = Some("system:serviceaccount:sonde-system:sonde".into());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:sonde-system".into(),
        "system:authenticated".into(),
    ]);
    Client::try_from(config).expect("a client")
}

/// Applies (server-side) every object of `deploy/kubernetes/<file>`, in
/// `namespace` instead of its own when given.
async fn apply_shipped(client: &Client, file: &str, namespace: Option<&str>) {
    for doc in sonde_tests::manifests::split(&sonde_tests::manifests::text(file)) {
        let mut object: DynamicObject = serde_saphyr::from_str(doc).expect("an object");
        if let Some(ns) = namespace {
            object.metadata.namespace = Some(ns.to_string());
        }
        let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
        let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
        let name = object.metadata.name.clone().unwrap();
        let api: Api<DynamicObject> = match &object.metadata.namespace {
            Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &PatchParams::apply("sonde-e2e").force(), &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{file}: apply {} {name}: {e}", gvk.kind));
    }
}

/// The notes of the Events on SondeCheck `check` with `reason`.
async fn notes(client: &Client, namespace: &str, check: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let list = events.list(&Default::default()).await.expect("list Events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(check))
        .filter_map(|e| e.note)
        .collect()
}

async fn until_note(client: &Client, namespace: &str, reason: &str) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(n) = notes(client, namespace, "api-ready", reason).await.pop() {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {reason} Event"))
}

async fn put_secret(client: &Client, namespace: &str, value: &str) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), namespace);
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "api-token"},
        "stringData": {"token": value}
    });
    secrets
        .patch(
            "api-token",
            &PatchParams::apply("sonde-e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("write the Secret");
}

/// A SondeCheck's `secretRefs` against a real API server, the agent acting
/// as its ServiceAccount under the shipped `rbac.yaml`: 403 (the gate
/// Unknown, an Event naming the RoleBinding) until the shipped example
/// RoleBinding is applied in the namespace, then the token reaches the
/// bearer server and the gate is True; the Secret deleted, Unknown with
/// `SecretMissing`; created again, True. No Event or status holds the value.
async fn secret_refs(kubeconfig: &Path) {
    let admin = client(kubeconfig).await;
    super::e2e_nodes::install_crds(&admin).await;
    apply_shipped(&admin, "rbac.yaml", None).await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces.get_opt("sonde-system").await.unwrap().is_none() {
        create_namespace(&admin, "sonde-system", json!({})).await;
    }
    let namespace = format!("sonde-e2e-secrets-{}", fastrand::u32(..));
    create_namespace(&admin, &namespace, json!({})).await;
    let server = sonde_tests::secrets::AuthServer::start(sonde_tests::secrets::Expected {
        user: "u".into(),
        password: "unused-password".into(),
        token: E2E_TOKEN.into(),
    })
    .await;
    put_secret(&admin, &namespace, E2E_TOKEN).await;
    let checks: Api<SondeCheck> = Api::namespaced(admin.clone(), &namespace);
    let check: SondeCheck = serde_json::from_value(json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
        "metadata": {"name": "api-ready"},
        "spec": {"plugin": "http", "port": "http", "periodSeconds": 1, "failureThreshold": 1,
                 "config": {"path": "/bearer", "bearer_token": "$(secret:token)"},
                 "secretRefs": [{"name": "token", "secretName": "api-token", "key": "token"}]}
    }))
    .unwrap();
    checks
        .create(&PostParams::default(), &check)
        .await
        .expect("create the SondeCheck");
    let kept = checks.get("api-ready").await.unwrap();
    assert_eq!(kept.spec.secret_refs.len(), 1, "the CRD as shipped keeps secretRefs");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &namespace);
    // A node of its own: the other e2e tests' agents serve none of its Pods.
    let node = "sonde-e2e-secrets-node";
    make_gated_pod(&pods, "web-1", node, server.addr.port(), "api-ready").await;

    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = start_agent_on(node, &namespace, as_agent(kubeconfig).await, dir.path()).await;
    let state =
        |status: &'static str| move |p: &Pod| condition(p, "sonde.dev/api-ready").is_some_and(|c| c.status == status);
    let p = until(&pods, "web-1", "the gate Unknown (forbidden)", state("Unknown")).await;
    let message = condition(&p, "sonde.dev/api-ready")
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(message.contains("403"), "{message}");
    let note = until_note(&admin, &namespace, "SecretForbidden").await;
    assert!(
        note.contains("sonde-secret-reader") && note.contains(&format!("RoleBinding in namespace \"{namespace}\"")),
        "{note}"
    );

    apply_shipped(&admin, "examples/secret-reader-rolebinding.yaml", Some(&namespace)).await;
    until(&pods, "web-1", "the gate True (bound)", state("True")).await;
    assert!(server.received().iter().any(|r| r.headers.contains(E2E_TOKEN)));

    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(admin.clone(), &namespace);
    secrets.delete("api-token", &DeleteParams::default()).await.unwrap();
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    checks
        .patch("api-ready", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    until(&pods, "web-1", "the gate Unknown (deleted)", state("Unknown")).await;
    let note = until_note(&admin, &namespace, "SecretMissing").await;
    assert!(note.contains("api-token") && note.contains("key \"token\""), "{note}");
    put_secret(&admin, &namespace, E2E_TOKEN).await;
    until(&pods, "web-1", "the gate True (created again)", state("True")).await;

    let events: Api<Event> = Api::namespaced(admin.clone(), &namespace);
    let said = serde_json::to_string(&events.list(&Default::default()).await.unwrap().items).unwrap()
        + &serde_json::to_string(&checks.get("api-ready").await.unwrap()).unwrap()
        + &serde_json::to_string(&pods.get("web-1").await.unwrap()).unwrap();
    assert!(!crate::secrets::holds(&said, E2E_TOKEN), "{said}");
    drop(gates);
    agent.stop().await;
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
}

/// [`secret_refs`] against a real API server: runs only with
/// `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_secret_refs_against_a_real_api_server() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_secret_refs_against_a_real_api_server",
        "the CRDs of deploy/kubernetes/crd.yaml installed",
    ) else {
        return;
    };
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    secret_refs(&path).await;
}
