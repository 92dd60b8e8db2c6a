//! What we ship, as a user meets it: every config in `docs/examples/` and
//! `examples/` is read as shipped and checked by `sonde validate`, and the
//! ones that can run on one machine (nginx in front of an app, the
//! Calico-style node agent, the multi-tenant agent) run in a real
//! `sonde run` against local servers until they reach the states the file
//! promises. The flag table and the metrics table of `docs/config.md` are
//! checked against the CLI and a real `/metrics`. That every shipped config
//! is read here by `Example::read` is checked by the harness's own tests
//! (`tests/tests/all/examples.rs`), which read this file. (The YAML blocks of
//! `README.md` and `docs/*.md` that are configs are parsed by sonde-core's
//! tests, `config::`; the rollout example's nginx is in sonde-sandbox's,
//! `backend::`.)
//!
//! **The substitution.** An example names paths and addresses of the
//! machine it is written for (`/etc/sonde/tokens/acme`, `127.0.0.1:80`).
//! A test replaces exactly those, each listed in the test: a path by a
//! fixture file or directory of the same kind in a temporary directory, an
//! address by a free loopback port where a local server (or the agent's
//! API) listens. Nothing else of the file changes, and each replaced text
//! must occur in the file, so an example that stops naming it fails the
//! test instead of being tested with what it no longer says.

use crate::support::{cache_dir, call, repo, secret, sonde};
use sonde_tests::processes::{Running, start_nginx_serving};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An example as shipped, with the substitutions of its test applied.
struct Example {
    name: &'static str,
    text: String,
}

