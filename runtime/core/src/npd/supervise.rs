//! Runs the node-problem-detector monitors of the config in force (custom
//! plugin and system-log monitors alike), and
//! follows reloads: a monitor whose file and rules are unchanged keeps
//! running (its conditions are not reset), one that changed starts again,
//! one that left the config stops.

use super::{self as npd, Board};
use crate::catalog::npd::{LogMonitor, Monitor};
use crate::control::Control;
use crate::executor::Executor;
use sonde_sandbox::engine::Engine;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Keeps one task per monitor of the config in force, reporting to `board`.
pub async fn supervise(control: Arc<Control>, executor: Executor, engine: Engine, board: Arc<Board>) {
    let mut reloads = control.reloads();
    let mut running: Vec<(Arc<Monitor>, JoinHandle<()>)> = Vec::new();
    let mut logs: Vec<(Arc<LogMonitor>, JoinHandle<()>)> = Vec::new();
    loop {
        let (wanted, wanted_logs) = {
            let catalog = control.catalog().lock().await;
            (catalog.npd.clone(), catalog.npd_logs.clone())
        };
        logs = follow_logs(logs, &wanted_logs, &board);
        let (kept, gone): (Vec<_>, Vec<_>) = running
            .into_iter()
            .partition(|(m, _)| wanted.iter().any(|w| same(w, m)));
        for (m, task) in gone {
            task.abort();
            board.forget(&m.monitor.source);
            tracing::info!(file = %m.file.display(), "node-problem-detector monitor stopped");
        }
        running = kept;
        for m in wanted.iter() {
            if running.iter().any(|(r, _)| same(r, m)) {
                continue;
            }
            tracing::info!(file = %m.file.display(), rules = m.rules.len(), source = m.monitor.source, "node-problem-detector monitor started");
            let sink: Arc<dyn npd::Sink> = board.clone();
            let task = tokio::spawn(npd::run(m.clone(), executor.clone(), engine.clone(), sink));
            running.push((m.clone(), task));
        }
        if reloads.changed().await.is_err() {
            break;
        }
    }
    for (_, task) in running {
        task.abort();
    }
    for (_, task) in logs {
        task.abort();
    }
}

/// The system-log monitors of `wanted` running: one unchanged keeps its
/// task (and its conditions), one changed or gone stops.
fn follow_logs(
    running: Vec<(Arc<LogMonitor>, JoinHandle<()>)>,
    wanted: &[Arc<LogMonitor>],
    board: &Arc<Board>,
) -> Vec<(Arc<LogMonitor>, JoinHandle<()>)> {
    let (mut kept, gone): (Vec<_>, Vec<_>) = running.into_iter().partition(|(m, _)| wanted.iter().any(|w| w == m));
    for (m, task) in gone {
        task.abort();
        board.forget(&m.monitor.source);
        tracing::info!(file = %m.file.display(), "node-problem-detector log monitor stopped");
    }
    for m in wanted {
        if kept.iter().any(|(r, _)| r == m) {
            continue;
        }
        tracing::info!(file = %m.file.display(), rules = m.monitor.rules.len(), source = m.monitor.source, "node-problem-detector log monitor started");
        let sink: Arc<dyn npd::Sink> = board.clone();
        kept.push((m.clone(), tokio::spawn(npd::syslog::run(m.clone(), sink))));
    }
    kept
}

/// Whether two monitors are the same file saying the same things, run
/// the same way: each rule's probe with the same tenant, command, grants
/// (its `env` among them) and limits.
fn same(a: &Monitor, b: &Monitor) -> bool {
    let run = |m: &Monitor| {
        m.rules
            .iter()
            .map(|p| (p.tenant.clone(), p.config.clone(), p.grants.clone(), p.limits))
            .collect::<Vec<_>>()
    };
    a.file == b.file && a.workdir == b.workdir && a.exec == b.exec && a.monitor == b.monitor && run(a) == run(b)
}
