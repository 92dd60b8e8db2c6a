//! The Kubernetes readiness-gate controller against an API server mocked
//! at the HTTP level (kube's `tower-test` pattern): every request the
//! agent makes is checked (method, path, content type, body, UID
//! precondition) and answered by a small in-memory API server that serves
//! lists and watch streams (with a `410 Gone` re-list on demand) and
//! applies strategic-merge patches of conditions the way the real one does
//! (merged by `type`). The probes are real: the built-in http plugin
//! against real loopback servers.
//!
//! `SONDE_E2E_KUBECONFIG` runs `e2e_against_a_real_api_server` against a
//! real cluster; without it the test says it was skipped.

use crate::support::engine;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use sonde::agent::{Agent, AgentOptions};
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use sonde_tests::HttpServer;
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

const NODE: &str = "node-1";
/// How long a test waits for something that should happen within seconds.
const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// One request the agent made.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) content_type: String,
    pub(crate) body: Value,
}

#[derive(Default)]
struct World {
    rv: u64,
    pods: BTreeMap<(String, String), Value>,
    checks: BTreeMap<(String, String), Value>,
    pod_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    check_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Objects of other kinds (Services, EndpointSlices), by collection
    /// path, and the watches of each collection.
    others: BTreeMap<String, BTreeMap<(String, String), Value>>,
    other_watches: BTreeMap<String, Vec<mpsc::UnboundedSender<Bytes>>>,
    /// Services and EndpointSlices are forbidden, as by a ClusterRole
    /// from before checks through a Service.
    forbid_services: bool,
    /// The next Pod watch answers with a `410 Gone` error event.
    gone_next_pod_watch: bool,
    /// Answers forced on the next patches: (code, message).
    patch_script: VecDeque<(u16, String)>,
    /// Namespaces by name (`kubernetes_namespaces`).
    namespaces: BTreeMap<String, Value>,
    /// Namespace watches, each with its label selector (a key that must exist).
    namespace_watches: Vec<(String, mpsc::UnboundedSender<Bytes>)>,
    /// Leases by (namespace, name), when [`FakeApi::open_leases`] was
    /// called; before, another agent holds the status Lease and renews it.
    leases: BTreeMap<(String, String), Value>,
    leases_open: bool,
    /// Lease writes fail with a 500 (the API server cannot reach etcd).
    lease_writes_fail: bool,
    /// The holder of each Lease write that succeeded, and when, in order.
    lease_holders: Vec<(String, tokio::time::Instant)>,
}

/// The mocked API server.
#[derive(Clone)]
pub(crate) struct FakeApi {
    world: Arc<Mutex<World>>,
    log: Arc<watch::Sender<Vec<Recorded>>>,
}

pub(crate) fn full(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
}

fn key_of(v: &Value) -> (String, String) {
    (
        v["metadata"]["namespace"].as_str().unwrap().to_string(),
        v["metadata"]["name"].as_str().unwrap().to_string(),
    )
}

impl FakeApi {
    /// An API server with no objects, answering through [`FakeApi::answer`].
    pub(crate) fn new() -> Self {
        Self {
            world: Arc::default(),
            log: Arc::new(watch::Sender::new(Vec::new())),
        }
    }

    pub(crate) fn start() -> (kube::Client, Self) {
        let api = Self::new();
        (api.client(), api)
    }

