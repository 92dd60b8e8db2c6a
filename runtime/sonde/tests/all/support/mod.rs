//! Shared test setup: one engine per test binary, with its compile cache in
//! Cargo's scratch directory so reruns do not recompile.

pub(crate) mod fake_api;
pub(crate) mod fake_nodes;
pub(crate) mod fake_secrets;
pub(crate) mod kube;
pub(crate) mod seeded;

use sonde_sandbox::engine::{Call, Engine, EngineConfig, Limits, Plugin};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::RunResult;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The repository's root, found at run time: a test binary reused from
/// another checkout's target dir (the metadata hash of a workspace member
/// leaves its path out) would otherwise look in that checkout.
pub(crate) fn repo() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR")).join("../..")
}

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

pub(crate) fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")
}

pub(crate) fn engine() -> Engine {
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

/// An engine of its own, under `limits`: what it enforces is its own,
/// whatever the other engines of this process do (a small instance pool:
/// a test runs a few calls at once).
pub(crate) fn engine_with(limits: sonde_sandbox::host::bounds::HostLimits) -> Engine {
    Engine::new(EngineConfig {
        cache_dir: Some(cache_dir()),
        max_concurrent_calls: 8,
        host_limits: limits,
        ..EngineConfig::default()
    })
    .expect("engine")
}

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

/// How many connections a listener at `addr` had accepted of those made
/// before this call, `accepted()` being its running count. A listener
/// accepts in the order connections complete, so this makes one more and
/// waits until the listener has taken it (its answer or its closing
/// arrives): every earlier one has been counted by then. It is the event
/// that proves "nothing else connected", where a sleep would only hope so.
pub(crate) async fn accepted_before_now(addr: std::net::SocketAddr, accepted: impl Fn() -> usize) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut marker = tokio::net::TcpStream::connect(addr).await.expect("connect the marker");
    // Enough bytes for any server to decide it does not like them (an
    // HTTP/2 server reads the 24-byte preface first), then wait for its
    // reply or its close.
    let _ = marker.write_all(b"GET / HTTP/1.1\r\nHost: sonde-test\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let answered = tokio::time::timeout(Duration::from_secs(10), marker.read(&mut buf)).await;
    assert!(
        answered.is_ok(),
        "the listener at {addr} never took the marker connection"
    );
    // Every marker sent to this listener so far is in its count.
    static MARKERS: std::sync::Mutex<Vec<std::net::SocketAddr>> = std::sync::Mutex::new(Vec::new());
    let mut markers = MARKERS.lock().unwrap_or_else(|e| e.into_inner());
    markers.push(addr);
    accepted() - markers.iter().filter(|a| **a == addr).count()
}

/// Writes `token` to `dir/name`, readable by its owner only (the agent
/// refuses a world-readable token file).
pub(crate) fn secret(dir: &std::path::Path, name: &str, token: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(name))
        .unwrap();
    std::io::Write::write_all(&mut f, token.as_bytes()).unwrap();
}

/// Starts an agent on `config` with its API on a free loopback port
/// (tokens as the config has them, no jitter), and returns it with that
/// address.
pub(crate) async fn start_agent(config: &std::path::Path) -> (sonde::agent::Agent, std::net::SocketAddr) {
    start_agent_on(engine(), config).await
}

/// [`start_agent`] on `engine`.
pub(crate) async fn start_agent_on(
    engine: Engine,
    config: &std::path::Path,
) -> (sonde::agent::Agent, std::net::SocketAddr) {
    let options = sonde::agent::AgentOptions {
        config: Some(config.to_path_buf()),
        api: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        grace: Duration::from_secs(2),
        jitter: false,
        api_auth: sonde::api::ApiAuth::Auto,
    };
    let agent = sonde::agent::Agent::start(engine, options).await.unwrap();
    let api = agent.api().unwrap();
    (agent, api)
}

/// One request on a new connection, with an optional bearer token and a
/// body: the status and body (status 0 when the connection closed without
/// an answer). A refused upload may be answered before the whole body is
/// sent.
pub(crate) async fn call(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    call_with(api, method, path, token, &[], body).await
}

/// [`call`] with more request headers (`name`, `value`).
pub(crate) async fn call_with(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(api).await.unwrap();
    let mut auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    for (name, value) in headers {
        auth += &format!("{name}: {value}\r\n");
    }
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: sonde\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await;
    let mut text = Vec::new();
    let _ = s.read_to_end(&mut text).await;
    parse_response(&text)
}

/// [`call`] for a test that expects the agent to go away: `None` when it
/// cannot be reached or closes without an answer, instead of a panic or
/// status 0.
pub(crate) async fn try_call(
    api: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(api).await.ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: sonde\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.ok()?;
    let _ = s.write_all(body).await;
    let mut text = Vec::new();
    s.read_to_end(&mut text).await.ok()?;
    Some(parse_response(&text)).filter(|(status, _)| *status != 0)
}

/// The status and body of a raw HTTP/1.1 response (status 0 if none).
pub(crate) fn parse_response(text: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(text).to_string();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// `name`'s path on `PATH`; `None` (the test is skipped, and says so) when
/// it is not installed, unless `SONDE_REQUIRE_TOOLS` is set (scripts/test
/// sets it: in CI a missing tool is a failure).
pub(crate) fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        missing(
            &format!("{name} is not installed"),
            &format!("apt-get install {package}"),
        );
    }
    found
}

/// The program at the path in the environment variable `var` (scripts/test
/// exports it after building the program), with [`tool`]'s convention: a
/// test is skipped without it, unless `SONDE_REQUIRE_TOOLS` is set. `what`
/// names the program, `how` says how to get it.
pub(crate) fn tool_from_env(var: &str, what: &str, how: &str) -> Option<PathBuf> {
    let found = std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_file());
    if found.is_none() {
        let said = std::env::var(var).map_or_else(|_| format!("{var} is not set"), |v| format!("{var}={v} is no file"));
        missing(&format!("{what} is missing ({said})"), how);
    }
    found
}

/// A missing tool: a failure under `SONDE_REQUIRE_TOOLS`, else a skip that
/// says so.
fn missing(what: &str, fix: &str) {
    assert!(std::env::var_os("SONDE_REQUIRE_TOOLS").is_none(), "{what}: {fix}");
    eprintln!("skipped: {what} ({fix}); SONDE_REQUIRE_TOOLS=1 makes this a failure");
}
