//! node-problem-detector's custom plugin monitors, run by sonde: each
//! monitor file's rules run on its own clock (every `invoke_interval`, at
//! most `concurrency` at once, as NPD runs them), each program through the
//! sandboxed `exec` plugin under its tenant's permit; their verdicts turn
//! into conditions and Events ([`state`]) for a [`Sink`] — the Node's
//! status in Kubernetes mode, the log everywhere. NPD's system-log monitors
//! match log lines instead of running programs ([`syslog`]).

pub mod board;
pub mod state;
mod supervise;
pub mod syslog;

use crate::catalog::npd::Monitor;
use crate::executor::Executor;
pub use board::{Board, MAX_PENDING_EVENTS, PendingEvent};
use sonde_sandbox::engine::Engine;
use sonde_sandbox::verdict::{RunResult, Status};
pub use state::{Condition, ConditionStatus, MonitorState, Report, Severity, Verdict};
use std::sync::Arc;
use std::time::SystemTime;
pub use supervise::supervise;
use tokio::time::Instant;

/// Where a monitor's reports go.
pub trait Sink: Send + Sync {
    /// A report of the monitor whose `source` is given.
    fn report(&self, source: &str, report: &Report);

    /// A line a system-log monitor read, and what became of it.
    fn line(&self, source: &str, outcome: syslog::LineOutcome) {
        let _ = (source, outcome);
    }
}

/// Reports to the log: a condition's change at `info` (`warn` when the
/// problem is present), an Event at `warn` or `info`.
#[derive(Debug, Default)]
pub struct LogSink;

impl Sink for LogSink {
    fn report(&self, source: &str, report: &Report) {
        match report {
            Report::Condition(c) if c.status == ConditionStatus::True => tracing::warn!(
                source,
                condition = c.kind,
                status = c.status.as_str(),
                reason = c.reason,
                message = c.message,
                "node condition"
            ),
            Report::Condition(c) => tracing::info!(
                source,
                condition = c.kind,
                status = c.status.as_str(),
                reason = c.reason,
                message = c.message,
                "node condition"
            ),
            Report::Event {
                severity: Severity::Warning,
                reason,
                message,
            } => tracing::warn!(source, reason, message, "node event"),
            Report::Event { reason, message, .. } => tracing::info!(source, reason, message, "node event"),
        }
    }
}

/// What a run's result says in NPD's terms: success is no problem, failure
/// a problem, anything else (a timeout, a denial, an error) unknown.
pub fn verdict(result: &RunResult) -> Verdict {
    match result.status {
        Status::Success => Verdict::Ok,
        Status::Failure => Verdict::Problem,
        _ => Verdict::Unknown,
    }
}

/// Runs `monitor`'s rules until the task is dropped, reporting to `sink`:
/// first each condition at its default (unless `skip_initial_status`),
/// then what each verdict changes. Every rule is due at once, then every
/// `invoke_interval` of its own; the rules due together run at most
/// `concurrency` at a time, and the next round waits for the last of them,
/// as NPD's does.
pub async fn run(monitor: Arc<Monitor>, executor: Executor, engine: Engine, sink: Arc<dyn Sink>) {
    let m = &monitor.monitor;
    let mut state = MonitorState::new(m, SystemTime::now());
    if !m.skip_initial_status {
        for c in state.conditions() {
            sink.report(&m.source, &Report::Condition(c.clone()));
        }
    }
    if monitor.rules.is_empty() {
        return;
    }
    let mut due = vec![Instant::now(); monitor.rules.len()];
    let permits = Arc::new(tokio::sync::Semaphore::new(m.concurrency.max(1)));
    loop {
        let next = due.iter().min().copied().unwrap_or_else(Instant::now);
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        let mut runs = tokio::task::JoinSet::new();
        for (i, when) in due.iter_mut().enumerate() {
            if *when > now {
                continue;
            }
            let interval = m.rules[i].invoke_interval;
            // A round that ran late is not made up for.
            *when += interval;
            if *when <= now {
                *when = now + interval;
            }
            let (executor, engine, spec, permits) = (
                executor.clone(),
                engine.clone(),
                monitor.rules[i].clone(),
                permits.clone(),
            );
            runs.spawn(async move {
                let _permit = permits.acquire_owned().await;
                (i, executor.run(&engine, &spec, 1).await)
            });
        }
        while let Some(done) = runs.join_next().await {
            let Ok((i, result)) = done else { continue };
            let reports = state.apply(m, &m.rules[i], verdict(&result), &result.message, SystemTime::now());
            for r in &reports {
                sink.report(&m.source, r);
            }
        }
    }
}
