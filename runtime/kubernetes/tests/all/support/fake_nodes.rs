//! The mocked API server's Nodes and SondeNodeChecks: the agent's watch of
//! its own Node (by `metadata.name`), every SondeNodeCheck, the
//! strategic-merge patch of `nodes/<name>/status` (merged by condition
//! `type`, `$patch: delete` honoured, as the real one does), the JSON merge
//! patch of a Node's taints under a resourceVersion precondition, and the
//! merge patch of a SondeNodeCheck's status. Every write is checked for
//! what it may carry.

use super::fake_api::{Body, Recorded, World, full, line, status, stream};
use http::Response;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tokio::sync::mpsc;

/// The condition types the kubelet owns: sonde never writes one.
pub(crate) const KUBELET_OWNED: [&str; 5] = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

/// Answers a request about Nodes or SondeNodeChecks; `None` for any other.
pub(crate) fn answer(w: &mut World, r: &Recorded, query: &BTreeMap<String, String>) -> Option<Response<Body>> {
    let watching = query.get("watch").is_some_and(|v| v == "true" || v == "1");
    let path = r.path.as_str();
    Some(match (r.method.as_str(), path) {
        ("GET", "/api/v1/nodes") => {
            let selector = query.get("fieldSelector").cloned().unwrap_or_default();
            let name = selector
                .strip_prefix("metadata.name=")
                .expect("an agent watches its own Node only")
                .to_string();
            if watching {
                let (tx, rx) = mpsc::unbounded_channel();
                w.node_watches.push((name, tx));
                return Some(stream(rx));
            }
            let items: Vec<Value> = w.nodes.get(&name).cloned().into_iter().collect();
            full(
                200,
                &json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
            )
        }
        ("GET", "/apis/sonde.dev/v1alpha1/sondenodechecks") => {
            if watching {
                let (tx, rx) = mpsc::unbounded_channel();
                w.node_check_watches.push(tx);
                return Some(stream(rx));
            }
            let items: Vec<Value> = w.node_checks.values().cloned().collect();
            full(
                200,
                &json!({"apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheckList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
            )
        }
        ("PATCH", p) if p.starts_with("/api/v1/nodes/") && p.ends_with("/status") => node_status(w, r, query),
        ("PATCH", p) if p.starts_with("/api/v1/nodes/") => node_taints(w, r, query),
        ("PATCH", p) if p.starts_with("/apis/sonde.dev/v1alpha1/sondenodechecks/") => check_status(w, r, query),
        _ => return None,
    })
}

/// `PATCH nodes/{name}/status`: sonde's conditions only, by strategic merge.
fn node_status(w: &mut World, r: &Recorded, query: &BTreeMap<String, String>) -> Response<Body> {
    let name = r.path.split('/').nth(4).unwrap().to_string();
    assert_eq!(
        r.content_type, "application/strategic-merge-patch+json",
        "never a JSON merge patch"
    );
    assert_eq!(query.get("fieldManager").map(String::as_str), Some("sonde-node"));
    let keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    assert_eq!(keys, ["status"], "the status only: {}", r.body);
    let status_keys: Vec<&String> = r.body["status"].as_object().unwrap().keys().collect();
    assert_eq!(status_keys, ["conditions"], "the conditions only: {}", r.body);
    for c in r.body["status"]["conditions"].as_array().unwrap() {
        let t = c["type"].as_str().unwrap();
        assert!(!KUBELET_OWNED.contains(&t), "never the kubelet's condition: {c}");
        if c.get("$patch").is_none() {
            assert!(c["lastHeartbeatTime"].is_string(), "every write is a heartbeat: {c}");
        }
    }
    if let Some((code, message)) = w.patch_script.pop_front() {
        return full(code, &status(code, "Scripted", &message));
    }
    let Some(mut node) = w.nodes.get(&name).cloned() else {
        return full(404, &status(404, "NotFound", "nodes not found"));
    };
    let list = node["status"]["conditions"].as_array_mut().unwrap();
    for c in r.body["status"]["conditions"].as_array().unwrap() {
        if c["$patch"] == "delete" {
            list.retain(|x| x["type"] != c["type"]);
            continue;
        }
        match list.iter_mut().find(|x| x["type"] == c["type"]) {
            Some(old) => {
                for (k, v) in c.as_object().unwrap() {
                    old[k] = v.clone();
                }
            }
            None => list.push(c.clone()),
        }
    }
    store_node(w, name, node)
}

/// `PATCH nodes/{name}`: the taints, replaced whole, under the Node's
/// resourceVersion (`409` on a stale one).
fn node_taints(w: &mut World, r: &Recorded, query: &BTreeMap<String, String>) -> Response<Body> {
    let name = r.path.split('/').nth(4).unwrap().to_string();
    assert_eq!(r.content_type, "application/merge-patch+json");
    assert_eq!(query.get("fieldManager").map(String::as_str), Some("sonde-node"));
    let keys: Vec<&String> = r.body.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["metadata", "spec"], "{}", r.body);
    let meta: Vec<&String> = r.body["metadata"].as_object().unwrap().keys().collect();
    assert_eq!(meta, ["resourceVersion"], "{}", r.body);
    let spec: Vec<&String> = r.body["spec"].as_object().unwrap().keys().collect();
    assert_eq!(spec, ["taints"], "the taints only: {}", r.body);
    w.taint_patches += 1;
    let Some(mut node) = w.nodes.get(&name).cloned() else {
        return full(404, &status(404, "NotFound", "nodes not found"));
    };
    if node["metadata"]["resourceVersion"] != r.body["metadata"]["resourceVersion"] {
        return full(
            409,
            &status(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest version and try again",
            ),
        );
    }
    node["spec"]["taints"] = r.body["spec"]["taints"].clone();
    store_node(w, name, node)
}

fn store_node(w: &mut World, name: String, mut node: Value) -> Response<Body> {
    w.rv += 1;
    node["metadata"]["resourceVersion"] = w.rv.to_string().into();
    w.nodes.insert(name.clone(), node.clone());
    let ev = line("MODIFIED", &node);
    w.node_watches
        .retain(|(watched, tx)| *watched != name || tx.send(ev.clone()).is_ok());
    full(200, &node)
}

/// `PATCH sondenodechecks/{name}/status`: a merge patch of `status` only.
fn check_status(w: &mut World, r: &Recorded, query: &BTreeMap<String, String>) -> Response<Body> {
    let parts: Vec<&str> = r.path.split('/').collect();
    assert_eq!(parts.get(6), Some(&"status"), "{}", r.path);
    assert_eq!(r.content_type, "application/merge-patch+json");
    assert_eq!(query.get("fieldManager").map(String::as_str), Some("sonde-status"));
    let keys: Vec<&String> = r.body.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["status"], "{}", r.body);
    let name = parts[5].to_string();
    let Some(mut check) = w.node_checks.get(&name).cloned() else {
        return full(404, &status(404, "NotFound", "sondenodechecks.sonde.dev not found"));
    };
    check["status"] = r.body["status"].clone();
    w.rv += 1;
    check["metadata"]["resourceVersion"] = w.rv.to_string().into();
    w.node_checks.insert(name, check.clone());
    let ev = line("MODIFIED", &check);
    w.node_check_watches.retain(|tx| tx.send(ev.clone()).is_ok());
    full(200, &check)
}