    /// Another client of this API server (another agent's).
    pub(crate) fn client(&self) -> kube::Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
        let server = self.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let resp = server.answer(req).await;
                send.send_response(resp);
            }
        });
        kube::Client::new(service, "default")
    }

    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap()
    }

    /// Answers one request as the API server would, and records it.
    pub(crate) async fn answer<B>(&self, req: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = req.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let rec = Recorded {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: parts
                .headers
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        };
        let resp = self.handle(&rec);
        self.log.send_modify(|l| l.push(rec));
        resp
    }

    fn handle(&self, r: &Recorded) -> Response<Body> {
        let query: BTreeMap<String, String> = form_urlencoded::parse(r.query.as_bytes()).into_owned().collect();
        let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        let mut w = self.world();
        match (r.method.as_str(), r.path.as_str()) {
            // The status writer's watch of every Pod: no field selector.
            ("GET", "/api/v1/pods") if !query.contains_key("fieldSelector") => {
                if watching {
                    let (tx, rx) = mpsc::unbounded_channel();
                    w.pod_watches.push(tx);
                    return stream(rx);
                }
                let items: Vec<Value> = w.pods.values().cloned().collect();
                full(
                    200,
                    &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
                )
            }
            (_, path) if path.starts_with("/apis/coordination.k8s.io/v1/namespaces/") => lease(&mut w, r),
            ("PATCH", path) if path.starts_with("/apis/sonde.dev/v1alpha1/namespaces/") => {
                check_status(&mut w, r, &query)
            }
            ("GET", "/api/v1/pods") => {
                let selector = query.get("fieldSelector").cloned().unwrap_or_default();
                let node = selector
                    .strip_prefix("spec.nodeName=")
                    .expect("Pods are watched by node")
                    .to_string();
                if watching {
                    if std::mem::take(&mut w.gone_next_pod_watch) {
                        let (tx, rx) = mpsc::unbounded_channel();
                        tx.send(line("ERROR", &status(410, "Expired", "too old resource version")))
                            .unwrap();
                        drop(tx);
                        return stream(rx);
                    }
                    let (tx, rx) = mpsc::unbounded_channel();
                    w.pod_watches.push(tx);
                    return stream(rx);
                }
                let items: Vec<Value> = w
                    .pods
                    .values()
                    .filter(|p| p["spec"]["nodeName"] == node.as_str())
                    .cloned()
                    .collect();
                full(
                    200,
                    &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
                )
            }
            ("GET", "/apis/sonde.dev/v1alpha1/sondechecks") => {
                if watching {
                    let (tx, rx) = mpsc::unbounded_channel();
                    w.check_watches.push(tx);
                    return stream(rx);
                }
                let items: Vec<Value> = w.checks.values().cloned().collect();
                full(
                    200,
                    &json!({"apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheckList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
                )
            }
            ("GET", path @ ("/api/v1/services" | "/apis/discovery.k8s.io/v1/endpointslices")) => {
                if w.forbid_services {
                    return full(403, &status(403, "Forbidden", "forbidden by the ClusterRole"));
                }
                if watching {
                    let (tx, rx) = mpsc::unbounded_channel();
                    w.other_watches.entry(path.to_string()).or_default().push(tx);
                    return stream(rx);
                }
                let items: Vec<Value> = w
                    .others
                    .get(path)
                    .into_iter()
                    .flat_map(|m| m.values().cloned())
                    .collect();
                full(
                    200,
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
                )
            }
            ("PATCH", path) if path.ends_with("/status") => {
                let parts: Vec<&str> = path.split('/').collect();
                // /api/v1/namespaces/{ns}/pods/{name}/status
                assert_eq!(parts[..4], ["", "api", "v1", "namespaces"], "{path}");
                assert_eq!(parts[5], "pods");
                let key = (parts[4].to_string(), parts[6].to_string());
                assert_eq!(
                    r.content_type, "application/strategic-merge-patch+json",
                    "never a JSON merge patch"
                );
                assert_eq!(query.get("fieldManager").map(String::as_str), Some("sonde"));
                let body = r.body.as_object().expect("a JSON object");
                let mut keys: Vec<&String> = body.keys().collect();
                keys.sort();
                assert_eq!(
                    keys,
                    ["metadata", "status"],
                    "only sonde's condition and the UID: {}",
                    r.body
                );
                assert_eq!(
                    r.body["metadata"].as_object().unwrap().len(),
                    1,
                    "metadata carries the uid only"
                );
                assert_eq!(
                    r.body["status"].as_object().unwrap().len(),
                    1,
                    "status carries conditions only"
                );
                for c in r.body["status"]["conditions"].as_array().unwrap() {
                    assert!(
                        c["type"].as_str().unwrap().starts_with("sonde.dev/"),
                        "only sonde's conditions: {c}"
                    );
                    assert!(
                        ["CheckPassed", "CheckFailed", "CheckTimeout", "CheckUnavailable"]
                            .contains(&c["reason"].as_str().unwrap()),
                        "{c}"
                    );
                }
                if let Some((code, message)) = w.patch_script.pop_front() {
                    return full(code, &status(code, "Scripted", &message));
                }
                let Some(pod) = w.pods.get(&key).cloned() else {
                    return full(404, &status(404, "NotFound", "pods not found"));
                };
                let uid = pod["metadata"]["uid"].as_str().unwrap();
                let want = r.body["metadata"]["uid"].as_str().expect("the UID precondition");
                if uid != want {
                    return full(
                        409,
                        &status(
                            409,
                            "Conflict",
                            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
                        ),
                    );
                }
                let mut pod = pod;
                merge_conditions(&mut pod, r.body["status"]["conditions"].as_array().unwrap());
                w.rv += 1;
                pod["metadata"]["resourceVersion"] = w.rv.to_string().into();
                w.pods.insert(key, pod.clone());
                let ev = line("MODIFIED", &pod);
                w.pod_watches.retain(|tx| tx.send(ev.clone()).is_ok());
                full(200, &pod)
            }
            // Events through kube-runtime's recorder: events.k8s.io/v1, a
            // repeat within its window patched into the first one's series.
            ("POST", path) if path.starts_with("/apis/events.k8s.io/v1/namespaces/") && path.ends_with("/events") => {
                assert_eq!(r.body["apiVersion"], "events.k8s.io/v1");
                assert_eq!(r.body["kind"], "Event");
                assert_eq!(r.body["reportingController"], "sonde");
                full(201, &r.body)
            }
            ("PATCH", path) if path.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
                assert!(r.body["series"]["count"].as_u64().is_some_and(|n| n >= 2), "{}", r.body);
                full(200, &r.body)
            }
            // Namespaces, listed and watched by a label selector that
            // names a key (`sonde.dev/tenant-template`: the label exists).
            ("GET", "/api/v1/namespaces") => {
                let selector = query
                    .get("labelSelector")
                    .cloned()
                    .expect("Namespaces are watched by label, never all of them");
                assert!(
                    !selector.contains(['=', '!', ',', '(']),
                    "an exists selector: {selector}"
                );
                if watching {
                    let (tx, rx) = mpsc::unbounded_channel();
                    w.namespace_watches.push((selector, tx));
                    return stream(rx);
                }
                let items: Vec<Value> = w
                    .namespaces
                    .values()
                    .filter(|ns| has_label(ns, &selector))
                    .cloned()
                    .collect();
                full(
                    200,
                    &json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": w.rv.to_string()}, "items": items}),
                )
            }
            (m, p) => panic!("unexpected request {m} {p}?{}", r.query),
        }
    }

    /// Adds or replaces Namespace `ns` and tells each watch as the API
    /// server does for a label selector: `ADDED`/`MODIFIED` while it
    /// matches, `DELETED` when it stops matching.
    pub(crate) fn put_namespace(&self, ns: Value) {
        let mut w = self.world();
        w.rv += 1;
        let mut ns = ns;
        ns["apiVersion"] = "v1".into();
        ns["kind"] = "Namespace".into();
        ns["metadata"]["resourceVersion"] = w.rv.to_string().into();
        let name = ns["metadata"]["name"].as_str().unwrap().to_string();
        let old = w.namespaces.insert(name, ns.clone());
        w.namespace_watches.retain(|(selector, tx)| {
            let (was, is) = (
                old.as_ref().is_some_and(|o| has_label(o, selector)),
                has_label(&ns, selector),
            );
            let kind = match (was, is) {
                (false, false) => return true,
                (false, true) => "ADDED",
                (true, true) => "MODIFIED",
                (true, false) => "DELETED",
            };
            tx.send(line(kind, &ns)).is_ok()
        });
    }

    /// Adds or replaces an object and tells the watches (`silently`: not).
    pub(crate) fn put(&self, obj: Value, silently: bool) {
        let mut w = self.world();
        w.rv += 1;
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = w.rv.to_string().into();
        let key = key_of(&obj);
        if let Some(collection) = collection_of(&obj) {
            let kind = if w
                .others
                .entry(collection.into())
                .or_default()
                .insert(key, obj.clone())
                .is_some()
            {
                "MODIFIED"
            } else {
                "ADDED"
            };
            let ev = line(kind, &obj);
            if !silently && let Some(watches) = w.other_watches.get_mut(collection) {
                watches.retain(|tx| tx.send(ev.clone()).is_ok());
            }
            return;
        }
        let is_pod = obj["kind"] == "Pod";
        let map = if is_pod { &mut w.pods } else { &mut w.checks };
        let kind = if map.insert(key, obj.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        if silently {
            return;
        }
        let ev = line(kind, &obj);
        let watches = if is_pod {
            &mut w.pod_watches
        } else {
            &mut w.check_watches
        };
        watches.retain(|tx| tx.send(ev.clone()).is_ok());
    }

    /// Deletes a Service or EndpointSlice and tells the watches.
    pub(crate) fn delete_other(&self, obj: &Value) {
        let mut w = self.world();
        w.rv += 1;
        let collection = collection_of(obj).expect("a Service or EndpointSlice");
        let Some(gone) = w.others.get_mut(collection).and_then(|m| m.remove(&key_of(obj))) else {
            return;
        };
        let ev = line("DELETED", &gone);
        if let Some(watches) = w.other_watches.get_mut(collection) {
            watches.retain(|tx| tx.send(ev.clone()).is_ok());
        }
    }

    fn delete_pod(&self, ns: &str, name: &str, silently: bool) {
        let mut w = self.world();
        w.rv += 1;
        let Some(pod) = w.pods.remove(&(ns.to_string(), name.to_string())) else {
            return;
        };
        if !silently {
            let ev = line("DELETED", &pod);
            w.pod_watches.retain(|tx| tx.send(ev.clone()).is_ok());
        }
    }

    /// Lets agents create and take Leases (before: another agent holds
    /// the status Lease and renews it).
    pub(crate) fn open_leases(&self) {
        self.world().leases_open = true;
    }

    /// Makes Lease writes fail with a 500, or succeed again.
    pub(crate) fn fail_lease_writes(&self, fail: bool) {
        self.world().lease_writes_fail = fail;
    }

    /// The holder of each Lease write that succeeded, and when, in order.
    pub(crate) fn lease_holders(&self) -> Vec<(String, tokio::time::Instant)> {
        self.world().lease_holders.clone()
    }

    /// SondeCheck `ns/name` as stored.
    pub(crate) fn check(&self, ns: &str, name: &str) -> Value {
        self.world().checks[&(ns.to_string(), name.to_string())].clone()
    }

    pub(crate) fn pod(&self, ns: &str, name: &str) -> Value {
        self.world().pods[&(ns.to_string(), name.to_string())].clone()
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.log.borrow().clone()
    }

    /// The condition writes (patches of `pods/*/status`).
    pub(crate) fn patches(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/") && r.path.ends_with("/status"))
            .collect()
    }

    pub(crate) fn events(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .collect()
    }

    /// Waits until the requests so far satisfy `f`.
    pub(crate) async fn wait(&self, what: &str, f: impl Fn(&[Recorded]) -> bool) {
        let mut rx = self.log.subscribe();
        tokio::time::timeout(PATIENCE, rx.wait_for(|l| f(l)))
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}; requests: {:#?}", self.requests()))
            .unwrap();
    }
}

/// The collection path of a Service or EndpointSlice (`None`: a Pod or a
/// SondeCheck, which the world keeps apart).
fn collection_of(obj: &Value) -> Option<&'static str> {
    match obj["kind"].as_str() {
        Some("Service") => Some("/api/v1/services"),
        Some("EndpointSlice") => Some("/apis/discovery.k8s.io/v1/endpointslices"),
        _ => None,
    }
}

