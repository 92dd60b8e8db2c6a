//! SondeNodeChecks against a real API server (no kubelet: the test creates
//! the Node object and plays the kubelet's condition): run by
//! [`e2e_node_checks_against_a_real_api_server`] when
//! `SONDE_E2E_KUBECONFIG` names a kubeconfig. It applies both CRDs of the
//! shipped `crd.yaml` (so it also shows they install on the server's
//! version), runs a tcp node check against a real local TCP server it
//! starts, stops and starts again on the same port, and follows the
//! condition, its heartbeat, the Events and the taint on the Node; then,
//! where the server serves ValidatingAdmissionPolicy, the shipped RBAC and
//! admission policy against requests made as the agent. It deletes the
//! Nodes, checks and policies it made; CRDs and RBAC it applied stay (other
//! e2e tests use them).

use super::e2e::client;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sonde_kubernetes as kubernetes;
use sonde_kubernetes::node::SondeNodeCheck;
use sonde_tests::manifests::{split, text};
use std::path::Path;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(60);
/// The shortest heartbeat the agent takes.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Applies every CRD of the shipped `crd.yaml` and waits until each is
/// established.
pub(super) async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for doc in split(&text("crd.yaml")) {
        let crd: CustomResourceDefinition = serde_saphyr::from_str(doc).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        crds.patch(&name, &PatchParams::apply("sonde-e2e").force(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("the server refuses the shipped CRD {name}: {e}"));
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(
            PATIENCE,
            kube::runtime::wait::await_condition(crds.clone(), &name, established),
        )
        .await
        .expect("the CRD established")
        .expect("watch the CRD");
    }
}

/// The shipped admission policies, in a server-side dry run, where the
/// server serves ValidatingAdmissionPolicy v1 (1.30 and newer): the
/// server compiles their CEL.
async fn dry_run_admission_policies(client: &Client) {
    let served = client.list_api_group_resources("admissionregistration.k8s.io/v1").await;
    if !served.is_ok_and(|l| l.resources.iter().any(|r| r.name == "validatingadmissionpolicies")) {
        eprintln!("no ValidatingAdmissionPolicy v1 on this server: admission-policy.yaml not tried");
        return;
    }
    for doc in split(&text("admission-policy.yaml")) {
        let object: DynamicObject = serde_saphyr::from_str(doc).expect("an object");
        let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let name = object.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("sonde-e2e").dry_run(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("admission-policy.yaml: {} {name} refused: {e}", gvk.kind));
    }
}

/// A real TCP server on a fixed loopback port, stopped and started again.
struct Port {
    port: u16,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Port {
    async fn start(port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        Self { port, task: Some(task) }
    }

    /// Stops listening: connections are refused.
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// Condition `t` of `node`, if it has one.
pub(super) fn condition(node: &Node, t: &str) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .cloned()
}

pub(super) fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

async fn until(nodes: &Api<Node>, name: &str, what: &str, f: impl Fn(&Node) -> bool) -> Node {
    let cond = move |n: Option<&Node>| n.is_some_and(&f);
    tokio::time::timeout(
        PATIENCE,
        kube::runtime::wait::await_condition(nodes.clone(), name, cond),
    )
    .await
    .unwrap_or_else(|_| panic!("{name}: timed out waiting for {what}"))
    .expect("watch the Node")
    .unwrap_or_else(|| panic!("{name}: deleted while waiting for {what}"))
}

/// The Node, with the kubelet's Ready condition as a kubelet would post it.
async fn make_node(nodes: &Api<Node>, name: &str, label: &str) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"sonde.dev/e2e": label}},
        "spec": {"taints": [{"key": "example.com/keep", "effect": "PreferNoSchedule"}]}
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create the Node");
    let status = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "played by the test",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]}});
    let params = PatchParams {
        field_manager: Some("e2e-kubelet".into()),
        ..PatchParams::default()
    };
    nodes
        .patch_status(name, &params, &Patch::Strategic(&status))
        .await
        .expect("play the kubelet");
}

async fn start_agent(client: Client, node: &str, dir: &Path) -> (sonde::agent::Agent, kubernetes::GateController) {
    let config = "tenants:\n  - id: node\n    ceiling: {net: [\"127.0.0.0/8:*\"]}\ntargets: []\n";
    let settings = crate::kubernetes::node_settings(node, HEARTBEAT, 5.0);
    crate::kubernetes::start_gates(client, dir, config, settings, false).await
}