/// Adds or replaces a Node or SondeNodeCheck and tells the watches.
pub(crate) fn put(w: &mut World, obj: Value) {
    w.rv += 1;
    let mut obj = obj;
    obj["metadata"]["resourceVersion"] = w.rv.to_string().into();
    let name = obj["metadata"]["name"].as_str().unwrap().to_string();
    if obj["kind"] == "Node" {
        let kind = if w.nodes.insert(name.clone(), obj.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let ev = line(kind, &obj);
        w.node_watches
            .retain(|(watched, tx)| *watched != name || tx.send(ev.clone()).is_ok());
    } else {
        assert_eq!(obj["kind"], "SondeNodeCheck");
        let kind = if w.node_checks.insert(name, obj.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let ev = line(kind, &obj);
        w.node_check_watches.retain(|tx| tx.send(ev.clone()).is_ok());
    }
}

/// Deletes SondeNodeCheck `name` and tells the watches.
pub(crate) fn delete_check(w: &mut World, name: &str) {
    w.rv += 1;
    if let Some(gone) = w.node_checks.remove(name) {
        let ev = line("DELETED", &gone);
        w.node_check_watches.retain(|tx| tx.send(ev.clone()).is_ok());
    }
}

/// A Node as the kubelet keeps it: its labels, the kubelet's conditions.
pub(crate) fn node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels},
        "spec": {},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}
        ]}
    })
}

/// A SondeNodeCheck `name` of plugin `tcp` at `target`, owning condition
/// `type_`, checked every `period` seconds.
pub(crate) fn node_check(name: &str, target: &str, type_: &str, period: u32) -> Value {
    json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeNodeCheck",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"plugin": "tcp", "target": target, "periodSeconds": period, "timeoutSeconds": 1,
                 "failureThreshold": 1, "condition": {"type": type_, "problemReason": "PortClosed", "okReason": "PortOpen"}}
    })
}
