//! `sonde run`: the agent. Loads the config into a [`Catalog`], restores
//! state, starts the [`scheduler`] and the [`api`], reloads on SIGHUP or
//! when the config file changes (an invalid new config leaves the old one
//! running, and the error shows in `/v1/status`), and on SIGTERM or SIGINT
//! stops scheduling, lets runs in flight finish within the grace period,
//! saves state and returns.

mod otlp;
mod problems;

use crate::api::{self, ApiAuth, ApiState};
pub use problems::{AgentError, KubernetesStart, StartProblem};
pub(crate) use problems::{StartOptions, start_problems};
use sonde_core::catalog::Catalog;
use sonde_core::config::ConfigErrors;
use sonde_core::control::{self, AgentStatus, Control, ControlParts, LeftOut};
pub use sonde_core::control::{AgentOptions, DEFAULT_API, DEFAULT_CONFIG, DEFAULT_CONFIG_NAME};
use sonde_core::executor::{EngineRunner, Executor, ExecutorConfig};
use sonde_core::metrics::{Metrics, RunMetrics};
use sonde_core::results::{DEFAULT_HISTORY, ResultCache};
use sonde_core::scheduler;
use sonde_kubernetes as kubernetes;
use sonde_sandbox::engine::Engine;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The commit the binary was built from (`unknown` outside a git checkout).
pub const COMMIT: &str = crate::build::INFO.commit;
/// How often the config file is checked for changes.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// A running agent: what tests and `sonde run` hold on to. What it runs
/// is read through its methods; it changes only through [`Agent::control`]
/// and [`Agent::reload`].
pub struct Agent {
    scheduler: scheduler::SchedulerHandle,
    results: ResultCache,
    api: Option<SocketAddr>,
    status: Arc<Mutex<AgentStatus>>,
    /// Set once the agent is stopping (`/healthz` answers 503).
    draining: Arc<AtomicBool>,
    executor: Executor,
    control: Arc<Control>,
    /// The readiness-gate controller's counters, shown by `/metrics`
    /// whether or not it runs.
    gate_stats: Arc<kubernetes::Stats>,
    /// What the node-problem-detector monitors last reported.
    node_problems: Arc<sonde_core::npd::Board>,
    /// How readiness gates are served, read from the first config and
    /// `$NODE_NAME` once: `Some` when `sonde run` serves them.
    gate_settings: Option<kubernetes::GateSettings>,
    options: AgentOptions,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The OTLP exports (the operator's `otlp:`, the tenants'); each
    /// stops when dropped.
    _otlp: Vec<sonde_otel::Exporter>,
}

/// The first load of the config, refused if [`start_problems`] finds
/// anything with `kubernetes`; its warnings logged.
async fn load_checked(
    engine: &Engine,
    options: &AgentOptions,
    cache: &sonde_core::catalog::resolve::Cache,
    kubernetes: Option<&KubernetesStart>,
) -> Result<(Catalog, Vec<LeftOut>), AgentError> {
    let (catalog, skipped) = control::load(engine, options, cache)
        .await
        .map_err(AgentError::Config)?;
    let problems = start_problems(
        &catalog,
        &StartOptions {
            api: options.api,
            api_auth: options.api_auth,
            kubernetes: kubernetes.cloned(),
        },
    );
    if !problems.is_empty() {
        return Err(AgentError::Refused(problems));
    }
    for w in &catalog.warnings {
        tracing::warn!("{w}");
    }
    Ok((catalog, skipped))
}

/// Serves the API on `addr`.
async fn serve_api(
    addr: SocketAddr,
    state: ApiState,
    engine: &Engine,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), AgentError> {
    api::serve(addr, state, engine.own_listeners())
        .await
        .map_err(|source| AgentError::Listen { source })
}

/// How many targets, probes and tenants `catalog` has.
fn counts(catalog: &Catalog) -> (usize, usize, usize) {
    (catalog.targets().len(), catalog.probes().len(), catalog.tenants.len())
}

