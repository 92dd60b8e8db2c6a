//! Shared test setup: one engine per test binary, with its compile cache in
//! Cargo's scratch directory so reruns do not recompile.

use sonde_runtime::engine::{Call, Engine, EngineConfig, Limits, Plugin};
use sonde_runtime::host::Grants;
use sonde_runtime::verdict::RunResult;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Runs the `sonde` binary with `args` and this binary's compile cache.
pub fn sonde(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(args)
        .output()
        .expect("run sonde")
}

pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")
}

pub fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            Engine::new(EngineConfig {
                cache_dir: Some(cache_dir()),
                ..EngineConfig::default()
            })
            .expect("engine")
        })
        .clone()
}

pub async fn guest(path: &str) -> Arc<Plugin> {
    engine().load_file(path.as_ref()).await.expect("load guest")
}

pub async fn builtin(name: &str) -> Arc<Plugin> {
    engine()
        .load(name, sonde_runtime::builtins::get(name).expect("built-in"))
        .await
        .expect("load built-in")
}

/// Runs `plugin` once with the given target, config, grants and timeout.
pub async fn run(plugin: &Arc<Plugin>, target: &str, config: &str, grants: &Grants, timeout: Duration) -> RunResult {
    let limits = Limits {
        timeout,
        ..Limits::default()
    };
    run_call(plugin, target, config, grants, limits).await
}

/// Runs the built-in plugin `name` once against `target` with no grants.
pub async fn check(name: &str, target: &str, config: &str, timeout: Duration) -> RunResult {
    run(&builtin(name).await, target, config, &Grants::default(), timeout).await
}

/// Runs the guest at `path` once with no target, config or grants, for 1s.
pub async fn run_alone(path: &str) -> RunResult {
    run(&guest(path).await, "", "{}", &Grants::default(), Duration::from_secs(1)).await
}

/// Runs `plugin` once with no target, config or grants, under `limits`.
pub async fn run_with_limits(plugin: &Arc<Plugin>, limits: Limits) -> RunResult {
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
    };
    engine().run(plugin, &call).await
}

/// The JSON `sonde` printed on stdout.
pub fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs a blocking `sonde` process while the test's own servers keep
/// answering on the async runtime.
pub async fn sonde_async(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || sonde(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}
