//! sonde as Prometheus' blackbox exporter: `GET /probe?target=&module=`
//! against real servers on loopback — a live target, a dead one, one
//! outside the module's grant (refused, and never dialled), a tenant's
//! module behind its token, the scrape's deadline, the bounded share a
//! flood of scrapes gets while scheduled probes keep their period — and
//! `sonde validate` refusing what `sonde run` would.

use crate::support::{parse_response, secret, sonde, start_agent, tool};
use sonde_tests::{CountingListener, HttpServer, closed_port};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OP: &str = "operator-secret";
const ACME: &str = "acme-secret";
const BETA: &str = "beta-secret";

/// `GET path` with `headers` (each `Name: value`), on a new connection.
pub(crate) async fn get(api: SocketAddr, path: &str, headers: &[String]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: sonde\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    parse_response(&text)
}

pub(crate) fn bearer(token: &str) -> Vec<String> {
    vec![format!("Authorization: Bearer {token}")]
}

/// The value of the unlabelled sample `name` in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A target `web` at `server` with a readiness probe `web-ready` every
/// 100 ms: the config's `targets:`.
fn web_ready(server: SocketAddr) -> String {
    format!(
        "targets:\n  - name: web\n    address: {server}\n    probes:\n      - {{ name: web-ready, plugin: http, config: {{ path: /health }}, period: 100ms }}\n"
    )
}

fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    secret(dir, "op.token", OP);
    secret(dir, "acme.token", ACME);
    secret(dir, "beta.token", BETA);
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn modules_config(dir: &Path, server: SocketAddr) -> PathBuf {
    let port = server.port();
    write_config(
        dir,
        &format!(
            r#"operator_token_file: op.token
tenants:
  - id: acme
    token_file: acme.token
    ceiling: {{ net: ["127.0.0.1:*"] }}
  - id: beta
    token_file: beta.token
modules:
  http_2xx:
    plugin: http
    config: {{ path: /health }}
    timeout: 5s
    grants: {{ net: ["127.0.0.1:{port}"] }}
  tcp_connect:
    plugin: tcp
    timeout: 2s
    grants: {{ net: ["127.0.0.0/8:*"] }}
  acme_http:
    plugin: http
    tenant: acme
    config: {{ path: /health }}
    grants: {{ net: ["127.0.0.1:*"] }}
"#
        ),
    )
}

#[tokio::test]
async fn probe_answers_success_for_a_live_target_and_failure_for_a_dead_one() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start_agent(&modules_config(dir.path(), server.addr)).await;

    let (status, body) = get(
        api,
        &format!("/probe?target={}&module=http_2xx", server.addr),
        &bearer(OP),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sample(&body, "probe_success"), Some(1.0), "{body}");
    let took = sample(&body, "probe_duration_seconds").unwrap();
    assert!(took > 0.0 && took < 5.0, "{body}");
    assert!(body.contains("sonde_probe_metric{metric=\"status_code\""), "{body}");

    // The same server, sick: the plugin's verdict.
    server.set_healthy(false);
    let (_, body) = get(
        api,
        &format!("/probe?target={}&module=http_2xx", server.addr),
        &bearer(OP),
    )
    .await;
    assert_eq!(sample(&body, "probe_success"), Some(0.0), "{body}");

    // Nothing listens there: 0, with the plugin's reason.
    let dead = closed_port();
    let (status, body) = get(
        api,
        &format!("/probe?target={dead}&module=tcp_connect&debug=true"),
        &bearer(OP),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(sample(&body, "probe_success"), Some(0.0), "{body}");
    assert!(body.contains("admission: allowed"), "{body}");

    // Another spelling of a granted address is the same address.
    let spelled = format!("127.1:{}", server.addr.port());
    let (_, body) = get(api, &format!("/probe?target={spelled}&module=tcp_connect"), &bearer(OP)).await;
    assert_eq!(sample(&body, "probe_success"), Some(1.0), "{body}");
}

