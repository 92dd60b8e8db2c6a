//! The Kubernetes layer as the binary runs it: the e2e suites against a
//! real API server (with `SONDE_E2E_KUBECONFIG`: [`e2e`]), `sonde
//! validate`'s reading of the `kubernetes:` block, and the agent's reads
//! of Secrets checked against its API's answers, against the mocked API
//! server of [`crate::support::fake_api`]. The controllers against the
//! mocked API server are in sonde-kubernetes's tests, on a node agent
//! started without this crate.

mod e2e;
mod e2e_injection;
mod e2e_nodes;
mod e2e_npd;
mod e2e_npd_side;
mod gates;
mod namespaces;
mod real_node;
mod secrets;

use crate::support::engine;
use crate::support::fake_api::*;
use sonde::agent::{Agent, AgentOptions};
use sonde_kubernetes::{self as kubernetes, GateSettings};
use std::path::Path;
use std::time::Duration;

#[path = "../../../../kubernetes/tests/all/support/node_settings.rs"]
mod node_settings;
pub(crate) use node_settings::{NODE, node_settings};

/// An agent on config text `config` (written to `dir`), first runs jittered
/// or not, and the readiness-gate controller on `client` with `settings`.
pub(crate) async fn start_gates(
    client: kube::Client,
    dir: &Path,
    config: &str,
    settings: GateSettings,
    jitter: bool,
) -> (Agent, kubernetes::GateController) {
    let path = dir.join("sonde.yaml");
    std::fs::write(&path, config).unwrap();
    let options = AgentOptions {
        config: Some(path),
        api: None,
        state_dir: None,
        grace: Duration::from_secs(1),
        jitter,
        api_auth: Default::default(),
    };
    let agent = Agent::start(engine(), options).await.unwrap();
    let handle = kubernetes::spawn(
        client,
        agent.control().clone(),
        agent.results().clone(),
        settings,
        Default::default(),
        agent.node_problems().clone(),
    );
    (agent, handle)
}

/// Waits until probe `name` has run `n` more times than `after`.
pub(crate) async fn runs(agent: &Agent, name: &str, n: usize) {
    let start = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let now = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
            if now >= (start + n).min(sonde_core::results::DEFAULT_HISTORY) {
                return;
            }
            follow.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} did not run {n} times"));
}
