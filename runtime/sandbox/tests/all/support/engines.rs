//! The engines of the tests: one per test binary, and one of a test's own
//! under its limits, all with the compile cache in Cargo's scratch
//! directory (the workspace's, so a plugin compiled by one crate's tests
//! is not compiled again by another's). Shared by `#[path]` with the
//! tests of sonde-core, sonde-kubernetes and the sonde crate.

use sonde_sandbox::engine::{Engine, EngineConfig};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The compile cache: `$CARGO_TARGET_TMPDIR/compile-cache`.
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
