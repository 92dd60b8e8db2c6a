//! Shared test setup: one engine per test binary, with its compile cache in
//! Cargo's scratch directory so reruns do not recompile.

#[allow(
    dead_code,
    reason = "sonde-kubernetes's mocked API server, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../kubernetes/tests/all/support/fake_api.rs"]
pub(crate) mod fake_api;
#[allow(
    dead_code,
    reason = "sonde-kubernetes's mocked Nodes, shared (`#[path]`): the mocked API server serves them, these tests make none"
)]
#[path = "../../../../kubernetes/tests/all/support/fake_nodes.rs"]
pub(crate) mod fake_nodes;
#[path = "../../../../kubernetes/tests/all/support/fake_secrets.rs"]
pub(crate) mod fake_secrets;
pub(crate) mod image;
pub(crate) mod kube;
#[path = "../../../../kubernetes/tests/all/support/rbac.rs"]
pub(crate) mod rbac;

#[allow(
    dead_code,
    reason = "sonde-oci's hostile registry, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../oci/tests/all/support/hostile_registry.rs"]
pub(crate) mod hostile_registry;
#[allow(
    dead_code,
    reason = "sonde-oci's registry, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../oci/tests/all/support/registry.rs"]
pub(crate) mod registry;
#[path = "../../../../oci/tests/all/support/signed.rs"]
pub(crate) mod signed;

use sonde_sandbox::engine::{Call, Engine, Limits, Plugin};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::RunResult;
pub(crate) use sonde_tests::raw_http::{accepted_before_now, call, call_with, parse_response, try_call};
pub(crate) use sonde_tests::seeded;
pub(crate) use sonde_tests::tools::{repo, secret, tool, tool_from_env};
use std::sync::Arc;
use std::time::Duration;

/// Runs the `sonde` binary with `args` and this binary's compile cache.
pub(crate) fn sonde(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sonde"))
        .arg("--cache-dir")
        .arg(cache_dir())
        .args(args)
        .output()
        .expect("run sonde")
}

/// A `sonde` command (with this binary's compile cache) that runs in a
/// mount namespace of its own, where each `(file, over)` of `binds` is
/// bind-mounted over the system file `over`: an `/etc/hosts` or
/// `/etc/resolv.conf` a test writes, so the system resolver answers what
/// the test says without touching the machine's own files.
pub(crate) fn sonde_with_mounts(binds: &[(&std::path::Path, &str)]) -> std::process::Command {
    let mounts: Vec<String> = binds
        .iter()
        .map(|(file, over)| format!("mount --bind '{}' {over}", file.display()))
        .collect();
    let script = format!("{} && exec \"$0\" \"$@\"", mounts.join(" && "));
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--mount", "sh", "-c", &script, env!("CARGO_BIN_EXE_sonde")])
        .arg("--cache-dir")
        .arg(cache_dir())
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET");
    command
}

#[allow(
    dead_code,
    unreachable_pub,
    reason = "sonde-sandbox's test engines, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../sandbox/tests/all/support/engines.rs"]
mod engines;
pub(crate) use engines::{cache_dir, engine, engine_with};

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

/// The JSON `sonde` printed on stdout.
pub(crate) fn json(out: &std::process::Output) -> serde_json::Value {
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
pub(crate) async fn sonde_async(args: Vec<String>) -> std::process::Output {
    tokio::task::spawn_blocking(move || sonde(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

/// Starts an agent on `config` with its API on a free loopback port
/// (tokens as the config has them, no jitter), and returns it with that
/// address.
pub(crate) async fn start_agent(config: &std::path::Path) -> (sonde::agent::Agent, std::net::SocketAddr) {
    start_agent_on(engine(), config).await
}

/// What the tests start an agent with: `config`, its API on `api`, tokens
/// as the config has them, no jitter, no state kept.
pub(crate) fn agent_options(config: &std::path::Path, api: std::net::SocketAddr) -> sonde::agent::AgentOptions {
    sonde::agent::AgentOptions {
        config: Some(config.to_path_buf()),
        api: Some(api),
        state_dir: None,
        grace: Duration::from_secs(2),
        jitter: false,
        api_auth: sonde::api::ApiAuth::Auto,
    }
}

/// [`start_agent`] on `engine`.
pub(crate) async fn start_agent_on(
    engine: Engine,
    config: &std::path::Path,
) -> (sonde::agent::Agent, std::net::SocketAddr) {
    let options = agent_options(config, "127.0.0.1:0".parse().unwrap());
    let agent = sonde::agent::Agent::start(engine, options).await.unwrap();
    let api = agent.api().unwrap();
    (agent, api)
}
