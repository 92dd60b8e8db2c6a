//! The agent's API as its readers use it: a kubelet or load balancer on
//! `/v1/ready/{group}`, `sonde check --group`, a watch client that drops and
//! reconnects, Prometheus (`promtool check metrics`), `/livez` against a
//! stalled scheduler, and the status page in headless Chromium. Everything
//! runs against a real agent probing a real HTTP server.

use crate::support::{cache_dir, engine};
use sonde::agent::{Agent, AgentOptions};
use sonde::cli::client::EventParser;
use sonde_sandbox::verdict::Status;
use sonde_tests::{CountingListener, HttpServer};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn options(config: &Path) -> AgentOptions {
    AgentOptions {
        config: Some(config.to_path_buf()),
        api: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        grace: Duration::from_secs(2),
        jitter: false,
        api_auth: Default::default(),
    }
}

async fn start(yaml: &str) -> (Agent, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sonde.yaml");
    std::fs::write(&config, yaml).unwrap();
    let agent = Agent::start(engine(), options(&config)).await.unwrap();
    let api = agent.api().unwrap();
    (agent, api, dir)
}

/// One request, `Connection: close`; the status and the body.
async fn request(api: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: sonde\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

async fn get(api: SocketAddr, path: &str) -> (u16, serde_json::Value) {
    let (status, body) = request(api, "GET", path).await;
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, json)
}

/// Polls `path` until it answers `status`.
async fn wait_status(api: SocketAddr, path: &str, status: u16) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (s, body) = get(api, path).await;
        if s == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{path} never answered {status}: {s} {body}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn sonde_exit(args: Vec<String>) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_sonde"))
            .arg("--cache-dir")
            .arg(cache_dir())
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), text)
    })
    .await
    .unwrap()
}

fn web(server: SocketAddr, extra: &str) -> String {
    format!(
        "targets:\n  - name: web\n    address: {server}\n    probes:\n      - {{name: web-ready, kind: readiness, plugin: http, config: {{path: /health}}, period: 100ms, failure_threshold: 1, groups: [edge]}}\n      - {{name: web-live, kind: liveness, plugin: tcp, period: 100ms, groups: [edge]}}\n{extra}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_group_flips_with_its_probe_and_check_group_exits_follow() {
    let server = HttpServer::start().await;
    let (agent, api, _dir) = start(&web(server.addr, "")).await;
    let url = format!("http://{api}");
    let check = |group: &str, live: bool| {
        let mut args = vec![
            "check".into(),
            "--group".into(),
            group.into(),
            "--api".into(),
            url.clone(),
        ];
        if live {
            args.push("--live".into());
        }
        sonde_exit(args)
    };

    let ready = wait_status(api, "/v1/ready/edge", 200).await;
    assert_eq!(ready["probes"], 1, "one readiness probe in the group: {ready}");
    assert_eq!(check("edge", false).await.0, 0);
    assert_eq!(get(api, "/v1/live/edge").await.0, 200);

    server.set_healthy(false);
    let body = wait_status(api, "/v1/ready/edge", 503).await;
    assert_eq!(body["failing"][0]["probe"], "web-ready", "{body}");
    assert!(
        body["failing"][0]["message"].as_str().unwrap().contains("500"),
        "{body}"
    );
    let (code, out) = check("edge", false).await;
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("web-ready"), "{out}");
    // Liveness is a tcp connect: still fine.
    assert_eq!(check("edge", true).await.0, 0);

    server.set_healthy(true);
    wait_status(api, "/v1/ready/edge", 200).await;
    assert_eq!(check("edge", false).await.0, 0);

    let (status, body) = get(api, "/v1/ready/nosuch").await;
    assert_eq!(status, 404, "{body}");
    let (code, out) = check("nosuch", false).await;
    assert_eq!(code, 3, "an unknown group is not an answer: {out}");

    agent.stop().await;
    let (code, out) = check("edge", false).await;
    assert_eq!(code, 3, "the agent is gone: {out}");
    assert!(out.contains("cannot reach the agent"), "{out}");
}

/// A Server-Sent Events client on a raw connection.
struct Watch {
    stream: tokio::net::TcpStream,
    parser: EventParser,
    pending: std::collections::VecDeque<sonde::cli::client::Event>,
}

