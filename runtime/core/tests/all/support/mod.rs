//! Shared test setup: one engine per test binary, with its compile cache in
//! Cargo's scratch directory so reruns do not recompile, and the real
//! registry of sonde-oci's tests.

#[allow(
    dead_code,
    reason = "sonde-oci's registry, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../oci/tests/all/support/registry.rs"]
pub(crate) mod registry;

use sonde_sandbox::engine::{Call, Limits, Plugin};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::RunResult;
use std::sync::Arc;
use std::time::Duration;

#[allow(
    dead_code,
    unreachable_pub,
    reason = "sonde-sandbox's test engines, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../sandbox/tests/all/support/engines.rs"]
mod engines;
pub(crate) use engines::engine;

/// Runs `plugin` once with the given target, config, grants and timeout.
pub(crate) async fn run(
    plugin: &Arc<Plugin>,
    target: &str,
    config: &str,
    grants: &Grants,
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
        grants: &Arc::new(grants.clone()),
        attempt: 1,
        observe: true,
    };
    engine().run(plugin, &call).await
}