/// Whether Namespace `ns` has label `key`.
fn has_label(ns: &Value, key: &str) -> bool {
    ns["metadata"]["labels"].get(key).is_some()
}

/// The Lease API (`coordination.k8s.io/v1`): get, create, and replace by
/// resourceVersion (`409` on a stale one), as the API server does. Until
/// [`FakeApi::open_leases`], another agent holds every Lease and renews it
/// before each read, and writes conflict.
fn lease(w: &mut World, r: &Recorded) -> Response<Body> {
    // /apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]
    let parts: Vec<&str> = r.path.split('/').collect();
    assert_eq!(parts.get(6), Some(&"leases"), "{}", r.path);
    let name = match r.method.as_str() {
        "POST" => r.body["metadata"]["name"].as_str().unwrap().to_string(),
        _ => parts[7].to_string(),
    };
    assert_eq!(name, "sonde-status", "the one Lease the agents use");
    let key = (parts[5].to_string(), name);
    let conflict = |why: &str| full(409, &status(409, "Conflict", why));
    w.rv += 1;
    let rv = w.rv.to_string();
    if !w.leases_open {
        if r.method != "GET" {
            return conflict("the object has been modified");
        }
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        return full(
            200,
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"namespace": key.0, "name": key.1, "resourceVersion": rv},
                    "spec": {"holderIdentity": "another-node", "leaseDurationSeconds": 30, "renewTime": now}}),
        );
    }
    if w.lease_writes_fail && r.method != "GET" {
        return full(500, &status(500, "InternalError", "etcdserver: request timed out"));
    }
    match r.method.as_str() {
        "GET" => match w.leases.get(&key) {
            Some(l) => full(200, l),
            None => full(
                404,
                &status(404, "NotFound", "leases.coordination.k8s.io \"sonde-status\" not found"),
            ),
        },
        "POST" if w.leases.contains_key(&key) => full(409, &status(409, "AlreadyExists", "already exists")),
        "PUT"
            if w.leases.get(&key).map(|l| &l["metadata"]["resourceVersion"])
                != Some(&r.body["metadata"]["resourceVersion"]) =>
        {
            conflict("the object has been modified; please apply your changes to the latest version and try again")
        }
        "POST" | "PUT" => {
            let mut l = r.body.clone();
            l["metadata"]["namespace"] = key.0.clone().into();
            l["metadata"]["resourceVersion"] = rv.into();
            let holder = l["spec"]["holderIdentity"].as_str().unwrap_or_default().to_string();
            w.lease_holders.push((holder, tokio::time::Instant::now()));
            w.leases.insert(key, l.clone());
            full(if r.method == "POST" { 201 } else { 200 }, &l)
        }
        m => panic!("unexpected {m} of a Lease"),
    }
}

/// A JSON merge patch (RFC 7386) of `patch` onto `target`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (k, v) in fields {
        if v.is_null() {
            target.as_object_mut().unwrap().remove(k);
        } else {
            merge_patch(&mut target[k], v);
        }
    }
}

/// `PATCH .../sondechecks/{name}/status`: a merge patch of `status` only,
/// by the field manager `sonde-status`.
fn check_status(w: &mut World, r: &Recorded, query: &BTreeMap<String, String>) -> Response<Body> {
    // /apis/sonde.dev/v1alpha1/namespaces/{ns}/sondechecks/{name}/status
    let parts: Vec<&str> = r.path.split('/').collect();
    assert_eq!(
        (parts.get(6), parts.get(8)),
        (Some(&"sondechecks"), Some(&"status")),
        "{}",
        r.path
    );
    assert_eq!(r.content_type, "application/merge-patch+json");
    assert_eq!(query.get("fieldManager").map(String::as_str), Some("sonde-status"));
    let keys: Vec<&String> = r.body.as_object().expect("a JSON object").keys().collect();
    assert_eq!(keys, ["status"], "the status only: {}", r.body);
    let key = (parts[5].to_string(), parts[7].to_string());
    let Some(mut check) = w.checks.get(&key).cloned() else {
        return full(404, &status(404, "NotFound", "sondechecks.sonde.dev not found"));
    };
    merge_patch(&mut check["status"], &r.body["status"]);
    w.rv += 1;
    check["metadata"]["resourceVersion"] = w.rv.to_string().into();
    w.checks.insert(key, check.clone());
    let ev = line("MODIFIED", &check);
    w.check_watches.retain(|tx| tx.send(ev.clone()).is_ok());
    full(200, &check)
}

