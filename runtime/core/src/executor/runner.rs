//! How the scheduler's runs reach the sandbox:
//! through the executor's permits onto the engine.

use super::{Executor, ExecutorConfig};
use crate::catalog::{ProbeSpec, TargetSpec};
use crate::scheduler::{ActionOutcome, Runner};
use sonde_sandbox::engine::Engine;
use sonde_sandbox::verdict::RunResult;

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
        match sonde_sandbox::host::exec::run_program(
            &action.argv,
            &action.env,
            action.timeout,
            sonde_sandbox::host::contain::RunLimits::default(),
        )
        .await
        {
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
            Err(e) => ActionOutcome {
                ok: false,
                message: e.to_string(),
            },
        }
    }
}
