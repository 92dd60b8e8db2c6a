//! The shipped gate injection against a real API server that serves
//! MutatingAdmissionPolicy (Kubernetes 1.34 and newer; no kubelet, no
//! controller-manager needed): run by
//! [`e2e_gate_injection_against_a_real_api_server`] when
//! `SONDE_E2E_KUBECONFIG` names a kubeconfig.
//!
//! It applies the shipped CRD and the policy file of the newest
//! admissionregistration version the server serves (`gate-injection.yaml`
//! for v1, else `gate-injection-v1beta1.yaml`), makes a namespace opted in
//! and one not, SondeChecks with and without a `podSelector`, and creates
//! Pods (they stay Pending: admission is all that is tested). When a
//! kube-controller-manager runs (its leader Lease is fresh), it also
//! creates a StatefulSet and a Deployment and checks the Pods their
//! controllers make: gated where their labels are selected, their
//! templates untouched. It deletes what it made, the CRD and the policy
//! only when it installed them.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::json;
use sonde_kubernetes::crd::{GATE_PREFIX, SondeCheck};
use sonde_tests::manifests::{split, text};
use std::path::Path;
use std::time::{Duration, Instant};

const MANAGER: &str = "sonde-e2e";
const GROUP: &str = "admissionregistration.k8s.io";
/// How long a new binding may take to apply to Pods.
const BINDING_PATIENCE: Duration = Duration::from_secs(30);

/// What the test installed, to delete at the end.
#[derive(Default)]
struct Installed {
    crd: bool,
    policy: Vec<(ApiResource, String)>,
}

/// The policy file for the newest version of MutatingAdmissionPolicy the
/// server serves; `None` (said why) on a server older than 1.34, which has
/// none: the suite is for the versions that have gate injection.
async fn policy_file(client: &Client) -> Option<&'static str> {
    for (version, file) in [
        ("v1", "gate-injection.yaml"),
        ("v1beta1", "gate-injection-v1beta1.yaml"),
    ] {
        let served = client.list_api_group_resources(&format!("{GROUP}/{version}")).await;
        if served.is_ok_and(|l| l.resources.iter().any(|r| r.name == "mutatingadmissionpolicies")) {
            return Some(file);
        }
    }
    let info = client.apiserver_version().await.expect("the server's version");
    let minor: u32 = info.minor.trim_end_matches('+').parse().expect("a minor version");
    assert!(
        (info.major.as_str(), minor) < ("1", 34),
        "Kubernetes {}: the server serves no MutatingAdmissionPolicy (on 1.34 and 1.35 its v1beta1 must be enabled)",
        info.git_version
    );
    eprintln!(
        "SKIPPED e2e_gate_injection_against_a_real_api_server: Kubernetes {} has no MutatingAdmissionPolicy (1.34 or newer)",
        info.git_version
    );
    None
}

/// Applies the shipped CRD and waits until it is established and serves
/// `podSelector` (a SondeCheck's field is pruned until then).
async fn install_crd(client: &Client, installed: &mut Installed) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // The first document: SondeCheck's (SondeNodeCheck's follows).
    let crd: CustomResourceDefinition = serde_saphyr::from_str(split(&text("crd.yaml"))[0]).unwrap();
    let name = crd.metadata.name.clone().unwrap();
    installed.crd = crds.get_opt(&name).await.expect("get the CRD").is_none();
    crds.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd))
        .await
        .expect("apply the shipped CRD");
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(
        BINDING_PATIENCE,
        kube::runtime::wait::await_condition(crds, &name, established),
    )
    .await
    .expect("the CRD established")
    .expect("watch the CRD");
}

/// Applies the objects of `file` (cluster-scoped), noting the ones that
/// were not there before.
async fn install_policy(client: &Client, file: &str, installed: &mut Installed) {
    let text = text(file);
    for doc in split(&text) {
        let object: DynamicObject = serde_saphyr::from_str(doc).expect("an object");
        let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
        let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.expect("a served kind");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let name = object.metadata.name.clone().unwrap();
        if api.get_opt(&name).await.unwrap().is_none() {
            installed.policy.push((resource.clone(), name.clone()));
        }
        api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{file}: apply {} {name}: {e}", gvk.kind));
    }
}

/// Creates namespace `name` (with `labels`) and its `default`
/// ServiceAccount, which Pods need and no controller-manager may make.
pub(super) async fn namespace(client: &Client, name: &str, labels: serde_json::Value) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create the namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    match accounts.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create the default ServiceAccount of {name}: {e}"),
    }
}

