//! The API with tenants: bearer tokens, isolation (another tenant's probe
//! is "not found"), runtime management of plugins and probes (validated
//! against quotas and ceilings, stored in `state_dir`, still there after a
//! restart), and every bad upload refused with nothing stored.

use crate::support::{call, secret, start_agent as start};
use sonde::api::ApiAuth;
use sonde_tests::{HttpServer, guests};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OP: &str = "operator-secret";
const ACME: &str = "acme-secret";
const BETA: &str = "beta-secret";

fn config(dir: &Path, server: SocketAddr) -> std::path::PathBuf {
    secret(dir, "op.token", OP);
    secret(dir, "acme.token", ACME);
    secret(dir, "beta.token", BETA);
    let yaml = format!(
        r#"operator_token_file: op.token
state_dir: state
tenants:
  - id: acme
    token_file: acme.token
    quotas: {{ max_probes: 5, max_concurrent_runs: 2 }}
    ceiling: {{ net: ["127.0.0.1:*"] }}
  - id: beta
    token_file: beta.token
    ceiling: {{ net: ["127.0.0.1:*"] }}
targets:
  - name: shop
    tenant: acme
    address: {server}
    probes:
      - {{name: shop-ready, kind: readiness, plugin: http, config: {{path: /health}}, period: 100ms, groups: [g]}}
  - name: bank
    tenant: beta
    address: {server}
    probes:
      - {{name: bank-ready, kind: readiness, plugin: http, config: {{path: /health}}, period: 100ms, groups: [g]}}
"#
    );
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

async fn wait_state(api: SocketAddr, token: &str, probe: &str, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = call(api, "GET", &format!("/v1/probes/{probe}"), Some(token), b"").await;
        if status == 200 && serde_json::from_str::<serde_json::Value>(&body).unwrap()["state"] == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{probe} never became {state}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_and_touches_only_its_own_probes() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, api) = start(&config(dir.path(), server.addr)).await;
    wait_state(api, OP, "bank-ready", "success").await;
    wait_state(api, OP, "shop-ready", "success").await;

    // No token, a wrong one: 401. sonde's own health needs none.
    assert_eq!(call(api, "GET", "/v1/probes", None, b"").await.0, 401);
    assert_eq!(call(api, "GET", "/v1/probes", Some("nope"), b"").await.0, 401);
    assert_eq!(call(api, "GET", "/metrics", None, b"").await.0, 401);
    assert_eq!(call(api, "GET", "/livez", None, b"").await.0, 200);

    let (_, list) = call(api, "GET", "/v1/probes", Some(ACME), b"").await;
    let names: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&list)
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["shop-ready"]);
    let (_, all) = call(api, "GET", "/v1/probes", Some(OP), b"").await;
    assert_eq!(serde_json::from_str::<Vec<serde_json::Value>>(&all).unwrap().len(), 2);

    // Read, run, change, delete another tenant's probe: not found.
    for (method, path, body) in [
        ("GET", "/v1/probes/bank-ready", &b""[..]),
        ("POST", "/v1/probes/bank-ready/run", b""),
        ("PUT", "/v1/probes/bank-ready", b"address: 127.0.0.1:1\nplugin: tcp\n"),
        ("DELETE", "/v1/probes/bank-ready", b""),
        ("GET", "/v1/targets/bank", b""),
    ] {
        let (status, body) = call(api, method, path, Some(ACME), body).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(!body.contains("beta"), "nothing about the other tenant: {body}");
    }
    // Its own is there.
    assert_eq!(
        call(api, "POST", "/v1/probes/shop-ready/run", Some(ACME), b"").await.0,
        200
    );
    // The shared group counts only what the caller sees.
    let (_, g) = call(api, "GET", "/v1/ready/g", Some(ACME), b"").await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&g).unwrap()["probes"],
        1,
        "{g}"
    );

    // The CLI sends $SONDE_TOKEN.
    let check = |token: Option<&'static str>| {
        let url = format!("http://{api}");
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sonde"));
            cmd.args(["check", "--group", "g", "--api", &url])
                .env_remove("SONDE_TOKEN");
            if let Some(t) = token {
                cmd.env("SONDE_TOKEN", t);
            }
            let out = cmd.output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
            )
        })
    };
    let (code, out) = check(Some(ACME)).await.unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("(1 probes)"), "{out}");
    let (code, out) = check(None).await.unwrap();
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("token"), "{out}");

    // Metrics: none of the other tenant's series.
    let (status, metrics) = call(api, "GET", "/metrics", Some(ACME), b"").await;
    assert_eq!(status, 200);
    assert!(metrics.contains(r#"probe="shop-ready""#), "{metrics}");
    assert!(
        metrics.contains(r#"sonde_tenant_runs_total{tenant="acme"}"#),
        "{metrics}"
    );
    assert!(!metrics.contains("bank") && !metrics.contains("beta"), "{metrics}");
    assert!(
        !metrics.contains("sonde_scheduler_"),
        "agent-wide series are the operator's: {metrics}"
    );
    let (_, metrics) = call(api, "GET", "/metrics", Some(OP), b"").await;
    assert!(metrics.contains(r#"tenant="beta""#) && metrics.contains("sonde_scheduler_start_lateness"));

    // The watch: only its own outcomes.
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    s.write_all(format!("GET /v1/watch?all=1 HTTP/1.0\r\nAuthorization: Bearer {ACME}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.matches("event: run").count() < 6 {
        assert!(Instant::now() < deadline, "{seen}");
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("shop-ready") && !seen.contains("bank-ready"), "{seen}");
    agent.stop().await;
}

fn stored_files(state: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![state.join("managed")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path().strip_prefix(state).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_add_plugins_and_probes_that_survive_a_restart_and_bad_uploads_store_nothing() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), server.addr);
    let state = dir.path().join("state");
    let (agent, api) = start(&config).await;

    // Bad plugins: each refused with the reason, nothing stored.
    let not_a_plugin = std::fs::read(guests::NOT_A_PLUGIN).unwrap();
    let too_big = vec![0u8; sonde_core::uploads::MAX_PLUGIN_BYTES + 1];
    let backdoor = std::fs::read(guests::IMPORT_BACKDOOR).unwrap();
    let bad_describe = std::fs::read(guests::PANIC_IN_DESCRIBE).unwrap();
    let cases: [(&str, &[u8], u16, &str); 8] = [
        ("bad-describe", &bad_describe, 422, "describe() failed"),
        ("backdoor", &backdoor, 422, "evil:backdoor/door"),
        ("text", b"hello", 422, "not a WebAssembly file"),
        ("core", b"\0asm\x01\0\0\0", 422, "core WebAssembly module"),
        ("other-world", &not_a_plugin, 422, "not a sonde plugin"),
        ("huge", &too_big, 413, "limit"),
        ("http", b"\0asm", 409, "built-in"),
        ("..", b"\0asm", 400, "name"),
    ];
    for (name, bytes, want, says) in cases {
        let (status, body) = call(api, "PUT", &format!("/v1/plugins/{name}"), Some(ACME), bytes).await;
        assert_eq!(status, want, "{name}: {body}");
        assert!(body.contains(says), "{name}: {body}");
    }
    assert!(stored_files(&state).is_empty(), "{:?}", stored_files(&state));

    // A good plugin, and a probe that uses it.
    let up = std::fs::read(guests::ALWAYS_UP).unwrap();
    let (status, body) = call(api, "PUT", "/v1/plugins/up", Some(ACME), &up).await;
    assert_eq!(status, 201, "{body}");
    // Another tenant cannot take the name.
    assert_eq!(call(api, "PUT", "/v1/plugins/up", Some(BETA), &up).await.0, 404);
    let spec = format!("address: {}\nplugin: up\nperiod: 100ms\ngroups: [mine]\n", server.addr);
    let (status, body) = call(api, "PUT", "/v1/probes/acme-up", Some(ACME), spec.as_bytes()).await;
    assert_eq!(status, 201, "{body}");
    wait_state(api, ACME, "acme-up", "success").await;
    let (_, p) = call(api, "GET", "/v1/probes/acme-up", Some(ACME), b"").await;
    assert_eq!(serde_json::from_str::<serde_json::Value>(&p).unwrap()["tenant"], "acme");
    assert_eq!(call(api, "GET", "/v1/probes/acme-up", Some(BETA), b"").await.0, 404);

    // Bad probes: refused, nothing stored.
    let wide = format!(
        "address: {}\nplugin: tcp\ngrants: {{ net: [\"10.0.0.0/8:*\"] }}\n",
        server.addr
    );
    let elsewhere = "address: 192.0.2.1:80\nplugin: tcp\n".to_string();
    let huge = format!(
        "address: 127.0.0.1:1\nplugin: tcp\n# {}\n",
        "x".repeat(sonde_core::uploads::MAX_PROBE_BYTES)
    );
    let cases: [(&str, String, u16, &str); 7] = [
        ("huge", huge, 413, "limit"),
        ("wide", wide, 422, "10.0.0.0/8"),
        ("elsewhere", elsewhere, 422, "192.0.2.1"),
        (
            "pathy",
            "address: 127.0.0.1:1\nplugin: /tmp/x.wasm\n".into(),
            400,
            "not a path",
        ),
        (
            "named",
            "address: 127.0.0.1:1\nplugin: tcp\ntenant: beta\n".into(),
            400,
            "tenant",
        ),
        (
            "typo",
            "address: 127.0.0.1:1\nplugin: tcp\nperiod: 10\n".into(),
            422,
            "period",
        ),
        (
            "shop-ready",
            "address: 127.0.0.1:1\nplugin: tcp\n".into(),
            409,
            "config file",
        ),
    ];
    let before = stored_files(&state);
    for (name, spec, want, says) in cases {
        let (status, body) = call(api, "PUT", &format!("/v1/probes/{name}"), Some(ACME), spec.as_bytes()).await;
        assert_eq!(status, want, "{name}: {body}");
        assert!(body.contains(says), "{name}: {body}");
    }
    assert_eq!(stored_files(&state), before, "nothing stored by a refused upload");
    // The quota: 5 probes, one in the file and one added.
    for n in 0..3 {
        let spec = format!("address: {}\nplugin: tcp\nperiod: 1h\n", server.addr);
        let (status, body) = call(api, "PUT", &format!("/v1/probes/more-{n}"), Some(ACME), spec.as_bytes()).await;
        assert_eq!(status, 201, "{body}");
    }
    let spec = format!("address: {}\nplugin: tcp\n", server.addr);
    let (status, body) = call(api, "PUT", "/v1/probes/one-too-many", Some(ACME), spec.as_bytes()).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("max_probes"), "{body}");
    // A plugin in use cannot go.
    let (status, body) = call(api, "DELETE", "/v1/plugins/up", Some(ACME), b"").await;
    assert_eq!(status, 409, "{body}");
    agent.stop().await;

    // Restarted: the added probe is back and runs.
    let (agent, api) = start(&config).await;
    wait_state(api, ACME, "acme-up", "success").await;
    agent.stop().await;

    // Its plugin vanished behind the agent's back: the agent still starts,
    // leaves the probe out and says so.
    std::fs::remove_file(state.join("managed/plugins/acme/up.wasm")).unwrap();
    let (agent, api) = start(&config).await;
    let (_, status) = call(api, "GET", "/v1/status", Some(OP), b"").await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(status["left_out"][0].as_str().unwrap().contains("acme-up"), "{status}");
    assert_eq!(call(api, "GET", "/v1/probes/acme-up", Some(ACME), b"").await.0, 404);
    wait_state(api, ACME, "shop-ready", "success").await;
    assert_eq!(call(api, "DELETE", "/v1/probes/acme-up", Some(ACME), b"").await.0, 200);
    assert_eq!(call(api, "DELETE", "/v1/probes/acme-up", Some(ACME), b"").await.0, 404);
    assert_eq!(call(api, "DELETE", "/v1/plugins/up", Some(ACME), b"").await.0, 404);
    let (_, status) = call(api, "GET", "/v1/status", Some(OP), b"").await;
    assert!(!status.contains("acme-up"), "{status}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_probes_is_stored_whole_or_not_at_all() {
    let server = HttpServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), server.addr);
    let (agent, api) = start(&config).await;
    let item = |name: &str| {
        format!(
            "{{\"name\": \"{name}\", \"address\": \"{}\", \"plugin\": \"tcp\", \"period\": \"1h\"}}",
            server.addr
        )
    };
    // One bad item (over the tenant's ceiling) refuses the whole batch.
    let bad = format!(
        "[{}, {{\"name\": \"b-2\", \"address\": \"10.9.9.9:80\", \"plugin\": \"tcp\"}}]",
        item("b-1")
    );
    let (status, body) = call(api, "PUT", "/v1/probes", Some(ACME), bad.as_bytes()).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("10.9.9.9:80"), "{body}");
    assert_eq!(call(api, "GET", "/v1/probes/b-1", Some(ACME), b"").await.0, 404);
    // A good one is stored and runs; sent again, it replaces.
    let good = format!("[{}, {}]", item("b-1"), item("b-2"));
    let (status, body) = call(api, "PUT", "/v1/probes", Some(ACME), good.as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["added"], serde_json::json!(["b-1", "b-2"]), "{body}");
    wait_state(api, ACME, "b-2", "success").await;
    let (status, body) = call(api, "PUT", "/v1/probes", Some(ACME), good.as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["replaced"], serde_json::json!(["b-1", "b-2"]), "{body}");
    // Over the quota (5: one in the file, two here) as a whole: refused.
    let many = format!("[{}, {}, {}]", item("b-3"), item("b-4"), item("b-5"));
    let (status, body) = call(api, "PUT", "/v1/probes", Some(ACME), many.as_bytes()).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("max_probes"), "{body}");
    assert_eq!(call(api, "GET", "/v1/probes/b-3", Some(ACME), b"").await.0, 404);
    // Names twice, or a name another tenant holds: refused.
    let twice = format!("[{}, {}]", item("b-1"), item("b-1"));
    assert_eq!(
        call(api, "PUT", "/v1/probes", Some(ACME), twice.as_bytes()).await.0,
        400
    );
    let theirs = format!("[{}]", item("bank-ready"));
    assert_eq!(
        call(api, "PUT", "/v1/probes", Some(ACME), theirs.as_bytes()).await.0,
        404
    );
    agent.stop().await;
}

#[test]
fn an_open_api_only_on_loopback() {
    let public: SocketAddr = "0.0.0.0:9464".parse().unwrap();
    let local: SocketAddr = "127.0.0.1:9464".parse().unwrap();
    assert!(ApiAuth::None.resolve(public, true, false).is_err());
    assert!(ApiAuth::Auto.resolve(public, false, false).is_err());
    assert_eq!(ApiAuth::Auto.resolve(public, true, false), Ok(ApiAuth::Token));
    assert_eq!(ApiAuth::Auto.resolve(local, false, false), Ok(ApiAuth::None));
    assert_eq!(ApiAuth::None.resolve(local, true, false), Ok(ApiAuth::None));
    assert!(ApiAuth::Token.resolve(local, false, false).is_err());
    // issue 26: with tenants, never without a token, even on loopback.
    assert_eq!(ApiAuth::Auto.resolve(local, true, true), Ok(ApiAuth::Token));
    let e = ApiAuth::Auto.resolve(local, false, true).unwrap_err();
    assert!(e.to_string().contains("while tenants are configured"), "{e}");
    assert!(ApiAuth::None.resolve(local, true, true).is_err());
}
