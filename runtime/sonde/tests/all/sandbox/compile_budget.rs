//! Compiling is a resource too: an upload is compiled in a child process
//! under a time and memory budget, outside the control lock. A component
//! built to stress the compiler is refused with 422 and nothing stored,
//! while another tenant's small upload completes in the meantime; compile
//! time is counted against the tenant.

use crate::support::{call, secret};
use sonde::agent::{Agent, AgentOptions};
use sonde::api::ApiAuth;
use sonde_policy::identity::Digest;
use sonde_sandbox::engine::{CompileBudget, Compiler, Engine, EngineConfig};
use sonde_tests::guests;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const ACME: &str = "acme-secret";
const BETA: &str = "beta-secret";

/// A component whose one core module has a function made to keep the
/// compiler busy: `locals` i32 locals, a loop of `ops` additions between
/// them (every local a value the loop carries round), every local used at
/// the end so none is dead. About 12 bytes per op.
fn compiler_stress(locals: u32, ops: u32) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, Component, Function, FunctionSection, Instruction, Module, ModuleSection, TypeSection, ValType,
    };
    let mut types = TypeSection::new();
    types.ty().function([], [ValType::I32]);
    let mut functions = FunctionSection::new();
    functions.function(0);
    let mut body = Function::new([(locals, ValType::I32)]);
    body.instruction(&Instruction::Loop(wasm_encoder::BlockType::Empty));
    for i in 0..ops {
        let pick = |k: u64, m: u64| ((u64::from(i) * k + m) % u64::from(locals)) as u32;
        let (a, b, c) = (pick(7919, 0), pick(104_729, 13), pick(31, 1));
        body.instruction(&Instruction::LocalGet(a))
            .instruction(&Instruction::LocalGet(b))
            .instruction(&Instruction::I32Add)
            .instruction(&Instruction::LocalSet(c));
    }
    body.instruction(&Instruction::LocalGet(0))
        .instruction(&Instruction::BrIf(0))
        .instruction(&Instruction::End);
    body.instruction(&Instruction::I32Const(0));
    for l in 0..locals {
        body.instruction(&Instruction::LocalGet(l))
            .instruction(&Instruction::I32Add);
    }
    body.instruction(&Instruction::End);
    let mut code = CodeSection::new();
    code.function(&body);
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// An agent with tenants acme and beta, a state dir, and an engine that
/// compiles in the `sonde` binary under `budget`.
async fn start(dir: &Path, budget: CompileBudget) -> (Agent, SocketAddr) {
    secret(dir, "op.token", "operator-secret");
    secret(dir, "acme.token", ACME);
    secret(dir, "beta.token", BETA);
    let yaml = "operator_token_file: op.token\nstate_dir: state\ntenants:\n  - id: acme\n    token_file: acme.token\n  - id: beta\n    token_file: beta.token\ntargets: []\n";
    let config = dir.join("sonde.yaml");
    std::fs::write(&config, yaml).unwrap();
    let engine = Engine::new(EngineConfig {
        cache_dir: Some(dir.join("cache")),
        max_concurrent_calls: 8,
        compiler: Compiler::Child {
            program: env!("CARGO_BIN_EXE_sonde").into(),
            budget,
        },
        ..EngineConfig::default()
    })
    .unwrap();
    let options = AgentOptions {
        config: Some(config),
        api: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        grace: Duration::from_secs(2),
        jitter: false,
        api_auth: ApiAuth::Auto,
    };
    let agent = Agent::start(engine, options).await.unwrap();
    let api = agent.api().unwrap();
    (agent, api)
}

