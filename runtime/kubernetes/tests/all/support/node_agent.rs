//! What a node agent runs, started without the sonde binary crate: the
//! pieces of `sonde::agent::Agent::start_with`, in its order — the first
//! load of the config, the result cache, the executor, the scheduler, the
//! [`Control`] that puts the catalog in force, the node-problem-detector
//! board and its supervisor, the take-up of background pulls — minus the
//! HTTP API and the start-problem checks, which the binary owns. The
//! readiness-gate controller is started on it by the tests
//! (`sonde_kubernetes::spawn`), as `sonde run` does.
//!
//! [`Agent`] has the methods the tests call on the binary's agent, with
//! the same names; [`start_gates`] and the helpers after it start one
//! with the controller, as the sonde crate's `kubernetes` tests do.

use super::fake_api::PATIENCE;
use sonde_core::catalog::Catalog;
use sonde_core::config::ConfigErrors;
use sonde_core::control::{self, AgentOptions, AgentStatus, Control, ControlParts, DEFAULT_CONFIG_NAME};
use sonde_core::executor::{EngineRunner, Executor, ExecutorConfig};
use sonde_core::metrics::RunMetrics;
use sonde_core::results::{DEFAULT_HISTORY, ResultCache};
use sonde_core::scheduler;
use sonde_kubernetes::{self as kubernetes, Allowlist, GateSettings};
use sonde_sandbox::engine::Engine;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use super::engines::engine;
pub(crate) use super::node_settings::{NODE, node_settings};

/// A running node agent (without its API).
pub(crate) struct Agent {
    scheduler: scheduler::SchedulerHandle,
    results: ResultCache,
    status: Arc<Mutex<AgentStatus>>,
    executor: Executor,
    control: Arc<Control>,
    node_problems: Arc<sonde_core::npd::Board>,
    options: AgentOptions,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The agent's status before its first catalog is in force (which fills
/// in the rest), as the binary's.
fn first_status(options: &AgentOptions) -> AgentStatus {
    AgentStatus {
        config: options
            .config
            .as_ref()
            .map_or(DEFAULT_CONFIG_NAME.to_string(), |p| p.display().to_string()),
        loaded_at: None,
        reload_error: None,
        left_out: Vec::new(),
        pulling: Vec::new(),
        probes: 0,
        version: env!("CARGO_PKG_VERSION"),
        namespace_tenants: Vec::new(),
    }
}

impl Agent {
    /// Loads the config of `options` and starts scheduling, as
    /// `Agent::start` does; panics where it would return an error.
    pub(crate) async fn start(engine: Engine, options: AgentOptions) -> Self {
        let cache = sonde_core::catalog::resolve::Cache::background();
        let ended = cache.pulls().map(|p| p.subscribe());
        let (catalog, skipped) = control::load(&engine, &options, &cache)
            .await
            .unwrap_or_else(|e| panic!("the first config: {e}"));
        for w in &catalog.warnings {
            tracing::warn!("{w}");
        }
        let state_dir = options.state_dir.clone().or_else(|| catalog.agent.state_dir.clone());
        let results = match state_dir.as_deref() {
            Some(dir) => ResultCache::open(dir, DEFAULT_HISTORY).expect("the state directory"),
            None => ResultCache::new(DEFAULT_HISTORY),
        };
        let status = Arc::new(Mutex::new(first_status(&options)));
        let run_metrics = Arc::new(RunMetrics::default());
        let executor = Executor::new(ExecutorConfig::default()).expect("executor");
        let runner = Arc::new(EngineRunner::with_executor(engine.clone(), executor.clone()));
        let scheduler = scheduler::spawn(
            runner,
            results.clone(),
            Catalog::default(),
            scheduler::Options {
                jitter: options.jitter,
                observer: run_metrics,
            },
        );
        let control = Arc::new(Control::new(ControlParts {
            engine: engine.clone(),
            options: options.clone(),
            state_dir,
            scheduler: scheduler.clone(),
            executor: executor.clone(),
            status: status.clone(),
            cache,
        }));
        control.put_in_force(catalog, skipped).await;
        let node_problems = Arc::new(sonde_core::npd::Board::default());
        let mut tasks = vec![tokio::spawn(sonde_core::npd::supervise(
            control.clone(),
            executor.clone(),
            engine,
            node_problems.clone(),
        ))];
        if let Some(ended) = ended {
            tasks.push(tokio::spawn(take_up_pulls(control.clone(), ended)));
        }
        Self {
            scheduler,
            results,
            status,
            executor,
            control,
            node_problems,
            options,
            tasks,
        }
    }

    /// Every probe's latest result and state.
    pub(crate) fn results(&self) -> &ResultCache {
        &self.results
    }

    /// What the node-problem-detector monitors last reported.
    pub(crate) fn node_problems(&self) -> &Arc<sonde_core::npd::Board> {
        &self.node_problems
    }

    /// The config status as it is now.
    pub(crate) fn status(&self) -> AgentStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The executor: per-tenant permits and stats.
    pub(crate) fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Reloads and runtime changes.
    pub(crate) fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Reads the config file again and applies it.
    pub(crate) async fn reload(&self) -> Result<scheduler::ReloadSummary, ConfigErrors> {
        self.control.reload().await
    }

    /// Stops scheduling, waits for runs in flight (up to the grace
    /// period), stops the tasks and saves state.
    pub(crate) async fn stop(self) {
        self.scheduler.shutdown(self.options.grace).await;
        for t in &self.tasks {
            t.abort();
        }
        let results = self.results.clone();
        let _ = tokio::task::spawn_blocking(move || results.flush()).await;
    }
}

/// Takes up the probes that wait on a background pull when one ends, as
/// the binary's agent does.
async fn take_up_pulls(control: Arc<Control>, mut ended: tokio::sync::broadcast::Receiver<Arc<str>>) {
    loop {
        let reference = match ended.recv().await {
            Ok(r) => Some(r),
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        control.take_up(reference.as_deref()).await;
    }
}

/// An agent with tenants `shop` (the loopback in its ceiling) and `poor`
/// (the 10/8 network only), and the controller on `client`.
pub(crate) async fn agent(client: kube::Client, dir: &Path) -> (Agent, kubernetes::GateController) {
    agent_with(client, dir, "", &["http", "tcp"]).await
}

/// [`agent`] with more top-level config (`extra`) and another allowlist.
pub(crate) async fn agent_with(
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
    let agent = Agent::start(engine(), options).await;
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

/// Waits until probe `name` has run `n` more times than before.
pub(crate) async fn runs(agent: &Agent, name: &str, n: usize) {
    let start = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
    let mut follow = agent.results().run_log().follow();
    tokio::time::timeout(PATIENCE, async {
        loop {
            let now = agent.results().get(name).and_then(|v| v.history).map_or(0, |h| h.len());
            if now >= (start + n).min(DEFAULT_HISTORY) {
                return;
            }
            follow.changed().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} did not run {n} times"));
}
