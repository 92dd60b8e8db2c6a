//! The agent with `otlp:` set: what a receiver gets is every series its
//! `/metrics` shows, read back under Prometheus's own translation of OTLP
//! names (so a series reads the same scraped or pushed); and a collector
//! that stalls slows no probe. The receiver is sonde-otel's test receiver
//! (a hyper server decoding the OTLP messages), shared by `#[path]`.

#[allow(
    dead_code,
    reason = "sonde-otel's test receiver, shared (`#[path]`): these tests make it take or stall only"
)]
#[path = "../../../otel/tests/all/receiver.rs"]
mod receiver;

use crate::support::{call, start_agent};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use receiver::{Answer, Receiver};
use sonde_tests::HttpServer;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A program scripts/tools.sh builds, at the path in `var` (`None`: the
/// test is skipped, and says so, unless SONDE_REQUIRE_TOOLS is set).
fn built(var: &str, what: &str) -> Option<std::path::PathBuf> {
    crate::support::tool_from_env(var, what, "scripts/test builds it; alone: eval \"$(scripts/tools.sh)\"")
}

/// The value of a span's attribute `key`, if it has one.
fn attribute<'a>(
    span: &'a opentelemetry_proto::tonic::trace::v1::Span,
    key: &str,
) -> Option<&'a opentelemetry_proto::tonic::common::v1::any_value::Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

/// A span's string attribute `key`, if it has one.
fn string_attribute(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    match attribute(span, key)? {
        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(v) => Some(v.clone()),
        _ => None,
    }
}

/// An agent probing `target` every 200 ms, exporting to `collector` with
/// `protocol` every second, every run traced.
fn config(target: std::net::SocketAddr, collector: std::net::SocketAddr, protocol: &str) -> String {
    format!(
        "otlp:\n  endpoint: http://{collector}\n  protocol: {protocol}\n  interval: 1s\n  traces: {{success_ratio: 1}}\n\
         targets:\n  - name: web\n    address: {target}\n    probes:\n\
         \x20     - {{name: ready, plugin: http, period: 200ms, config: {{path: /ok}}}}\n"
    )
}

/// The families `/metrics` (the Prometheus text format) shows samples of.
fn scraped(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut family = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split_whitespace().next().map(str::to_string);
        } else if !line.starts_with('#')
            && let Some(f) = &family
        {
            names.insert(f.clone());
        }
    }
    names
}

/// What Prometheus names an OTLP metric (its OTLP translation rule, as
/// Prometheus documents it): dots to underscores, the unit's word added
/// (`s`: seconds, `By`: bytes) unless the name ends with it, `_total` on a
/// monotonic sum.
fn prometheus_name(otlp_name: &str, unit: &str, monotonic: bool) -> String {
    let mut name = otlp_name.replace('.', "_");
    let word = match unit {
        "s" => "seconds",
        "By" => "bytes",
        _ => "",
    };
    if !word.is_empty() && !name.ends_with(word) {
        name = format!("{name}_{word}");
    }
    if monotonic {
        name.push_str("_total");
    }
    name
}

/// The metrics of `request`, in Prometheus's names ([`prometheus_name`]).
fn as_prometheus_names(request: &ExportMetricsServiceRequest) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for m in request
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
    {
        let monotonic = matches!(&m.data, Some(Data::Sum(s)) if s.is_monotonic);
        names.insert(prometheus_name(&m.name, &m.unit, monotonic));
    }
    names
}