impl Example {
    fn read(name: &'static str) -> Self {
        let text = std::fs::read_to_string(repo().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        Self { name, text }
    }

    /// Replaces every occurrence of `from`, which the file must name.
    fn sub(mut self, from: &str, to: impl AsRef<str>) -> Self {
        assert!(
            self.text.contains(from),
            "{} no longer names {from:?}: update its test's substitutions",
            self.name
        );
        self.text = self.text.replace(from, to.as_ref());
        self
    }

    /// Writes the substituted config into `dir` and checks it the way an
    /// operator would first: `sonde validate` answers `ok`, and its API
    /// does not listen on an address the file probes.
    fn write_valid(&self, dir: &Path, env: &[(&str, &str)]) -> PathBuf {
        let path = dir.join("sonde.yaml");
        std::fs::write(&path, &self.text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
            .arg("--cache-dir")
            .arg(cache_dir())
            .arg("validate")
            .arg(&path)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sonde validate {}: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let file = sonde_core::config::parse(&path, &self.text).unwrap_or_else(|e| panic!("{e}"));
        if let Some(listen) = file.api.as_ref().and_then(|a| a.value.listen.clone()) {
            for t in &file.targets {
                let probed = std::iter::once(&t.address.value)
                    .chain(t.probes.iter().filter_map(|p| p.target.as_ref().map(|a| &a.value)));
                for address in probed {
                    assert!(
                        !address.contains(&listen),
                        "{}: the API listens on {listen}, the address target {} probes",
                        self.name,
                        t.name.value
                    );
                }
            }
        }
        path
    }

    /// The API paths (`/v1/…`) the file's comments tell a reader to read.
    fn documented_gets(&self) -> Vec<String> {
        let mut paths = Vec::new();
        for line in self.text.lines().filter(|l| l.trim_start().starts_with('#')) {
            for (i, _) in line.match_indices("/v1/") {
                let path = line[i..].split_whitespace().next().unwrap_or("");
                paths.push(path.trim_end_matches(['.', ',', ')', ';', '`']).to_string());
            }
        }
        paths
    }
}

/// A free loopback address (bound and released at once).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Writes an executable shell script at `path`.
fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A real HTTP/1.1 server (hyper) on a free loopback port answering
/// `routes` (path, status, body) and 404 otherwise; it records the `Host`
/// of each request.
struct Routes {
    addr: SocketAddr,
    hosts: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Routes {
    async fn start(routes: &'static [(&'static str, u16, &'static str)]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hosts = Arc::new(Mutex::new(Vec::new()));
        let seen = hosts.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let host = req
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        seen.lock().unwrap().push(host);
                        let path = req.uri().path().to_string();
                        let (status, body) = routes
                            .iter()
                            .find(|(p, _, _)| *p == path)
                            .map_or((404, "not found"), |(_, s, b)| (*s, *b));
                        let response = hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(bytes::Bytes::from_static(body.as_bytes())))
                            .unwrap();
                        async move { Ok::<_, std::convert::Infallible>(response) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, hosts, task }
    }

    fn hosts(&self) -> Vec<String> {
        self.hosts.lock().unwrap().clone()
    }
}

impl Drop for Routes {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts `sonde run --no-jitter --config CONFIG` (its API where the file
/// says), with `env` added to its environment.
fn sonde_run(config: &Path, env: &[(&str, &str)]) -> Running {
    let log = config.with_file_name("sonde.log");
    let child = Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(["run", "--no-jitter", "--grace", "0s", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start sonde run");
    Running {
        child,
        what: "sonde run",
        log,
    }
}

/// Waits (up to 120 s: the first run may compile the built-in plugins)
/// until every probe named in `want` has the state given, as `token` sees
/// `/v1/probes`, and returns that list.
async fn wait_states(
    agent: &mut Running,
    api: SocketAddr,
    token: Option<&str>,
    want: &[(&str, &str)],
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("{} exited ({status}):\n{}", agent.what, agent.log());
        }
        let (status, body) = match tokio::net::TcpStream::connect(api).await {
            Ok(_) => call(api, "GET", "/v1/probes", token, b"").await,
            Err(_) => (0, String::new()),
        };
        let list: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let state = |name: &str| {
            list.as_array()
                .and_then(|l| l.iter().find(|p| p["name"] == name))
                .map(|p| p["state"].as_str().unwrap_or("").to_string())
        };
        if status == 200 && want.iter().all(|(n, s)| state(n).as_deref() == Some(*s)) {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "never reached {want:?}: {status} {body}\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every API path the comments of `example` name answers 200 (with
/// `token`).
async fn documented_gets_answer(example: &Example, api: SocketAddr, token: Option<&str>) {
    let gets = example.documented_gets();
    assert!(!gets.is_empty(), "{} documents no API path to read", example.name);
    for path in gets {
        let (status, body) = call(api, "GET", &path, token, b"").await;
        assert_eq!(status, 200, "{}: GET {path}: {body}", example.name);
    }
}

#[test]
fn the_postgres_example_validates() {
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    secret(&secrets, "pg-monitor", "monitor-password");
    let check_pgsql = dir.path().join("check_pgsql");
    script(&check_pgsql, "echo 'OK'");
    Example::read("docs/examples/postgres.yaml")
        .sub("/etc/sonde/secrets", secrets.to_str().unwrap())
        .sub("/usr/lib/nagios/plugins/check_pgsql", check_pgsql.to_str().unwrap())
        .write_valid(dir.path(), &[]);
}

/// The nginx the example sits behind: a real one (Debian's `nginx`) on
/// `listen`, proxying everything to `app` with the request's `Host`.
fn start_nginx(dir: &Path, listen: SocketAddr, app: SocketAddr) -> Running {
    let server = format!(
        "server {{\n    listen {listen};\n    location / {{ proxy_pass http://{app}; proxy_set_header Host $host; }}\n  }}\n"
    );
    start_nginx_serving(dir, &server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_example_runs_behind_a_real_nginx() {
    let app = Routes::start(&[
        ("/healthz", 200, r#"{"status": {"db": "ok"}}"#),
        ("/livez", 200, "alive"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let front = free_addr();
    let mut nginx = start_nginx(dir.path(), front, app.addr);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(front).await.is_err() {
        if let Ok(Some(s)) = nginx.child.try_wait() {
            panic!("nginx exited ({s}): {}", nginx.log());
        }
        assert!(Instant::now() < deadline, "nginx never listened: {}", nginx.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restarts = dir.path().join("restarts");
    let systemctl = dir.path().join("systemctl");
    script(&systemctl, &format!("echo \"$@\" >> {}", restarts.display()));
    let api = free_addr();
    let state = dir.path().join("state");
    let example = Example::read("docs/examples/web-behind-nginx.yaml")
        .sub("127.0.0.1:9464", api.to_string())
        .sub("/var/lib/sonde", state.to_str().unwrap())
        .sub("127.0.0.1:80", front.to_string())
        .sub("/usr/bin/systemctl", systemctl.to_str().unwrap());
    let config = example.write_valid(dir.path(), &[]);
    let mut agent = sonde_run(&config, &[]);
    // The readiness probe needs 2 passes in a row (its period: 10 s).
    wait_states(
        &mut agent,
        api,
        None,
        &[
            ("nginx-liveness", "success"),
            ("shop-startup", "success"),
            ("shop-readiness", "success"),
            ("shop-liveness", "success"),
        ],
    )
    .await;
    documented_gets_answer(&example, api, None).await;
    let (status, body) = call(api, "GET", "/v1/ready/frontend", None, b"").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        app.hosts().iter().any(|h| h == "shop.example.com"),
        "the readiness probe's Host header never reached the app through nginx: {:?}",
        app.hosts()
    );
    assert!(!restarts.exists(), "a healthy app was restarted");
    drop(nginx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calico_style_example_runs_against_local_felix_and_bird() {
    let felix = Routes::start(&[("/liveness", 200, "{}"), ("/readiness", 200, "{}")]).await;
    let bird = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bird_addr = bird.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = bird.accept().await {
            held.push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let calico = dir.path().join("calico");
    std::fs::create_dir(&calico).unwrap();
    std::fs::write(calico.join("nodename"), "worker-1").unwrap();
    let ctl = dir.path().join("bird.ctl");
    std::fs::write(&ctl, "").unwrap();
    let birdcl = dir.path().join("birdcl");
    script(
        &birdcl,
        "echo 'BIRD 2.0.12 ready.'\necho 'Mesh_10_0_0_2 BGP --- up 2026-11-25 Established'",
    );
    let sv = dir.path().join("sv");
    let restarts = dir.path().join("restarts");
    script(&sv, &format!("echo \"$@\" >> {}", restarts.display()));
    let api = free_addr();
    let example = Example::read("docs/examples/calico-node-style.yaml")
        .sub("127.0.0.1:9464", api.to_string())
        .sub("/var/run/sonde", dir.path().join("state").to_str().unwrap())
        .sub("127.0.0.1:9099", felix.addr.to_string())
        .sub("127.0.0.1:179", bird_addr.to_string())
        .sub("/usr/bin/sv", sv.to_str().unwrap())
        .sub("/usr/local/bin/birdcl", birdcl.to_str().unwrap())
        .sub("/var/run/calico/bird.ctl", ctl.to_str().unwrap())
        .sub("/var/lib/calico", calico.to_str().unwrap());
    let config = example.write_valid(dir.path(), &[]);
    let mut agent = sonde_run(&config, &[]);
    wait_states(
        &mut agent,
        api,
        None,
        &[
            ("felix-live", "success"),
            ("felix-ready", "success"),
            ("nodename", "success"),
            ("bird-ready", "success"),
            ("bird-sessions", "success"),
        ],
    )
    .await;
    documented_gets_answer(&example, api, None).await;
    // `sonde check --group node`, as the kubelet's exec probe runs it.
    let out = sonde(&["check", "--group", "node", "--api", &format!("http://{api}")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!restarts.exists(), "a healthy felix was restarted");
    accept.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_tenant_example_runs_and_each_token_sees_its_own() {
    let exporter = Routes::start(&[("/metrics", 200, "up 1\n")]).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::create_dir(&tokens).unwrap();
    secret(&tokens, "operator", "operator-token");
    secret(&tokens, "acme", "acme-token");
    let api = free_addr();
    let example = Example::read("docs/examples/multi-tenant.yaml")
        .sub("0.0.0.0:9464", api.to_string())
        .sub("/etc/sonde/tokens/", format!("{}/", tokens.display()))
        .sub("127.0.0.1:9100", exporter.addr.to_string());
    let env = [("GLOBEX_TOKEN", "globex-token")];
    let config = example.write_valid(dir.path(), &env);
    let mut agent = sonde_run(&config, &env);
    let all = wait_states(
        &mut agent,
        api,
        Some("operator-token"),
        &[("node-exporter-readiness", "success")],
    )
    .await;
    let names = |list: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        names(&all),
        ["billing-ready", "node-exporter-readiness", "shop-db", "shop-ready"]
    );
    for (token, want) in [
        ("acme-token", vec!["shop-db", "shop-ready"]),
        ("globex-token", vec!["billing-ready"]),
    ] {
        let (status, body) = call(api, "GET", "/v1/probes", Some(token), b"").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(names(&serde_json::from_str(&body).unwrap()), want, "{token}");
    }
    let (status, _) = call(api, "GET", "/v1/probes", None, b"").await;
    assert_eq!(status, 401);
    let (status, _) = call(
        api,
        "GET",
        "/v1/probes/node-exporter-readiness",
        Some("acme-token"),
        b"",
    )
    .await;
    assert_eq!(status, 404, "a tenant sees the operator's probe");

    // Every metric family the agent serves (tenants' included) is in
    // docs/config.md's table.
    let (status, metrics) = call(api, "GET", "/metrics", Some("operator-token"), b"").await;
    assert_eq!(status, 200, "{metrics}");
    let docs = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    let mut missing = Vec::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (name, kind) = (words.next().unwrap(), words.next().unwrap_or(""));
        let name = if kind == "counter" && !name.ends_with("_total") {
            format!("{name}_total")
        } else {
            name.to_string()
        };
        if !docs.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(metrics.contains("sonde_tenant_"), "{metrics}");
    assert!(missing.is_empty(), "not in docs/config.md's metrics table: {missing:?}");
}

#[test]
fn every_flag_of_sonde_run_is_in_the_readme_synopsis_and_the_flag_table() {
    use clap::CommandFactory;
    let cli = sonde::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("sonde run");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let synopsis = readme
        .lines()
        .skip_while(|l| !l.starts_with("sonde run ["))
        .take_while(|l| !l.starts_with("sonde validate"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!synopsis.is_empty(), "no `sonde run [` synopsis in README.md");
    let config = std::fs::read_to_string(repo().join("docs/config.md")).unwrap();
    let table: Vec<&str> = config
        .lines()
        .skip_while(|l| !l.starts_with("| flag of `sonde run`"))
        .take_while(|l| l.starts_with('|'))
        .collect();
    let mut flags = 0;
    for arg in run.get_arguments().filter(|a| !a.is_global_set()) {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" {
            continue;
        }
        let flag = format!("--{long}");
        assert!(
            synopsis.contains(&format!("[{flag}")),
            "{flag} is not in README.md's synopsis:\n{synopsis}"
        );
        assert!(
            table.iter().any(|row| row.starts_with(&format!("| `{flag}"))),
            "{flag} is not in docs/config.md's flag table"
        );
        flags += 1;
    }
    assert!(flags >= 7, "{flags}");
}
