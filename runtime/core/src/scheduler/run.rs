//! Running a due probe (or one asked for through the API): the task that
//! calls the runner, retrying errors.

use super::*;

impl<R: Runner> Core<R> {
    pub(super) fn start(&mut self, name: &Arc<str>, planned: Option<Instant>) {
        let Some(e) = self.entries.get_mut(name) else { return };
        e.running = true;
        self.in_flight += 1;
        let (spec, epoch) = (e.spec.clone(), e.epoch);
        let (runner, tx, name) = (self.runner.clone(), self.tx.clone(), name.clone());
        if let Some(p) = planned {
            let late = Instant::now().saturating_duration_since(p);
            tracing::trace!(probe = %name, late_us = late.as_micros() as u64, "run starts");
            self.options.observer.run_started(&spec, late);
        }
        let observer = self.options.observer.clone();
        let on = self.runner.runtime();
        let run = async move {
            let mut attempt = 1;
            let result = loop {
                let r = runner.probe(&spec, attempt).await;
                if !r.is_error() || attempt >= MAX_ATTEMPTS {
                    break r;
                }
                tracing::debug!(probe = %name, attempt, reason = ?r.reason, message = %r.message, "probe error; retrying");
                attempt += 1;
            };
            observer.run_finished(&spec, &result);
            let _ = tx.send(Msg::RunDone {
                name,
                epoch,
                planned,
                result,
            });
        };
        match on {
            Some(rt) => drop(rt.spawn(run)),
            None => drop(tokio::spawn(run)),
        }
    }

    pub(super) fn trigger(&mut self, name: &str, reply: oneshot::Sender<Result<RunResult, TriggerError>>) {
        if self.stopping {
            let _ = reply.send(Err(TriggerError::ShuttingDown));
            return;
        }
        let Some((key, e)) = self.entries.get_key_value(name) else {
            let _ = reply.send(Err(TriggerError::NotFound(name.to_string())));
            return;
        };
        if self.targets.get(&e.spec.target).is_some_and(|t| t.held) {
            let _ = reply.send(Err(TriggerError::Held(name.to_string())));
            return;
        }
        let key = key.clone();
        let running = e.running;
        if !running {
            self.start(&key, None);
        }
        if let Some(e) = self.entries.get_mut(&key) {
            e.waiters.push(reply);
        }
    }
}