fn stream(rx: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(hyper::body::Frame::data(b)), rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(frames).boxed())
        .unwrap()
}

/// The API server's strategic merge of `status.conditions` (patch strategy
/// `merge`, key `type`): each patched condition's fields replace the
/// stored one's of the same type; the others stay.
fn merge_conditions(pod: &mut Value, patch: &[Value]) {
    let list = pod["status"]["conditions"].as_array_mut().unwrap();
    for c in patch {
        match list.iter_mut().find(|x| x["type"] == c["type"]) {
            Some(old) => {
                for (k, v) in c.as_object().unwrap() {
                    old[k] = v.clone();
                }
            }
            None => list.push(c.clone()),
        }
    }
}

pub(crate) fn pod(ns: &str, name: &str, uid: &str, node: &str, port: u16, gates: &[&str], conditions: Value) -> Value {
    let gates: Vec<Value> = gates
        .iter()
        .map(|g| json!({"conditionType": format!("sonde.dev/{g}")}))
        .collect();
    let mut conditions = conditions;
    let list = conditions.as_array_mut().unwrap();
    // The kubelet's own, which sonde must never drop.
    list.push(json!({"type": "ContainersReady", "status": "True"}));
    list.push(json!({"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"}));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"nodeName": node, "readinessGates": gates,
                 "containers": [{"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "conditions": conditions}
    })
}

pub(crate) fn check(ns: &str, name: &str, period: u32, failure_threshold: u32) -> Value {
    json!({
        "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
        "metadata": {"namespace": ns, "name": name, "uid": format!("check-{ns}-{name}")},
        "spec": {"plugin": "http", "config": {"path": "/health"}, "port": "http",
                 "periodSeconds": period, "timeoutSeconds": 1, "failureThreshold": failure_threshold}
    })
}

fn passed() -> Value {
    json!([{"type": "sonde.dev/ready", "status": "True", "reason": "CheckPassed", "message": "200 OK",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}])
}

pub(crate) fn cond<'a>(pod: &'a Value, t: &str) -> Option<&'a Value> {
    pod["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == t)
}

/// An agent with tenants `shop` (the loopback in its ceiling) and `poor`
/// (the 10/8 network only), and the controller on `client`.
async fn agent(client: kube::Client, dir: &Path) -> (Agent, kubernetes::GateController) {
    agent_with(client, dir, "", &["http", "tcp"]).await
}

/// [`agent`] with more top-level config (`extra`) and another allowlist.
async fn agent_with(
    client: kube::Client,
    dir: &Path,
    extra: &str,
    plugins: &[&str],
) -> (Agent, kubernetes::GateController) {
    agent_configured(client, dir, extra, "", plugins).await
}

/// [`agent_with`], and `shop_ceiling` added to tenant `shop`'s ceiling.
pub(crate) async fn agent_configured(
    client: kube::Client,
    dir: &Path,
    extra: &str,
    shop_ceiling: &str,
    plugins: &[&str],
) -> (Agent, kubernetes::GateController) {
    let config = format!(
        "{extra}tenants:\n  - id: shop\n    quotas: {{max_probes: 200, max_concurrent_runs: 16}}\n    ceiling: {{net: [\"127.0.0.0/8:*\"]{shop_ceiling}}}\n  - id: poor\n    ceiling: {{net: [\"10.0.0.0/8:*\"]}}\ntargets: []\n"
    );
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&plugins.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
    };
    start_gates(client, dir, &config, settings, false).await
}

/// An agent on config text `config` (written to `dir`), first runs jittered
/// or not, and the readiness-gate controller on `client` with `settings`.
pub(crate) async fn start_gates(
    client: kube::Client,
    dir: &Path,
    config: &str,
    settings: GateSettings,
    jitter: bool,
) -> (Agent, kubernetes::GateController) {
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, config).unwrap();
    let options = AgentOptions {
        config: Some(path),
        api: None,
        state_dir: None,
        grace: Duration::from_secs(1),
        jitter,
        api_auth: Default::default(),
    };
    let agent = Agent::start(engine(), options).await.unwrap();
    let handle = kubernetes::spawn(
        client,
        agent.control().clone(),
        agent.results().clone(),
        settings,
        Default::default(),
    );
    (agent, handle)
}

