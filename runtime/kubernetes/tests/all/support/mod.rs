//! Shared test setup: a mocked Kubernetes API server (`fake_api`, with the
//! Nodes and Secrets it serves in `fake_nodes` and `fake_secrets`). The
//! sonde crate's tests include these files too (`#[path]`), for the
//! controllers a running agent drives.

#[allow(
    dead_code,
    reason = "shared with the sonde crate's tests (`#[path]`), which use the rest"
)]
pub(crate) mod fake_api;
#[allow(dead_code, reason = "shared with the sonde crate's tests (`#[path]`), which use it")]
pub(crate) mod fake_nodes;
#[allow(dead_code, reason = "shared with the sonde crate's tests (`#[path]`), which use it")]
pub(crate) mod fake_secrets;

pub(crate) use sonde_tests::tools::repo;
