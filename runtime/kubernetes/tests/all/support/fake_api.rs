//! An API server mocked at the HTTP level (kube's `tower-test` pattern):
//! every request the agent makes is checked (method, path, content type,
//! body, UID precondition) and answered by a small in-memory API server that
//! serves lists and watch streams (with a `410 Gone` re-list on demand) and
//! applies strategic-merge patches of conditions the way the real one does
//! (merged by `type`); the Lease and the SondeCheck status subresource too.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How long a test waits for something that should happen within seconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

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
pub(crate) struct World {
    pub(crate) rv: u64,
    pub(crate) pods: BTreeMap<(String, String), Value>,
    pub(crate) checks: BTreeMap<(String, String), Value>,
    pub(crate) pod_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    pub(crate) check_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Objects of other kinds (Services, EndpointSlices), by collection
    /// path, and the watches of each collection.
    pub(crate) others: BTreeMap<String, BTreeMap<(String, String), Value>>,
    pub(crate) other_watches: BTreeMap<String, Vec<mpsc::UnboundedSender<Bytes>>>,
    /// Services and EndpointSlices are forbidden, as by a ClusterRole
    /// from before checks through a Service.
    pub(crate) forbid_services: bool,
    /// The next Pod watch answers with a `410 Gone` error event.
    pub(crate) gone_next_pod_watch: bool,
    /// Answers forced on the next patches: (code, message).
    pub(crate) patch_script: VecDeque<(u16, String)>,
    /// Namespaces by name (`kubernetes_namespaces`).
    pub(crate) namespaces: BTreeMap<String, Value>,
    /// Namespace watches, each with its label selector (a key that must exist).
    pub(crate) namespace_watches: Vec<(String, mpsc::UnboundedSender<Bytes>)>,
    /// Leases by (namespace, name), when [`FakeApi::open_leases`] was
    /// called; before, another agent holds the status Lease and renews it.
    pub(crate) leases: BTreeMap<(String, String), Value>,
    pub(crate) leases_open: bool,
    /// Lease writes fail with a 500 (the API server cannot reach etcd).
    pub(crate) lease_writes_fail: bool,
    /// The holder of each Lease write that succeeded, and when, in order.
    pub(crate) lease_holders: Vec<(String, tokio::time::Instant)>,
    /// Nodes by name, and the watches of one Node each (by name).
    pub(crate) nodes: BTreeMap<String, Value>,
    pub(crate) node_watches: Vec<(String, mpsc::UnboundedSender<Bytes>)>,
    /// SondeNodeChecks by name, and their watches.
    pub(crate) node_checks: BTreeMap<String, Value>,
    pub(crate) node_check_watches: Vec<mpsc::UnboundedSender<Bytes>>,
    /// Taint patches received (answered or not).
    pub(crate) taint_patches: usize,
    /// Secrets by (namespace, name), and the RBAC rules that let the agent
    /// read them, by namespace ([`super::fake_secrets`]).
    pub(crate) secrets: BTreeMap<(String, String), Value>,
    pub(crate) secret_rules: Vec<(String, Value)>,
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

pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

pub(crate) fn line(kind: &str, object: &Value) -> Bytes {
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

    pub(crate) fn world(&self) -> std::sync::MutexGuard<'_, World> {
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
        if let Some(answer) = super::fake_nodes::answer(&mut w, r, &query) {
            return answer;
        }
        if let Some(answer) = super::fake_secrets::answer(&mut w, r) {
            return answer;
        }
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
        if obj["kind"] == "Node" || obj["kind"] == "SondeNodeCheck" {
            return super::fake_nodes::put(&mut w, obj);
        }
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

    pub(crate) fn delete_pod(&self, ns: &str, name: &str, silently: bool) {
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
            .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/namespaces/") && r.path.ends_with("/status"))
            .collect()
    }

    /// The Node condition writes (patches of `nodes/*/status`).
    pub(crate) fn node_patches(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.starts_with("/api/v1/nodes/") && r.path.ends_with("/status"))
            .collect()
    }

    /// Node `name` as stored.
    pub(crate) fn node(&self, name: &str) -> Value {
        self.world().nodes[name].clone()
    }

    /// SondeNodeCheck `name` as stored.
    pub(crate) fn node_check(&self, name: &str) -> Value {
        self.world().node_checks[name].clone()
    }

    /// Deletes SondeNodeCheck `name` and tells the watches.
    pub(crate) fn delete_node_check(&self, name: &str) {
        super::fake_nodes::delete_check(&mut self.world(), name);
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

pub(crate) fn stream(rx: mpsc::UnboundedReceiver<Bytes>) -> Response<Body> {
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

pub(crate) fn passed() -> Value {
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