impl Watch {
    async fn open(api: SocketAddr, path: &str, last_event_id: Option<&str>) -> Self {
        let mut stream = tokio::net::TcpStream::connect(api).await.unwrap();
        let header = last_event_id.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
        // HTTP/1.0: the stream comes unchunked, ended by the close.
        let req = format!("GET {path} HTTP/1.0\r\nHost: sonde\r\n{header}\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            stream.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.contains(" 200 "), "{head}");
        assert!(head.contains("text/event-stream"), "{head}");
        Self {
            stream,
            parser: EventParser::default(),
            pending: Default::default(),
        }
    }

    /// The next event.
    async fn next(&mut self) -> sonde::cli::client::Event {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return e;
            }
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(15), self.stream.read(&mut buf))
                .await
                .expect("an event within 15s")
                .unwrap();
            assert!(n > 0, "the stream ended");
            self.pending.extend(self.parser.feed(&buf[..n]));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_each_change_once_in_order_and_a_reconnect_misses_none() {
    let server = HttpServer::start().await;
    let (agent, api, _dir) = start(&web(server.addr, "")).await;
    wait_status(api, "/v1/ready/edge", 200).await;
    let mut reference = agent.results().subscribe();
    let mut watch = Watch::open(api, "/v1/watch?probe=web-ready", None).await;

    let mut seen = Vec::new();
    let mut last_id = String::new();
    for healthy in [false, true, false] {
        server.set_healthy(healthy);
        let want = reference.recv().await.unwrap();
        let e = watch.next().await;
        assert_eq!(e.event, "change");
        let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(v["probe"], "web-ready");
        assert_eq!(
            v["to"],
            serde_json::to_value(want.to).unwrap(),
            "same change, same order"
        );
        assert_ne!(e.id, last_id);
        last_id = e.id.clone();
        seen.push(v["to"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, ["failure", "success", "failure"]);

    // Drop the connection; three changes happen meanwhile.
    drop(watch);
    let mut missed = Vec::new();
    for healthy in [true, false, true] {
        server.set_healthy(healthy);
        let c = reference.recv().await.unwrap();
        missed.push(serde_json::to_value(c.to).unwrap());
    }
    let mut watch = Watch::open(api, "/v1/watch?probe=web-ready", Some(&last_id)).await;
    for want in &missed {
        let e = watch.next().await;
        assert_eq!(e.event, "change", "{e:?}");
        let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(&v["to"], want, "the missed changes, in order, each once");
    }
    // Nothing more until the next real change.
    server.set_healthy(false);
    let want = reference.recv().await.unwrap();
    let e = watch.next().await;
    let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
    assert_eq!(v["to"], serde_json::to_value(want.to).unwrap());
    assert_eq!(want.to, Status::Failure);

    // An id from another run of the agent: a reset, then the live stream.
    let mut watch = Watch::open(api, "/v1/watch", Some("1-999")).await;
    assert_eq!(watch.next().await.event, "reset");
    // Every outcome with ?all=1.
    let mut all = Watch::open(api, "/v1/watch?all=1&probe=web-live", None).await;
    let e = all.next().await;
    assert_eq!(e.event, "run");
    let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
    assert_eq!(
        (v["probe"].as_str(), v["status"].as_str()),
        (Some("web-live"), Some("success"))
    );
    agent.stop().await;
}

/// `name{labels} value` lines of the exposition, by series text.
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_and_carry_probe_runs_and_scheduler_lateness() {
    let server = HttpServer::start().await;
    // The second probe's label value tries to end its series and forge one.
    let tagged = concat!(
        "      - {name: web-tagged, plugin: tcp, period: 100ms, labels: {team: payments, namespace: shop}}\n",
        "      - {name: web-forger, plugin: tcp, period: 100ms, labels: {note: \"x\\\"} 1\\nsonde_forged 1\"}}\n",
    );
    let (agent, api, _dir) = start(&web(server.addr, tagged)).await;
    wait_status(api, "/v1/ready/edge", 200).await;
    server.set_healthy(false);
    wait_status(api, "/v1/ready/edge", 503).await;
    let (status, text) = request(api, "GET", "/metrics").await;
    assert_eq!(status, 200);

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) is installed");
    std::io::Write::write_all(&mut promtool.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let s = samples(&text);
    let value = |series: &str| {
        s.iter()
            .find(|(k, _)| k == series)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(
        value(r#"sonde_probe_state{probe="web-ready",target="web",kind="readiness",tenant="default",state="failure"}"#),
        1.0
    );
    assert_eq!(
        value(r#"sonde_probe_state{probe="web-ready",target="web",kind="readiness",tenant="default",state="success"}"#),
        0.0
    );
    assert_eq!(
        value(r#"sonde_probe_state{probe="web-live",target="web",kind="liveness",tenant="default",state="success"}"#),
        1.0
    );
    // A probe's extra labels follow sonde's own on every per-probe series,
    // and its API entry shows them.
    assert_eq!(
        value(
            r#"sonde_probe_state{probe="web-tagged",target="web",kind="readiness",tenant="default",state="success",namespace="shop",team="payments"}"#
        ),
        1.0
    );
    assert!(
        value(
            r#"sonde_probe_runs_total{probe="web-tagged",status="success",reason="",namespace="shop",team="payments"}"#
        ) >= 1.0
    );
    assert!(
        s.iter()
            .any(|(k, _)| k == r#"sonde_probe_last_fuel{probe="web-tagged",namespace="shop",team="payments"}"#),
        "{text}"
    );
    // A label value is data: escaped in its series, never a line of its own
    // (and promtool, above, parsed the whole exposition).
    assert!(!text.lines().any(|l| l.starts_with("sonde_forged")), "{text}");
    assert!(
        text.contains(r#"sonde_probe_state{probe="web-forger",target="web",kind="readiness",tenant="default",state="success",note="x\"} 1\nsonde_forged 1"}"#),
        "{text}"
    );
    let (_, probe) = request(api, "GET", "/v1/probes/web-tagged").await;
    let probe: serde_json::Value = serde_json::from_str(&probe).unwrap();
    assert_eq!(
        probe["labels"],
        serde_json::json!({"namespace": "shop", "team": "payments"})
    );
    assert!(value(r#"sonde_probe_runs_total{probe="web-ready",status="success",reason=""}"#) >= 1.0);
    assert!(value(r#"sonde_probe_runs_total{probe="web-ready",status="failure",reason=""}"#) >= 1.0);
    assert!(value("sonde_scheduler_start_lateness_seconds_count") >= 2.0);
    assert!(value(r#"sonde_run_duration_seconds_count{plugin="http",kind="readiness"}"#) >= 2.0);
    assert!(value(r#"sonde_run_fuel_count{plugin="tcp",kind="liveness"}"#) >= 1.0);
    assert!(
        s.iter()
            .any(|(k, _)| k.starts_with(r#"sonde_probe_metric{probe="web-ready""#)),
        "the http plugin's timings: {text}"
    );
    assert!(value("sonde_plugin_cache_hits_total") + value("sonde_plugin_cache_misses_total") >= 2.0);
    assert!(value(r#"sonde_tenant_runs_total{tenant="default"}"#) >= 2.0);
    assert!(value(r#"sonde_tenant_sandbox_seconds_total{tenant="default"}"#) > 0.0);
    // Every call's permit wait is in the tenant's histogram.
    assert_eq!(
        value(r#"sonde_tenant_queue_wait_seconds_count{tenant="default"}"#),
        value(r#"sonde_tenant_queue_wait_seconds_bucket{le="+Inf",tenant="default"}"#)
    );
    assert!(value(r#"sonde_tenant_queue_wait_seconds_count{tenant="default"}"#) >= 2.0);

    // Prometheus asks for OpenMetrics, and gets it.
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: sonde\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut om = String::new();
    s.read_to_string(&mut om).await.unwrap();
    assert!(om.contains("content-type: application/openmetrics-text"), "{om}");
    assert!(om.ends_with("# EOF\n"), "{om}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_fails_while_the_scheduler_is_stalled_and_recovers() {
    let server = HttpServer::start().await;
    let (agent, api, _dir) = start(&web(server.addr, "health_timeout: 1s\n")).await;
    let body = wait_status(api, "/livez", 200).await;
    assert!(
        body["last_updated"].is_string() && body["current_time"].is_string(),
        "{body}"
    );
    agent.scheduler().stall(Duration::from_secs(4));
    let body = wait_status(api, "/livez", 503).await;
    // 503 once overdue passes the 1 s health_timeout; the body shows whole
    // milliseconds, so 1000.4 ms reads as 1000.
    assert!(body["overdue_ms"].as_u64().unwrap() >= 1000, "{body}");
    assert_eq!(get(api, "/healthz").await.0, 503);
    // The API itself still answers while the scheduler is stuck.
    assert_eq!(get(api, "/v1/probes").await.0, 200);
    wait_status(api, "/livez", 200).await;
    wait_status(api, "/healthz", 200).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_draining_but_livez_does_not() {
    let silent = CountingListener::start_silent().await;
    let yaml = format!(
        "targets:\n  - name: stuck\n    address: {}\n    probes:\n      - {{name: hangs, kind: readiness, plugin: http, period: 100ms, timeout: 3s}}\n",
        silent.addr
    );
    let (agent, api, _dir) = start(&yaml).await;
    // Wait for the run in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    while silent.accepted() == 0 {
        assert!(Instant::now() < deadline, "the probe never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopping = tokio::spawn(agent.stop());
    wait_status(api, "/healthz", 503).await;
    assert_eq!(get(api, "/livez").await.0, 200, "draining is not dead");
    stopping.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_with_the_right_status() {
    let server = HttpServer::start().await;
    let (agent, api, _dir) = start(&web(server.addr, "")).await;
    let cases = [
        ("GET", "/v1/nothing", 404),
        ("GET", "/v1/probes/nosuch", 404),
        ("GET", "/v1/targets/nosuch", 404),
        ("POST", "/v1/probes/nosuch/run", 404),
        ("DELETE", "/v1/probes", 405),
        ("POST", "/metrics", 405),
        ("GET", "/v1/watch?all=maybe", 400),
    ];
    for (method, path, want) in cases {
        let (status, body) = request(api, method, path).await;
        assert_eq!(status, want, "{method} {path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
        assert!(v["error"].is_string(), "{method} {path}: {body}");
    }
    let (status, t) = get(api, "/v1/targets/web").await;
    assert_eq!(status, 200);
    assert_eq!(t["probes"], serde_json::json!(["web-live", "web-ready"]));
    let (status, r) = get(api, "/v1/probes/web-live").await;
    assert_eq!(status, 200);
    assert_eq!(r["kind"], "liveness");
    let (status, r) = request(api, "POST", "/v1/probes/web-live/run").await;
    assert_eq!(status, 200, "{r}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_prints_each_state_change() {
    let server = std::sync::Arc::new(HttpServer::start().await);
    let (agent, api, _dir) = start(&web(server.addr, "")).await;
    wait_status(api, "/v1/ready/edge", 200).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .args(["status", "--watch", "--api", &format!("http://{api}")])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    // The watch prints only changes after it connected: flip until a failure shows.
    let flipper = {
        let server = server.clone();
        tokio::spawn(async move {
            loop {
                server.set_healthy(false);
                tokio::time::sleep(Duration::from_millis(400)).await;
                server.set_healthy(true);
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
        })
    };
    let mut line = String::new();
    let found = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            line.clear();
            if tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
                .await
                .unwrap()
                == 0
            {
                return false;
            }
            if line.contains("web-ready") && line.contains("success -> failure") {
                return true;
            }
        }
    })
    .await
    .expect("a line within 15s");
    assert!(found, "{line}");
    flipper.abort();
    child.kill().await.unwrap();
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_every_probe_in_headless_chromium() {
    let server = HttpServer::start().await;
    let extra = "  - name: db\n    address: 127.0.0.1:1\n    probes:\n      - {name: db-ready, kind: readiness, plugin: tcp, period: 200ms}\n";
    let (agent, api, dir) = start(&web(server.addr, extra)).await;
    wait_status(api, "/v1/ready/edge", 200).await;
    let (status, html) = request(api, "GET", "/").await;
    assert_eq!(status, 200);
    assert!(html.contains("db-ready"), "{html}");

    let chromium = |args: Vec<String>| {
        let profile = dir.path().join("chromium-profile");
        tokio::task::spawn_blocking(move || {
            Command::new("timeout")
                .args(["60", "chromium"])
                .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
                .arg(format!("--user-data-dir={}", profile.display()))
                .args(args)
                .output()
                .expect("chromium (Debian package chromium) is installed")
        })
    };
    let url = format!("http://{api}/");
    // `?updates=3`: the page follows the watch stream for three outcomes,
    // then closes it, so Chromium's virtual time (which stands still while
    // a request is open) runs out and the DOM is dumped after the updates.
    let out = chromium(vec![
        "--virtual-time-budget=20000".into(),
        "--dump-dom".into(),
        format!("{url}?updates=3"),
    ])
    .await
    .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    for probe in ["web-ready", "web-live", "db-ready"] {
        assert!(
            dom.contains(&format!("data-probe=\"{probe}\"")),
            "{probe} missing:\n{dom}"
        );
    }
    assert!(
        dom.contains("data-live=\"paused\"") && dom.contains("data-updates=\"3\""),
        "the page followed /v1/watch for three outcomes:\n{dom}"
    );

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(vec![
        format!("--screenshot={}", shot.display()),
        "--window-size=1280,720".into(),
        "--virtual-time-budget=20000".into(),
        format!("{url}?updates=3"),
    ])
    .await
    .unwrap();
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {}: {e}\n{}",
            shot.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot");
    println!("status page screenshot: {}", shot.display());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_config_probes_the_api_where_it_is_moved() {
    let api = sonde_tests::closed_port();
    let mut options = options(Path::new("unused"));
    options.config = None;
    options.api = Some(api);
    let agent = Agent::start(engine(), options).await.unwrap();
    assert_eq!(agent.api(), Some(api));
    let body = wait_status(api, "/v1/ready/sonde", 200).await;
    assert_eq!(body["probes"], 1, "{body}");
    assert_eq!(get(api, "/v1/live/sonde").await.0, 200);
    agent.stop().await;
}
