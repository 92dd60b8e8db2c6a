//! The shipped gate injection (`deploy/kubernetes/gate-injection*.yaml`)
//! read as it is: one MutatingAdmissionPolicy and its binding per
//! admissionregistration version, in agreement with the shipped CRD, the
//! shipped namespace and the controller's gate prefix. What it does to
//! Pods is the sonde crate's `kubernetes::e2e_injection`'s, against a real
//! API server.

use crate::support::repo;
use serde_json::{Value, json};
use sonde_kubernetes::crd::{GATE_PREFIX, SELECTOR_OPERATORS};
use sonde_tests::manifests::{split, text};

/// The file's documents, parsed.
fn documents(name: &str) -> Vec<Value> {
    split(&text(name))
        .iter()
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect()
}

/// The one object of `kind` in `docs`.
fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

/// `gate-injection-v1beta1.yaml` is `gate-injection.yaml` with the
/// apiVersion of 1.34 and 1.35, and nothing else changed.
#[test]
fn the_two_versions_differ_in_their_api_version_only() {
    let v1 = text("gate-injection.yaml");
    let beta = text("gate-injection-v1beta1.yaml");
    let version = |v: &str| format!("apiVersion: admissionregistration.k8s.io/{v}\n");
    assert_eq!(v1.matches(&version("v1")).count(), 2, "the policy and its binding");
    assert_eq!(beta.matches(&version("v1beta1")).count(), 2);
    let beta = beta.replace(&version("v1beta1"), &version("v1"));
    let differ = beta.lines().zip(v1.lines()).enumerate().find(|(_, (b, v))| b != v);
    assert_eq!(differ, None, "line (from 0) of the v1beta1 file and of the v1 file");
    assert_eq!(beta, v1, "one file is longer");
    for name in ["gate-injection.yaml", "gate-injection-v1beta1.yaml"] {
        let kinds: Vec<Value> = documents(name).iter().map(|d| d["kind"].clone()).collect();
        assert_eq!(
            kinds,
            ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"],
            "{name}"
        );
    }
}

/// The policy takes SondeChecks of the shipped CRD's group and version as
/// parameters, all of them in the Pod's namespace, only those with a
/// `podSelector`, and adds the gate the controller follows.
#[test]
fn the_policy_takes_sondechecks_and_adds_the_controllers_gate() {
    let docs = documents("gate-injection.yaml");
    let policy = of_kind(&docs, "MutatingAdmissionPolicy");
    let binding = of_kind(&docs, "MutatingAdmissionPolicyBinding");
    let crd: Value = serde_saphyr::from_str(split(&text("crd.yaml"))[0]).unwrap();
    let group = crd["spec"]["group"].as_str().unwrap();
    let version = crd["spec"]["versions"][0]["name"].as_str().unwrap();
    assert_eq!(
        policy["spec"]["paramKind"],
        json!({"apiVersion": format!("{group}/{version}"), "kind": crd["spec"]["names"]["kind"]})
    );
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(
        binding["spec"]["paramRef"],
        json!({"selector": {}, "parameterNotFoundAction": "Allow"})
    );
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(
        rules,
        &json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]),
        "Pods when created, nothing else"
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        "has(params.spec.podSelector)"
    );
    let variable = |name: &str| -> String {
        let all = policy["spec"]["variables"].as_array().unwrap();
        let v = all
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"));
        v["expression"].as_str().unwrap().to_string()
    };
    assert_eq!(variable("gate"), format!("'{GATE_PREFIX}' + params.metadata.name"));
    let patch = policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
        .as_str()
        .unwrap();
    assert!(
        patch.starts_with("variables.selected && !variables.gated ?"),
        "only a selected Pod without the gate is patched: {patch}"
    );
    assert!(patch.contains("conditionType: variables.gate"), "{patch}");
    assert!(variable("gated").contains("g.conditionType == variables.gate"));
    // Every operator the CRD admits is evaluated, and no other.
    let selected = variable("selected");
    for op in SELECTOR_OPERATORS {
        assert!(selected.contains(&format!("e.operator == '{op}'")), "{op}: {selected}");
    }
    assert_eq!(selected.matches("e.operator == ").count(), SELECTOR_OPERATORS.len());
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let selector = &schema["podSelector"]["properties"];
    assert_eq!(
        selector["matchExpressions"]["items"]["properties"]["operator"]["enum"],
        json!(SELECTOR_OPERATORS)
    );
    assert_eq!(selector["matchLabels"]["additionalProperties"]["type"], "string");
}

/// Opted-in namespaces only, never sonde's own (the Namespace of
/// `rbac.yaml`), and a Pod is never blocked: failurePolicy Ignore.
#[test]
fn the_binding_is_opt_in_and_never_blocks_a_pod() {
    let docs = documents("gate-injection.yaml");
    let policy = of_kind(&docs, "MutatingAdmissionPolicy");
    let binding = of_kind(&docs, "MutatingAdmissionPolicyBinding");
    assert_eq!(policy["spec"]["failurePolicy"], "Ignore");
    assert_eq!(policy["spec"]["reinvocationPolicy"], "Never");
    let rbac: Vec<Value> = split(&text("rbac.yaml"))
        .iter()
        .map(|d| serde_saphyr::from_str(d).unwrap())
        .collect();
    let own = of_kind(&rbac, "Namespace")["metadata"]["name"].clone();
    assert_eq!(
        binding["spec"]["matchResources"],
        json!({"namespaceSelector": {"matchExpressions": [
            {"key": "sonde.dev/readiness-gates", "operator": "In", "values": ["inject"]},
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [own]},
        ]}})
    );
    let opt_in = "kubectl label namespace shop sonde.dev/readiness-gates=inject";
    assert!(
        text("gate-injection.yaml").contains(opt_in),
        "the header says how to opt in"
    );
    let docs = std::fs::read_to_string(repo().join("docs/kubernetes.md")).unwrap();
    assert!(docs.contains(opt_in), "and so do the docs");
}

/// The SondeChecks of docs/kubernetes.md's "Injecting the readiness gate",
/// as shipped, are SondeChecks whose `podSelector` the agents accept.
#[test]
fn the_documented_pod_selectors_are_well_formed() {
    use sonde_kubernetes::crd::{SondeCheck, check_selector};
    let documents = sonde_tests::doc_documents(
        "docs/kubernetes.md",
        "## Injecting the readiness gate",
        "yaml kubernetes",
    );
    assert_eq!(documents.len(), 2);
    for text in &documents {
        let check: SondeCheck = serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let selector = check.spec.pod_selector.expect("a podSelector");
        assert_eq!(check_selector(&selector), Ok(()), "{text}");
    }
}
