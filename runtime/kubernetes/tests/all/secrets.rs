//! SondeChecks' `secretRefs` and the shipped RBAC: what `rbac.yaml` and
//! the shipped examples let the agent read. The agent's own reads of
//! Secrets, checked against its API's answers too, are in the sonde
//! crate's tests (`kubernetes::secrets`).

use crate::support::fake_api::*;
use serde_json::{Value, json};

/// The shipped RBAC: `rbac.yaml` lets the agent read no Secret anywhere;
/// each shipped example, applied, lets it `get` Secrets in its own
/// namespace only (the narrowed one: only those it names), and never list
/// or watch them.
#[test]
fn the_shipped_rbac_reads_no_secret_until_a_namespace_opts_in() {
    use crate::support::rbac::{agent_may, agent_rules};
    let get = |ns: &str, name: &str| Recorded {
        method: "GET".into(),
        path: format!("/api/v1/namespaces/{ns}/secrets/{name}"),
        query: String::new(),
        content_type: String::new(),
        body: Value::Null,
    };
    let rules = agent_rules();
    assert!(
        !agent_may(&rules, &get("shop", "api-token")),
        "no Secret without an opt-in"
    );
    let reader = crate::support::fake_secrets::manifest("rbac.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "sonde-secret-reader")
        .expect("the ClusterRole sonde-secret-reader");
    assert_eq!(
        reader["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
        "get, never list or watch"
    );
    for (file, names) in [
        ("examples/secret-reader-rolebinding.yaml", None),
        ("examples/secret-reader-role-narrowed.yaml", Some(vec!["api-token"])),
    ] {
        let api = FakeApi::new();
        api.apply_rbac(file, None);
        let rules = api.world().secret_rules.clone();
        assert!(rules.iter().all(|(ns, _)| ns == "shop"), "{file}: its namespace only");
        let may = |ns: &str, name: &str| {
            rules.iter().any(|(n, r)| {
                n == ns
                    && r["verbs"] == json!(["get"])
                    && r.get("resourceNames")
                        .is_none_or(|v| v.as_array().unwrap().iter().any(|x| x == name))
            })
        };
        assert!(may("shop", "api-token"), "{file}");
        assert!(!may("other", "api-token"), "{file}");
        assert_eq!(may("shop", "unnamed"), names.is_none(), "{file}");
    }
}
