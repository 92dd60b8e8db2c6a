//! The shipped install on a real node: a cluster started by
//! `scripts/kube-cluster.sh start VERSION DIR --node` (a control plane with
//! every controller, and containerd, runc, the CNI bridge, a kubelet and
//! kube-proxy), named by `SONDE_E2E_NODE_DIR`. Nothing of the install is
//! played: the image is the shipped Containerfile's `FROM scratch` stage
//! around the binary under test, imported into the node's containerd under
//! the name `daemonset.yaml` gives it; `kubectl apply -k deploy/kubernetes`
//! installs it as a user does; the DaemonSet controller makes the Pod, the
//! kubelet runs it on its read-only root, the agent reaches the API server
//! through the `kubernetes` Service under its own ServiceAccount and RBAC.
//!
//! One test, in the order a user meets it: the agent's Pod is Ready; its
//! API answers scrapes by TokenReview and RBAC; the shipped example
//! SondeNodeCheck writes its condition (and taint) on the kubelet's own
//! Node and follows the target; a Deployment gated by a SondeCheck is
//! Ready only through its gates; the agent's Pod deleted and made again
//! flips nothing; and a burst of 40 Pods is timed from ContainersReady to
//! the gate (printed; BENCHMARKS.md records it).

use super::e2e::{client, condition as pod_condition};
use super::e2e_nodes::{condition as node_condition, has_taint};
use crate::support::call;
use crate::support::image::containerd_import;
use crate::support::kube::e2e_node_dir;
use crate::support::{repo, tool};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};
use sonde_tests::HttpServer;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one step may take: Pods start in seconds here, the node
/// check needs three failed runs 10 s apart.
const PATIENCE: Duration = Duration::from_secs(120);
/// The agent's namespace and Pods' label, as `daemonset.yaml` has them.
const AGENT_NAMESPACE: &str = "sonde-system";
const AGENT_LABEL: &str = "app.kubernetes.io/name=sonde";
/// The gated Deployment's namespace: the shipped ConfigMap maps it to its
/// tenant `shop`, whose ceiling is the Pod network.
const APP_NAMESPACE: &str = "default";
/// The gate the Deployment's Pods carry.
const GATE: &str = "sonde.dev/web-ready";
/// How many Pods the burst makes.
const BURST: usize = 40;

/// The cluster of `SONDE_E2E_NODE_DIR`.
struct Cluster {
    dir: PathBuf,
    kubectl: PathBuf,
    node: String,
    client: Client,
}