fn stored_plugins(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for tenant in std::fs::read_dir(dir.join("state/managed/plugins"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in std::fs::read_dir(tenant.path()).into_iter().flatten().flatten() {
            out.push(f.path().display().to_string());
        }
    }
    out
}

/// The value of `sonde_tenant_compile_seconds_total` for `tenant`.
async fn compile_seconds(api: SocketAddr, token: &str, tenant: &str) -> f64 {
    let (status, metrics) = call(api, "GET", "/metrics", Some(token), b"").await;
    assert_eq!(status, 200, "{metrics}");
    let prefix = format!("sonde_tenant_compile_seconds_total{{tenant=\"{tenant}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiler_bomb_is_refused_with_422_while_another_tenants_upload_completes() {
    let dir = tempfile::tempdir().unwrap();
    let budget = CompileBudget::fixed(Duration::from_secs(4), 512 * 1024 * 1024);
    let (agent, api) = start(dir.path(), budget).await;
    let bomb = compiler_stress(20_000, 150_000);
    let bomb_upload = tokio::spawn(async move { call(api, "PUT", "/v1/plugins/bomb", Some(ACME), &bomb).await });

    // Beta's small upload meanwhile: done long before the bomb's budget
    // runs out (it waited 15 s for the control lock before).
    let up = std::fs::read(guests::ALWAYS_UP).unwrap();
    let start = Instant::now();
    let (status, body) = call(api, "PUT", "/v1/plugins/up", Some(BETA), &up).await;
    let took = start.elapsed();
    assert_eq!(status, 201, "{body}");
    assert!(
        !bomb_upload.is_finished(),
        "the bomb's compile ended before beta's upload ({took:?}): it does not stress the compiler"
    );
    assert!(took < Duration::from_secs(5), "beta's upload took {took:?}");

    let (status, body) = bomb_upload.await.unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("budget"), "{body}");
    let stored = stored_plugins(dir.path());
    assert!(
        stored.iter().all(|p| !p.contains("bomb")),
        "the refused plugin was stored: {stored:?}"
    );
    let bomb_digest = Digest::of(&compiler_stress(20_000, 150_000)).hex();
    let cached: Vec<String> = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        cached.iter().all(|f| !f.starts_with(&bomb_digest)),
        "the refused plugin's compile left a file: {cached:?}"
    );
    // The bomb's compile time is acme's, the small one beta's.
    assert!(compile_seconds(api, ACME, "acme").await >= 1.0);
    assert!(compile_seconds(api, BETA, "beta").await > 0.0);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_or_deleting_a_plugin_frees_its_compiled_code_and_cache_file() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, api) = start(dir.path(), CompileBudget::default()).await;
    let cache_files = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("cache"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".cwasm"))
            .collect();
        names.sort();
        names
    };
    let digest = |wasm: &[u8]| Digest::of(wasm).hex();
    let up = std::fs::read(guests::ALWAYS_UP).unwrap();
    let other = std::fs::read(guests::BURN_FUEL).unwrap();
    assert_eq!(call(api, "PUT", "/v1/plugins/p", Some(ACME), &up).await.0, 201);
    assert!(
        cache_files().iter().any(|f| f.starts_with(&digest(&up))),
        "{:?}",
        cache_files()
    );
    // Replaced: the old version's cache file goes.
    assert_eq!(call(api, "PUT", "/v1/plugins/p", Some(ACME), &other).await.0, 200);
    let files = cache_files();
    assert!(files.iter().all(|f| !f.starts_with(&digest(&up))), "{files:?}");
    assert!(files.iter().any(|f| f.starts_with(&digest(&other))), "{files:?}");
    // Deleted: its cache file goes too.
    assert_eq!(call(api, "DELETE", "/v1/plugins/p", Some(ACME), b"").await.0, 200);
    let files = cache_files();
    assert!(files.iter().all(|f| !f.starts_with(&digest(&other))), "{files:?}");
    agent.stop().await;
}

/// The budget's three flags as a user gives them to `sonde check`: a base
/// too short refuses the plugin; a generous per-MiB share admits it; the
/// cap (`--compile-timeout-max`) takes that share back.
#[test]
fn the_compile_budget_flags_scale_and_cap_as_documented() {
    let run = |base: &str, per_mib: &str, max: &str| {
        crate::support::sonde(&[
            "--no-cache",
            "--compile-timeout",
            base,
            "--compile-timeout-per-mib",
            per_mib,
            "--compile-timeout-max",
            max,
            "check",
            sonde_tests::guests::ALWAYS_UP,
            "--target",
            "127.0.0.1:1",
        ])
    };
    let refused = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        out.status.code() == Some(3) && err.contains("budget")
    };
    let out = run("1ms", "0s", "1ms");
    assert!(refused(&out), "a 1 ms budget compiled it: {out:?}");
    // 1 h per MiB of a ~0.1 MiB guest: minutes, capped at 2 min.
    let out = run("1ms", "1h", "2m");
    assert!(!refused(&out), "the per-MiB share was not added: {out:?}");
    let out = run("1ms", "1h", "1ms");
    assert!(refused(&out), "the cap did not hold: {out:?}");
}