#[tokio::test]
async fn a_target_outside_the_grant_is_refused_and_never_dialled() {
    let server = HttpServer::start().await;
    let other = CountingListener::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, api) = start_agent(&modules_config(dir.path(), server.addr)).await;

    // http_2xx may reach the server's port only.
    let outside = [
        other.addr.to_string(),
        format!("http://{}/health", other.addr),
        format!("localhost:{}", server.addr.port()),
        "10.1.2.3:80".to_string(),
        // The agent's own API, through a grant that covers its address.
        api.to_string(),
    ];
    let cases = outside
        .iter()
        .map(|t| ("http_2xx", t.clone()))
        .chain([("tcp_connect", api.to_string())]);
    for (module, target) in cases {
        let (status, body) = get(
            api,
            &format!("/probe?target={}&module={module}&debug=true", urlencode(&target)),
            &bearer(OP),
        )
        .await;
        assert_eq!(status, 200, "{target}: {body}");
        assert!(body.contains("admission: denied"), "{target}: {body}");
        assert!(body.contains("nothing was dialled"), "{target}: {body}");
        assert_eq!(sample(&body, "probe_success"), Some(0.0), "{target}: {body}");
        assert!(body.contains("reason=\"denied\""), "{target}: {body}");
    }
    assert_eq!(other.accepted(), 0, "a refused target was dialled");
    drop(agent);
}

pub(crate) fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test]
async fn a_tenants_module_answers_its_token_only() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start_agent(&modules_config(dir.path(), server.addr)).await;
    let path = format!("/probe?target={}&module=acme_http", server.addr);
    for token in [ACME, OP] {
        let (status, body) = get(api, &path, &bearer(token)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(sample(&body, "probe_success"), Some(1.0), "{body}");
    }
    let (status, body) = get(api, &path, &bearer(BETA)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no module named \\\"acme_http\\\""), "{body}");
    // And acme does not see the operator's modules.
    let (status, _) = get(
        api,
        &format!("/probe?target={}&module=http_2xx", server.addr),
        &bearer(ACME),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = get(api, &path, &[]).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn bad_requests_name_what_is_wrong() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, api) = start_agent(&modules_config(dir.path(), server.addr)).await;
    let t = server.addr;
    for (path, headers, says) in [
        (format!("/probe?target={t}"), vec![], "module: missing"),
        ("/probe?module=http_2xx".to_string(), vec![], "target: missing"),
        (format!("/probe?target={t}&module=nope"), vec![], "no module named"),
        (
            format!("/probe?target={t}&module=http_2xx"),
            vec!["X-Prometheus-Scrape-Timeout-Seconds: soon".to_string()],
            "x-prometheus-scrape-timeout-seconds",
        ),
    ] {
        let mut h = bearer(OP);
        h.extend(headers);
        let (status, body) = get(api, &path, &h).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
}

#[tokio::test]
async fn the_scrape_timeout_less_its_margin_bounds_the_run() {
    let silent = CountingListener::start_silent().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = r#"operator_token_file: op.token
modules:
  slow:
    plugin: http
    timeout: 30s
    grants: { net: ["127.0.0.1:*"] }
"#;
    let (_agent, api) = start_agent(&write_config(dir.path(), yaml)).await;
    let mut h = bearer(OP);
    h.push("X-Prometheus-Scrape-Timeout-Seconds: 1.5".into());
    let start = Instant::now();
    let (status, body) = get(
        api,
        &format!("/probe?target={}&module=slow&debug=true", silent.addr),
        &h,
    )
    .await;
    let took = start.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("deadline 1s"), "{body}");
    // The plugin (told its deadline) or the host (enforcing it) ends it.
    assert_eq!(sample(&body, "probe_success"), Some(0.0), "{body}");
    let timed_out =
        body.contains("reason=\"timeout\"") || body.lines().any(|l| l.starts_with("message:") && l.contains("timeout"));
    assert!(timed_out, "{body}");
    // 1.5 s less the 0.5 s margin, not the module's 30 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[tokio::test]
