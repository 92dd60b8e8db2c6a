//! Kubernetes readiness gates, from a DaemonSet: a Pod names a
//! [`SondeCheck`](crd::SondeCheck) in a readiness gate
//! `sonde.dev/<check-name>`; the agent on the Pod's node keeps one probe
//! per (Pod, gate) in the catalog — added when the Pod has an IP, changed
//! when its IP or the check changes, removed when the Pod goes, each an
//! incremental catalog change — and writes the gate's condition on the
//! Pod's status when the probe's state changes (docs/kubernetes.md). A
//! cluster-scoped [`SondeNodeCheck`](node::SondeNodeCheck) is run by every
//! agent whose node it selects, each setting one condition on its own Node
//! ([`node`]).
//!
//! - [`crd`]: the `SondeCheck` resource;
//! - `settings`: the agent's `kubernetes:` settings and the plugin
//!   allowlist;
//! - `view`: a Pod as the controller sees it, and a gate's condition;
//! - `desired`: the probe of a (Pod, gate) pair, or why it has none —
//!   pure functions;
//! - `gates`: the Pod-gate controller — the reflectors of Pods, checks and
//!   Services, reconciling one Pod as a pure plan (which probes to add,
//!   replace or remove; which gates have none and why; which Events), the
//!   applier of plans, and the per-Pod latest-wins write queue;
//! - `writer`: the strategic-merge patch, rate limit and backoff;
//! - `events`: Kubernetes Events on Pods and SondeChecks, through
//!   kube-runtime's recorder;
//! - [`review`]: the API's callers, by `TokenReview` and `SubjectAccessReview`;
//! - `namespaces`: the Namespaces labelled `sonde.dev/tenant-template`,
//!   whose tenants the config's namespace templates make.
//! - [`secrets`]: the Secrets of checks' `secretRefs`, read one `GET` at a
//!   time, and the cells the checks' probes hold.
//! - [`status`]: each SondeCheck's `status`, written by the one agent
//!   elected through a Lease.
//! - [`node`]: `SondeNodeCheck`s, run by every agent whose node they
//!   select, each setting one condition on its own Node.
//!
//! Namespaces map to tenants (by default the tenant of the namespace's
//! name), so a check is held to its tenant's quotas and ceiling like any
//! probe; a check outside them is refused with an Event on it.
//!
//! # Examples
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn demo(
//! #     control: Arc<sonde_core::control::Control>,
//! #     results: sonde_core::results::ResultCache,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use sonde_kubernetes::{self as kubernetes, GateSettings};
//!
//! // The agent's control and results (the `sonde` binary's agent has both).
//! let settings = GateSettings::new(None, std::env::var("NODE_NAME").ok())?;
//! let client = kubernetes::connect().await?;
//! let handle = kubernetes::spawn(client, control, results, settings, Default::default(), Default::default());
//! handle.synced().await;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod crd;
mod desired;
mod events;
mod expand;
mod gates;
mod lease;
mod namespaces;
pub mod node;
pub mod review;
pub mod secrets;
mod settings;
mod stats;
pub mod status;
mod view;
mod writer;

use kube::CustomResourceExt;
pub use settings::{
    Allowlist, AllowlistProblem, DEFAULT_BURST, DEFAULT_MESSAGE_REFRESH, DEFAULT_NODE_HEARTBEAT, DEFAULT_NODE_TENANT,
    DEFAULT_PLUGINS, DEFAULT_QPS, GateSettings, GateSettingsError, NodeSettings,
};
use sonde_core::control::Control;
use sonde_core::results::ResultCache;
pub use stats::Stats;
use std::sync::Arc;
use tokio::sync::watch;

/// The running readiness-gate controller ([`spawn`]); dropping it stops
/// the controller.
pub struct GateController {
    /// What it did so far.
    pub stats: Arc<Stats>,
    synced: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    /// The status writer's election (and, while it leads, the writer).
    status: tokio::task::JoinHandle<()>,
    /// The node checks of this agent's Node.
    nodes: tokio::task::JoinHandle<()>,
}

impl GateController {
    /// Waits until both reflectors listed and every Pod's probes are in
    /// the catalog.
    pub async fn synced(&self) {
        let mut s = self.synced.clone();
        // Errs only when the controller ended: nothing more to wait for.
        let _ = s.wait_for(|v| *v).await;
    }

    /// Stops the controller; conditions on Pods are left as they are.
    pub fn stop(&self) {
        self.task.abort();
        self.status.abort();
        self.nodes.abort();
    }
}

impl Drop for GateController {
    fn drop(&mut self) {
        self.task.abort();
        self.status.abort();
        self.nodes.abort();
    }
}

/// Why the agent cannot reach the API server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Neither in-cluster config nor a kubeconfig.
    #[error("kubernetes: no API server config (in-cluster ServiceAccount or kubeconfig): {0}")]
    Config(#[from] kube::config::InferConfigError),
    /// The client cannot be built.
    #[error("kubernetes: cannot build the API client: {0}")]
    Client(#[from] kube::Error),
}

/// A client of the API server from the in-cluster ServiceAccount (or
/// `$KUBECONFIG`), over rustls with the ring provider.
pub async fn connect() -> Result<kube::Client, ConnectError> {
    let config = kube::Config::infer().await?;
    Ok(kube::Client::try_from(config)?)
}

/// Starts the controller of `settings.node_name`'s Pods, and of the
/// SondeNodeChecks that select that Node, on the catalog of `control`,
/// following probe states in `results`.
pub fn spawn(
    client: kube::Client,
    control: Arc<Control>,
    results: ResultCache,
    settings: GateSettings,
    stats: Arc<Stats>,
    problems: Arc<sonde_core::npd::Board>,
) -> GateController {
    let (synced_tx, synced) = watch::channel(false);
    tracing::info!(node = %settings.node_name, plugins = ?settings.plugins, qps = settings.qps, burst = settings.burst, "kubernetes: serving readiness gates sonde.dev/* of this node's Pods");
    let (status_client, status_control, status_settings) = (client.clone(), control.clone(), settings.clone());
    let (leading_tx, leading) = watch::channel(false);
    let nodes = tokio::spawn(node::run(node::Inputs {
        client: client.clone(),
        control: control.clone(),
        results: results.clone(),
        settings: settings.clone(),
        stats: stats.clone(),
        leading,
        problems,
    }));
    let (controller, streams) = gates::Reconciler::new(
        client.clone(),
        control.clone(),
        results,
        settings,
        stats.clone(),
        synced_tx,
    );
    // One agent of all writes the SondeChecks' statuses (docs/kubernetes.md).
    let status = tokio::spawn(status::run(status::Inputs {
        client: status_client,
        control: status_control,
        settings: status_settings,
        stats: stats.clone(),
        checks: controller.checks(),
        services: controller.services(),
        synced: synced.clone(),
        leading: leading_tx,
    }));
    // With namespace templates, Namespaces are followed in the same task
    // (stopped with it), and no gate is served before their tenants are in force.
    let task = tokio::spawn(async move {
        if !control.has_namespace_templates().await {
            return controller.run(streams).await;
        }
        let (listed_tx, mut listed) = watch::channel(false);
        let gates = async move {
            // Errs only when the Namespace watch ended: serve without it.
            let _ = listed.wait_for(|l| *l).await;
            controller.run(streams).await;
        };
        tokio::join!(namespaces::follow(client, control, listed_tx), gates);
    });
    GateController {
        stats,
        synced,
        task,
        status,
        nodes,
    }
}

/// The header of the generated `deploy/kubernetes/crd.yaml`.
const CRD_HEADER: &str = "\
# SondeCheck: a check that sonde's DaemonSet runs against each Pod that names
# it in a readiness gate `sonde.dev/<check-name>`; SondeNodeCheck: a check
# every agent whose node it selects runs against its node, setting a Node
# condition (docs/kubernetes.md).
# Generated from the SondeCheck and SondeNodeCheck types
# (runtime/kubernetes/src/crd.rs, node/crd.rs): do not edit by hand;
# regenerate with
#   SONDE_WRITE_CRD=1 cargo test --workspace --test all -- shipped_crd
";

/// The CRDs of [`SondeCheck`](crd::SondeCheck) and
/// [`SondeNodeCheck`](crate::node::SondeNodeCheck) as
/// `deploy/kubernetes/crd.yaml` ships them (two YAML documents).
pub fn crd_yaml() -> String {
    let check = serde_saphyr::to_string(&crd::SondeCheck::crd()).expect("a CRD serializes");
    let node = serde_saphyr::to_string(&crate::node::SondeNodeCheck::crd()).expect("a CRD serializes");
    format!("{CRD_HEADER}{check}---\n{node}")
}