impl Cluster {
    async fn open(dir: PathBuf) -> Self {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (not a cluster started with --node?)", path.display()))
                .trim()
                .to_string()
        };
        let (version, node) = (read("version"), read("node/name"));
        let bin = std::env::var_os("SONDE_KUBE_BIN").expect("SONDE_KUBE_BIN (scripts/kube.sh sets it)");
        let kubectl = Path::new(&bin).join(format!("kubectl-{version}"));
        let client = client(&dir.join("kubeconfig")).await;
        Self {
            dir,
            kubectl,
            node,
            client,
        }
    }

    /// `kubectl args…` as the admin, from the repository's root, with
    /// `input` on its standard input; its output, once it succeeded.
    fn kubectl(&self, args: &[&str], input: Option<&str>) -> String {
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .args(args)
            .current_dir(repo())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let mut stdin = child.stdin.take().unwrap();
        if let Some(text) = input {
            std::io::Write::write_all(&mut stdin, text.as_bytes()).unwrap();
        }
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `objects`.
    fn apply(&self, objects: &Value) {
        self.kubectl(&["apply", "-f", "-"], Some(&objects.to_string()));
    }

    /// The agent's log (the container's, as the kubelet keeps it) and
    /// what the cluster says of its Pods, for a failure's message.
    fn agent_log(&self) -> String {
        let run = |args: &[&str]| {
            Command::new(&self.kubectl)
                .arg("--kubeconfig")
                .arg(self.dir.join("kubeconfig"))
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
                .unwrap_or_default()
        };
        run(&["-n", AGENT_NAMESPACE, "logs", "--tail", "40", "-l", AGENT_LABEL])
            + &run(&["get", "pods", "-A", "-o", "wide"])
            + &run(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
    }
}

/// Waits until `probe` gives a value, asking again every 250 ms; fails
/// after [`PATIENCE`] with `what` and the agent's log.
async fn until<T, F: Future<Output = Option<T>>>(cluster: &Cluster, what: &str, mut probe: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; the agent's log:\n{}",
            cluster.agent_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn is_true(pod: &Pod, t: &str) -> bool {
    pod_condition(pod, t).is_some_and(|c| c.status == "True")
}

/// A shipped YAML file of one document, as JSON.
fn shipped(path: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_install_runs_on_a_real_node() {
    let Some(dir) = e2e_node_dir("the_shipped_install_runs_on_a_real_node") else {
        return;
    };
    let (Some(podman), Some(ctr)) = (tool("podman", "podman"), tool("ctr", "containerd")) else {
        return;
    };
    let cluster = Cluster::open(dir).await;
    // The image under the name the DaemonSet gives it, so the kubelet finds
    // it without pulling (its tag is not `latest`: IfNotPresent).
    let daemonset = shipped("deploy/kubernetes/daemonset.yaml");
    let image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("daemonset.yaml's image")
        .to_string();
    containerd_import(
        &podman,
        &ctr,
        &cluster.dir.join("node/containerd.sock"),
        Path::new(env!("CARGO_BIN_EXE_sonde")),
        &image,
    );
    cluster.kubectl(&["apply", "-k", "deploy/kubernetes"], None);

    let agent = the_agent_pod_is_ready(&cluster, None).await;
    scrapes_are_authenticated_by_token_review(&cluster, &agent).await;
    // The felix-like server stays up to the end: the restart must find the
    // node healthy.
    let _felix = the_example_node_check_follows_its_target(&cluster).await;
    the_deployment_is_ready_only_through_its_gates(&cluster).await;
    a_restart_of_the_agent_flips_nothing(&cluster, &agent).await;
    a_burst_of_pods_is_gated(&cluster).await;
}

/// The agent's Pod, made by the DaemonSet controller on the node, Ready,
/// and not `previous` (a Pod it replaced).
async fn the_agent_pod_is_ready(cluster: &Cluster, previous: Option<&Pod>) -> Pod {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), AGENT_NAMESPACE);
    let before = previous.and_then(|p| p.metadata.uid.clone());
    let pod = until(cluster, "the agent's Pod Ready", || {
        let (pods, before) = (pods.clone(), before.clone());
        async move {
            let list = pods.list(&ListParams::default().labels(AGENT_LABEL)).await.ok()?;
            list.items
                .into_iter()
                .find(|p| p.metadata.uid != before && p.metadata.deletion_timestamp.is_none() && is_true(p, "Ready"))
        }
    })
    .await;
    let owner = &pod.metadata.owner_references.as_ref().expect("an owner")[0];
    assert_eq!(owner.kind, "DaemonSet", "{owner:?}");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(cluster.node.as_str()));
    let context = spec.containers[0].security_context.as_ref().unwrap();
    assert_eq!(
        context.read_only_root_filesystem,
        Some(true),
        "the shipped root is read-only"
    );
    let log = cluster.agent_log();
    assert!(!log.contains("Read-only file system"), "{log}");
    pod
}

/// The agent's address: its Pod's IP and the API's port.
fn api_of(agent: &Pod) -> SocketAddr {
    let ip = agent
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .as_ref()
        .expect("the agent's Pod IP");
    SocketAddr::new(ip.parse().unwrap(), 9464)
}