/// The result cache: kept in `state_dir`, or in memory only.
fn open_results(state_dir: Option<&Path>) -> Result<ResultCache, AgentError> {
    match state_dir {
        Some(dir) => {
            ResultCache::open(dir, DEFAULT_HISTORY).map_err(|source| AgentError::StateDir { source: source.into() })
        }
        None => Ok(ResultCache::new(DEFAULT_HISTORY)),
    }
}

/// The agent's status before its first catalog is in force (which fills
/// in the rest).
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

/// How the API authenticates its clients (with the Kubernetes reviewer
/// when it asks the API server).
async fn api_access(
    options: &AgentOptions,
    catalog: &Catalog,
    api_addr: Option<SocketAddr>,
) -> Result<(ApiAuth, Option<Arc<kubernetes::review::Reviewer>>), AgentError> {
    // Checked before (start_problems): this cannot fail.
    let auth = match api_addr {
        Some(addr) => options
            .api_auth
            .or_file(catalog.agent.api_auth)
            .resolve(addr, catalog.tenants.has_tokens(), catalog.tenants.len() > 1)
            .map_err(|source| AgentError::ApiAuth { source })?,
        None => ApiAuth::None,
    };
    let reviews = match auth {
        ApiAuth::Kubernetes => {
            let client = kubernetes::connect()
                .await
                .map_err(|source| AgentError::Reviews { source: source.into() })?;
            let limits = kubernetes::review::ReviewLimits::default();
            Some(Arc::new(kubernetes::review::Reviewer::new(client, limits)))
        }
        _ => None,
    };
    Ok((auth, reviews))
}

/// The readiness-gate controller's writes, read when `/metrics` is scraped.
fn gate_writes(stats: &Arc<kubernetes::Stats>) -> Arc<dyn Fn() -> sonde_core::metrics::KubernetesWrites + Send + Sync> {
    let stats = stats.clone();
    Arc::new(move || stats.writes())
}

/// `stats` of `engine`, read when `/metrics` is scraped.
fn engine_stats<T: 'static>(engine: &Engine, stats: fn(&Engine) -> T) -> Arc<dyn Fn() -> T + Send + Sync> {
    let engine = engine.clone();
    Arc::new(move || stats(&engine))
}

/// What `/metrics` reads the pulls from ([`Metrics::pulls`]).
type PullsSource = Arc<dyn Fn() -> (Vec<sonde_core::catalog::Waiting>, usize) + Send + Sync>;

/// The pulls for `/metrics`: the plugins waited for, and the pulls in
/// flight.
fn pulls_metric(control: &Arc<Control>, status: &Arc<Mutex<AgentStatus>>) -> PullsSource {
    let (control, status) = (control.clone(), status.clone());
    Arc::new(move || {
        let waiting = status.lock().unwrap_or_else(|e| e.into_inner()).pulling.clone();
        (waiting, control.pulls_in_flight())
    })
}

/// The scheduler, with no probe yet, running them on `engine` through
/// `executor`, into `results`.
fn start_scheduler(
    engine: &Engine,
    executor: &Executor,
    results: &ResultCache,
    jitter: bool,
    observer: Arc<dyn scheduler::Observer>,
) -> scheduler::SchedulerHandle {
    let runner = Arc::new(EngineRunner::with_executor(engine.clone(), executor.clone()));
    let options = scheduler::Options { jitter, observer };
    scheduler::spawn(runner, results.clone(), Catalog::default(), options)
}

/// The line that says the agent has started, and with what.
fn log_started(
    config: &str,
    (targets, probes, tenants): (usize, usize, usize),
    api: Option<SocketAddr>,
    state_dir: Option<&Path>,
    jitter: bool,
) {
    tracing::info!(
        version = %env!("CARGO_PKG_VERSION"),
        commit = %COMMIT,
        config = %config,
        targets,
        probes,
        tenants,
        api = %api.map_or("none".to_string(), |a| format!("http://{a}")),
        state_dir = %state_dir.map_or("none (state is not kept across restarts)".into(), |d| d.display().to_string()),
        exec_containment = %sonde_sandbox::host::contain::Containment::in_force().describe(),
        "{}",
        if jitter {
            "sonde started; first runs spread over their periods (--no-jitter starts them at once)"
        } else {
            "sonde started; every probe runs now (--no-jitter)"
        }
    );
}

