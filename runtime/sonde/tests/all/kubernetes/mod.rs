//! The Kubernetes layer: readiness gates, SondeCheck status, namespace
//! tenants, against the mocked API server of [`crate::support::fake_api`]
//! (and, with `SONDE_E2E_KUBECONFIG`, a real one: [`e2e`]). The probes are
//! real: the built-in plugins against real loopback servers.

mod e2e;
mod e2e_injection;
mod e2e_nodes;
mod e2e_npd;
mod gates;
mod namespaces;
mod nodes;
mod npd_nodes;
mod secrets;
mod services;
mod status;

use crate::support::engine;
use crate::support::fake_api::*;
use sonde::agent::{Agent, AgentOptions};
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

pub(crate) const NODE: &str = "node-1";

/// An agent with tenants `shop` (the loopback in its ceiling) and `poor`
/// (the 10/8 network only), and the controller on `client`.
async fn agent(client: kube::Client, dir: &Path) -> (Agent, kubernetes::GateController) {
    agent_with(client, dir, "", &["http", "tcp"]).await
}

/// [`agent`] with more top-level config (`extra`) and another allowlist.
async fn agent_with(
    client: kube::Client,
    dir: &Path,
    extra: &str,
    plugins: &[&str],
) -> (Agent, kubernetes::GateController) {
    agent_configured(client, dir, extra, "", plugins).await
}

/// [`agent_with`], and `shop_ceiling` added to tenant `shop`'s ceiling.
pub(crate) async fn agent_configured(
    client: kube::Client,
    dir: &Path,
    extra: &str,
    shop_ceiling: &str,
    plugins: &[&str],
) -> (Agent, kubernetes::GateController) {
    let config = format!(
        "{extra}tenants:\n  - id: shop\n    quotas: {{max_probes: 200, max_concurrent_runs: 16}}\n    ceiling: {{net: [\"127.0.0.0/8:*\"]{shop_ceiling}}}\n  - id: poor\n    ceiling: {{net: [\"10.0.0.0/8:*\"]}}\ntargets: []\n"
    );
    let settings = GateSettings {
        node_name: NODE.into(),
        plugins: Allowlist::parse(&plugins.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap(),
        namespaces: BTreeMap::new(),
        qps: 200.0,
        burst: 200,
        message_refresh: kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: Default::default(),
    };
    start_gates(client, dir, &config, settings, false).await
}

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

/// The settings of an agent on Node `node` (address 127.0.0.1) that runs
/// node checks in tenant `node`, heartbeating every `heartbeat`, writing
/// at most `qps` a second, with the `http` and `tcp` plugins allowed.
pub(crate) fn node_settings(node: &str, heartbeat: Duration, qps: f64) -> sonde_kubernetes::GateSettings {
    sonde_kubernetes::GateSettings {
        node_name: node.into(),
        plugins: sonde_kubernetes::Allowlist::parse(&["http".to_string(), "tcp".to_string()]).unwrap(),
        namespaces: std::collections::BTreeMap::new(),
        qps,
        burst: (qps * 2.0) as u32,
        message_refresh: sonde_kubernetes::DEFAULT_MESSAGE_REFRESH,
        node: sonde_kubernetes::NodeSettings {
            ip: Some("127.0.0.1".into()),
            tenant: "node".into(),
            heartbeat,
        },
    }
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