/// `/metrics` answers a ServiceAccount bound to `sonde-reader`, refuses one
/// that is not (403) and an anonymous caller (401); `/healthz` answers
/// anyone (the kubelet's probes).
async fn scrapes_are_authenticated_by_token_review(cluster: &Cluster, agent: &Pod) {
    let api = api_of(agent);
    cluster.kubectl(&["-n", AGENT_NAMESPACE, "create", "serviceaccount", "scraper"], None);
    cluster.kubectl(&["-n", AGENT_NAMESPACE, "create", "serviceaccount", "stranger"], None);
    cluster.kubectl(
        &[
            "create",
            "clusterrolebinding",
            "scraper-reads-sonde",
            "--clusterrole",
            "sonde-reader",
            "--serviceaccount",
            "sonde-system:scraper",
        ],
        None,
    );
    let token = |sa: &str| cluster.kubectl(&["-n", AGENT_NAMESPACE, "create", "token", sa], None);
    let (scraper, stranger) = (token("scraper"), token("stranger"));
    let (status, body) = call(api, "GET", "/metrics", Some(scraper.trim()), b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sonde_build_info"), "{body}");
    let (status, body) = call(api, "GET", "/metrics", Some(stranger.trim()), b"").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(api, "GET", "/metrics", None, b"").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = call(api, "GET", "/healthz", None, b"").await;
    assert_eq!(status, 200, "{body}");
}

/// The shipped example SondeNodeCheck, applied as shipped, against a
/// felix-like server on the node's address (returned, serving): its
/// condition appears on the kubelet's own Node beside the kubelet's own,
/// goes True with the taint when the target fails (with the message
/// docs/kubernetes.md shows) and False again without it.
async fn the_example_node_check_follows_its_target(cluster: &Cluster) -> HttpServer {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let node = nodes.get(&cluster.node).await.unwrap();
    let addresses = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .expect("the node's addresses");
    let ip = &addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .expect("an InternalIP")
        .address;
    let felix = HttpServer::start_on(SocketAddr::new(ip.parse().unwrap(), 9099)).await;
    cluster.kubectl(&["apply", "-f", "deploy/kubernetes/examples/sondenodecheck.yaml"], None);
    let example = shipped("deploy/kubernetes/examples/sondenodecheck.yaml");
    let spec = &example["spec"];
    let text = |v: &Value| v.as_str().expect("a string in the example").to_string();
    let (kind, taint) = (text(&spec["condition"]["type"]), text(&spec["taint"]["key"]));
    let (ok, problem) = (
        text(&spec["condition"]["okReason"]),
        text(&spec["condition"]["problemReason"]),
    );

    let (node, _) = node_in(cluster, &kind, "False", &ok).await;
    assert!(!has_taint(&node, &taint));
    assert!(
        node_condition(&node, "Ready").is_some_and(|c| c.status == "True"),
        "the kubelet's own"
    );
    felix.set_healthy(false);
    let (_, c) = node_in(cluster, &kind, "True", &problem).await;
    assert_eq!(c.message.as_deref(), Some("GET /liveness: 503 Service Unavailable"));
    // The taint is its own write, after the condition's (and the Node
    // writer's rate limit): it follows, it is not in the same read.
    until(cluster, "the node check's taint", || {
        let nodes = nodes.clone();
        let taint = taint.as_str();
        async move { nodes.get(&cluster.node).await.ok().filter(|n| has_taint(n, taint)) }
    })
    .await;
    felix.set_healthy(true);
    node_in(cluster, &kind, "False", &ok).await;
    until(cluster, "the node check's taint gone", || {
        let nodes = nodes.clone();
        let taint = taint.as_str();
        async move { nodes.get(&cluster.node).await.ok().filter(|n| !has_taint(n, taint)) }
    })
    .await;
    felix
}

/// Waits until the node's condition `kind` is `status` for `reason`.
async fn node_in(cluster: &Cluster, kind: &str, status: &str, reason: &str) -> (Node, NodeCondition) {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let what = format!("the node's {kind} {status} ({reason})");
    until(cluster, &what, || {
        let nodes = nodes.clone();
        async move {
            let node = nodes.get(&cluster.node).await.ok()?;
            let c = node_condition(&node, kind)?;
            (c.status == status && c.reason.as_deref() == Some(reason)).then_some((node, c))
        }
    })
    .await
}

/// The check and the Deployment of `replicas` Pods it gates.
fn gated_deployment(path: &str, replicas: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
         "metadata": {"name": "web-ready", "namespace": APP_NAMESPACE},
         "spec": {"plugin": "http", "config": {"path": path}, "port": "http",
                  "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 1}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "web", "namespace": APP_NAMESPACE},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                  "template": {"metadata": {"labels": {"app": "web"}},
                               "spec": {"readinessGates": [{"conditionType": GATE}],
                                        "terminationGracePeriodSeconds": 1,
                                        "containers": [{"name": "web", "image": "sonde.invalid/web:1",
                                                        "imagePullPolicy": "Never",
                                                        "ports": [{"name": "http", "containerPort": 8080}]}]}}}}
    ]})
}

/// The Deployment's Pods, those not being deleted.
async fn web_pods(cluster: &Cluster) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), APP_NAMESPACE);
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect()
        })
        .unwrap_or_default()
}

/// With the check failing, the Pods' containers are ready and the Pods are
/// not (the gate False, with the request and its status); once the check
/// passes, the gate goes True and the Pods Ready.
async fn the_deployment_is_ready_only_through_its_gates(cluster: &Cluster) {
    cluster.apply(&gated_deployment("/missing", 2));
    let pods = until(
        cluster,
        "two Pods whose containers are ready and whose gate is False",
        || async move {
            let pods = web_pods(cluster).await;
            let held = pods.iter().all(|p| {
                is_true(p, "ContainersReady")
                    && pod_condition(p, GATE).is_some_and(|c| c.status == "False")
                    && !is_true(p, "Ready")
            });
            (pods.len() == 2 && held).then_some(pods)
        },
    )
    .await;
    let gate = pod_condition(&pods[0], GATE).unwrap();
    assert_eq!(gate.message.as_deref(), Some("GET /missing: 404 Not Found"), "{gate:?}");
    cluster.apply(&gated_deployment("/healthz", 2));
    until(cluster, "both Pods Ready through their gates", || async move {
        let pods = web_pods(cluster).await;
        (pods.len() == 2 && pods.iter().all(|p| is_true(p, GATE) && is_true(p, "Ready"))).then_some(())
    })
    .await;
}

