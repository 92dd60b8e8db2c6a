//! The Kubernetes install as shipped: `deploy/kubernetes/*.yaml` read as
//! they are (not a copy), and `sonde` started the way the DaemonSet starts
//! it — its args and env, the ConfigMap's config, the DaemonSet's user and
//! group, no home directory, an empty environment besides, and each of its
//! volumes as a directory under a fake root (a mount path in an arg, an env
//! value or the ConfigMap's config is rewritten to that directory). The one
//! other change: the ceiling's Pod network, `10.0.0.0/8`, becomes
//! `127.0.0.0/8`, where this test's Pod listens (a test sends no traffic
//! off loopback).
//!
//! The API server is [`FakeApi`] served over HTTP on loopback (the agent
//! finds it through `$KUBECONFIG`, where in a Pod it would use its
//! ServiceAccount), answering `TokenReview`s for a few known tokens and
//! `SubjectAccessReview`s by the rules of `rbac.yaml`'s `sonde-reader`
//! ClusterRole, taken as bound to Prometheus's ServiceAccount. With no
//! other agent, this one takes the status Lease and writes the check's
//! status; every request it makes is checked against the rules
//! `rbac.yaml` binds to its ServiceAccount.
//!
//! Needs root (to run the agent as the DaemonSet's user, as CI does) and
//! the DaemonSet's port, 9464, free on loopback.

use crate::support::call;
use crate::support::fake_api::{Body, FakeApi, Recorded, cond, full};
use crate::support::rbac::{agent_may, agent_rules};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NODE: &str = "node-7";
/// The ConfigMap's ceiling: the Pod network.
const POD_NETWORK: &str = "10.0.0.0/8:*";
const PATIENCE: Duration = Duration::from_secs(60);
/// The agent's own ServiceAccount token (from the kubeconfig).
const AGENT_TOKEN: &str = "sonde-serviceaccount-token";
/// Prometheus's ServiceAccount token, bound to `sonde-reader`.
const PROMETHEUS_TOKEN: &str = "prometheus-serviceaccount-token";
const PROMETHEUS_USER: &str = "system:serviceaccount:monitoring:prometheus";
/// A valid token of a user no role is bound to.
const STRANGER_TOKEN: &str = "stranger-token";

fn manifest(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn of_kind(docs: &[Value], kind: &str, name: &str) -> Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .clone()
}

/// What the fake API server's reviews saw.
#[derive(Default)]
struct Reviews {
    tokens: AtomicUsize,
    access: AtomicUsize,
    /// The `Authorization` headers the agent sent with its reviews.
    agent_auth: Mutex<Vec<String>>,
}

/// `sonde-reader`'s non-resource rules: (paths, verbs).
fn reader_rules() -> Vec<(Vec<String>, Vec<String>)> {
    let rbac = manifest("rbac.yaml");
    let role = of_kind(&rbac, "ClusterRole", "sonde-reader");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (strings(&r["nonResourceURLs"]), strings(&r["verbs"])))
        .collect()
}

/// RBAC's match of a non-resource URL: exact, or a prefix ending in `*`.
fn rbac_allows(rules: &[(Vec<String>, Vec<String>)], path: &str, verb: &str) -> bool {
    rules.iter().any(|(paths, verbs)| {
        verbs.iter().any(|v| v == verb || v == "*")
            && paths.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => p == path,
            })
    })
}