async fn run(kubeconfig: &Path) {
    let client = client(kubeconfig).await;
    install_crds(&client).await;
    dry_run_admission_policies(&client).await;
    let id = fastrand::u32(..);
    let node_name = format!("sonde-e2e-node-{id}");
    let nodes: Api<Node> = Api::all(client.clone());
    make_node(&nodes, &node_name, &id.to_string()).await;
    let checks: Api<SondeNodeCheck> = Api::all(client.clone());
    let mut port = Port::start(0).await;
    let type_ = format!("SondeE2EPortDown{id}");
    let taint = format!("sonde.dev/e2e-port-{id}");
    let name = format!("e2e-port-{id}");
    let check: SondeNodeCheck = serde_json::from_value(json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheck",
        "metadata": {"name": name},
        "spec": {"plugin": "tcp", "target": format!("$(NODE_IP):{}", port.port), "periodSeconds": 1,
                 "failureThreshold": 1, "nodeSelector": {"matchLabels": {"sonde.dev/e2e": id.to_string()}},
                 "condition": {"type": type_, "problemReason": "PortClosed", "okReason": "PortOpen"},
                 "taint": {"key": taint, "effect": "NoSchedule"}}
    }))
    .unwrap();
    checks
        .create(&PostParams::default(), &check)
        .await
        .expect("create the SondeNodeCheck");
    let kubelets = kubelet_type_refused(&checks, id).await;

    let dir = tempfile::tempdir().unwrap();
    let (agent, controller) = start_agent(client.clone(), &node_name, dir.path()).await;
    let n = until(&nodes, &node_name, "the condition False", |n| {
        condition(n, &type_).is_some_and(|c| c.status == "False")
    })
    .await;
    let first = condition(&n, &type_).unwrap();
    assert_eq!(first.reason.as_deref(), Some("PortOpen"));
    assert_eq!(
        condition(&n, "Ready").unwrap().message.as_deref(),
        Some("played by the test"),
        "the kubelet's condition stays"
    );
    let managed: Vec<String> = n
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some("sonde-node"))
        .map(|m| serde_json::to_value(&m.fields_v1).unwrap().to_string())
        .collect();
    assert_eq!(managed.len(), 1, "{managed:?}");
    assert!(
        managed[0].contains(&type_) && !managed[0].contains("\\\"Ready\\\""),
        "{managed:?}"
    );

    // The heartbeat advances while the condition holds.
    let beat = first.last_heartbeat_time.clone().expect("a heartbeat").0;
    until(&nodes, &node_name, "a newer heartbeat", |n| {
        condition(n, &type_).is_some_and(|c| c.last_heartbeat_time.is_some_and(|t| t.0 > beat) && c.status == "False")
    })
    .await;

    // The server stops: the problem is present, the taint comes.
    port.stop().await;
    let n = until(&nodes, &node_name, "the condition True and the taint", |n| {
        condition(n, &type_).is_some_and(|c| c.status == "True") && has_taint(n, &taint)
    })
    .await;
    assert_eq!(condition(&n, &type_).unwrap().reason.as_deref(), Some("PortClosed"));
    assert!(has_taint(&n, "example.com/keep"), "others' taints stay");

    // It starts again on the same port: cleared, the taint goes.
    let _port = Port::start(port.port).await;
    let n = until(&nodes, &node_name, "the condition False, no taint", |n| {
        condition(n, &type_).is_some_and(|c| c.status == "False") && !has_taint(n, &taint)
    })
    .await;
    assert!(has_taint(&n, "example.com/keep"));

    // One Event on the Node per transition: a reason seen again within
    // the recorder's window is counted in the first one's series.
    let events: Api<Event> = Api::all(client.clone());
    let count = |list: &[Event], reason: &str| -> i32 {
        list.iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node_name.as_str()))
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum()
    };
    let counts = tokio::time::timeout(PATIENCE, async {
        loop {
            let list = events.list(&Default::default()).await.expect("list Events").items;
            let counts = (count(&list, "PortOpen"), count(&list, "PortClosed"));
            if counts.0 + counts.1 >= 3 {
                return counts;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("three Events on the Node");
    assert_eq!(counts, (2, 1), "opened, closed, opened again");

    // The check goes: its condition goes with it.
    checks
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the check");
    until(&nodes, &node_name, "the condition removed", |n| {
        condition(n, &type_).is_none()
    })
    .await;
    drop(controller);
    agent.stop().await;
    the_policy_keeps_the_agent_to_its_own_node(&client, &node_name, id).await;
    if let Some(k) = kubelets {
        let _ = checks.delete(&k, &DeleteParams::default()).await;
    }
    let _ = nodes.delete(&node_name, &DeleteParams::default()).await;
}

/// A request as sonde's agent on `node` makes it: its ServiceAccount, with
/// the node's name in the user info's extra, as a bound token carries it
/// (impersonated by the test's admin); the API's error code, if any.
async fn as_agent(client: &Client, node: &str, path: &str, content_type: &str, body: serde_json::Value) -> Option<u16> {
    let request = http::Request::patch(path)
        .header("Content-Type", content_type)
        .header("Impersonate-User", "system:serviceaccount:sonde-system:sonde")
        .header("Impersonate-Group", "system:serviceaccounts")
        .header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", node)
        .body(body.to_string().into_bytes())
        .unwrap();
    match client.request_text(request).await {
        Ok(_) => None,
        Err(kube::Error::Api(e)) => {
            eprintln!("as the agent: PATCH {path}: {} {}", e.code, e.message);
            Some(e.code)
        }
        Err(e) => panic!("{path}: {e}"),
    }
}

/// The shipped `rbac.yaml` and `admission-policy.yaml`, applied, keep the
/// agent's ServiceAccount to its own Node: its condition is written, but
/// not another Node's, not the kubelet's `Ready`, not a taint in
/// Kubernetes' own domains, not a label. Where the server serves
/// ValidatingAdmissionPolicy v1 only; the policies the test made are
/// deleted.
async fn the_policy_keeps_the_agent_to_its_own_node(client: &Client, node: &str, id: u32) {
    let served = client.list_api_group_resources("admissionregistration.k8s.io/v1").await;
    if !served.is_ok_and(|l| l.resources.iter().any(|r| r.name == "validatingadmissionpolicies")) {
        return;
    }
    let mut made = Vec::new();
    for file in ["rbac.yaml", "admission-policy.yaml"] {
        for doc in split(&text(file)) {
            let object: DynamicObject = serde_saphyr::from_str(doc).expect("an object");
            let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
            let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
            let name = object.metadata.name.clone().unwrap();
            let api: Api<DynamicObject> = match &object.metadata.namespace {
                Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                    Api::namespaced_with(client.clone(), ns, &resource)
                }
                _ => Api::all_with(client.clone(), &resource),
            };
            if file == "admission-policy.yaml" && api.get_opt(&name).await.unwrap().is_none() {
                made.push((api.clone(), name.clone()));
            }
            api.patch(&name, &PatchParams::apply("sonde-e2e").force(), &Patch::Apply(&object))
                .await
                .unwrap_or_else(|e| panic!("{file}: apply {} {name}: {e}", gvk.kind));
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let other = format!("sonde-e2e-other-{id}");
    make_node(&nodes, &other, "other").await;
    let strategic = "application/strategic-merge-patch+json";
    let merge = "application/merge-patch+json";
    let condition = |t: &str| {
        json!({"status": {"conditions": [{"type": t, "status": "False", "reason": "Fine",
               "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}})
    };
    let status = |n: &str| format!("/api/v1/nodes/{n}/status");
    // The binding takes a moment to apply.
    let denied = tokio::time::timeout(PATIENCE, async {
        loop {
            if as_agent(client, node, &status(&other), strategic, condition("Sonde")).await == Some(403) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(denied.is_ok(), "another Node's status is refused");
    assert_eq!(
        as_agent(client, node, &status(node), strategic, condition("Sonde")).await,
        None,
        "its own condition"
    );
    assert_eq!(
        as_agent(client, node, &status(node), strategic, condition("Ready")).await,
        Some(403),
        "the kubelet's"
    );
    // The Node's taints as they are (the API server's TaintNodesByCondition
    // put node.kubernetes.io/not-ready on it), and one more.
    let current = nodes.get(node).await.unwrap().spec.unwrap().taints.unwrap_or_default();
    let taints = |key: &str| {
        let mut all = serde_json::to_value(&current).unwrap();
        all.as_array_mut()
            .unwrap()
            .push(json!({"key": key, "effect": "NoSchedule"}));
        json!({"spec": {"taints": all}})
    };
    let path = format!("/api/v1/nodes/{node}");
    assert_eq!(
        as_agent(client, node, &path, merge, taints("sonde.dev/x")).await,
        None,
        "a taint of its own"
    );
    assert_eq!(
        as_agent(client, node, &path, merge, taints("node.kubernetes.io/unreachable")).await,
        Some(403),
        "Kubernetes' taint"
    );
    let label = json!({"metadata": {"labels": {"sonde.dev/e2e": "changed"}}});
    assert_eq!(as_agent(client, node, &path, merge, label).await, Some(403), "a label");
    let _ = nodes.delete(&other, &DeleteParams::default()).await;
    for (api, name) in made {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

/// A check claiming the kubelet's `Ready`: the CRD's CEL rule refuses it
/// where the server runs CEL; elsewhere (1.24 without the feature gate) it
/// is created, and its name is returned for the agent to refuse and the
/// test to delete.
async fn kubelet_type_refused(checks: &Api<SondeNodeCheck>, id: u32) -> Option<String> {
    let name = format!("e2e-claims-ready-{id}");
    let check: SondeNodeCheck = serde_json::from_value(json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheck",
        "metadata": {"name": name},
        "spec": {"plugin": "tcp", "target": "127.0.0.1:1", "condition": {"type": "Ready"},
                 "nodeSelector": {"matchLabels": {"sonde.dev/e2e": id.to_string()}}}
    }))
    .unwrap();
    match checks.create(&PostParams::default(), &check).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("the kubelet owns"), "{}", e.message);
            None
        }
        Err(e) => panic!("create: {e}"),
        Ok(_) => {
            eprintln!("the server does not run the CRD's CEL rules: the agent refuses the kubelet's type instead");
            Some(name)
        }
    }
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_node_checks_against_a_real_api_server() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_node_checks_against_a_real_api_server",
        "the CRDs of deploy/kubernetes/crd.yaml installed",
    ) else {
        return;
    };
    run(&path).await;
}
