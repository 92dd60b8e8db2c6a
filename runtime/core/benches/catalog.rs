//! The cost of one incremental registry change with 100,000 probes loaded:
//! a probe (a target of its own, as an API upload or a Kubernetes Pod
//! brings) checked and committed, then removed again — the same checks as a
//! whole load (names, quotas, ceilings, plugin, schema). Target: ≤ 1 ms
//! each. Run with `cargo bench -p sonde-core --bench registry`.

use criterion::{Criterion, criterion_group, criterion_main};
use sonde_core::catalog::{Catalog, Change};
use sonde_core::config;
use sonde_sandbox::engine::{Engine, EngineConfig};
use std::fmt::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Probes loaded before the change.
const LOADED: usize = 100_000;

fn file_with(n: usize) -> String {
    let mut text = String::from(
        "tenants:\n  - id: acme\n    quotas: { max_probes: 200000 }\n    ceiling: { net: [\"10.0.0.0/8:*\"] }\ntargets:\n",
    );
    for i in 0..n {
        let tenant = if i % 2 == 0 { "    tenant: acme\n" } else { "" };
        write!(
            text,
            "  - name: t{i}\n{tenant}    address: 10.0.{}.{}:80\n    probes:\n      - plugin: http\n        config: {{ path: /healthz }}\n",
            (i / 250) % 250,
            i % 250
        )
        .unwrap();
    }
    text
}

/// One stored probe as the API turns it into a target.
fn one(name: &str) -> Vec<config::Target> {
    let text = format!(
        "targets:\n  - name: {name}\n    tenant: acme\n    address: 10.9.9.9:80\n    probes:\n      - name: {name}\n        plugin: http\n        config: {{ path: /ready }}\n"
    );
    let mut file = config::parse(Path::new("PUT /v1/probes/x"), &text).unwrap();
    file.targets
        .iter_mut()
        .for_each(|t| t.source = Some(format!("PUT /v1/probes/{name}").into()));
    file.targets
}

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
    let mut catalog = rt
        .block_on(Catalog::load_text(&engine, Path::new("bench.yaml"), &file_with(LOADED)))
        .unwrap();
    assert_eq!(catalog.probes().len(), LOADED);

    let mut g = c.benchmark_group("registry");
    // Each iteration times one change alone; the undo runs outside the clock.
    g.bench_function("add_one_probe_at_100k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let targets = one("extra");
                let started = Instant::now();
                let prepared = rt.block_on(catalog.prepare(&engine, Change::add(targets))).unwrap();
                std::hint::black_box(catalog.commit(prepared));
                total += started.elapsed();
                let undo = rt
                    .block_on(catalog.prepare(&engine, Change::remove(["extra"])))
                    .unwrap();
                let _ = catalog.commit(undo);
            }
            total
        })
    });
    g.bench_function("remove_one_probe_at_100k", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let redo = rt
                    .block_on(catalog.prepare(&engine, Change::add(one("extra"))))
                    .unwrap();
                let _ = catalog.commit(redo);
                let started = Instant::now();
                let prepared = rt
                    .block_on(catalog.prepare(&engine, Change::remove(["extra"])))
                    .unwrap();
                std::hint::black_box(catalog.commit(prepared));
                total += started.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
