//! Shared test setup: a mocked Kubernetes API server (`fake_api`, with the
//! Nodes and Secrets it serves in `fake_nodes` and `fake_secrets`, and the
//! shipped RBAC's rules in `rbac`), and a node agent started without the
//! sonde binary crate (`node_agent`). The sonde crate's tests include the
//! mocked API server's files too (`#[path]`), for its e2e suites, its CLI
//! and its API.

#[allow(
    dead_code,
    unreachable_pub,
    reason = "sonde-sandbox's test engines, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../sandbox/tests/all/support/engines.rs"]
mod engines;
#[allow(
    dead_code,
    reason = "shared with the sonde crate's tests (`#[path]`), which use the rest"
)]
pub(crate) mod fake_api;
pub(crate) mod fake_nodes;
#[allow(
    dead_code,
    reason = "shared with the sonde crate's tests (`#[path]`), which use the rest"
)]
pub(crate) mod fake_secrets;
pub(crate) mod node_agent;
pub(crate) mod node_settings;
pub(crate) mod rbac;

#[allow(
    dead_code,
    reason = "sonde-oci's hostile registry, shared (`#[path]`): these tests use a part"
)]
#[path = "../../../../oci/tests/all/support/hostile_registry.rs"]
pub(crate) mod hostile_registry;
#[allow(
    dead_code,
    unused_imports,
    unused_macros,
    reason = "sonde-oci's registry, shared (`#[path]`): these tests use a part, not its `registry!`"
)]
#[path = "../../../../oci/tests/all/support/registry.rs"]
pub(crate) mod registry;

pub(crate) use sonde_tests::tools::repo;
