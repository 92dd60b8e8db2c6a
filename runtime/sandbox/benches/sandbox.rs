//! The cost of the sandbox: one call of a trivial plugin (instantiate +
//! call + drop, compile excluded), one tcp run against a loopback listener,
//! and one http run against a loopback hyper server (a new connection per
//! run, and over the host's keep-alive pool). Run with
//! `cargo bench -p sonde-sandbox`; `sonde bench` (BENCHMARKS.md) measures
//! throughput against a native baseline.

use criterion::{Criterion, criterion_group, criterion_main};
use sonde_sandbox::engine::{Call, Engine, EngineConfig, Limits};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::Status;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let engine = Engine::new(EngineConfig {
        cache_dir: None,
        ..EngineConfig::default()
    })
    .unwrap();
    let grants = std::sync::Arc::new(Grants::default());

    let up = rt
        .block_on(engine.load_file(sonde_tests::guests::ALWAYS_UP.as_ref()))
        .unwrap();
    let call = Call {
        probe: "bench",
        target: "",
        config: "{}",
        limits: Limits::default(),
        grants: &grants,
        attempt: 1,
        observe: false,
    };
    assert_eq!(rt.block_on(engine.run(&up, &call)).status, Status::Success);
    c.bench_function("sandbox/trivial_call", |b| {
        b.to_async(&rt).iter(|| engine.run(&up, &call))
    });

    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let target = listener.local_addr().unwrap().to_string();
    rt.spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            drop(s);
        }
    });
    let tcp = rt
        .block_on(engine.load("tcp", sonde_builtins::get("tcp").unwrap()))
        .unwrap();
    let call = Call {
        target: &target,
        ..call.clone()
    };
    assert_eq!(rt.block_on(engine.run(&tcp, &call)).status, Status::Success);
    c.bench_function("sandbox/tcp_run", |b| b.to_async(&rt).iter(|| engine.run(&tcp, &call)));

    let server = rt.block_on(sonde_tests::HttpServer::start());
    let target = server.addr.to_string();
    let http = rt
        .block_on(engine.load("http", sonde_builtins::get("http").unwrap()))
        .unwrap();
    for (name, config) in [
        ("sandbox/http_run", r#"{"path": "/health"}"#),
        (
            "sandbox/http_keepalive_run",
            r#"{"path": "/health", "keepalive": true}"#,
        ),
    ] {
        let call = Call {
            target: &target,
            config,
            ..call.clone()
        };
        assert_eq!(rt.block_on(engine.run(&http, &call)).status, Status::Success);
        c.bench_function(name, |b| b.to_async(&rt).iter(|| engine.run(&http, &call)));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