async fn every_series_arrives(protocol: &str) {
    let target = HttpServer::start().await;
    let receiver = Receiver::start(Answer::Take).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, config(target.addr, receiver.addr, protocol)).unwrap();
    let (agent, api) = start_agent(&path).await;
    // Exports and scrapes are read at different instants: they agree once
    // nothing new appears between two of them (the probe has run, the
    // first export is counted).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = 0;
    loop {
        receiver.until(seen + 1).await;
        seen = receiver.count();
        let (status, text) = call(api, "GET", "/metrics", None, b"").await;
        assert_eq!(status, 200, "{text}");
        let (pushed, scraped) = (as_prometheus_names(&receiver.last()), scraped(&text));
        if pushed == scraped && scraped.contains("sonde_probe_runs_total") {
            assert!(scraped.contains("sonde_otlp_exports_total"), "{scraped:?}");
            // The export's own series are in docs/config.md's table too.
            let docs = std::fs::read_to_string(crate::support::repo().join("docs/config.md")).unwrap();
            for name in [
                "sonde_otlp_exports_total",
                "sonde_otlp_export_failures_total",
                "sonde_otlp_dropped_total",
            ] {
                assert!(docs.contains(&format!("`{name}`")), "{name} is not in docs/config.md");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pushed but not scraped: {:?}\nscraped but not pushed: {:?}",
            pushed.difference(&scraped).collect::<Vec<_>>(),
            scraped.difference(&pushed).collect::<Vec<_>>()
        );
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_of_metrics_arrives_over_grpc() {
    every_series_arrives("grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_of_metrics_arrives_over_http_protobuf() {
    every_series_arrives("http/protobuf").await;
}

/// A collector that takes each request and never answers: the probe runs
/// on time all along (its runs keep coming, the scheduler is never
/// overdue), one export of each signal at a time is held, each failure
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_collector_slows_no_probe() {
    let target = HttpServer::start().await;
    let receiver = Receiver::start(Answer::Stall).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, config(target.addr, receiver.addr, "grpc")).unwrap();
    let (agent, api) = start_agent(&path).await;
    receiver.until(2).await;
    let runs = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("sonde_probe_runs_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    let (_, before) = call(api, "GET", "/metrics", None, b"").await;
    let started = Instant::now();
    receiver.until(3).await;
    let (_, after) = call(api, "GET", "/metrics", None, b"").await;
    let elapsed = started.elapsed().as_secs_f64();
    // One run every 200 ms meanwhile (half of them, to leave room for a
    // loaded machine; a probe blocked behind the export would make none).
    assert!(
        runs(&after) - runs(&before) >= elapsed / 0.2 / 2.0,
        "{} runs in {elapsed:.1} s",
        runs(&after) - runs(&before)
    );
    assert!(
        after.contains("sonde_otlp_export_failures_total{signal=\"metrics\",reason=\"timeout\"}"),
        "{after}"
    );
    // Spans of runs whose export did not land are dropped, and counted:
    // nothing piles up behind the collector.
    let dropped: f64 = after
        .lines()
        .find_map(|l| l.strip_prefix("sonde_otlp_dropped_total{signal=\"traces\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    assert!(dropped > 0.0, "{after}");
    // One export at a time of each signal: the series, the spans.
    let most = receiver
        .received
        .most_in_flight
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 2, "{most} exports at once");
    agent.stop().await;
}

/// The OpenTelemetry Collector itself (scripts/otelcol/main.go, built by
/// scripts/tools.sh: `SONDE_OTELCOL`), its OTLP receiver on gRPC and HTTP,
/// its file exporter writing what it took as OTLP JSON: the agent's
/// export over each protocol reads, in Prometheus's names, as its
/// `/metrics` does, with the resource attributes a collector expects, and
/// its runs' spans are there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_takes_every_series_over_grpc_and_http() {
    let Some(otelcol) = built("SONDE_OTELCOL", "the OpenTelemetry Collector") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (grpc, http) = (sonde_tests::closed_port(), sonde_tests::closed_port());
    let out = dir.path().join("metrics.json");
    let collector_config = dir.path().join("otelcol.yaml");
    std::fs::write(
        &collector_config,
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: \"{grpc}\"}}\n      http: {{endpoint: \"{http}\"}}\n\
             exporters:\n  file:\n    path: {}\n    flush_interval: 100ms\n\
             service:\n  telemetry: {{metrics: {{level: none}}}}\n  pipelines:\n    metrics: {{receivers: [otlp], exporters: [file]}}\n    traces: {{receivers: [otlp], exporters: [file]}}\n",
            out.display()
        ),
    )
    .unwrap();
    let mut collector = std::process::Command::new(&otelcol)
        .arg(format!("--config={}", collector_config.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("otelcol.log")).unwrap())
        .spawn()
        .expect("start the Collector");
    let log = || std::fs::read_to_string(dir.path().join("otelcol.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(grpc).await.is_err() || tokio::net::TcpStream::connect(http).await.is_err() {
        assert!(Instant::now() < deadline, "the Collector did not listen:\n{}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let target = HttpServer::start().await;
    for (collector_addr, protocol) in [(grpc, "grpc"), (http, "http/protobuf")] {
        // The Collector keeps the file open: this protocol's exports are
        // the lines written after those already there.
        let before = std::fs::read_to_string(&out).unwrap_or_default().lines().count();
        let path = dir.path().join("sonde.yaml");
        std::fs::write(&path, config(target.addr, collector_addr, protocol)).unwrap();
        let (agent, api) = start_agent(&path).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (_, text) = call(api, "GET", "/metrics", None, b"").await;
            let written = std::fs::read_to_string(&out).unwrap_or_default();
            let new = || written.lines().skip(before);
            let last = new()
                .filter(|l| l.contains("\"resourceMetrics\""))
                .last()
                .map(collector_names)
                .unwrap_or_default();
            let spans = new().any(|l| l.contains("\"resourceSpans\"") && l.contains("\"sonde.run\""));
            let scraped = scraped(&text);
            if last.0 == scraped && scraped.contains("sonde_probe_runs_total") && spans {
                assert_eq!(
                    last.1.get("service.name").map(String::as_str),
                    Some("sonde"),
                    "{protocol}"
                );
                assert!(last.1.contains_key("host.name"), "{:?}", last.1);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{protocol}: written but not scraped: {:?}\nscraped but not written: {:?}\nthe export: {}\nthe Collector:\n{}",
                last.0.difference(&scraped).collect::<Vec<_>>(),
                scraped.difference(&last.0).collect::<Vec<_>>(),
                text.lines()
                    .filter(|l| l.starts_with("sonde_otlp"))
                    .collect::<Vec<_>>()
                    .join("; "),
                log()
            );
        }
        agent.stop().await;
    }
    let _ = collector.kill();
    let _ = collector.wait();
}

/// One line of the file exporter (OTLP JSON): the metrics' names as
/// Prometheus reads them ([`prometheus_name`]), and the resource's
/// string attributes.
fn collector_names(line: &str) -> (BTreeSet<String>, std::collections::BTreeMap<String, String>) {
    let json: serde_json::Value = serde_json::from_str(line).expect("a line of OTLP JSON");
    let mut names = BTreeSet::new();
    let mut resource = std::collections::BTreeMap::new();
    for rm in json["resourceMetrics"].as_array().into_iter().flatten() {
        for a in rm["resource"]["attributes"].as_array().into_iter().flatten() {
            if let Some(v) = a["value"]["stringValue"].as_str() {
                resource.insert(a["key"].as_str().unwrap_or_default().to_string(), v.to_string());
            }
        }
        for m in rm["scopeMetrics"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["metrics"].as_array().into_iter().flatten())
        {
            let (name, unit) = (
                m["name"].as_str().unwrap_or_default(),
                m["unit"].as_str().unwrap_or_default(),
            );
            names.insert(prometheus_name(name, unit, m["sum"]["isMonotonic"] == true));
        }
    }
    (names, resource)
}

/// With traces: a span per run, an error span (with the run's message)
/// for the one that fails, its host phases as children, and the run
/// duration histogram's exemplar naming a run whose span arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_is_a_span_and_the_duration_histogram_links_to_one() {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::Span;
    let target = HttpServer::start().await;
    let receiver = Receiver::start(Answer::Take).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    let probe = |name: &str, path: &str| {
        format!("      - {{name: {name}, plugin: http, period: 200ms, config: {{path: {path}}}}}\n")
    };
    let yaml = format!(
        "otlp:\n  endpoint: http://{}\n  protocol: http/protobuf\n  interval: 1s\n  traces: {{success_ratio: 1}}\n\
         targets:\n  - name: web\n    address: {}\n    probes:\n{}{}",
        receiver.addr,
        target.addr,
        probe("web-ok", "/ok"),
        probe("web-bad", "/missing")
    );
    std::fs::write(&path, yaml).unwrap();
    let (agent, api) = start_agent(&path).await;
    let attr = string_attribute;
    let run_of = |name: &str| {
        receiver
            .spans()
            .into_iter()
            .find(|s| s.name == "sonde.run" && attr(s, "sonde.probe.name").as_deref() == Some(name))
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ok, bad) = loop {
        if let (Some(ok), Some(bad)) = (run_of("web-ok"), run_of("web-bad")) {
            break (ok, bad);
        }
        assert!(
            Instant::now() < deadline,
            "no span of each probe: {:?}",
            receiver.spans().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(ok.status.as_ref().unwrap().code, 1, "OK: {ok:?}");
    let status = bad.status.as_ref().unwrap();
    assert_eq!(status.code, 2, "ERROR: {bad:?}");
    assert!(status.message.contains("404"), "{status:?}");
    assert_eq!(attr(&bad, "sonde.run.outcome").as_deref(), Some("failure"));
    assert_eq!(attr(&bad, "sonde.plugin.name").as_deref(), Some("http"));
    assert!(attr(&bad, "sonde.plugin.digest").is_some_and(|d| d.starts_with("sha256:")));
    // The fuel it burned and the memory its instance held (a wasm page at least).
    let int = |s: &Span, key: &str| match attribute(s, key)? {
        Value::IntValue(v) => Some(*v),
        _ => None,
    };
    assert!(int(&bad, "sonde.run.fuel").is_some_and(|f| f > 0), "{bad:?}");
    assert!(int(&bad, "sonde.run.memory").is_some_and(|m| m >= 65536), "{bad:?}");
    let children: Vec<String> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.parent_span_id == bad.span_id)
        .map(|s| s.name)
        .collect();
    assert!(children.iter().any(|n| n == "sonde.host.http"), "{children:?}");
    // An exemplar of the run duration histogram names a run that arrived.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let traced: BTreeSet<Vec<u8>> = receiver.spans().into_iter().map(|s| s.trace_id).collect();
        let linked = receiver.received.requests.lock().unwrap().iter().any(|(_, r, _)| {
            r.resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .filter(|m| m.name == "sonde.run.duration")
                .filter_map(|m| match &m.data {
                    Some(Data::Histogram(h)) => Some(h),
                    _ => None,
                })
                .flat_map(|h| &h.data_points)
                .flat_map(|p| &p.exemplars)
                .any(|e| traced.contains(&e.trace_id))
        });
        if linked {
            break;
        }
        assert!(Instant::now() < deadline, "no exemplar names a traced run");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, metrics) = call(api, "GET", "/metrics", None, b"").await;
    assert!(
        metrics.contains("sonde_otlp_exports_total{signal=\"traces\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sonde_otlp_dropped_total{signal=\"traces\"} 0"),
        "{metrics}"
    );
    agent.stop().await;
}

/// `propagate: true`: the probe's HTTP request and gRPC call carry the
/// run's `traceparent` (the target records it), and the run's span, always
/// sent, has that trace and span id: the target's spans hang under the
/// check. One the plugin sets itself is replaced. A probe without it sends
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_propagating_probe_is_the_root_of_the_targets_trace() {
    // What a plugin might set to pass for another trace.
    const FORGED: &str = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01";
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let web = HttpServer::start().await;
    let quiet = HttpServer::start().await;
    let grpc = sonde_tests::GrpcHealthServer::start().await;
    let receiver = Receiver::start(Answer::Take).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    let yaml = format!(
        "otlp:\n  endpoint: http://{}\n  protocol: grpc\n  interval: 1s\n  traces: {{success_ratio: 0}}\n\
         targets:\n\
         \x20 - name: web\n    address: {}\n    probes:\n      - {{name: web-traced, plugin: http, period: 200ms, config: {{path: /ok, headers: {{traceparent: \"{FORGED}\"}}}}, propagate: true}}\n\
         \x20 - name: quiet\n    address: {}\n    probes:\n      - {{name: quiet, plugin: http, period: 200ms, config: {{path: /ok}}}}\n\
         \x20 - name: api\n    address: {}\n    probes:\n      - {{name: api-traced, plugin: grpc, period: 200ms, propagate: true}}\n",
        receiver.addr, web.addr, quiet.addr, grpc.addr
    );
    std::fs::write(&path, yaml).unwrap();
    let (agent, _api) = start_agent(&path).await;
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    // The span of each run that sent a traceparent: "00-<trace>-<span>-01".
    let sent_by_runs = || -> BTreeSet<String> {
        receiver
            .spans()
            .into_iter()
            .filter(|s| s.name == "sonde.run")
            .filter(|s| {
                s.attributes.iter().any(|a| {
                    a.key == "sonde.probe.name"
                        && matches!(a.value.as_ref().and_then(|v| v.value.as_ref()),
                            Some(Value::StringValue(n)) if n.ends_with("-traced"))
                })
            })
            .map(|s| format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)))
            .collect()
    };
    let grpc_sent = || -> Vec<String> {
        grpc.metadata()
            .into_iter()
            .flat_map(|m| m.into_iter().filter(|(k, _)| k == "traceparent").map(|(_, v)| v))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans = sent_by_runs();
        let http_joined = web.traceparents().iter().any(|t| spans.contains(t));
        let grpc_joined = grpc_sent().iter().any(|t| spans.contains(t));
        if http_joined && grpc_joined {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "http {http_joined}, grpc {grpc_joined}: the targets got {:?} and {:?}, the runs' spans are {spans:?}",
            web.traceparents(),
            grpc_sent()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each run its own trace, and each request of a run carries the run's.
    let got = web.traceparents();
    assert!(got.len() >= 2 && got[0] != got[1], "{got:?}");
    assert!(
        got.iter()
            .all(|t| t.len() == 55 && t.starts_with("00-") && t.ends_with("-01")),
        "{got:?}"
    );
    assert!(quiet.traceparents().is_empty(), "{:?}", quiet.traceparents());
    // The plugin's own traceparent never reaches the target: the host's
    // replaces it.
    assert!(!got.iter().any(|t| t == FORGED), "{got:?}");
    agent.stop().await;
}

/// Everything a collector was sent, decoded and written out: what its
/// owner can read.
fn everything(receiver: &Receiver) -> String {
    let metrics = receiver.received.requests.lock().unwrap();
    let traces = receiver.received.traces.lock().unwrap();
    format!(
        "{:?}\n{:?}",
        metrics.iter().map(|(_, m, _)| m).collect::<Vec<_>>(),
        *traces
    )
}

/// Two tenants with their own collectors (credentials by handle of their
/// own secrets), and the operator's: what a tenant's collector is sent is
/// that tenant's alone: no name, address or value of the other tenant's
/// or the operator's probes appears anywhere in it, every span is its
/// own, every export carries its own token; the operator's collector gets
/// all three. Each export's counters carry its tenant, and a tenant's
/// scrape shows its own export's only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_collector_gets_its_own_data_and_the_operators_gets_all() {
    let (acme_web, globex_web, own_web) = (
        HttpServer::start().await,
        HttpServer::start().await,
        HttpServer::start().await,
    );
    let (operator, acme, globex) = (
        Receiver::start(Answer::Take).await,
        Receiver::start(Answer::Take).await,
        Receiver::start(Answer::Take).await,
    );
    let dir = tempfile::tempdir().unwrap();
    for (file, token) in [
        ("op.token", "operator-token-0123456789"),
        ("acme.token", "acme-api-token-0123456789"),
        ("acme-otlp", "acme-collector-secret-1"),
        ("globex.token", "globex-api-token-0123456789"),
        ("globex-otlp", "globex-collector-secret-2"),
    ] {
        crate::support::secret(dir.path(), file, token);
    }
    let tenant = |id: &str, collector: std::net::SocketAddr, protocol: &str| {
        format!(
            "  - id: {id}\n    token_file: {id}.token\n    ceiling: {{net: [\"127.0.0.1:*\"]}}\n\
             \x20   secrets: {{collector: {{file: {id}-otlp}}}}\n\
             \x20   otlp:\n      endpoint: http://{collector}\n      protocol: {protocol}\n      interval: 1s\n\
             \x20     headers: {{authorization: \"Bearer $(secret:collector)\"}}\n      traces: {{success_ratio: 1}}\n"
        )
    };
    let target = |name: &str, tenant: Option<&str>, addr: std::net::SocketAddr| {
        format!(
            "  - name: {name}\n    address: {addr}\n{}    probes:\n      - {{name: {name}-ready, plugin: http, period: 200ms, config: {{path: /ok}}}}\n",
            tenant.map_or(String::new(), |t| format!("    tenant: {t}\n"))
        )
    };
    let yaml = format!(
        "operator_token_file: op.token\n\
         otlp:\n  endpoint: http://{}\n  interval: 1s\n  traces: {{success_ratio: 1}}\n\
         tenants:\n{}{}targets:\n{}{}{}",
        operator.addr,
        tenant("acme", acme.addr, "grpc"),
        tenant("globex", globex.addr, "http/protobuf"),
        target("acme-web", Some("acme"), acme_web.addr),
        target("globex-web", Some("globex"), globex_web.addr),
        target("own-web", None, own_web.addr),
    );
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, yaml).unwrap();
    let (agent, api) = start_agent(&path).await;
    let span_tenants = |r: &Receiver| -> BTreeSet<String> {
        r.spans()
            .iter()
            .filter(|s| s.name == "sonde.run")
            .filter_map(|s| string_attribute(s, "sonde.tenant"))
            .collect()
    };
    let has_runs = |r: &Receiver| r.count() > 0 && as_prometheus_names(&r.last()).contains("sonde_probe_runs_total");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(has_runs(&acme)
        && has_runs(&globex)
        && span_tenants(&operator).len() == 3
        && !span_tenants(&acme).is_empty()
        && !span_tenants(&globex).is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "operator spans of {:?}, acme {:?}, globex {:?}",
            span_tenants(&operator),
            span_tenants(&acme),
            span_tenants(&globex)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (a_web, g_web, o_web) = (
        acme_web.addr.to_string(),
        globex_web.addr.to_string(),
        own_web.addr.to_string(),
    );
    for (who, receiver, own, others, token) in [
        (
            "acme",
            &acme,
            "acme-web",
            [("globex", &g_web), ("own-web", &o_web)],
            "acme-collector-secret-1",
        ),
        (
            "globex",
            &globex,
            "globex-web",
            [("acme", &a_web), ("own-web", &o_web)],
            "globex-collector-secret-2",
        ),
    ] {
        let seen = everything(receiver);
        assert!(seen.contains(own), "{who}'s collector lacks its own probe");
        for (name, addr) in others {
            assert!(!seen.contains(name), "{who}'s collector was sent {name:?}");
            assert!(!seen.contains(addr.as_str()), "{who}'s collector was sent {addr}");
        }
        assert_eq!(span_tenants(receiver), BTreeSet::from([who.to_string()]));
        let requests = receiver.received.requests.lock().unwrap();
        assert!(requests.iter().all(|(_, _, headers)| {
            headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {token}"))
        }));
    }
    let all = everything(&operator);
    for name in ["acme-web", "globex-web", "own-web"] {
        assert!(all.contains(name), "the operator's collector lacks {name}");
    }
    assert!(
        operator
            .received
            .requests
            .lock()
            .unwrap()
            .iter()
            .all(|(_, _, h)| h.get("authorization").is_none())
    );
    // Each export's counters: all three for the operator, its own for a tenant.
    let (_, text) = call(api, "GET", "/metrics", Some("operator-token-0123456789"), b"").await;
    let exported = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter(|l| l.starts_with("sonde_otlp_exports_total{") && l.contains("signal=\"metrics\""))
            .map(|l| {
                l.split("tenant=\"")
                    .nth(1)
                    .map_or("(operator)".to_string(), |t| t.split('"').next().unwrap().to_string())
            })
            .collect()
    };
    assert_eq!(
        exported(&text),
        BTreeSet::from(["(operator)".to_string(), "acme".into(), "globex".into()]),
        "{text}"
    );
    let (_, text) = call(api, "GET", "/metrics", Some("acme-api-token-0123456789"), b"").await;
    assert_eq!(exported(&text), BTreeSet::from(["acme".to_string()]), "{text}");
    agent.stop().await;
}

/// Tenants whose ceilings cover loopback name the agent's own API as
/// their collector, by an address in another spelling (`127.1`) and by a
/// name (`localhost`, resolved by the export's connector): the config is
/// taken (each is inside its ceiling), but no export connects: each is
/// denied by the grant check before a connection is opened, and counted
/// with `reason="denied"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_collector_is_never_the_agents_own_listener() {
    let api = sonde_tests::closed_port();
    let dir = tempfile::tempdir().unwrap();
    crate::support::secret(dir.path(), "op.token", "operator-token-0123456789");
    let path = dir.path().join("sonde.yaml");
    std::fs::write(
        &path,
        format!(
            "operator_token_file: op.token\n\
             tenants:\n  - id: acme\n    ceiling: {{net: [\"127.0.0.0/8:*\"]}}\n\
             \x20   otlp: {{endpoint: \"http://127.1:{port}\", protocol: http/protobuf, interval: 1s}}\n\
             \x20 - id: globex\n    ceiling: {{net: [\"localhost:*\"]}}\n\
             \x20   otlp: {{endpoint: \"http://localhost:{port}\", protocol: grpc, interval: 1s}}\n\
             targets: []\n",
            port = api.port()
        ),
    )
    .unwrap();
    let options = crate::support::agent_options(&path, api);
    let agent = sonde::agent::Agent::start(crate::support::engine(), options)
        .await
        .unwrap();
    let denied =
        |t: &str| format!("sonde_otlp_export_failures_total{{signal=\"metrics\",reason=\"denied\",tenant=\"{t}\"}}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (_, text) = call(api, "GET", "/metrics", Some("operator-token-0123456789"), b"").await;
        if ["acme", "globex"]
            .iter()
            .all(|t| text.lines().any(|l| l.starts_with(&denied(t))))
        {
            break text;
        }
        assert!(Instant::now() < deadline, "no denied export:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        text.lines()
            .filter(|l| l.starts_with("sonde_otlp_exports_total{"))
            .all(|l| l.ends_with(" 0")),
        "an export landed:\n{text}"
    );
    agent.stop().await;
}

/// Prometheus 3 itself (3.5, built from its Go module by
/// scripts/tools.sh: `SONDE_PROMETHEUS3`), its OTLP receiver on, the
/// agent's export sent to it over HTTP/protobuf: the metric names
/// Prometheus stores are the families `/metrics` shows (a histogram's as
/// its `_bucket`, `_sum` and `_count`), Prometheus's `target_info` holds
/// the resource (its `job` is `service.name`), and a PromQL query of a
/// sonde counter answers with the agent's own count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_3_takes_the_export_and_answers_promql() {
    use crate::prometheus::{get10, start_prometheus_with, urlencode};
    let Some(prometheus) = built("SONDE_PROMETHEUS3", "Prometheus 3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (addr, _prometheus) =
        start_prometheus_with(&prometheus, dir.path(), "global: {}\n", &["--web.enable-otlp-receiver"]);
    let target = HttpServer::start().await;
    let path = dir.path().join("sonde.yaml");
    std::fs::write(
        &path,
        format!(
            "otlp:\n  endpoint: http://{addr}/api/v1/otlp\n  protocol: http/protobuf\n  interval: 1s\n  traces: {{enabled: false}}\n\
             targets:\n  - name: web\n    address: {}\n    probes:\n\
             \x20     - {{name: ready, plugin: http, period: 200ms, config: {{path: /ok}}}}\n",
            target.addr
        ),
    )
    .unwrap();
    let (agent, api) = start_agent(&path).await;
    let json =
        |body: Option<String>| serde_json::from_str::<serde_json::Value>(&body.unwrap_or_default()).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, text) = call(api, "GET", "/metrics", None, b"").await;
        let mut expected = BTreeSet::new();
        let mut family = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                family = words
                    .next()
                    .zip(words.next())
                    .map(|(n, t)| (n.to_string(), t == "histogram"));
            } else if !line.starts_with('#')
                && let Some((name, histogram)) = &family
            {
                if *histogram {
                    expected.extend(["_bucket", "_sum", "_count"].map(|s| format!("{name}{s}")));
                } else {
                    expected.insert(name.clone());
                }
            }
        }
        let names = json(get10(addr, "/api/v1/label/__name__/values").await);
        let mut stored: BTreeSet<String> = names["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect();
        let resource = stored.remove("target_info");
        if resource && stored == expected && stored.contains("sonde_probe_runs_total") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored but not scraped: {:?}\nscraped but not stored: {:?}",
            stored.difference(&expected).collect::<Vec<_>>(),
            expected.difference(&stored).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The resource, and a sonde counter, by PromQL: asked until Prometheus
    // answers (its head may lag the names it lists on a loaded machine).
    let query = |q: &str| format!("/api/v1/query?query={}", urlencode(q));
    let deadline = Instant::now() + Duration::from_secs(30);
    let (info, stored) = loop {
        let info = json(get10(addr, &query("last_over_time(target_info[10m])")).await);
        let runs = json(get10(addr, &query("sum(sonde_probe_runs_total{probe=\"ready\"})")).await);
        let stored = runs["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(stored) = stored
            && !info["data"]["result"][0]["metric"].is_null()
        {
            break (info, stored);
        }
        assert!(Instant::now() < deadline, "no answer: {info}, {runs}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(info["data"]["result"][0]["metric"]["job"], "sonde", "{info}");
    let (_, text) = call(api, "GET", "/metrics", None, b"").await;
    let now: f64 = text
        .lines()
        .filter(|l| l.starts_with("sonde_probe_runs_total{") && l.contains("probe=\"ready\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        stored >= 1.0 && stored <= now,
        "Prometheus has {stored} runs, /metrics {now}"
    );
    agent.stop().await;
}

/// `propagate: true` on a `/probe` module, and on a probe whose plugin
/// sends its request through standard `wasi:http` (the hostile guest
/// `wasi_http_elsewhere`, which also sets a `traceparent` of its own):
/// each target records the run's `traceparent`, never the plugin's, and
/// the run's span (the `/probe` run's naming the target it was asked
/// for) arrives with those ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_module_and_a_wasi_http_plugin_propagate_the_runs_trace() {
    const FORGED: &str = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01";
    let (scraped_web, wasi_web) = (HttpServer::start().await, HttpServer::start().await);
    let receiver = Receiver::start(Answer::Take).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sonde.yaml");
    let wasi_config = serde_json::json!({
        "authority": wasi_web.addr.to_string(),
        "path": "/ok",
        "headers": [["traceparent", FORGED]],
    });
    std::fs::write(
        &path,
        format!(
            "otlp:\n  endpoint: http://{}\n  interval: 1s\n  traces: {{success_ratio: 0}}\n\
             modules:\n  traced_http: {{plugin: http, config: {{path: /ok}}, grants: {{net: [\"127.0.0.1:*\"]}}, propagate: true}}\n\
             targets:\n  - name: wasi\n    address: {}\n    probes:\n\
             \x20     - {{name: wasi-traced, plugin: \"{}\", period: 200ms, config: {wasi_config}, propagate: true}}\n",
            receiver.addr,
            wasi_web.addr,
            sonde_tests::guests::WASI_HTTP_ELSEWHERE,
        ),
    )
    .unwrap();
    let (agent, api) = start_agent(&path).await;
    let (status, body) = call(
        api,
        "GET",
        &format!("/probe?module=traced_http&target={}", scraped_web.addr),
        None,
        b"",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("probe_success 1"), "{body}");
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let string = string_attribute;
    // Each run span's traceparent, with its probe and address.
    let runs = || -> Vec<(String, Option<String>, Option<String>)> {
        receiver
            .spans()
            .iter()
            .filter(|s| s.name == "sonde.run")
            .map(|s| {
                (
                    format!("00-{}-{}-01", hex(&s.trace_id), hex(&s.span_id)),
                    string(s, "sonde.probe.name"),
                    string(s, "server.address"),
                )
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans = runs();
        let joined = |sent: &[String]| sent.iter().any(|t| spans.iter().any(|(id, _, _)| id == t));
        if joined(&scraped_web.traceparents()) && joined(&wasi_web.traceparents()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/probe's target got {:?}, wasi:http's {:?}; the spans: {spans:?}",
            scraped_web.traceparents(),
            wasi_web.traceparents()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = scraped_web.traceparents();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let span = runs().into_iter().find(|(id, _, _)| *id == sent[0]).unwrap();
    assert_eq!(
        span.2.as_deref(),
        Some(scraped_web.addr.to_string().as_str()),
        "{span:?}"
    );
    let wasi = wasi_web.traceparents();
    assert!(
        !wasi.iter().any(|t| t == FORGED),
        "the plugin's own traceparent went out: {wasi:?}"
    );
    assert!(wasi.iter().all(|t| t.len() == 55 && t.starts_with("00-")), "{wasi:?}");
    agent.stop().await;
}

/// Nothing one tenant's collector does reaches another export: acme's
/// collector takes every request and never answers, and meanwhile the
/// operator's collector gets an export every interval as before, globex's
/// too, acme's failures are counted under acme alone, and its spans
/// dropped from its own queue, not from the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_stalled_collector_holds_up_no_other_export() {
    let target = HttpServer::start().await;
    let (operator, acme, globex) = (
        Receiver::start(Answer::Take).await,
        Receiver::start(Answer::Stall).await,
        Receiver::start(Answer::Take).await,
    );
    let dir = tempfile::tempdir().unwrap();
    crate::support::secret(dir.path(), "op.token", "operator-token-0123456789");
    let tenant = |id: &str, collector: std::net::SocketAddr| {
        format!(
            "  - id: {id}\n    ceiling: {{net: [\"127.0.0.1:*\"]}}\n\
             \x20   otlp: {{endpoint: \"http://{collector}\", interval: 1s, traces: {{success_ratio: 1}}}}\n"
        )
    };
    let probe = |id: &str| {
        format!(
            "  - name: {id}-web\n    tenant: {id}\n    address: {}\n    probes:\n\
             \x20     - {{name: {id}-ready, plugin: http, period: 100ms, config: {{path: /ok}}}}\n",
            target.addr
        )
    };
    let path = dir.path().join("sonde.yaml");
    std::fs::write(
        &path,
        format!(
            "operator_token_file: op.token\notlp: {{endpoint: \"http://{}\", interval: 1s, traces: {{success_ratio: 1}}}}\n\
             tenants:\n{}{}targets:\n{}{}",
            operator.addr,
            tenant("acme", acme.addr),
            tenant("globex", globex.addr),
            probe("acme"),
            probe("globex"),
        ),
    )
    .unwrap();
    let (agent, api) = start_agent(&path).await;
    acme.until(2).await;
    let (operator_before, globex_before) = (operator.count(), globex.count());
    let started = Instant::now();
    // Three of acme's exports held to their timeout (1 s each, then the
    // back-off): the others keep their interval all along.
    acme.until(4).await;
    let elapsed = started.elapsed().as_secs_f64();
    for (name, r, before) in [
        ("operator", &operator, operator_before),
        ("globex", &globex, globex_before),
    ] {
        let sent = (r.count() - before) as f64;
        assert!(sent >= elapsed / 2.0, "{name}: {sent} exports in {elapsed:.1} s");
    }
    let (_, text) = call(api, "GET", "/metrics", Some("operator-token-0123456789"), b"").await;
    let failures: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sonde_otlp_export_failures_total{"))
        .collect();
    assert!(
        !failures.is_empty() && failures.iter().all(|l| l.contains("tenant=\"acme\"")),
        "{text}"
    );
    let dropped = |who: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("sonde_otlp_dropped_total{") && l.contains(who))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert!(dropped("tenant=\"acme\"") > 0.0, "{text}");
    assert_eq!(dropped("tenant=\"globex\""), 0.0, "{text}");
    agent.stop().await;
}

/// A TLS file the export cannot use (a `ca_file` with no certificate in
/// it), in the operator's block and in a tenant's: `sonde validate` and
/// the agent's start refuse the file alike, each problem naming the file,
/// the owner of the block and the key; nothing starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_tls_file_is_refused_by_validate_and_run_naming_whose_block() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("not-a-ca.pem"), "not a certificate\n").unwrap();
    crate::support::secret(dir.path(), "op.token", "operator-token-0123456789");
    let path = dir.path().join("sonde.yaml");
    std::fs::write(
        &path,
        "operator_token_file: op.token\n\
         otlp: {endpoint: \"https://collector.example:4317\", ca_file: not-a-ca.pem}\n\
         tenants:\n  - id: acme\n    ceiling: {net: [\"otel.acme.example:4317\"]}\n\
         \x20   otlp: {endpoint: \"https://otel.acme.example:4317\", ca_file: not-a-ca.pem}\n\
         targets: []\n",
    )
    .unwrap();
    let file = path.display().to_string();
    let operator = format!("{file}: otlp.ca_file: no usable CA certificate in it");
    let tenant = format!("{file}: tenant \"acme\": otlp.ca_file: no usable CA certificate in it");
    let out = crate::support::sonde_async(vec!["validate".into(), file.clone()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&operator) && stderr.contains(&tenant), "{stderr}");
    let options = crate::support::agent_options(&path, "127.0.0.1:0".parse().unwrap());
    let refused = match sonde::agent::Agent::start(crate::support::engine(), options).await {
        Ok(_) => panic!("the agent started"),
        Err(e) => e.to_string(),
    };
    assert!(refused.contains(&operator) && refused.contains(&tenant), "{refused}");
}

/// docs/opentelemetry.md's configs, as shipped (its secret files put in a
/// scratch directory, its CA file the system's bundle), are one file
/// `sonde validate` takes, and load as the page says: the operator's
/// export with its header, protocol, interval and resource; the probe
/// that propagates; acme's own export, inside its ceiling, with its own
/// secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_configs_load_as_shipped() {
    let doc = std::fs::read_to_string(crate::support::repo().join("docs/opentelemetry.md")).unwrap();
    let blocks: Vec<String> = sonde_tests::manifests::yaml_blocks(&doc)
        .into_iter()
        .filter(|(_, info, _)| info == "yaml")
        .map(|(_, _, body)| body)
        .collect();
    assert_eq!(
        blocks.len(),
        3,
        "docs/opentelemetry.md's yaml blocks changed: {blocks:#?}"
    );
    let dir = tempfile::tempdir().unwrap();
    crate::support::secret(dir.path(), "otlp-token", "operator-collector-token");
    crate::support::secret(dir.path(), "acme-otel", "acme-collector-token");
    let mut text = blocks.concat();
    for (from, to) in [
        ("/etc/sonde/secrets/otlp-token", "otlp-token"),
        ("/etc/sonde/secrets/acme-otel", "acme-otel"),
        ("/etc/sonde/collector-ca.pem", "/etc/ssl/certs/ca-certificates.crt"),
    ] {
        assert!(text.contains(from), "docs/opentelemetry.md no longer names {from}");
        text = text.replace(from, to);
    }
    let path = dir.path().join("sonde.yaml");
    std::fs::write(&path, &text).unwrap();
    let out = crate::support::sonde_async(vec!["validate".into(), path.display().to_string()]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let catalog = sonde_core::catalog::Catalog::load_file(&crate::support::engine(), &path)
        .await
        .unwrap();
    let operator = catalog.agent.otlp.operator.as_ref().expect("the operator's export");
    assert_eq!(operator.endpoint, "https://collector.example.com:4317");
    assert_eq!(operator.protocol.as_str(), "grpc");
    assert_eq!(operator.interval, Duration::from_secs(60));
    assert_eq!(
        operator.headers[0].value().unwrap().as_slice(),
        b"Bearer operator-collector-token"
    );
    assert_eq!(operator.resource["deployment.environment.name"], "prod");
    assert!(operator.ca.is_some());
    let acme = catalog.agent.otlp.of_tenant("acme").expect("acme's export");
    assert_eq!(acme.endpoint, "https://otel.acme.example:4317");
    assert_eq!(
        acme.headers[0].value().unwrap().as_slice(),
        b"Bearer acme-collector-token"
    );
    assert_eq!(acme.traces.map(|t| t.success_ratio), Some(0.1));
    assert!(catalog.probes().any(|p| &*p.target == "checkout" && p.propagate));
}
