//! The shipped files that no agent has to run to be checked: the
//! Prometheus rules (by promtool) and their PrometheusRule twin, the
//! container image's pinned base images, and the list of shipped example
//! configs against the tests that run them. The tests that start an agent
//! or run the `sonde` command live in the `sonde` crate's tests.

mod examples;
mod image;
mod prometheus;

use std::path::{Path, PathBuf};

/// The repository's root: this crate is its `tests/` folder.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A YAML file of the repository as JSON.
fn yaml(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
