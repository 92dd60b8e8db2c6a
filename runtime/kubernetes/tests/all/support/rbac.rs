//! The rules the shipped `rbac.yaml` grants sonde's ServiceAccount, and
//! whether they allow a request the agent sent the mocked API server. The
//! sonde crate's tests include this file too (`#[path]`), for the shipped
//! install.

use super::fake_api::Recorded;
use super::fake_secrets::manifest;
use serde_json::Value;

fn of_kind(docs: &[Value], kind: &str, name: &str) -> Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .clone()
}

/// The rules the shipped `rbac.yaml` grants sonde's ServiceAccount, each
/// with the namespace it holds in (`None`: a ClusterRole, everywhere).
pub(crate) fn agent_rules() -> Vec<(Option<String>, Value)> {
    let rbac = manifest("rbac.yaml");
    let bound = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["kind"] == "ServiceAccount" && s["name"] == "sonde" && s["namespace"] == "sonde-system")
    };
    let mut rules = Vec::new();
    for b in rbac
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
    {
        if !bound(b) {
            continue;
        }
        let role = of_kind(
            &rbac,
            b["roleRef"]["kind"].as_str().unwrap(),
            b["roleRef"]["name"].as_str().unwrap(),
        );
        let namespace = role["metadata"]["namespace"].as_str().map(str::to_string);
        assert_eq!(
            namespace.as_deref(),
            b["metadata"]["namespace"].as_str(),
            "a RoleBinding binds a Role of its own namespace"
        );
        for rule in role["rules"].as_array().unwrap() {
            rules.push((namespace.clone(), rule.clone()));
        }
    }
    rules
}

/// Whether `rules` allow the API request `r`, read as RBAC reads it: its
/// group, resource (and subresource), namespace and verb.
pub(crate) fn agent_may(rules: &[(Option<String>, Value)], r: &Recorded) -> bool {
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts[0] {
        "api" => ("", &parts[2..]),
        _ => (parts[1], &parts[3..]),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let resource = match rest {
        [res, _, sub] => format!("{res}/{sub}"),
        [res, ..] => res.to_string(),
        [] => return false,
    };
    let verb = match (r.method.as_str(), rest.len()) {
        ("GET", 1) if r.query.contains("watch=true") => "watch",
        ("GET", 1) => "list",
        ("GET", _) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => return false,
    };
    let has = |v: &Value, want: &str| v.as_array().unwrap().iter().any(|x| x == want || x == "*");
    rules.iter().any(|(ns, rule)| {
        (ns.is_none() || ns.as_deref() == namespace)
            && has(&rule["apiGroups"], group)
            && has(&rule["resources"], &resource)
            && has(&rule["verbs"], verb)
    })
}
