//! The mocked API server's Secrets: `GET /api/v1/namespaces/{ns}/secrets/{name}`
//! only (a list or a watch of Secrets fails the test: the agent never
//! makes one), authorised as the API server would by RBAC rules applied
//! from the shipped manifests ([`FakeApi::apply_rbac`]): the agent's
//! ServiceAccount may `get` a Secret where a RoleBinding binds it a role
//! with that rule (the ClusterRole `sonde-secret-reader` of `rbac.yaml`, or
//! a Role of the binding's namespace, `resourceNames` honoured); else 403.
//! A Secret it may read but the world lacks is a 404.

use super::fake_api::{Body, FakeApi, Recorded, World, full, status};
use base64::Engine as _;
use http::Response;
use serde_json::{Value, json};

/// The agent's ServiceAccount, as `rbac.yaml` names it.
const AGENT: (&str, &str) = ("sonde-system", "sonde");

/// Answers a request about Secrets; `None` for any other.
pub(crate) fn answer(w: &mut World, r: &Recorded) -> Option<Response<Body>> {
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    let (namespace, name) = match parts[..] {
        ["api", "v1", "namespaces", ns, "secrets", name] => (ns, name),
        ["api", "v1", "secrets"] | ["api", "v1", "namespaces", _, "secrets"] => {
            panic!(
                "the agent lists or watches Secrets: {} {}?{}",
                r.method, r.path, r.query
            )
        }
        _ => return None,
    };
    assert_eq!(r.method, "GET", "the agent only reads Secrets: {}", r.path);
    assert!(!r.query.contains("watch"), "a watch of one Secret: {}", r.query);
    let allowed = w.secret_rules.iter().any(|(ns, rule)| {
        ns == namespace
            && rule["resources"].as_array().unwrap().iter().any(|x| x == "secrets")
            && rule["verbs"].as_array().unwrap().iter().any(|x| x == "get" || x == "*")
            && rule
                .get("resourceNames")
                .and_then(Value::as_array)
                .is_none_or(|names| names.iter().any(|n| n == name))
    });
    if !allowed {
        let message = format!(
            "secrets \"{name}\" is forbidden: User \"system:serviceaccount:{}:{}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"{namespace}\"",
            AGENT.0, AGENT.1
        );
        return Some(full(403, &status(403, "Forbidden", &message)));
    }
    Some(match w.secrets.get(&(namespace.to_string(), name.to_string())) {
        Some(s) => full(200, s),
        None => full(404, &status(404, "NotFound", &format!("secrets \"{name}\" not found"))),
    })
}

/// The documents of `deploy/kubernetes/<file>`, as shipped.
pub(crate) fn manifest(file: &str) -> Vec<Value> {
    let path = super::repo().join("deploy/kubernetes").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

impl FakeApi {
    /// Adds or replaces Secret `ns/name` holding `data` (key, value).
    pub(crate) fn put_secret(&self, ns: &str, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                let encoded = base64::engine::general_purpose::STANDARD.encode(v);
                (k.to_string(), Value::from(encoded))
            })
            .collect();
        let mut w = self.world();
        w.rv += 1;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"namespace": ns, "name": name, "resourceVersion": w.rv.to_string()},
            "data": data});
        w.secrets.insert((ns.to_string(), name.to_string()), secret);
    }

    /// Deletes Secret `ns/name`.
    pub(crate) fn delete_secret(&self, ns: &str, name: &str) {
        self.world().secrets.remove(&(ns.to_string(), name.to_string()));
    }

    /// Applies the RoleBindings of `deploy/kubernetes/<file>` (and the
    /// Roles it holds) that bind the agent's ServiceAccount, in
    /// `namespace` instead of theirs when given: from then on the agent
    /// may do there what the role's rules say. A ClusterRole comes from
    /// the shipped `rbac.yaml`.
    pub(crate) fn apply_rbac(&self, file: &str, namespace: Option<&str>) {
        let docs = manifest(file);
        let cluster = manifest("rbac.yaml");
        let mut w = self.world();
        for b in docs.iter().filter(|d| d["kind"] == "RoleBinding") {
            let binds_agent = b["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["kind"] == "ServiceAccount" && s["namespace"] == AGENT.0 && s["name"] == AGENT.1);
            if !binds_agent {
                continue;
            }
            let ns = namespace.unwrap_or_else(|| b["metadata"]["namespace"].as_str().unwrap());
            let (kind, name) = (&b["roleRef"]["kind"], &b["roleRef"]["name"]);
            let role = match kind.as_str() {
                Some("ClusterRole") => cluster
                    .iter()
                    .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == *name),
                _ => docs
                    .iter()
                    .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == *name),
            }
            .unwrap_or_else(|| panic!("{file}: no {kind} {name}"));
            for rule in role["rules"].as_array().unwrap() {
                w.secret_rules.push((ns.to_string(), rule.clone()));
            }
        }
    }
}
