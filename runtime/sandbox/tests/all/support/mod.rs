//! Shared test setup: one engine per test binary, with its compile cache in
//! Cargo's scratch directory so reruns do not recompile, and the calls the
//! tests make on it.

use sonde_sandbox::engine::{Call, Engine, Limits, Plugin};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::RunResult;
pub(crate) use sonde_tests::raw_http::accepted_before_now;
pub(crate) use sonde_tests::seeded;
use std::sync::Arc;
use std::time::Duration;

mod engines;
pub(crate) use engines::{cache_dir, engine, engine_with};

/// Runs `plugin` (loaded by `engine`) once on `engine`.
pub(crate) async fn run_on(
    engine: &Engine,
    plugin: &Arc<Plugin>,
    target: &str,
    config: &str,
    timeout: Duration,
) -> RunResult {
    let call = Call {
        probe: "test",
        target,
        config,
        limits: Limits {
            timeout,
            ..Limits::default()
        },
        grants: &Arc::new(Grants::default()),
        attempt: 1,
        observe: true,
    };
    engine.run(plugin, &call).await
}

pub(crate) async fn guest(path: &str) -> Arc<Plugin> {
    engine().load_file(path.as_ref()).await.expect("load guest")
}

pub(crate) async fn builtin(name: &str) -> Arc<Plugin> {
    engine()
        .load(name, sonde_builtins::get(name).expect("built-in"))
        .await
        .expect("load built-in")
}

/// Runs `plugin` once with the given target, config, grants and timeout.
pub(crate) async fn run(
    plugin: &Arc<Plugin>,
    target: &str,
    config: &str,
    grants: &Grants,
    timeout: Duration,
) -> RunResult {
    let limits = Limits {
        timeout,
        ..Limits::default()
    };
    run_call(plugin, target, config, grants, limits).await
}

/// Runs the built-in plugin `name` once against `target` with no grants.
pub(crate) async fn check(name: &str, target: &str, config: &str, timeout: Duration) -> RunResult {
    run(&builtin(name).await, target, config, &Grants::default(), timeout).await
}

/// Runs the guest at `path` once with no target, config or grants, for 1s.
pub(crate) async fn run_alone(path: &str) -> RunResult {
    run(&guest(path).await, "", "{}", &Grants::default(), Duration::from_secs(1)).await
}

/// Runs `plugin` once with no target, config or grants, under `limits`.
pub(crate) async fn run_with_limits(plugin: &Arc<Plugin>, limits: Limits) -> RunResult {
    run_call(plugin, "", "{}", &Grants::default(), limits).await
}

async fn run_call(plugin: &Arc<Plugin>, target: &str, config: &str, grants: &Grants, limits: Limits) -> RunResult {
    let call = Call {
        probe: "test",
        target,
        config,
        limits,
        grants: &Arc::new(grants.clone()),
        attempt: 1,
        observe: true,
    };
    engine().run(plugin, &call).await
}