/// Waits until probe `name` has run `n` more times than `after`.
pub(crate) async fn runs(agent: &Agent, name: &str, n: usize) {
    let start = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let now = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
            if now >= (start + n).min(sonde_core::results::DEFAULT_HISTORY) {
                return;
            }
            follow.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} did not run {n} times"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_follows_its_pod_added_retargeted_and_removed() {
    let good = HttpServer::start().await;
    let bad = HttpServer::start().await;
    bad.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 2), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, good.addr.port(), &["ready"], json!([])),
        false,
    );
    // Another node's Pod: never listed, never written.
    api.put(
        pod(
            "shop",
            "web-2",
            "uid-2",
            "node-2",
            good.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    let name = "k8s_shop_web-1_ready";
    let view = agent.results().get(name).expect("one probe for the (Pod, gate)");
    assert_eq!(view.target, name);
    assert_eq!(view.tenant, "shop");
    let labels: Vec<(&str, &str)> = view.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, [("check", "ready"), ("namespace", "shop"), ("pod", "web-1")]);
    assert!(
        agent.results().get("k8s_shop_web-2_ready").is_none(),
        "another node's Pod"
    );

    api.wait("the True condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    let p = &api.patches()[0];
    assert_eq!(p.path, "/api/v1/namespaces/shop/pods/web-1/status");
    assert_eq!(p.body["metadata"]["uid"], "uid-1");
    let c = &p.body["status"]["conditions"][0];
    assert_eq!(
        (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
        (Some("sonde.dev/ready"), Some("True"), Some("CheckPassed"))
    );
    assert!(c["lastTransitionTime"].is_string(), "a flip stamps the transition");
    let stored = api.pod("shop", "web-1");
    assert!(
        cond(&stored, "Ready").is_some() && cond(&stored, "ContainersReady").is_some(),
        "the kubelet's conditions stay"
    );

    // Retarget: the Pod's port annotation moves the probe to the failing server.
    let mut moved = api.pod("shop", "web-1");
    moved["metadata"]["annotations"] = json!({"sonde.dev/ready.port": bad.addr.port().to_string()});
    api.put(moved, false);
    api.wait("the False condition", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    let p = &api.patches()[1];
    let c = &p.body["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("CheckFailed"))
    );
    assert!(c["message"].as_str().unwrap().contains("500"), "{c}");
    let view = agent.results().get(name).unwrap();
    assert!(
        view.history.unwrap().len() >= 2,
        "two failures in a row before the write (failureThreshold 2)"
    );

    // Removed with its Pod.
    api.delete_pod("shop", "web-1", false);
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        while agent.results().get(name).is_some() {
            let _ = tokio::time::timeout(Duration::from_millis(200), follow.changed()).await;
        }
    })
    .await
    .expect("the probe goes with its Pod");
    assert!(api.patches().iter().all(|p| !p.path.contains("web-2")));
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_writes_nothing_while_the_condition_on_the_pod_holds() {
    let good = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, good.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    runs(&agent, "k8s_shop_web-1_ready", 3).await;
    assert_eq!(api.patches().len(), 0, "seeded True, still passing: no write");
    assert_eq!(gates.stats.patch_attempts.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_patch_comes_only_after_failure_threshold_failures() {
    let server = HttpServer::start().await;
    server.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    let name = "k8s_shop_web-1_ready";
    // Two failures: below the threshold, the Pod keeps True.
    runs(&agent, name, 2).await;
    let v = agent.results().get(name).unwrap();
    if v.consecutive < 3 {
        assert_eq!(api.patches().len(), 0, "no write before the third failure");
    }
    api.wait("the False condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    assert!(agent.results().get(name).unwrap().consecutive >= 3);
    assert_eq!(api.patches().len(), 1);
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "False");
    drop(gates);
    agent.stop().await;
}

/// A gate whose status holds takes its probe's latest message at each
/// `message_refresh`: a Pod that keeps failing, for another reason, says
/// the new reason without a flip (no `lastTransitionTime`, no Event), and
/// nothing more is written while the message stays the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_gate_message_follows_the_latest_reason_without_a_flip() {
    let server = HttpServer::start().await;
    server.set_healthy(false);
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 1), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = "tenants:\n  - id: shop\n    ceiling: {net: [\"127.0.0.0/8:*\"]}\ntargets: []\n";
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&["http".to_string()]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: Duration::from_secs(1),
    };
    let (agent, gates) = start_gates(client, dir.path(), config, settings, false).await;
    gates.synced().await;
    api.wait("the False condition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    let first = cond(&api.pod("shop", "web-1"), "sonde.dev/ready").unwrap().clone();
    assert_eq!(first["status"], "False");
    assert!(first["message"].as_str().unwrap().contains("500"), "{first}");

    // From now on the connection is refused: still failing, another reason.
    drop(server);
    api.wait("the refused connection's message", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() >= 2
    })
    .await;
    let second = api.patches()[1].body["status"]["conditions"][0].clone();
    assert_eq!(second["status"], "False");
    assert_eq!(second["reason"], "CheckFailed");
    assert!(
        second.get("lastTransitionTime").is_none(),
        "the status did not flip: {second}"
    );
    assert_ne!(second["message"], first["message"]);
    let stored = cond(&api.pod("shop", "web-1"), "sonde.dev/ready").unwrap().clone();
    assert_eq!(stored["message"], second["message"]);
    assert_eq!(stored["lastTransitionTime"], first["lastTransitionTime"]);

    // Three more runs of a 1 s check span two more refreshes: the message
    // is the same, so nothing more is written, and no Event but the flip's.
    runs(&agent, "k8s_shop_web-1_ready", 3).await;
    assert_eq!(api.patches().len(), 2, "{:#?}", api.patches());
    let events = api.events();
    let reasons: Vec<&str> = events.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckFailed"], "{events:#?}");
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_recreated_under_the_same_name_is_not_written_for_the_old_one() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    let mut delayed = check("shop", "ready", 1, 1);
    delayed["spec"]["initialDelaySeconds"] = 1.into();
    api.put(delayed, false);
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-old",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    // Before the first run (a second away), the Pod is deleted and created
    // again under its name; the agent's watch has not said so yet, so its
    // write carries the old UID, which the API server must refuse.
    api.put(
        pod(
            "shop",
            "web-1",
            "uid-new",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        true,
    );
    api.wait("the old UID's write", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    assert_eq!(api.patches()[0].body["metadata"]["uid"], "uid-old");
    let stored = api.pod("shop", "web-1");
    assert!(
        cond(&stored, "sonde.dev/ready").is_none(),
        "the new Pod was not written"
    );
    // Now the watch tells: a new probe, a write with the new UID.
    let mut fresh = stored.clone();
    fresh["metadata"]["labels"] = json!({"v": "2"});
    api.put(fresh, false);
    api.wait("the new Pod's write", |r| {
        r.iter()
            .any(|r| r.method == "PATCH" && r.body["metadata"]["uid"] == "uid-new")
    })
    .await;
    let old = api
        .patches()
        .iter()
        .filter(|p| p.body["metadata"]["uid"] == "uid-old")
        .count();
    assert_eq!(old, 1, "the old UID's write is dropped, not retried");
    assert_eq!(gates.stats.gone.load(std::sync::atomic::Ordering::Relaxed), 1);
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "True");
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_retried_and_a_forbidden_write_is_not_hammered() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.world()
        .patch_script
        .push_back((409, "the object has been modified".into()));
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
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    api.wait("the retried write", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    let stored = api.pod("shop", "web-1");
    assert_eq!(cond(&stored, "sonde.dev/ready").unwrap()["status"], "True");
    assert_eq!(gates.stats.retries.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Forbidden: reported and retried no sooner than the forbidden backoff.
    api.world()
        .patch_script
        .push_back((403, "pods \"web-1\" is forbidden".into()));
    server.set_healthy(false);
    api.wait("the forbidden write", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 3
    })
    .await;
    runs(&agent, "k8s_shop_web-1_ready", 4).await;
    assert_eq!(api.patches().len(), 3, "no retry within seconds of a 403");
    assert_eq!(gates.stats.forbidden.load(std::sync::atomic::Ordering::Relaxed), 1);
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_outside_its_namespace_ceiling_is_refused_with_an_event() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("poor", "ready", 1, 1), false);
    api.put(
        pod(
            "poor",
            "web-1",
            "uid-1",
            NODE,
            server.addr.port(),
            &["ready"],
            json!([]),
        ),
        false,
    );
    let mut tcp = check("shop", "raw", 1, 1);
    tcp["spec"]["plugin"] = "exec".into();
    api.put(tcp, false);
    api.put(
        pod("shop", "web-2", "uid-2", NODE, server.addr.port(), &["raw"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert!(
        agent.results().get("k8s_poor_web-1_ready").is_none(),
        "refused, not run"
    );
    api.wait("two refusal events", |r| {
        r.iter()
            .filter(|r| r.method == "POST" && r.body["reason"] == "Refused")
            .count()
            == 2
    })
    .await;
    let events = api.events();
    let ceiling = events
        .iter()
        .find(|e| e.body["regarding"]["namespace"] == "poor")
        .unwrap();
    assert_eq!(ceiling.path, "/apis/events.k8s.io/v1/namespaces/poor/events");
    assert_eq!(ceiling.body["regarding"]["kind"], "SondeCheck");
    assert_eq!(ceiling.body["type"], "Warning");
    let message = ceiling.body["note"].as_str().unwrap();
    assert!(
        message.contains("127.0.0.1") && message.contains("ceiling"),
        "names the grant: {message}"
    );
    assert!(
        !message.contains(dir.path().to_str().unwrap()),
        "the agent's config path is not the namespace's business: {message}"
    );
    let allow = events
        .iter()
        .find(|e| e.body["regarding"]["namespace"] == "shop")
        .unwrap();
    assert!(
        allow.body["note"].as_str().unwrap().contains("allowlist"),
        "{}",
        allow.body
    );
    api.wait("the Unknown conditions", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() == 2
    })
    .await;
    for p in api.patches() {
        let c = &p.body["status"]["conditions"][0];
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("Unknown"), Some("CheckUnavailable"))
        );
    }
    drop(gates);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_410_gone_watch_relists_and_drops_pods_deleted_meanwhile() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    api.put(
        pod("shop", "web-1", "uid-1", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    api.put(
        pod("shop", "web-2", "uid-2", NODE, server.addr.port(), &["ready"], passed()),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert!(agent.results().get("k8s_shop_web-2_ready").is_some());
    let lists = |r: &[Recorded]| {
        r.iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.query.contains("watch="))
            .count()
    };
    assert_eq!(lists(&api.requests()), 1);
    // The Pod goes while the watch is down; the next watch is too old.
    api.delete_pod("shop", "web-2", true);
    {
        let mut w = api.world();
        w.gone_next_pod_watch = true;
        w.pod_watches.clear(); // ends the open watch
    }
    api.wait("a re-list", |r| lists(r) >= 2).await;
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        while agent.results().get("k8s_shop_web-2_ready").is_some() {
            let _ = tokio::time::timeout(Duration::from_millis(200), follow.changed()).await;
        }
    })
    .await
    .expect("the deleted Pod's probe goes after the re-list");
    assert!(agent.results().get("k8s_shop_web-1_ready").is_some());
    assert_eq!(api.patches().len(), 0);
    drop(gates);
    agent.stop().await;
}

/// The acceptance figure: 110 Pods on the node, one gate each, a 1 s
/// check: no write at all in steady state, and one patch per transition
/// when one target flaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_110_steady_state_writes_nothing_and_a_flap_writes_once_per_transition() {
    let mut servers = Vec::new();
    for _ in 0..110 {
        servers.push(HttpServer::start().await);
    }
    let (client, api) = FakeApi::start();
    api.put(check("shop", "ready", 1, 3), false);
    for (i, s) in servers.iter().enumerate() {
        api.put(
            pod(
                "shop",
                &format!("web-{i}"),
                &format!("uid-{i}"),
                NODE,
                s.addr.port(),
                &["ready"],
                passed(),
            ),
            false,
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    assert_eq!(gates.stats.probes.load(std::sync::atomic::Ordering::Relaxed), 110);
    // Steady state: every probe runs three more times, no write.
    for i in 0..110 {
        runs(&agent, &format!("k8s_shop_web-{i}_ready"), 3).await;
    }
    let writes = |api: &FakeApi| api.requests().into_iter().filter(|r| r.method != "GET").count();
    let steady = writes(&api);
    assert_eq!(steady, 0, "writes (patches or Events) in steady state");
    let reads = api.requests().len();

    servers[7].set_healthy(false);
    api.wait("the down transition", |r| r.iter().any(|r| r.method == "PATCH"))
        .await;
    servers[7].set_healthy(true);
    api.wait("the up transition", |r| {
        r.iter().filter(|r| r.method == "PATCH").count() >= 2
    })
    .await;
    // Steady again: three more runs of the flapped probe, nothing more.
    runs(&agent, "k8s_shop_web-7_ready", 3).await;
    let patches = api.patches();
    assert_eq!(patches.len(), 2, "one patch per transition: {patches:#?}");
    assert!(
        patches
            .iter()
            .all(|p| p.path == "/api/v1/namespaces/shop/pods/web-7/status")
    );
    let statuses: Vec<&str> = patches
        .iter()
        .map(|p| p.body["status"]["conditions"][0]["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["False", "True"]);
    api.wait("one Event per transition", |r| {
        r.iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/events"))
            .count()
            >= 2
    })
    .await;
    let events = api.events();
    let reasons: Vec<&str> = events.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckFailed", "CheckPassed"], "{events:#?}");
    eprintln!(
        "110 Pods, 1 s checks: {steady} writes and {reads} reads (lists and watches) up to steady state; flap of one target: {} patches and {} Events for 2 transitions, {} requests in all",
        patches.len(),
        events.len(),
        api.requests().len()
    );
    drop(gates);
    agent.stop().await;
}

/// Against a real API server: runs only with `SONDE_E2E_KUBECONFIG`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_against_a_real_api_server() {
    let Ok(path) = std::env::var("SONDE_E2E_KUBECONFIG") else {
        eprintln!(
            "SKIPPED e2e_against_a_real_api_server: set SONDE_E2E_KUBECONFIG to a kubeconfig of a test cluster to run it"
        );
        return;
    };
    crate::kubernetes_e2e::run(Path::new(&path)).await;
}

/// A SondeCheck may name its plugin by `oci://…@sha256:` reference when a
/// registry scope on the allowlist covers it: the namespace's tenant pulls
/// it from a real registry, runs the pinned digest and the gate turns True.
/// The same component under a repository the scope does not cover is
/// refused with an Event, and nothing is pulled for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_check_covered_by_the_allowlist_drives_its_gate_and_another_is_refused() {
    let Some(registry) = crate::oci::Registry::start(Default::default()) else {
        return;
    };
    let pusher = tempfile::tempdir().unwrap();
    let tcp = sonde_builtins::get("tcp").unwrap();
    let mut pinned = Vec::new();
    for repo in ["acme/tcp-check:1.0", "stray/tcp-check:1.0"] {
        let pushed = registry
            .client(pusher.path())
            .push(&registry.reference(repo), tcp, &crate::oci::info())
            .await
            .unwrap();
        pinned.push(pushed.reference.to_string());
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepting = tokio::spawn(async move {
        loop {
            let _ = listener.accept().await;
        }
    });
    let (client, api) = FakeApi::start();
    for (name, plugin, pod_name, uid) in [
        ("ready", &pinned[0], "web-1", "uid-1"),
        ("stray", &pinned[1], "web-2", "uid-2"),
    ] {
        let mut c = check("shop", name, 1, 1);
        c["spec"]["plugin"] = plugin.as_str().into();
        c["spec"]["config"] = json!({});
        api.put(c, false);
        api.put(pod("shop", pod_name, uid, NODE, port, &[name], json!([])), false);
    }
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "state_dir: {}\noci:\n  registries:\n    \"{}\": {{ insecure: true }}\n  timeout: 5s\n",
        dir.path().join("state").display(),
        registry.addr
    );
    let scope = format!("oci://{}/acme/*", registry.addr);
    // The tenant's own ceiling lets it pull from the whole registry; the
    // allowlist narrows that to acme/.
    let ceiling = format!(", registries: [\"{}/*\"]", registry.addr);
    let (agent, gates) = agent_configured(client, dir.path(), &extra, &ceiling, &["tcp", &scope]).await;
    gates.synced().await;
    api.wait("the gate of the covered check turns True", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/shop/pods/web-1/status"
                && r.body["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;
    let view = agent.results().get("k8s_shop_web-1_ready").unwrap();
    assert_eq!(view.plugin, pinned[0], "runs the pinned digest");
    assert_eq!(view.tenant, "shop");
    let pulled = agent.executor().tenant_stats("shop").unwrap().pull_bytes;
    assert!(
        (tcp.len() as u64..2 * tcp.len() as u64).contains(&pulled),
        "one pull, the namespace's tenant's: {pulled} bytes for a {} byte component",
        tcp.len()
    );
    api.wait("a refusal Event on the stray check", |r| {
        r.iter()
            .any(|r| r.method == "POST" && r.body["reason"] == "Refused" && r.body["regarding"]["name"] == "stray")
    })
    .await;
    let refusal = api
        .events()
        .into_iter()
        .find(|e| e.body["regarding"]["name"] == "stray")
        .unwrap();
    assert!(
        refusal.body["note"].as_str().unwrap().contains("allowlist"),
        "{}",
        refusal.body
    );
    assert!(
        agent.results().get("k8s_shop_web-2_stray").is_none(),
        "refused, not run"
    );
    drop(gates);
    agent.stop().await;
    accepting.abort();
}

/// `sonde validate` checks the `kubernetes:` block's allowlist: an entry
/// that a prefix test could be fooled by is refused, naming the file and
/// the entry; a good block passes.
#[test]
fn validate_refuses_an_allowlist_entry_it_cannot_compare_safely() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    for (entry, why) in [
        ("/opt/sonde/../tmp/", "normal absolute path"),
        ("oci://ghcr.io/acme/", "registry scope"),
        ("sha256:abcd", "64 lowercase hex"),
    ] {
        std::fs::write(
            &config,
            format!("kubernetes:\n  plugins: [http, \"{entry}\"]\ntargets: []\n"),
        )
        .unwrap();
        let out = crate::support::sonde(&["validate", config.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{entry}: {stderr}");
        assert!(
            stderr.contains(config.to_str().unwrap()) && stderr.contains(entry) && stderr.contains(why),
            "{stderr}"
        );
    }
    std::fs::write(
        &config,
        "kubernetes:\n  plugins: [http, \"oci://ghcr.io/acme/*\", /opt/sonde/plugins/]\ntargets: []\n",
    )
    .unwrap();
    let out = crate::support::sonde(&["validate", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The fourth finding: namespace A's SondeCheck names a pinned
/// `oci://` plugin on a silent registry; namespace B then adds a plain
/// `tcp` check and a Pod with its gate. No reconcile waits on A's pull:
/// B's gate turns True within two of its periods, and A's gate says that
/// its plugin is being pulled (`Unknown`/`CheckUnavailable`, one Event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_registry_in_one_namespace_holds_up_no_other() {
    use crate::oci_hostile::{Hostile, Server, accepting, pinned_on};
    let silent = Server::start(Hostile::Silent).await;
    let (target, accepting) = accepting().await;
    let (client, api) = FakeApi::start();
    let mut a = check("shop", "pulled", 1, 1);
    a["spec"]["plugin"] = pinned_on(&silent).into();
    a["spec"]["config"] = json!({});
    api.put(a, false);
    api.put(
        pod("shop", "a-1", "uid-a", NODE, target.port(), &["pulled"], json!([])),
        false,
    );
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "state_dir: {state}\noci:\n  registries:\n    \"{addr}\": {{ insecure: true }}\ntenants:\n  - id: shop\n    ceiling: {{net: [\"127.0.0.0/8:*\"], registries: [\"{addr}/*\"]}}\n  - id: other\n    ceiling: {{net: [\"127.0.0.0/8:*\"]}}\ntargets: []\n",
        state = dir.path().join("state").display(),
        addr = silent.addr,
    );
    let scope = format!("oci://{}/acme/*", silent.addr);
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&["tcp".to_string(), scope]).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
    };
    let (agent, gates) = start_gates(client, dir.path(), &config, settings, false).await;
    gates.synced().await;
    api.wait("A's gate says its plugin is being pulled", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/shop/pods/a-1/status"
                && r.body["status"]["conditions"][0]["status"] == "Unknown"
                && r.body["status"]["conditions"][0]["reason"] == "CheckUnavailable"
                && r.body["status"]["conditions"][0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("being pulled"))
        })
    })
    .await;
    // Namespace B comes while A's pull hangs.
    let started = std::time::Instant::now();
    let mut b = check("other", "ready", 1, 1);
    b["spec"]["plugin"] = "tcp".into();
    b["spec"]["config"] = json!({});
    api.put(b, false);
    api.put(
        pod("other", "b-1", "uid-b", NODE, target.port(), &["ready"], json!([])),
        false,
    );
    api.wait("B's gate turns True", |r| {
        r.iter().any(|r| {
            r.method == "PATCH"
                && r.path == "/api/v1/namespaces/other/pods/b-1/status"
                && r.body["status"]["conditions"][0]["status"] == "True"
        })
    })
    .await;
    let took = started.elapsed();
    eprintln!("B's gate True {} ms after its Pod came", took.as_millis());
    assert!(took < Duration::from_secs(2), "two of B's 1 s periods: {took:?}");
    let pulling: Vec<Recorded> = api
        .events()
        .into_iter()
        .filter(|e| e.body["reason"] == "PluginPulling")
        .collect();
    assert_eq!(pulling.len(), 1, "one Event for the pull: {pulling:#?}");
    assert_eq!(pulling[0].body["regarding"]["name"], "pulled");
    assert!(
        agent.results().get("k8s_shop_a-1_pulled").is_none(),
        "A's probe waits, not run"
    );
    drop(gates);
    agent.stop().await;
    accepting.abort();
}

/// Events go through kube-runtime's recorder (events.k8s.io/v1): each
/// transition of a gate records one on the Pod, and a repeat of the same
/// reason on the same Pod within the recorder's window is counted on the
/// first Event's series (a patch) rather than created again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_transition_is_counted_on_the_first_event() {
    let server = HttpServer::start().await;
    let (client, api) = FakeApi::start();
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
    let dir = tempfile::tempdir().unwrap();
    let (agent, gates) = agent(client, dir.path()).await;
    gates.synced().await;
    for (n, healthy) in [(1, true), (2, false), (3, true)] {
        server.set_healthy(healthy);
        api.wait("the next transition", |r| {
            r.iter()
                .filter(|r| r.method == "PATCH" && r.path.ends_with("/status"))
                .count()
                >= n
        })
        .await;
    }
    api.wait("the repeat patched into the series", |r| {
        r.iter()
            .any(|r| r.method == "PATCH" && r.path.starts_with("/apis/events.k8s.io/v1/namespaces/shop/events/"))
    })
    .await;
    let created = api.events();
    let reasons: Vec<&str> = created.iter().map(|e| e.body["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["CheckPassed", "CheckFailed"], "{created:#?}");
    let series: Vec<Recorded> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/events/"))
        .collect();
    assert_eq!(series.len(), 1, "{series:#?}");
    assert_eq!(series[0].body["reason"], "CheckPassed");
    assert_eq!(series[0].body["series"]["count"], 2);
    assert_eq!(series[0].body["regarding"]["uid"], "uid-1");
    let first = created[0].body["metadata"]["name"].as_str().unwrap();
    assert!(
        series[0].path.ends_with(&format!("/events/{first}")),
        "{}",
        series[0].path
    );
    assert_eq!(gates.stats.events_failed.load(std::sync::atomic::Ordering::Relaxed), 0);
    drop(gates);
    agent.stop().await;
}

/// `deploy/kubernetes/crd.yaml` is generated from the `SondeCheck` type
/// (`SONDE_WRITE_CRD=1` rewrites it): the shipped file parses as an
/// `apiextensions.k8s.io/v1` CustomResourceDefinition equal to the type's,
/// byte for byte what the generator writes, and it keeps the CEL rules
/// and printer columns the API server enforces and `kubectl get` shows.
#[test]
fn shipped_crd_is_generated_from_the_sondecheck_type() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use sonde_kubernetes::crd::{SondeCheck, crd_yaml};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/crd.yaml");
    let generated = crd_yaml();
    if std::env::var_os("SONDE_WRITE_CRD").is_some() {
        std::fs::write(&path, &generated).unwrap();
        eprintln!("wrote {}", path.display());
    }
    let shipped = std::fs::read_to_string(&path).unwrap();
    let regenerate = "the SondeCheck type and deploy/kubernetes/crd.yaml disagree: regenerate it with SONDE_WRITE_CRD=1 cargo test --workspace --test all -- shipped_crd";
    let parsed: CustomResourceDefinition =
        serde_saphyr::from_str(&shipped).unwrap_or_else(|e| panic!("{}: not a CRD: {e}", path.display()));
    assert!(parsed == SondeCheck::crd(), "{regenerate}");
    assert!(shipped == generated, "{regenerate} (the text differs)");

    let crd = serde_json::to_value(&parsed).unwrap();
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["metadata"]["name"], "sondechecks.sonde.dev");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["sck"]));
    assert_eq!(crd["spec"]["names"]["categories"], json!(["sonde"]));
    let version = &crd["spec"]["versions"][0];
    let columns: Vec<(&str, &str, &str)> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["jsonPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Plugin", "string", ".spec.plugin"),
            ("Mode", "string", ".spec.mode"),
            (
                "Accepted",
                "string",
                ".status.conditions[?(@.type==\"Accepted\")].status"
            ),
            ("Ready", "integer", ".status.podsReady"),
            ("NotReady", "integer", ".status.podsNotReady"),
            ("Unknown", "integer", ".status.podsUnknown"),
            ("Reason", "string", ".status.conditions[?(@.type==\"Accepted\")].reason"),
            ("Port", "string", ".spec.port"),
            ("Service", "string", ".spec.service.name"),
            ("Period", "integer", ".spec.periodSeconds"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
    // The status is a subresource: the agents' status writes cannot touch
    // the spec, and a user's spec writes cannot forge the status.
    assert_eq!(version["subresources"], json!({"status": {}}));
    let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    for k in ["observedGeneration", "podsReady", "podsNotReady", "podsUnknown"] {
        assert_eq!(status[k]["type"], "integer", "{k}");
    }
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let rules = |v: &Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .unwrap_or_else(|| panic!("no CEL rules in {v}"))
            .iter()
            .map(|r| r["rule"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        rules(spec),
        [
            "has(self.port) ? !has(self.service) : has(self.service)",
            "!has(self.timeoutSeconds) || !has(self.periodSeconds) || self.timeoutSeconds <= self.periodSeconds"
        ]
    );
    assert_eq!(
        rules(&spec["properties"]["plugin"]),
        ["!self.startsWith('oci://') || self.contains('@sha256:')"]
    );
    // An int-or-string is costed at the largest request whatever its
    // maxLength: its name is checked by OpenAPI's maxLength and pattern
    // (strings only), CEL checks only the number's range (no string
    // function, whose cost put the CRD over its budget on Kubernetes 1.24).
    let name = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
    for (port, max) in [
        (&spec["properties"]["port"], 15),
        (&spec["properties"]["service"]["properties"]["port"], 63),
    ] {
        assert_eq!(port["x-kubernetes-int-or-string"], true);
        assert_eq!(rules(port), ["type(self) != int || (self >= 1 && self <= 65535)"]);
        assert_eq!(
            (port["maxLength"].as_u64(), port["pattern"].as_str()),
            (Some(max), Some(name))
        );
    }
    assert_eq!(spec["required"], json!(["plugin"]));
    let service = &spec["properties"]["service"];
    assert_eq!(service["required"], json!(["name", "port"]));
    assert_eq!(service["properties"]["port"]["x-kubernetes-int-or-string"], true);
    assert_eq!(rules(&service["properties"]["port"]).len(), 1);
    assert_eq!(
        spec["properties"]["config"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(spec["properties"]["mode"]["enum"], json!(["Continuous", "StartupOnly"]));
}

/// Checks through a Service: the egress-proxy rollout case. The Service's
/// "ClusterIP" is a round-robin balancer on loopback in front of three Pod
/// backends, each answering with its own `Pod-IPv4`; only the API server
/// is mocked, the traffic is real.
mod through_a_service {
    use super::*;
    use sonde_sandbox::verdict::Status;
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
}