async fn a_flood_of_scrapes_gets_429_and_scheduled_probes_keep_their_period() {
    let server = HttpServer::start().await;
    let silent = CountingListener::start_silent().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = r#"operator_token_file: op.token
api: { max_probe_runs: 2, max_probe_queue: 2 }
modules:
  slow:
    plugin: http
    timeout: 3s
    grants: { net: ["127.0.0.1:*"] }
"#
    .to_string()
        + &web_ready(server.addr);
    let (_agent, api) = start_agent(&write_config(dir.path(), &yaml)).await;
    let path = format!("/probe?target={}&module=slow", silent.addr);
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let path = path.clone();
            tokio::spawn(async move { get(api, &path, &bearer(OP)).await.0 })
        })
        .collect();
    // While the flood holds every /probe slot and queue place, the
    // scheduled probe goes on: ten more runs at its 100 ms period, well
    // within the 3 s the flood's runs hang for.
    let before = server.accepted();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.accepted() < before + 10 {
        assert!(Instant::now() < deadline, "the scheduled probe stalled under the flood");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut codes = Vec::new();
    for f in flood {
        codes.push(f.await.unwrap());
    }
    let refused = codes.iter().filter(|c| **c == 429).count();
    let ran = codes.iter().filter(|c| **c == 200).count();
    // Queued, then past their deadline before a run slot came free.
    let late = codes.iter().filter(|c| **c == 503).count();
    // Two ran at once and two waited; the rest were refused at once (a
    // request that arrived after the first runs ended may have run too).
    assert_eq!(refused + ran + late, codes.len(), "{codes:?}");
    assert!(late <= 2, "{codes:?}");
    assert!(ran >= 2 && refused >= 28, "{codes:?}");
    // Each run that was let in dialled once: never more than were run.
    assert!(silent.accepted() <= ran, "{} > {ran}", silent.accepted());
}

/// A `/probe` run is polled on the thread that serves its request, not
/// handed to the sandbox threads: with every `/probe` slot taken by a
/// plugin that spins until its deadline, the API (on this test's one
/// thread) must still answer, because a spinning call yields at each epoch
/// tick.
#[tokio::test]
async fn spinning_probe_runs_leave_the_api_answering() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"operator_token_file: op.token
api: {{ max_probe_runs: 4 }}
modules:
  spin:
    plugin: {spin}
    timeout: 3s
    grants: {{ net: ["127.0.0.1:*"] }}
"#,
        spin = sonde_tests::guests::SPIN_FOREVER
    );
    let (_agent, api) = start_agent(&write_config(dir.path(), &yaml)).await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let answer = get(api, "/probe?target=127.0.0.1:9&module=spin", &bearer(OP)).await;
                (answer, Instant::now())
            })
        })
        .collect();
    // Every slot is taken once the four runs hold their tenant's permits.
    loop {
        let (_, text) = get(api, "/metrics", &bearer(OP)).await;
        if series(&text, "sonde_tenant_runs_running{tenant=\"default\"}") == Some(4.0) {
            break;
        }
        // Not a wall-clock bound: the four must all be running before the
        // first of them ends (3 s of spinning), however slow the machine.
        assert!(
            !runs.iter().any(tokio::task::JoinHandle::is_finished),
            "a run ended before the four ran at once:\n{text}"
        );
        tokio::task::yield_now().await;
    }
    for _ in 0..5 {
        let (code, body) = get(api, "/livez", &[]).await;
        assert_eq!(code, 200, "{body}");
    }
    let answered = Instant::now();
    let mut first_end = None::<Instant>;
    for r in runs {
        let ((code, body), ended) = r.await.unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("probe_success 0"), "{body}");
        first_end = Some(first_end.map_or(ended, |f| f.min(ended)));
    }
    // Were the API blocked behind the spinning calls, /livez would have
    // answered only once one of them had ended.
    assert!(
        answered < first_end.unwrap(),
        "/livez answered only after a spinning run ended: the API waited behind them"
    );
}

