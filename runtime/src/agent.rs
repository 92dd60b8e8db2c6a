//! `sonde run`: the agent. Loads the config into a [`Registry`], restores
//! state, starts the [`scheduler`] and the [`api`], reloads on SIGHUP or
//! when the config file changes (an invalid new config leaves the old one
//! running, and the error shows in `/v1/status`), and on SIGTERM or SIGINT
//! stops scheduling, lets runs in flight finish within the grace period,
//! saves state and returns.

use crate::api::{self, AgentStatus, ApiState};
use crate::config::ConfigErrors;
use crate::engine::Engine;
use crate::executor::{Executor, ExecutorConfig};
use crate::registry::{ProbeSpec, Registry, TargetSpec};
use crate::results::{DEFAULT_HISTORY, ResultCache};
use crate::scheduler::{self, ActionOutcome, Runner};
use crate::verdict::RunResult;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The config `sonde run` uses without `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");
/// How the embedded default config is named in messages.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded default>";
/// How often the config file is checked for changes.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Runs probes and actions with the engine and the host, each probe call
/// through the fair [`Executor`].
pub struct EngineRunner {
    engine: Engine,
    executor: Executor,
}

impl EngineRunner {
    /// A runner on `engine` with a default executor that knows only the
    /// operator's tenant.
    ///
    /// # Panics
    ///
    /// When the sandbox runtime's threads cannot be started.
    pub fn new(engine: Engine) -> Self {
        let executor = Executor::new(ExecutorConfig::default()).expect("start the sandbox runtime");
        Self::with_executor(engine, executor)
    }

    /// A runner on `engine` whose calls go through `executor`.
    pub fn with_executor(engine: Engine, executor: Executor) -> Self {
        Self { engine, executor }
    }

    /// Its executor.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }
}

impl Runner for EngineRunner {
    async fn probe(&self, spec: &ProbeSpec, attempt: u32) -> RunResult {
        self.executor.run(&self.engine, spec, attempt).await
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.executor.runtime()
    }

    async fn act(&self, target: &TargetSpec) -> ActionOutcome {
        let Some(action) = &target.on_failure else {
            return ActionOutcome {
                ok: true,
                message: "no action".into(),
            };
        };
        match crate::host::exec::run_program(&action.argv, &action.env, action.timeout).await {
            Ok(out) if out.timed_out => ActionOutcome {
                ok: false,
                message: format!(
                    "{} killed after {}",
                    action.argv[0],
                    humantime::format_duration(action.timeout)
                ),
            },
            Ok(out) => ActionOutcome {
                ok: out.exit_code == Some(0),
                message: format!(
                    "{} exited {}: {}",
                    action.argv[0],
                    out.exit_code.map_or("by a signal".into(), |c| c.to_string()),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            },
            Err(e) => ActionOutcome { ok: false, message: e },
        }
    }
}

/// How `sonde run` was asked to run.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// The config file; `None` runs [`DEFAULT_CONFIG`].
    pub config: Option<PathBuf>,
    /// Overrides the file's `api`.
    pub api: Option<SocketAddr>,
    /// Overrides the file's `state_dir`.
    pub state_dir: Option<PathBuf>,
    /// How long runs in flight may take to finish at shutdown.
    pub grace: Duration,
    /// Random first-run offsets.
    pub jitter: bool,
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The config is invalid.
    #[error("{0}")]
    Config(ConfigErrors),
    /// Something else failed at start.
    #[error("{0}")]
    Start(String),
}

/// Loads the config named by `path`, or the embedded default.
pub async fn load_registry(engine: &Engine, path: Option<&Path>) -> Result<Registry, ConfigErrors> {
    let reg = load_registry_quietly(engine, path).await?;
    for w in &reg.warnings {
        tracing::warn!("{w}");
    }
    Ok(reg)
}

async fn load_registry_quietly(engine: &Engine, path: Option<&Path>) -> Result<Registry, ConfigErrors> {
    match path {
        Some(p) => Registry::load_file(engine, p).await,
        None => {
            let mut reg = Registry::load_text(engine, Path::new(DEFAULT_CONFIG_NAME), DEFAULT_CONFIG).await?;
            reg.source = None;
            Ok(reg)
        }
    }
}

/// A running agent: what tests and `sonde run` hold on to.
pub struct Agent {
    /// The scheduler.
    pub scheduler: scheduler::Handle,
    /// The results.
    pub results: ResultCache,
    /// Where the API listens, if it does.
    pub api: Option<SocketAddr>,
    /// The config status.
    pub status: Arc<Mutex<AgentStatus>>,
    /// The executor: per-tenant permits and stats.
    pub executor: Executor,
    /// The tenants of the config in force, with their tokens.
    pub tenants: Arc<Mutex<Arc<crate::tenants::Tenants>>>,
    engine: Engine,
    options: AgentOptions,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Agent {
    /// Loads everything and starts scheduling and serving.
    pub async fn start(engine: Engine, options: AgentOptions) -> Result<Self, AgentError> {
        let registry = load_registry(&engine, options.config.as_deref())
            .await
            .map_err(AgentError::Config)?;
        let state_dir = options.state_dir.clone().or_else(|| registry.state_dir.clone());
        let results = match &state_dir {
            Some(dir) => ResultCache::open(dir, DEFAULT_HISTORY).map_err(|e| AgentError::Start(e.to_string()))?,
            None => ResultCache::new(DEFAULT_HISTORY),
        };
        let api_addr = options.api.or(registry.api);
        let status = Arc::new(Mutex::new(AgentStatus {
            config: options
                .config
                .as_ref()
                .map_or(DEFAULT_CONFIG_NAME.to_string(), |p| p.display().to_string()),
            loaded_at: Some(SystemTime::now()),
            reload_error: None,
            probes: registry.probes.len(),
            version: env!("CARGO_PKG_VERSION"),
        }));
        tracing::info!(
            probes = registry.probes.len(),
            targets = registry.targets.len(),
            "config loaded"
        );
        let executor = Executor::new(ExecutorConfig::default()).map_err(|e| AgentError::Start(e.to_string()))?;
        executor.configure(&registry.tenants);
        let tenants = Arc::new(Mutex::new(registry.tenants.clone()));
        let runner = Arc::new(EngineRunner::with_executor(engine.clone(), executor.clone()));
        let scheduler = scheduler::spawn(
            runner,
            results.clone(),
            registry,
            scheduler::Options {
                jitter: options.jitter,
                ..Default::default()
            },
        );
        let mut tasks = Vec::new();
        let mut api = None;
        if let Some(addr) = api_addr {
            let state = ApiState {
                results: results.clone(),
                scheduler: scheduler.clone(),
                status: status.clone(),
            };
            let (bound, task) = api::serve(addr, state)
                .await
                .map_err(|e| AgentError::Start(e.to_string()))?;
            tracing::info!(addr = %bound, "API listening");
            api = Some(bound);
            tasks.push(task);
        }
        Ok(Self {
            scheduler,
            results,
            api,
            status,
            executor,
            tenants,
            engine,
            options,
            tasks,
        })
    }

    /// Reads the config file again and applies it; an invalid one is
    /// refused (the old config keeps running) and the error kept in the
    /// status.
    pub async fn reload(&self) -> Result<scheduler::ReloadSummary, ConfigErrors> {
        match load_registry(&self.engine, self.options.config.as_deref()).await {
            Ok(reg) => {
                let probes = reg.probes.len();
                self.executor.configure(&reg.tenants);
                *self.tenants.lock().unwrap_or_else(|e| e.into_inner()) = reg.tenants.clone();
                let summary = self.scheduler.reload(reg).await;
                let mut s = self.status.lock().unwrap_or_else(|e| e.into_inner());
                s.loaded_at = Some(SystemTime::now());
                s.reload_error = None;
                s.probes = probes;
                tracing::info!(
                    added = summary.added.len(),
                    changed = summary.changed.len(),
                    removed = summary.removed.len(),
                    kept = summary.kept,
                    "config reloaded"
                );
                Ok(summary)
            }
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the previous config keeps running");
                self.status.lock().unwrap_or_else(|e| e.into_inner()).reload_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Stops scheduling, waits for runs in flight (up to the grace
    /// period), stops serving and saves state.
    pub async fn stop(self) {
        self.scheduler.shutdown(self.options.grace).await;
        for t in &self.tasks {
            t.abort();
        }
        let results = self.results.clone();
        let _ = tokio::task::spawn_blocking(move || results.flush()).await;
    }
}

/// A cheap fingerprint of a file: its modification time and length.
fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// `sonde run`: starts the agent and runs it until SIGTERM or SIGINT.
pub async fn run(engine: Engine, options: AgentOptions) -> Result<(), AgentError> {
    use tokio::signal::unix::{SignalKind, signal};
    let sig = |kind| signal(kind).map_err(|e| AgentError::Start(format!("cannot handle signals: {e}")));
    let mut hup = sig(SignalKind::hangup())?;
    let mut term = sig(SignalKind::terminate())?;
    let mut int = sig(SignalKind::interrupt())?;
    let agent = Agent::start(engine, options.clone()).await?;
    let mut watch = tokio::time::interval(WATCH_INTERVAL);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seen = options.config.as_deref().and_then(fingerprint);
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading the config");
                let _ = agent.reload().await;
                seen = options.config.as_deref().and_then(fingerprint);
            }
            _ = watch.tick(), if options.config.is_some() => {
                let now = options.config.as_deref().and_then(fingerprint);
                if now.is_some() && now != seen {
                    seen = now;
                    tracing::info!("the config file changed: reloading");
                    let _ = agent.reload().await;
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    tracing::info!(grace = %humantime::format_duration(options.grace), "stopping: letting runs in flight finish");
    agent.stop().await;
    Ok(())
}