/// Creates SondeCheck `name` in `namespace`, with `selector` as its
/// `podSelector` when given, and checks the server kept it.
async fn check(client: &Client, namespace: &str, name: &str, selector: Option<serde_json::Value>) {
    let checks: Api<SondeCheck> = Api::namespaced(client.clone(), namespace);
    let mut spec = json!({"plugin": "http", "port": 8080});
    if let Some(s) = &selector {
        spec["podSelector"] = s.clone();
    }
    let c: SondeCheck = serde_json::from_value(json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    let made = checks
        .create(&PostParams::default(), &c)
        .await
        .expect("create the SondeCheck");
    assert_eq!(
        made.spec.pod_selector.is_some(),
        selector.is_some(),
        "{namespace}/{name}: the podSelector as sent"
    );
}

/// Creates Pod `name` with `labels` and `gates` (condition types), and
/// returns the condition types of the readiness gates it was created with.
async fn pod(client: &Client, namespace: &str, name: &str, labels: serde_json::Value, gates: &[&str]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let gates: Vec<_> = gates.iter().map(|g| json!({"conditionType": g})).collect();
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]});
    if !gates.is_empty() {
        spec["readinessGates"] = json!(gates);
    }
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec})).unwrap();
    let made = pods
        .create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("create Pod {namespace}/{name}: {e}"));
    let gates = made.spec.and_then(|s| s.readiness_gates).unwrap_or_default();
    gates.into_iter().map(|g| g.condition_type).collect()
}

/// Waits until the binding applies: a throwaway Pod that must be gated
/// is created and deleted until it is.
async fn until_the_binding_applies(client: &Client, namespace: &str) -> Duration {
    let start = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for i in 0.. {
        let name = format!("throwaway-{i}");
        let gates = pod(client, namespace, &name, json!({"app": "web"}), &[]).await;
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        if !gates.is_empty() {
            break;
        }
        assert!(start.elapsed() < BINDING_PATIENCE, "the binding never applied");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    start.elapsed()
}

async fn run(kubeconfig: &Path) {
    let started = Instant::now();
    let client = super::e2e::client(kubeconfig).await;
    let Some(file) = policy_file(&client).await else {
        return;
    };
    let mut installed = Installed::default();
    install_crd(&client, &mut installed).await;
    install_policy(&client, file, &mut installed).await;
    let id = fastrand::u32(..);
    let (shop, other) = (format!("sonde-inject-{id}"), format!("sonde-plain-{id}"));
    namespace(&client, &shop, json!({"sonde.dev/readiness-gates": "inject"})).await;
    namespace(&client, &other, json!({})).await;
    checks(&client, &shop, &other).await;
    let waited = until_the_binding_applies(&client, &shop).await;
    the_pods_get_their_gates(&client, &shop, &other).await;
    let workloads = workload_pods_get_their_gates(&client, &shop, &other).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&shop, &other] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
    uninstall(&client, installed).await;
    eprintln!(
        "e2e gate injection ({file}): the binding applied after {waited:?}, {:?} in all; {workloads}",
        started.elapsed()
    );
}

/// SondeChecks in `shop` selecting with each operator, one without a
/// `podSelector`, and one in `other`, a namespace not opted in.
async fn checks(client: &Client, shop: &str, other: &str) {
    check(client, shop, "web", Some(json!({"matchLabels": {"app": "web"}}))).await;
    let canary = json!({"matchExpressions": [{"key": "track", "operator": "In", "values": ["canary"]},
                                             {"key": "legacy", "operator": "DoesNotExist"}]});
    check(client, shop, "canary", Some(canary)).await;
    let stable = json!({"matchExpressions": [{"key": "app", "operator": "Exists"},
                                             {"key": "track", "operator": "NotIn", "values": ["canary"]}]});
    check(client, shop, "stable", Some(stable)).await;
    check(client, shop, "manual", None).await;
    check(client, other, "web", Some(json!({"matchLabels": {"app": "web"}}))).await;
}

/// The Pods created in `shop` get the gates of the checks that select
/// them, once each; those in `other` get none.
async fn the_pods_get_their_gates(client: &Client, shop: &str, other: &str) {
    // The gates a Pod is created with, sorted (one evaluation per
    // SondeCheck, in no promised order).
    let gates = async |ns: &str, name: &str, labels, given: &[&str]| {
        let mut made = pod(client, ns, name, labels, given).await;
        made.sort();
        made
    };
    let gate = |check: &str| format!("{GATE_PREFIX}{check}");
    let (web, stable) = (gate("web"), gate("stable"));
    let made = gates(shop, "web-1", json!({"app": "web"}), &[]).await;
    assert_eq!(
        made,
        [stable.clone(), web.clone()],
        "matchLabels, Exists and NotIn select it"
    );
    let made = gates(shop, "web-2", json!({"app": "web"}), &[&web, "example.com/x"]).await;
    assert_eq!(
        made,
        ["example.com/x".to_string(), stable.clone(), web.clone()],
        "a gate already there is not added twice"
    );
    let made = gates(shop, "canary-1", json!({"app": "web", "track": "canary"}), &[]).await;
    assert_eq!(made, [gate("canary"), web.clone()], "In selects it, NotIn does not");
    let made = gates(shop, "canary-legacy", json!({"track": "canary", "legacy": "y"}), &[]).await;
    assert!(made.is_empty(), "DoesNotExist fails: {made:?}");
    let made = gates(shop, "bare", json!({}), &[]).await;
    assert!(made.is_empty(), "a Pod no podSelector matches is left alone: {made:?}");
    let made = gates(other, "web-1", json!({"app": "web"}), &[]).await;
    assert!(made.is_empty(), "a namespace not opted in is left alone: {made:?}");
}