#[tokio::test]
async fn validate_refuses_every_bad_module_naming_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 6] = [
        ("m:\n    plugin: http\n", "grants.net: empty"),
        (
            "m:\n    plugin: nosuch\n    grants: {net: [\"127.0.0.1:*\"]}\n",
            "nosuch",
        ),
        ("m:\n    plugin: http\n    grants: {net: [\"127.0.0.1\"]}\n", "no port"),
        (
            "m:\n    plugin: http\n    config: {path: 7}\n    grants: {net: [\"127.0.0.1:*\"]}\n",
            "path",
        ),
        (
            "m:\n    plugin: http\n    bogus: 1\n    grants: {net: [\"127.0.0.1:*\"]}\n",
            "bogus",
        ),
        (
            "m:\n    plugin: http\n    tenant: acme\n    grants: {net: [\"10.0.0.0/8:*\"]}\n",
            "ceiling",
        ),
    ];
    for (i, (module, says)) in cases.iter().enumerate() {
        let yaml = format!("tenants:\n  - id: acme\n    ceiling: {{ net: [\"127.0.0.1:*\"] }}\nmodules:\n  {module}");
        let path = dir.path().join(format!("bad{i}.yaml"));
        std::fs::write(&path, &yaml).unwrap();
        let out = sonde(&["validate", path.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{yaml}\n{text}");
        assert!(text.contains(&format!("bad{i}.yaml:")), "{yaml}\n{text}");
        assert!(text.contains(says), "{yaml}\n{text}");
        // And `sonde run` refuses it too, by the same load.
        let options = crate::support::agent_options(&path, "127.0.0.1:0".parse().unwrap());
        let refused = sonde::agent::Agent::start(crate::support::engine(), options).await;
        assert!(refused.is_err(), "{yaml}");
    }
}

/// The value of the series `series` (name and labels as exposed).
fn series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test]
async fn metrics_carry_build_info_reload_state_and_a_state_set() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = "operator_token_file: op.token\n".to_string() + &web_ready(server.addr);
    let config = write_config(dir.path(), &yaml);
    let (agent, api) = start_agent(&config).await;
    let metrics = || async { get(api, "/metrics", &bearer(OP)).await.1 };
    let ready = r#"sonde_probe_state{probe="web-ready",target="web",kind="readiness",tenant="default",state="#;
    let deadline = Instant::now() + Duration::from_secs(15);
    let text = loop {
        let text = metrics().await;
        if series(&text, &format!("{ready}\"success\"}}")) == Some(1.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "web-ready never succeeded:\n{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // One series per state, exactly one of them 1.
    for state in ["warning", "failure", "unknown"] {
        assert_eq!(series(&text, &format!("{ready}\"{state}\"}}")), Some(0.0), "{text}");
    }
    let build = format!(
        "sonde_build_info{{version=\"{}\",commit=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        sonde::agent::COMMIT
    );
    assert_eq!(series(&text, &build), Some(1.0), "{text}");
    assert_eq!(series(&text, "sonde_config_last_reload_successful"), Some(1.0));
    let loaded = series(&text, "sonde_config_last_reload_success_timestamp_seconds").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(loaded <= now && loaded > now - 60.0, "{loaded} vs {now}");

    // A refused reload: 0, and the old config's load time stays.
    std::fs::write(&config, "targets: [nonsense\n").unwrap();
    agent.reload().await.unwrap_err();
    let text = metrics().await;
    assert_eq!(
        series(&text, "sonde_config_last_reload_successful"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "sonde_config_last_reload_success_timestamp_seconds"),
        Some(loaded)
    );
    // Fixed: 1 again, and a later load time.
    std::fs::write(&config, &yaml).unwrap();
    agent.reload().await.unwrap();
    let text = metrics().await;
    assert_eq!(
        series(&text, "sonde_config_last_reload_successful"),
        Some(1.0),
        "{text}"
    );
    assert!(series(&text, "sonde_config_last_reload_success_timestamp_seconds").unwrap() >= loaded);
}

fn shipped(path: &str) -> PathBuf {
    crate::support::repo().join("deploy/prometheus").join(path)
}

/// A YAML file of the repository as JSON.
fn yaml(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every name a scrape of `text` (Prometheus text format) exposes,
/// sampled or declared.
fn exposed_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap_or_default();
            names.insert(name.to_string());
            if words.next() == Some("histogram") {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

#[tokio::test]
async fn every_dashboard_and_rule_query_reads_metrics_a_live_agent_exposes() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml_text = r#"operator_token_file: op.token
modules:
  http_2xx:
    plugin: http
    grants: { net: ["127.0.0.1:*"] }
"#
    .to_string()
        + &web_ready(server.addr);
    let (_agent, api) = start_agent(&write_config(dir.path(), &yaml_text)).await;
    // Until a run has filled the histograms.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut metrics = String::new();
    while !metrics.contains("sonde_run_duration_seconds_bucket") {
        assert!(Instant::now() < deadline, "no run in\n{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = get(api, "/metrics", &bearer(OP)).await.1;
    }
    let (_, probe) = get(
        api,
        &format!("/probe?target={}&module=http_2xx", server.addr),
        &bearer(OP),
    )
    .await;
    let exposed = exposed_names(&(metrics + &probe));

    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shipped("dashboard.json")).unwrap()).unwrap();
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"].as_str().and_then(|q| q.strip_prefix("label_values(")) {
            queries.push(q.split(',').next().unwrap().to_string());
        }
    }
    let rules = yaml(&shipped("rules.yaml"));
    for r in rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
    {
        queries.push(r["expr"].as_str().unwrap().to_string());
    }
    for q in &queries {
        let names = sonde_tests::promql::names(q);
        assert!(!names.is_empty(), "no metric in {q}");
        for name in names {
            assert!(
                exposed.contains(&name),
                "{q}: {name} is not exposed by the agent:\n{exposed:?}"
            );
        }
    }
}

