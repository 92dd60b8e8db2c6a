//! Putting a changed probe set in force: probes and targets added,
//! changed and removed, each keeping what it may keep.

use super::*;

impl<R: Runner> Core<R> {
    pub(super) fn apply(&mut self, d: Delta) -> ReloadSummary {
        let mut summary = ReloadSummary::default();
        self.remove_gone_probes(&d, &mut summary);
        self.apply_targets(d.full, &d.removed_targets, d.targets);
        for p in &d.probes {
            self.apply_probe(p, &mut summary);
        }
        self.start_restored_targets(&d.probes);
        summary
    }

    /// Removes the probes gone: those `d` names, or for a whole catalog,
    /// those not in it. Their waiters learn they are gone.
    pub(super) fn remove_gone_probes(&mut self, d: &Delta, summary: &mut ReloadSummary) {
        let gone: Vec<Arc<str>> = if d.full {
            let keep: std::collections::HashSet<&Arc<str>> = d.probes.iter().map(|p| &p.name).collect();
            self.entries.keys().filter(|n| !keep.contains(n)).cloned().collect()
        } else {
            d.removed_probes.clone()
        };
        for name in gone {
            self.unschedule(&name);
            if let Some(e) = self.entries.remove(&name) {
                for w in e.waiters {
                    let _ = w.send(Err(TriggerError::NotFound(name.to_string())));
                }
                self.results.remove(&name);
                summary.removed.push(name.to_string());
            }
        }
    }

    /// Drops the targets gone (`removed`, or with `full` every one not in
    /// `updated`) and puts in the new and changed ones; a target already
    /// started stays started, and keeps its hold.
    pub(super) fn apply_targets(
        &mut self,
        full: bool,
        removed: &[Arc<str>],
        updated: Vec<crate::catalog::TargetUpdate>,
    ) {
        let now = Instant::now();
        if full {
            let keep: std::collections::HashSet<&Arc<str>> = updated.iter().map(|t| &t.spec.name).collect();
            self.targets.retain(|n, _| keep.contains(n));
        } else {
            for t in removed {
                self.targets.remove(t);
            }
        }
        for t in updated {
            let has_startup = t.has_startup;
            let state = match self.targets.remove(&t.spec.name) {
                Some(old) => TargetState {
                    spec: t.spec,
                    probes: t.probes,
                    // A target already started stays started.
                    started: old.started || !has_startup,
                    has_startup,
                    held: old.held,
                    hold: old.hold,
                    since: old.since,
                },
                None => TargetState {
                    spec: t.spec,
                    probes: t.probes,
                    has_startup,
                    started: !has_startup,
                    held: false,
                    hold: 0,
                    since: now,
                },
            };
            self.targets.insert(state.spec.name.clone(), state);
        }
    }

    /// Puts in the probe `p` if it is new or changed (counted in
    /// `summary`), and schedules its first run if its target lets it run.
    pub(super) fn apply_probe(&mut self, p: &Arc<ProbeSpec>, summary: &mut ReloadSummary) {
        match self.entries.get(&p.name) {
            Some(e) if *e.spec == **p => {
                summary.kept += 1;
                return;
            }
            Some(_) => {
                self.unschedule(&p.name);
                // Replaced below by `insert`, never removed in between:
                // a reader of the API sees the old record, then the new.
                self.results.forget_saved(&p.name);
                summary.changed.push(p.name.to_string());
            }
            None => summary.added.push(p.name.to_string()),
        }
        let meta = ProbeMeta {
            name: p.name.clone(),
            target: p.target.clone(),
            kind: p.kind,
            groups: p.groups.clone(),
            labels: p.labels.clone(),
            tenant: p.tenant.clone(),
            plugin: p.plugin_ref.as_str().into(),
        };
        let counter = self.results.insert(&meta, Counter::initial(p.kind));
        self.next_epoch += 1;
        // A run of the old spec may still be in flight: keep its flag so
        // the new spec's first run waits for it.
        let (waiters, running) = self
            .entries
            .remove(&p.name)
            .map(|e| (e.waiters, e.running))
            .unwrap_or_default();
        self.entries.insert(
            p.name.clone(),
            Entry {
                spec: p.clone(),
                counter,
                epoch: self.next_epoch,
                planned: None,
                heap_gen: 0,
                running,
                due: false,
                waiters,
            },
        );
        if let Some(t) = self.targets.get(&p.target)
            && eligible(p.kind, t)
        {
            let since = t.since;
            self.schedule_first(&p.name, since);
        }
    }

    /// Starts the targets whose startup probe (among `probes`) was
    /// restored as succeeded.
    pub(super) fn start_restored_targets(&mut self, probes: &[Arc<ProbeSpec>]) {
        let restored_started: Vec<Arc<str>> = probes
            .iter()
            .filter_map(|p| self.entries.get(&p.name))
            .filter(|e| e.spec.kind == Kind::Startup && e.counter.state == Status::Success)
            .map(|e| e.spec.target.clone())
            .filter(|t| self.targets.get(t).is_some_and(|t| !t.started))
            .collect();
        for t in restored_started {
            self.target_started(&t);
        }
    }
}