/// The gate of each web Pod and the node check's condition: status and
/// last transition.
async fn conditions(cluster: &Cluster) -> BTreeMap<String, (String, String)> {
    let mut all = BTreeMap::new();
    for pod in web_pods(cluster).await {
        let c = pod_condition(&pod, GATE).expect("a gate condition");
        let at = c.last_transition_time.map(|t| t.0.to_string()).unwrap_or_default();
        all.insert(pod.metadata.name.unwrap(), (c.status, at));
    }
    let node = Api::<Node>::all(cluster.client.clone())
        .get(&cluster.node)
        .await
        .unwrap();
    let c = node_condition(&node, "CalicoFelixUnhealthy").expect("the node check's condition");
    let at = c.last_transition_time.map(|t| t.0.to_string()).unwrap_or_default();
    all.insert(format!("node/{}", cluster.node), (c.status, at));
    all
}

/// Runs of the gate's check the agent at `api` made, by its `/metrics`.
async fn gate_runs(api: SocketAddr, token: &str) -> f64 {
    let (status, body) = call(api, "GET", "/metrics", Some(token), b"").await;
    if status != 200 {
        return 0.0;
    }
    body.lines()
        .filter(|l| l.starts_with("sonde_probe_runs_total{") && l.contains("web-ready"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The agent's Pod deleted: the DaemonSet makes another, whose agent
/// checks the gates again (each at least twice) and writes nothing that
/// flips them or the node's condition.
async fn a_restart_of_the_agent_flips_nothing(cluster: &Cluster, agent: &Pod) {
    let before = conditions(cluster).await;
    assert!(before.values().all(|(s, _)| s == "True" || s == "False"), "{before:?}");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), AGENT_NAMESPACE);
    let name = agent.metadata.name.as_deref().unwrap();
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete the agent's Pod");
    let again = the_agent_pod_is_ready(cluster, Some(agent)).await;
    let token = cluster.kubectl(&["-n", AGENT_NAMESPACE, "create", "token", "scraper"], None);
    let api = api_of(&again);
    let token = token.trim();
    until(cluster, "the new agent's runs of every gate, twice", || async move {
        (gate_runs(api, token).await >= 4.0).then_some(())
    })
    .await;
    assert_eq!(conditions(cluster).await, before, "a restart flipped a condition");
}

/// 40 more Pods at once: for each, the time from its ContainersReady to
/// its gate True, as a watch of the Pods sees them; printed with p50, p90
/// and max.
async fn a_burst_of_pods_is_gated(cluster: &Cluster) {
    let before: Vec<String> = web_pods(cluster)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), APP_NAMESPACE);
    let mut events = watcher(pods, watcher::Config::default().labels("app=web")).boxed();
    let started = Instant::now();
    cluster.apply(&gated_deployment("/healthz", before.len() + BURST));
    let mut containers_ready: BTreeMap<String, Instant> = BTreeMap::new();
    let mut gated: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    while gated.len() < BURST {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {BURST} Pods gated in time", gated.len()))
            .expect("the watch goes on")
            .expect("a watch event");
        let (watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event else {
            continue;
        };
        let now = Instant::now();
        let name = pod.metadata.name.clone().unwrap();
        if before.contains(&name) {
            continue;
        }
        if is_true(&pod, "ContainersReady") {
            containers_ready.entry(name.clone()).or_insert(now);
        }
        if is_true(&pod, GATE) && containers_ready.contains_key(&name) {
            gated.entry(name).or_insert(now);
        }
    }
    let mut latencies: Vec<Duration> = gated.iter().map(|(name, at)| *at - containers_ready[name]).collect();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "burst of {BURST} Pods: all gated {:.1} s after the scale-up; ContainersReady -> gate True: p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        started.elapsed().as_secs_f64(),
        ms(latencies[latencies.len() / 2]),
        ms(latencies[latencies.len() * 9 / 10]),
        ms(*latencies.last().unwrap()),
    );
}