#[tokio::test]
async fn the_docs_modules_load_as_shipped() {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/prometheus.md")).unwrap();
    let blocks = sonde_tests::manifests::yaml_blocks(&doc);
    let (_, _, config) = blocks
        .iter()
        .find(|(_, info, body)| info == "yaml" && body.contains("modules:"))
        .expect("docs/prometheus.md has a config with modules:");
    let dir = tempfile::tempdir().unwrap();
    secret(dir.path(), "op.token", OP);
    secret(dir.path(), "shop.token", ACME);
    let mut text = config.clone();
    for (from, to) in [
        ("/etc/sonde/tokens/operator", "op.token"),
        ("/etc/sonde/tokens/shop", "shop.token"),
    ] {
        assert!(text.contains(from), "docs/prometheus.md no longer names {from}");
        text = text.replace(from, to);
    }
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, &text).unwrap();
    let out = sonde(&["validate", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reg = sonde_core::catalog::Catalog::load_file(&crate::support::engine(), &path)
        .await
        .unwrap();
    let names: Vec<&str> = reg.modules.names().collect();
    assert_eq!(names, ["grpc", "http_2xx", "shop_http", "tcp_connect"]);
    assert_eq!(&*reg.modules.get("shop_http").unwrap().tenant, "shop");
    assert_eq!(
        reg.modules.get("http_2xx").unwrap().limits.timeout,
        Duration::from_secs(5)
    );
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real Prometheus (`prometheus`, the binary) with the config `text`,
/// its data under `dir`, on a free loopback port: its address, and the
/// process, killed when dropped.
pub(crate) fn start_prometheus(prometheus: &Path, dir: &Path, text: &str) -> (SocketAddr, Killed) {
    start_prometheus_with(prometheus, dir, text, &[])
}

/// [`start_prometheus`] with the flags `extra` too.
pub(crate) fn start_prometheus_with(prometheus: &Path, dir: &Path, text: &str, extra: &[&str]) -> (SocketAddr, Killed) {
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, text).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = std::process::Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={addr}"))
        .arg("--log.level=warn")
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    (addr, Killed(child))
}

/// Kills the child when dropped.
pub(crate) struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` of an HTTP/1.0 server: the body (no chunked encoding).
/// `GET path` over HTTP/1.0 (Prometheus' API): the body, or `None`.
pub(crate) async fn get10(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut text = Vec::new();
    s.read_to_end(&mut text).await.ok()?;
    Some(parse_response(&text).1)
}

/// Prometheus' answer to the instant query `q`: `instance` to value.
async fn query(prometheus: SocketAddr, q: &str) -> std::collections::BTreeMap<String, f64> {
    let path = format!("/api/v1/query?query={}", urlencode(q));
    let Some(body) = get10(prometheus, &path).await else {
        return Default::default();
    };
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    json["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let instance = r["metric"]["instance"].as_str().unwrap_or_default().to_string();
            let value = r["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
            (instance, value)
        })
        .collect()
}

#[tokio::test]
async fn a_real_prometheus_scrapes_probe_with_the_blackbox_relabelling_of_the_docs() {
    let Some(prometheus) = tool("prometheus", "prometheus") else {
        return;
    };
    let live = HttpServer::start().await;
    let dead = closed_port();
    let outside = CountingListener::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"operator_token_file: op.token
modules:
  http_2xx:
    plugin: http
    config: {{ path: /health }}
    timeout: 5s
    grants: {{ net: ["127.0.0.1:{}", "127.0.0.1:{}"] }}
"#,
        live.addr.port(),
        dead.port()
    );
    let (_agent, api) = start_agent(&write_config(dir.path(), &config)).await;

    // The scrape config of docs/prometheus.md, as shipped, with this
    // machine's addresses and token.
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/prometheus.md")).unwrap();
    let (_, _, block) = sonde_tests::manifests::yaml_blocks(&doc)
        .into_iter()
        .find(|(_, info, _)| info == "yaml prometheus")
        .expect("docs/prometheus.md has a ```yaml prometheus block");
    let targets = [live.addr.to_string(), dead.to_string(), outside.addr.to_string()];
    let mut text = block.clone();
    for (from, to) in [
        (
            "/etc/prometheus/sonde-token",
            dir.path().join("op.token").display().to_string(),
        ),
        ("127.0.0.1:9464", api.to_string()),
        ("10.0.3.7:8080", targets[0].clone()),
        ("10.0.3.8:8080", format!("{}\n          - {}", targets[1], targets[2])),
    ] {
        assert!(text.contains(from), "docs/prometheus.md no longer names {from}");
        text = text.replace(from, &to);
    }
    let text = format!("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n{text}");
    let (addr, _prometheus) = start_prometheus(&prometheus, dir.path(), &text);

    // Until Prometheus has scraped all three targets (and the agent).
    let deadline = Instant::now() + Duration::from_secs(90);
    let success = loop {
        let s = query(addr, r#"probe_success{job="sonde-probe"}"#).await;
        let agent = query(addr, r#"sonde_build_info{job="sonde"}"#).await;
        if s.len() == 3 && !agent.is_empty() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped every target: {s:?} {agent:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(success[&targets[0]], 1.0, "{success:?}");
    assert_eq!(success[&targets[1]], 0.0, "{success:?}");
    assert_eq!(success[&targets[2]], 0.0, "{success:?}");
    let denied = query(addr, r#"sonde_probe_outcome{job="sonde-probe",reason="denied"}"#).await;
    assert_eq!(denied.keys().collect::<Vec<_>>(), [&targets[2]], "{denied:?}");
    assert_eq!(outside.accepted(), 0, "the target outside the grant was dialled");
}

#[test]
fn validate_shows_the_modules_in_force_and_refuses_a_label_named_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    std::fs::write(
        &path,
        "api: {listen: 127.0.0.1:9464, max_probe_runs: 3}\nmodules:\n  tcp_connect:\n    plugin: tcp\n    timeout: 2s\n    grants: {net: [\"127.0.0.1:*\"]}\n",
    )
    .unwrap();
    let out = sonde(&["validate", "-o", "json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let effective = crate::support::json(&out);
    assert_eq!(effective["api"]["max_probe_runs"], 3);
    assert_eq!(effective["api"]["max_probe_queue"], 64);
    assert_eq!(effective["modules"]["tcp_connect"]["plugin"], "tcp");
    assert_eq!(effective["modules"]["tcp_connect"]["timeout"], "2s");
    assert_eq!(effective["modules"]["tcp_connect"]["grants"]["net"][0], "127.0.0.1:*");

    // `state` is sonde_probe_state's own label now.
    std::fs::write(
        &path,
        "targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - {plugin: tcp, labels: {state: x}}\n",
    )
    .unwrap();
    let out = sonde(&["validate", path.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("state"), "{text}");
}