async fn route(
    api: FakeApi,
    reviews: Arc<Reviews>,
    rules: Arc<Vec<(Vec<String>, Vec<String>)>>,
    req: http::Request<hyper::body::Incoming>,
) -> http::Response<Body> {
    use http_body_util::BodyExt;
    let path = req.uri().path().to_string();
    let review = matches!(
        path.as_str(),
        "/apis/authentication.k8s.io/v1/tokenreviews" | "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    );
    if !review {
        return api.answer(req).await;
    }
    assert_eq!(req.method(), "POST", "{path}");
    let auth = req
        .headers()
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    reviews.agent_auth.lock().unwrap().push(auth);
    let body: Value = serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let mut answer = body.clone();
    if path.ends_with("/tokenreviews") {
        reviews.tokens.fetch_add(1, Ordering::SeqCst);
        assert_eq!(body["kind"], "TokenReview");
        let user = match body["spec"]["token"].as_str().unwrap() {
            PROMETHEUS_TOKEN => Some(PROMETHEUS_USER),
            STRANGER_TOKEN => Some("stranger@example.com"),
            _ => None,
        };
        answer["status"] = match user {
            Some(u) => json!({"authenticated": true, "user": {"username": u, "uid": format!("uid-{u}"),
                              "groups": ["system:authenticated"]}}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
    } else {
        reviews.access.fetch_add(1, Ordering::SeqCst);
        assert_eq!(body["kind"], "SubjectAccessReview");
        let spec = &body["spec"];
        assert!(spec["resourceAttributes"].is_null(), "{spec}");
        let attrs = &spec["nonResourceAttributes"];
        let allowed = spec["user"] == PROMETHEUS_USER
            && spec["groups"] == json!(["system:authenticated"])
            && spec["uid"] == format!("uid-{PROMETHEUS_USER}")
            && rbac_allows(&rules, attrs["path"].as_str().unwrap(), attrs["verb"].as_str().unwrap());
        answer["status"] = json!({"allowed": allowed});
    }
    full(201, &answer)
}

/// Serves `api` (and the reviews) over HTTP/1.1 on loopback.
async fn serve(api: FakeApi, reviews: Arc<Reviews>) -> SocketAddr {
    let rules = Arc::new(reader_rules());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (api, reviews, rules) = (api.clone(), reviews.clone(), rules.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let (api, reviews, rules) = (api.clone(), reviews.clone(), rules.clone());
                    async move { Ok::<_, Infallible>(route(api, reviews, rules, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `path` with a volume's mount path replaced by its directory.
fn mapped(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (mount, dir) in mounts {
        if value == mount || value.starts_with(&format!("{mount}/")) {
            return format!("{}{}", dir.display(), &value[mount.len()..]);
        }
    }
    value.to_string()
}

/// How the agent is started the way the DaemonSet starts it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Launch {
    /// On this host's filesystem as the DaemonSet's user and group, each
    /// volume a directory under a fake root (paths rewritten to it).
    Host,
    /// As the DaemonSet's container under podman: an image of the binary
    /// alone (`FROM scratch`: the binary and the libraries it links), the
    /// container's security context (read-only root with no `/tmp`, no
    /// capabilities, no privilege escalation, its user and group) and its
    /// volumes mounted where the Pod mounts them. The one difference: the
    /// host's network, where this test's API server and Pod listen.
    Container,
}

/// The two launches share the DaemonSet's port.
static PORT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_shipped_daemonset_starts_serves_a_gate_and_authenticates_scrapes_by_token_review() {
    shipped_daemonset(Launch::Host).await;
}

/// The blocker a real node found: the container crash-looped on its
/// read-only root ("cannot set up the wasm engine: Read-only file system
/// … /tmp/sonde-empty-…"), which the run on the host's filesystem could
/// not see.
#[tokio::test]
async fn the_shipped_daemonset_container_starts_on_its_read_only_root_and_serves_a_gate() {
    shipped_daemonset(Launch::Container).await;
}

/// The volumes of the DaemonSet's container: (mount path, directory),
/// the ConfigMap's files written (the ceiling's Pod network on loopback;
/// for [`Launch::Host`], mount paths rewritten to the directories).
fn lay_out_volumes(fake: &Path, pod_spec: &Value, launch: Launch) -> Vec<(String, PathBuf)> {
    let container = &pod_spec["containers"][0];
    let configmap = manifest("configmap.yaml").remove(0);
    let mut mounts = Vec::new();
    for m in container["volumeMounts"].as_array().unwrap() {
        let mount = m["mountPath"].as_str().unwrap().to_string();
        let dir = fake.join(mount.trim_start_matches('/'));
        mounts.push((mount, dir));
    }
    for (m, (_, dir)) in container["volumeMounts"].as_array().unwrap().iter().zip(&mounts) {
        let volume = pod_spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        std::fs::create_dir_all(dir).unwrap();
        for a in dir.ancestors().take_while(|a| *a != fake) {
            chmod(a, 0o755);
        }
        if let Some(name) = volume["configMap"]["name"].as_str() {
            assert_eq!(configmap["metadata"]["name"], name);
            for (file, text) in configmap["data"].as_object().unwrap() {
                let mut text = text.as_str().unwrap().to_string();
                if launch == Launch::Host {
                    for (mount, dir) in &mounts {
                        text = text.replace(mount.as_str(), &dir.display().to_string());
                    }
                }
                if file == "sonde.yaml" {
                    assert!(
                        text.contains(POD_NETWORK),
                        "the ConfigMap's ceiling no longer names {POD_NETWORK}"
                    );
                    text = text.replace(POD_NETWORK, "127.0.0.0/8:*");
                }
                std::fs::write(dir.join(file), text).unwrap();
                chmod(&dir.join(file), 0o644);
            }
            chmod(dir, 0o555);
        } else if volume["hostPath"].is_object() {
            // The host's own files, never written: a directory of the fake
            // root stands for the host's, mounted as the Pod mounts it.
            assert_eq!(m["readOnly"], true, "a host path is mounted read-only: {m}");
            assert_eq!(volume["hostPath"]["type"], "Directory", "{volume}");
            chmod(dir, 0o755);
        } else {
            assert!(volume["emptyDir"].is_object(), "a volume this test knows: {volume}");
            // An emptyDir is created world-writable, as the kubelet does.
            chmod(dir, 0o777);
        }
    }
    mounts
}

/// Removes the test's container and image, however the test ends.
struct PodmanCleanup {
    podman: PathBuf,
    name: String,
    tag: String,
}

impl Drop for PodmanCleanup {
    fn drop(&mut self) {
        let podman = |args: &[&str]| {
            let _ = std::process::Command::new(&self.podman)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        };
        podman(&["rm", "--force", "--time", "0", &self.name]);
        podman(&["rmi", "--force", &self.tag]);
    }
}

/// `podman run` of the DaemonSet's container, from `image`, with its
/// security context, env and volumes; `kubeconfig` mounted where `$KUBECONFIG`
/// names it (in a Pod the agent uses its ServiceAccount instead).
fn podman_run(
    podman: &Path,
    pod_spec: &Value,
    mounts: &[(String, PathBuf)],
    env: &BTreeMap<String, String>,
    image: &str,
    name: &str,
    kubeconfig: &Path,
) -> std::process::Command {
    let container = &pod_spec["containers"][0];
    let pod_context = &pod_spec["securityContext"];
    let context = &container["securityContext"];
    // runc: crun refuses this machine's hybrid cgroup layout.
    let mut command = std::process::Command::new(podman);
    command.args(["--runtime", "runc", "run", "--rm", "--pull=never", "--name", name]);
    command.args([
        "--network=host",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
    ]);
    command.arg(format!(
        "--user={}:{}",
        pod_context["runAsUser"], pod_context["runAsGroup"]
    ));
    if context["readOnlyRootFilesystem"] == true {
        // podman would mount a tmpfs on /tmp; a Pod gets none.
        command.args(["--read-only", "--read-only-tmpfs=false"]);
    }
    for cap in context["capabilities"]["drop"].as_array().into_iter().flatten() {
        command.arg(format!("--cap-drop={}", cap.as_str().unwrap()));
    }
    if context["allowPrivilegeEscalation"] == false {
        command.arg("--security-opt=no-new-privileges");
    }
    for (m, (mount, dir)) in container["volumeMounts"].as_array().unwrap().iter().zip(mounts) {
        let ro = if m["readOnly"] == true { ":ro" } else { "" };
        command.arg(format!("--volume={}:{mount}{ro}", dir.display()));
    }
    command.arg(format!(
        "--volume={}:/run/sonde-test/kubeconfig:ro",
        kubeconfig.display()
    ));
    command.arg("--env=KUBECONFIG=/run/sonde-test/kubeconfig");
    for (k, v) in env {
        command.arg(format!("--env={k}={v}"));
    }
    command.arg(image);
    command
}

async fn shipped_daemonset(launch: Launch) {
    // SAFETY: getuid has no preconditions.
    #[allow(
        unsafe_code,
        reason = "getuid, to know whether the test can run as the DaemonSet's user"
    )]
    let root = unsafe { libc::getuid() } == 0;
    if !root {
        eprintln!("SKIPPED the shipped-install test: it runs the agent as the DaemonSet's user, which needs root");
        return;
    }
    let podman = match launch {
        Launch::Host => None,
        Launch::Container => {
            let (Some(podman), Some(_)) = (
                crate::support::tool("podman", "podman"),
                crate::support::tool("runc", "runc"),
            ) else {
                return;
            };
            Some(podman)
        }
    };
    let _port = PORT.lock().await;
    let daemonset = manifest("daemonset.yaml").remove(0);
    let pod_spec = &daemonset["spec"]["template"]["spec"];
    let container = &pod_spec["containers"][0];
    let uid = pod_spec["securityContext"]["runAsUser"].as_u64().unwrap();
    let gid = pod_spec["securityContext"]["runAsGroup"].as_u64().unwrap();
    assert_eq!(pod_spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);

    // The fake root: the volumes, and for the host launch the binary where
    // the image has it.
    let fake = tempfile::tempdir().unwrap();
    chmod(fake.path(), 0o755);
    let bin = fake.path().join("usr/local/bin/sonde");
    if launch == Launch::Host {
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::copy(env!("CARGO_BIN_EXE_sonde"), &bin).unwrap();
        chmod(&bin, 0o755);
    }
    let mounts = lay_out_volumes(fake.path(), pod_spec, launch);
    let map = |v: &str| match launch {
        Launch::Host => mapped(v, &mounts),
        Launch::Container => v.to_string(),
    };

    // The API server, with one Pod of this node behind a gate.
    let api = FakeApi::new();
    // No other agent: this one takes the status Lease and writes statuses.
    api.open_leases();
    let reviews = Arc::new(Reviews::default());
    let server = serve(api.clone(), reviews.clone()).await;
    // The Pod's service: a real listener at its IP.
    let app = sonde_tests::CountingListener::start().await;
    api.put(
        json!({
            "apiVersion": "sonde.dev/v1alpha1", "kind": "SondeCheck",
            "metadata": {"namespace": "default", "name": "ready", "uid": "check-ready"},
            "spec": {"plugin": "tcp", "port": app.addr.port(), "periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 1}
        }),
        true,
    );
    // In the ceiling (the Pod network, here on loopback): a check the
    // tenant may run.
    api.put(
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": "default", "name": "web-0", "uid": "uid-web-0"},
            "spec": {"nodeName": NODE, "readinessGates": [{"conditionType": "sonde.dev/ready"}],
                     "containers": [{"name": "app", "image": "app"}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                       "conditions": [{"type": "ContainersReady", "status": "True"}]}
        }),
        true,
    );
    let kubeconfig = fake.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{server}\"}}\nusers:\n- name: sonde\n  user: {{token: {AGENT_TOKEN}}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: sonde}}\ncurrent-context: fake\n"
        ),
    )
    .unwrap();
    chmod(&kubeconfig, 0o644);

    // The DaemonSet's args and env (for the host launch, mount paths mapped).
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| map(a.as_str().unwrap()))
        .collect();
    let mut env = BTreeMap::new();
    for e in container["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => map(v),
            (_, Value::String(f)) if f == "spec.nodeName" => NODE.to_string(),
            (_, Value::String(f)) if f == "status.hostIP" => "127.0.0.1".to_string(),
            // The Pod's name, as the DaemonSet controller would make it.
            (_, Value::String(f)) if f == "metadata.name" => format!("sonde-{}", NODE),
            (_, Value::String(f)) if f == "metadata.namespace" => daemonset["metadata"]["namespace"]
                .as_str()
                .expect("the DaemonSet's namespace")
                .to_string(),
            _ => panic!("an env entry this test cannot fill: {e}"),
        };
        env.insert(name, value);
    }
    // `sonde validate` takes the config `sonde run` is given, as that user.
    let config = args
        .iter()
        .skip_while(|a| *a != "--config")
        .nth(1)
        .expect("--config in the DaemonSet's args");
    let tag = format!("localhost/sonde-shipped-test:{}", std::process::id());
    let name = format!("sonde-shipped-test-{}", std::process::id());
    let _cleanup = podman.as_ref().map(|podman| {
        crate::support::image::podman_import(podman, Path::new(env!("CARGO_BIN_EXE_sonde")), &tag);
        PodmanCleanup {
            podman: podman.clone(),
            name: format!("{name}-run"),
            tag: tag.clone(),
        }
    });
    // The binary as the DaemonSet's user and group, with its env only.
    let as_daemonset = |run: &str| match &podman {
        None => {
            let mut command = std::process::Command::new("setpriv");
            command
                .args([
                    "--reuid",
                    &uid.to_string(),
                    "--regid",
                    &gid.to_string(),
                    "--clear-groups",
                    "--",
                ])
                .arg(&bin)
                .env_clear()
                .envs(&env)
                .env("KUBECONFIG", &kubeconfig)
                .current_dir("/");
            command
        }
        Some(podman) => podman_run(
            podman,
            pod_spec,
            &mounts,
            &env,
            &tag,
            &format!("{name}-{run}"),
            &kubeconfig,
        ),
    };
    let validated = as_daemonset("validate").args(["validate", config]).output().unwrap();
    assert!(
        validated.status.success(),
        "sonde validate refused the shipped config ({launch:?}): {}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );

    let log_path = fake.path().join("sonde.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = tokio::process::Command::from(as_daemonset("run"))
        .args(&args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the agent starts");
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // Ready: /healthz answers 200, without a token.
    let port = container["ports"][0]["containerPort"].as_u64().unwrap() as u16;
    let agent: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("sonde exited ({status}) before it was ready ({launch:?}):\n{}", logs());
        }
        if let Some((200, _)) = crate::support::try_call(agent, "GET", "/healthz", None, b"").await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/healthz was not 200 within {PATIENCE:?} ({launch:?}):\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(call(agent, "GET", "/livez", None, b"").await.0, 200);

    // The Pod's gate is written.
    let waited = tokio::time::timeout(
        PATIENCE,
        api.wait("the gate's condition", |log| {
            log.iter()
                .any(|r| r.method == "PATCH" && r.path.ends_with("/pods/web-0/status"))
        }),
    )
    .await;
    assert!(waited.is_ok(), "no gate written:\n{}", logs());
    // True once a run has reached the Pod (the first write may come first).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let c = loop {
        let pod = api.pod("default", "web-0");
        let c = cond(&pod, "sonde.dev/ready").expect("the gate's condition").clone();
        if c["status"] == "True" || tokio::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(c["status"], "True", "{c}\n{}", logs());
    assert!(app.accepted() >= 1, "the check never reached the Pod");

    // /metrics: 401 without a token or with one the API server does not
    // know, 403 for a user RBAC does not allow, 200 for Prometheus.
    let (status, body) = call(agent, "GET", "/metrics", None, b"").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = call(agent, "GET", "/metrics", Some("forged"), b"").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = call(agent, "GET", "/metrics", Some(STRANGER_TOKEN), b"").await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(agent, "GET", "/metrics", Some(PROMETHEUS_TOKEN), b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("sonde_"), "{body}");
    let (status, body) = call(agent, "GET", "/v1/probes", Some(PROMETHEUS_TOKEN), b"").await;
    assert_eq!(status, 200, "sonde-reader reads probes: {body}");
    assert!(body.contains("web-0"), "{body}");
    let (status, body) = call(agent, "DELETE", "/v1/probes/x", Some(PROMETHEUS_TOKEN), b"").await;
    assert_eq!(status, 403, "sonde-reader writes nothing: {body}");

    // Cached: the same scrape again asks the API server nothing more.
    let before = (
        reviews.tokens.load(Ordering::SeqCst),
        reviews.access.load(Ordering::SeqCst),
    );
    for _ in 0..3 {
        assert_eq!(call(agent, "GET", "/metrics", Some(PROMETHEUS_TOKEN), b"").await.0, 200);
        assert_eq!(call(agent, "GET", "/metrics", Some("forged"), b"").await.0, 401);
    }
    let after = (
        reviews.tokens.load(Ordering::SeqCst),
        reviews.access.load(Ordering::SeqCst),
    );
    assert_eq!(before, after, "cached reviews are not asked again");
    // Every review went out with the agent's own credentials.
    let sent = reviews.agent_auth.lock().unwrap().clone();
    assert!(!sent.is_empty());
    assert!(sent.iter().all(|a| *a == format!("Bearer {AGENT_TOKEN}")), "{sent:?}");

    // It elected itself and wrote the check's status; every request it
    // made to the API server is one the shipped RBAC allows.
    let waited = tokio::time::timeout(
        PATIENCE,
        api.wait("the check's status", |log| {
            log.iter()
                .any(|r| r.method == "PATCH" && r.path.ends_with("/sondechecks/ready/status"))
        }),
    )
    .await;
    assert!(waited.is_ok(), "no status written:\n{}", logs());
    let rules = agent_rules();
    let requests = api.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path.contains("/namespaces/sonde-system/leases"))
    );
    for r in &requests {
        assert!(
            agent_may(&rules, r),
            "rbac.yaml does not allow {} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }
    let elsewhere = Recorded {
        path: "/apis/coordination.k8s.io/v1/namespaces/default/leases/sonde-status".into(),
        ..requests.iter().find(|r| r.path.contains("/leases/")).unwrap().clone()
    };
    assert!(!agent_may(&rules, &elsewhere), "Leases in the agent's namespace only");

    // It wrote where the manifests give room, and nowhere else.
    let cache = &mounts.iter().find(|(m, _)| m == "/var/cache/sonde").unwrap().1;
    assert!(cache.join("state").is_dir(), "state_dir on the volume:\n{}", logs());
    let compiled = std::fs::read_dir(cache.join("compiled"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(compiled > 0, "the compile cache is on the volume:\n{}", logs());
    assert!(!logs().contains("compile cache disabled"), "{}", logs());

    assert!(!logs().contains("Read-only file system"), "{}", logs());

    child.start_kill().unwrap();
    let _ = child.wait().await;
}