/// How long a workload controller may take to make its first Pod.
const CONTROLLER_PATIENCE: Duration = Duration::from_secs(60);

/// Whether a kube-controller-manager runs: its leader Lease was renewed
/// within the last minute.
async fn controller_manager_runs(client: &Client) -> bool {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let Ok(Some(lease)) = leases.get_opt("kube-controller-manager").await else {
        return false;
    };
    let renewed = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    renewed.is_some_and(|t| {
        let now = k8s_openapi::jiff::Timestamp::now();
        now.duration_since(t).as_secs() < 60
    })
}

/// The gates of the first Pod in `namespace` whose name starts with
/// `prefix`, once its controller has made it.
async fn first_pod_gates(client: &Client, namespace: &str, prefix: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    loop {
        let list = pods.list(&Default::default()).await.expect("list Pods");
        let made = list
            .items
            .into_iter()
            .find(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix)));
        if let Some(p) = made {
            let mut gates: Vec<String> = p
                .spec
                .and_then(|s| s.readiness_gates)
                .unwrap_or_default()
                .into_iter()
                .map(|g| g.condition_type)
                .collect();
            gates.sort();
            return gates;
        }
        assert!(
            start.elapsed() < CONTROLLER_PATIENCE,
            "no Pod {prefix}* in {namespace} after {CONTROLLER_PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A workload object of `kind` (`StatefulSet` or `Deployment`) named
/// `name`, its Pods labelled `labels`.
fn workload(kind: &str, name: &str, labels: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}
        }
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// With a controller-manager: a StatefulSet's and a Deployment's Pods in
/// `shop` get the gates of the checks selecting their labels, a
/// StatefulSet's in `other` none, and no template is changed. Says what
/// it did, or why it did nothing.
async fn workload_pods_get_their_gates(client: &Client, shop: &str, other: &str) -> String {
    if !controller_manager_runs(client).await {
        return "workloads skipped: no kube-controller-manager runs (no fresh kube-system/kube-controller-manager Lease)"
            .into();
    }
    let start = Instant::now();
    let gate = |check: &str| format!("{GATE_PREFIX}{check}");
    for ns in [shop, other] {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let set: StatefulSet = serde_json::from_value(workload("StatefulSet", "db", json!({"app": "web"}))).unwrap();
        sets.create(&PostParams::default(), &set)
            .await
            .expect("create the StatefulSet");
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), shop);
    let canary = json!({"app": "web", "track": "canary"});
    let d: Deployment = serde_json::from_value(workload("Deployment", "api", canary)).unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("create the Deployment");
    assert_eq!(
        first_pod_gates(client, shop, "db-").await,
        [gate("stable"), gate("web")],
        "the StatefulSet's Pod is gated by the checks selecting app=web"
    );
    assert_eq!(
        first_pod_gates(client, shop, "api-").await,
        [gate("canary"), gate("web")],
        "the Deployment's Pod is gated by the checks selecting it"
    );
    assert!(
        first_pod_gates(client, other, "db-").await.is_empty(),
        "a namespace not opted in is left alone"
    );
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), shop);
    let template = sets.get("db").await.unwrap().spec.unwrap().template;
    assert!(
        template.spec.unwrap().readiness_gates.is_none(),
        "the template itself is not mutated"
    );
    format!("a StatefulSet's and a Deployment's Pods gated in {:?}", start.elapsed())
}

/// Deletes what [`install_crd`] and [`install_policy`] made.
async fn uninstall(client: &Client, installed: Installed) {
    for (resource, name) in installed.policy.iter().rev() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    if installed.crd {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let _ = crds.delete("sondechecks.sonde.dev", &DeleteParams::default()).await;
    }
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_gate_injection_against_a_real_api_server() {
    let Some(path) = crate::support::kube::e2e_kubeconfig(
        "e2e_gate_injection_against_a_real_api_server",
        "Kubernetes 1.34 or newer, MutatingAdmissionPolicy enabled",
    ) else {
        return;
    };
    run(&path).await;
}
