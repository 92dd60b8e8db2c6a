//! What a finished run does: the thresholds applied, the result recorded,
//! the next run planned; a target held while its `on_failure` action runs.

use super::*;

impl<R: Runner> Core<R> {
    pub(super) fn done(&mut self, name: Arc<str>, epoch: u64, planned: Option<Instant>, result: RunResult) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let Some(e) = self.entries.get_mut(&name) else { return };
        // One run per probe at a time, whatever its epoch.
        e.running = false;
        let due = std::mem::take(&mut e.due);
        for w in e.waiters.drain(..) {
            let _ = w.send(Ok(result.clone()));
        }
        let (kind, period, target) = (e.spec.kind, e.spec.period, e.spec.target.clone());
        // A run from before a reset or a change counts for nothing.
        let current = e.epoch == epoch;
        if current {
            let before = e.counter.state;
            let changed = e
                .counter
                .observe(&result, e.spec.success_threshold, e.spec.failure_threshold);
            if result.is_error() {
                tracing::warn!(probe = %name, reason = ?result.reason, message = %result.message, "probe could not run");
            }
            if let Some(new) = changed {
                // Greppable: `probe=web target=web from=success to=failure reason=timeout`;
                // without a typed reason, the run's own message (quoted) says why.
                let reason = result
                    .reason
                    .map_or_else(|| format!("{:?}", result.message), |r| r.to_string());
                tracing::info!(probe = %name, target = %target, kind = %kind, from = %before, to = %new, reason = %reason, "state changed");
            }
            self.results.record(&name, result, e.counter);
            if !self.stopping {
                if kind == Kind::Startup && changed == Some(Status::Success) {
                    self.target_started(&target);
                } else if matches!(kind, Kind::Liveness | Kind::Startup)
                    && changed == Some(Status::Failure)
                    && self.targets.get(&target).is_some_and(|t| t.spec.on_failure.is_some())
                {
                    self.hold(&target);
                }
            }
        }
        if self.stopping || !self.targets.get(&target).is_some_and(|t| eligible(kind, t)) {
            return;
        }
        let Some(e) = self.entries.get(&name) else { return };
        if e.planned.is_some() {
            return; // the next run is planned already (after a manual run or a reset)
        }
        let now = Instant::now();
        let at = match planned {
            _ if due => now,
            Some(p) if current => (p + period).max(now),
            _ => return,
        };
        self.schedule(&name, at);
    }

    pub(super) fn target_started(&mut self, target: &Arc<str>) {
        let Some(t) = self.targets.get_mut(target) else { return };
        t.started = true;
        tracing::info!(target = %target, "startup probe succeeded; starting the other probes");
        let (probes, since) = (t.probes.clone(), t.since);
        for p in &probes {
            match self.entries.get(p).map(|e| e.spec.kind) {
                Some(Kind::Startup) => self.unschedule(p),
                Some(_) => self.schedule_first(p, since),
                None => {}
            }
        }
    }

    pub(super) fn hold(&mut self, target: &Arc<str>) {
        let Some(t) = self.targets.get_mut(target) else { return };
        t.held = true;
        t.hold += 1;
        let hold = t.hold;
        let spec = t.spec.clone();
        let probes = t.probes.clone();
        for p in &probes {
            self.unschedule(p);
            self.next_epoch += 1;
            let epoch = self.next_epoch;
            if let Some(e) = self.entries.get_mut(p) {
                e.epoch = epoch;
            }
        }
        tracing::warn!(target = %target, "probe failed; running on_failure and holding the target's probes");
        let (runner, tx, target) = (self.runner.clone(), self.tx.clone(), target.clone());
        tokio::spawn(async move {
            let outcome = runner.act(&spec).await;
            let _ = tx.send(Msg::ActionDone { target, hold, outcome });
        });
    }

    pub(super) fn action_done(&mut self, target: &Arc<str>, hold: u64, outcome: ActionOutcome) {
        let Some(t) = self.targets.get_mut(target) else { return };
        if t.hold != hold || !t.held {
            return;
        }
        if outcome.ok {
            tracing::info!(target = %target, message = %outcome.message, "on_failure action done; probes start again");
        } else {
            tracing::error!(target = %target, message = %outcome.message, "on_failure action failed; probes start again");
        }
        t.held = false;
        t.since = Instant::now();
        t.started = !t.has_startup;
        let (probes, since) = (t.probes.clone(), t.since);
        for p in &probes {
            self.reset(p);
            let Some(kind) = self.entries.get(p).map(|e| e.spec.kind) else {
                continue;
            };
            if self.targets.get(target).is_some_and(|t| eligible(kind, t)) {
                self.schedule_first(p, since);
            }
        }
    }

    /// Back to the initial state; runs in flight no longer count.
    pub(super) fn reset(&mut self, name: &Arc<str>) {
        self.next_epoch += 1;
        let epoch = self.next_epoch;
        let Some(e) = self.entries.get_mut(name) else { return };
        e.epoch = epoch;
        e.counter = Counter::initial(e.spec.kind);
        self.results.reset(name, e.counter);
    }
}