impl Agent {
    /// The scheduler of the probes in force.
    pub fn scheduler(&self) -> &scheduler::SchedulerHandle {
        &self.scheduler
    }

    /// Every probe's latest result and state.
    pub fn results(&self) -> &ResultCache {
        &self.results
    }

    /// What the node-problem-detector monitors last reported (the Node
    /// writer follows it in Kubernetes mode).
    pub fn node_problems(&self) -> &Arc<sonde_core::npd::Board> {
        &self.node_problems
    }

    /// Where the API listens, if it does.
    pub fn api(&self) -> Option<SocketAddr> {
        self.api
    }

    /// The config status as it is now: the last reload's error, what was
    /// left out.
    pub fn status(&self) -> AgentStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The executor: per-tenant permits and stats.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Reloads and runtime changes (probes and plugins of tenants, the
    /// readiness-gate controller's probes).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Loads everything and starts scheduling and serving (no readiness
    /// gates: [`run_with`] serves those).
    pub async fn start(engine: Engine, options: AgentOptions) -> Result<Self, AgentError> {
        Self::start_with(engine, options, None).await
    }

    /// As [`Agent::start`], refusing what `start_problems` finds with
    /// `kubernetes` (how readiness gates would be served, if they are).
    pub async fn start_with(
        engine: Engine,
        options: AgentOptions,
        kubernetes: Option<KubernetesStart>,
    ) -> Result<Self, AgentError> {
        // Shared by every load: a pull started by one lands for the next,
        // and none is waited for (the API and every probe at hand start now).
        let cache = sonde_core::catalog::resolve::Cache::background();
        let ended = cache.pulls().map(|p| p.subscribe());
        let (catalog, skipped) = load_checked(&engine, &options, &cache, kubernetes.as_ref()).await?;
        // What the agent reads once from its first config, for its whole
        // life (a reload changes none of it): where state and the API
        // live, the API's access, the Kubernetes controller's settings.
        let state_dir = options.state_dir.clone().or_else(|| catalog.agent.state_dir.clone());
        let results = open_results(state_dir.as_deref())?;
        let api_addr = options.api.or(catalog.agent.api);
        let counts = counts(&catalog);
        let health_timeout = catalog.agent.health_timeout.unwrap_or(api::DEFAULT_HEALTH_TIMEOUT);
        let api_limits = catalog.agent.api_limits;
        let (auth, reviews) = api_access(&options, &catalog, api_addr).await?;
        let gate_settings = gate_settings(&options, &catalog, kubernetes.as_ref())?;
        let status = Arc::new(Mutex::new(first_status(&options)));
        let run_metrics = Arc::new(RunMetrics::default());
        let executor = Executor::new(ExecutorConfig::default())
            .map_err(|source| AgentError::Executor { source: source.into() })?;
        // The runs' spans (with `otlp:` traces) are made where the histograms are fed.
        let otlp = otlp::Otlp::new(catalog.agent.otlp.clone());
        let (observer, tracing) = otlp.observer(&run_metrics);
        let scheduler = start_scheduler(&engine, &executor, &results, options.jitter, observer);
        let control = Arc::new(Control::new(ControlParts {
            engine: engine.clone(),
            options: options.clone(),
            state_dir: state_dir.clone(),
            scheduler: scheduler.clone(),
            executor: executor.clone(),
            status: status.clone(),
            cache,
        }));
        // The one path a catalog takes into force, the first as every
        // reload's: the sandbox's bounds, the executor's tenants, the
        // scheduler.
        control.put_in_force(catalog, skipped).await;
        let draining = Arc::new(AtomicBool::new(false));
        let gate_stats = Arc::new(kubernetes::Stats::default());
        let node_problems = Arc::new(sonde_core::npd::Board::default());
        let mut tasks = background(&control, &executor, &engine, &node_problems, ended);
        let metrics = Metrics {
            build: crate::build::INFO,
            runs: run_metrics,
            results: results.clone(),
            scheduler: scheduler.clone(),
            pool: engine_stats(&engine, Engine::pool_stats),
            cache: engine_stats(&engine, Engine::cache_stats),
            executor: executor.clone(),
            pulls: pulls_metric(&control, &status),
            status: status.clone(),
            kubernetes: gate_writes(&gate_stats),
            node_problems: node_problems.clone(),
            otlp: otlp.counters(),
        };
        let otlp = otlp.start(&metrics, engine.own_listeners())?;
        let mut api = None;
        if let Some(addr) = api_addr {
            let state = ApiState {
                results: results.clone(),
                scheduler: scheduler.clone(),
                status: status.clone(),
                metrics,
                draining: draining.clone(),
                health_timeout,
                control: control.clone(),
                auth,
                reviews,
                limits: api_limits,
                watches: api::WatchStreams::default(),
                scrapes: api::scrape::ScrapeGate::default(),
                tracing,
            };
            let (bound, task) = serve_api(addr, state, &engine).await?;
            api = Some(bound);
            tasks.push(task);
        }
        let config = status.lock().unwrap_or_else(|e| e.into_inner()).config.clone();
        log_started(&config, counts, api, state_dir.as_deref(), options.jitter);
        Ok(Self {
            scheduler,
            results,
            api,
            status,
            draining,
            executor,
            control,
            gate_stats,
            node_problems,
            gate_settings,
            options,
            tasks,
            _otlp: otlp,
        })
    }

    /// Reads the config file again (with the probes tenants stored) and
    /// applies it; an invalid one is refused (the old config keeps
    /// running) and the error kept in the status.
    pub async fn reload(&self) -> Result<scheduler::ReloadSummary, ConfigErrors> {
        self.control.reload().await
    }

    /// Stops scheduling, waits for runs in flight (up to the grace
    /// period), stops serving and saves state.
    pub async fn stop(self) {
        self.draining.store(true, Ordering::Relaxed);
        self.scheduler.shutdown(self.options.grace).await;
        for t in &self.tasks {
            t.abort();
        }
        if let Some(addr) = self.api {
            self.control.engine().own_listeners().remove(addr);
        }
        let results = self.results.clone();
        let _ = tokio::task::spawn_blocking(move || results.flush()).await;
    }
}

/// The agent's tasks besides the scheduler and the API: the
/// node-problem-detector monitors' supervisor, and the task that takes up
/// probes whose background pull `ended`.
fn background(
    control: &Arc<Control>,
    executor: &Executor,
    engine: &Engine,
    node_problems: &Arc<sonde_core::npd::Board>,
    ended: Option<tokio::sync::broadcast::Receiver<Arc<str>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = vec![tokio::spawn(sonde_core::npd::supervise(
        control.clone(),
        executor.clone(),
        engine.clone(),
        node_problems.clone(),
    ))];
    if let Some(ended) = ended {
        tasks.push(tokio::spawn(take_up_pulls(control.clone(), ended)));
    }
    tasks
}

/// Takes up the probes of the file and the store that wait on a background
/// pull: when one ends (or its backoff passes), the config is loaded again,
/// from memory and the cache, so that they run (or show why not).
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

/// A cheap fingerprint of a file: its modification time and length.
fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// `sonde run`: starts the agent and runs it until SIGTERM or SIGINT.
pub async fn run(engine: Engine, options: AgentOptions) -> Result<(), AgentError> {
    run_with(engine, options, false).await
}

/// How readiness gates are served, when they are: with a `kubernetes:`
/// block in the first config or `--kubernetes`, the block's settings and
/// the node `kubernetes` read from `$NODE_NAME`.
fn gate_settings(
    options: &AgentOptions,
    catalog: &Catalog,
    kubernetes: Option<&KubernetesStart>,
) -> Result<Option<kubernetes::GateSettings>, AgentError> {
    let Some(start) = kubernetes else {
        return Ok(None);
    };
    let spec = catalog.agent.kubernetes.as_ref();
    if spec.is_none() && !start.forced {
        return Ok(None);
    }
    kubernetes::GateSettings::new(spec, start.node_name.clone())
        .map(Some)
        .map_err(|e| {
            let file = options.config.as_ref().map(|p| format!("{}: ", p.display()));
            AgentError::GateSettings {
                file: file.unwrap_or_default(),
                source: e.into(),
            }
        })
}

/// Starts the Kubernetes readiness-gate controller when the agent serves
/// readiness gates ([`gate_settings`]).
async fn start_kubernetes(agent: &Agent) -> Result<Option<kubernetes::GateController>, AgentError> {
    let Some(settings) = agent.gate_settings.clone() else {
        return Ok(None);
    };
    let client = kubernetes::connect()
        .await
        .map_err(|source| AgentError::Kubernetes { source: source.into() })?;
    Ok(Some(kubernetes::spawn(
        client,
        agent.control.clone(),
        agent.results.clone(),
        settings,
        agent.gate_stats.clone(),
        agent.node_problems.clone(),
    )))
}

/// `sonde run [--kubernetes]`: starts the agent (and, with `kubernetes` or
/// a `kubernetes:` block, the readiness-gate controller) and runs it until
/// SIGTERM or SIGINT. Gate conditions are left as they are at shutdown.
pub async fn run_with(engine: Engine, options: AgentOptions, kubernetes: bool) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let sig = |kind| signal(kind).map_err(|source| AgentError::Signals { source });
    let mut hup = sig(SignalKind::hangup())?;
    let mut term = sig(SignalKind::terminate())?;
    let mut int = sig(SignalKind::interrupt())?;
    let start = KubernetesStart {
        forced: kubernetes,
        node_name: std::env::var("NODE_NAME").ok(),
    };
    let agent = Agent::start_with(engine, options.clone(), Some(start)).await?;
    let gates = start_kubernetes(&agent).await?;
    // Under systemd (Type=notify), `systemctl start` returns now: the API
    // is up and every probe is scheduled.
    notify(&[sd_notify::NotifyState::Ready]);
    let mut watch = tokio::time::interval(WATCH_INTERVAL);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seen = options.config.as_deref().and_then(fingerprint);
    let signal = loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::debug!("SIGHUP: reloading the config");
                reload(&agent).await;
                seen = options.config.as_deref().and_then(fingerprint);
            }
            _ = watch.tick(), if options.config.is_some() => {
                let now = options.config.as_deref().and_then(fingerprint);
                if now.is_some() && now != seen {
                    seen = now;
                    tracing::debug!("the config file changed: reloading");
                    reload(&agent).await;
                }
            }
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
    };
    notify(&[sd_notify::NotifyState::Stopping]);
    tracing::info!(signal = %signal, grace = %humantime::format_duration(options.grace), "stopping: letting runs in flight finish");
    let started = std::time::Instant::now();
    if let Some(g) = &gates {
        g.stop();
    }
    agent.stop().await;
    tracing::info!(took_ms = started.elapsed().as_millis() as u64, "sonde stopped");
    Ok(())
}

/// A reload as systemd wants to see it: RELOADING=1 with the monotonic
/// time, then READY=1 whether the new config was taken or refused (the
/// old one keeps running either way). `control` logs the outcome.
async fn reload(agent: &Agent) {
    let mut states = vec![sd_notify::NotifyState::Reloading];
    if let Ok(now) = sd_notify::NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    notify(&states);
    let _ = agent.reload().await;
    notify(&[sd_notify::NotifyState::Ready]);
}

/// Tells systemd (when `$NOTIFY_SOCKET` is set) how the agent is doing.
fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd; check the unit's NotifyAccess= and that $NOTIFY_SOCKET is reachable");
    }
}
