//! The scheduler's kubelet semantics, as the kubelet's own
//! `pkg/kubelet/prober/worker_test.go` checks them: initial delay, failure
//! and success thresholds, startup gating, hold after a liveness failure,
//! the result of a prober error, cleanup on removal — plus drift, overrun,
//! manual runs and reloads. Time is tokio's paused clock, so every instant
//! is exact and nothing sleeps for real.
//!
//! The probes are real registry entries (real plugins loaded); the runner
//! plays their outcomes from a script, as the kubelet's tests use a fake
//! prober, so each test says exactly what every run returns.

use crate::support::engine;
use sonde_core::catalog::{Catalog, ProbeSpec, TargetSpec};
use sonde_core::results::ResultCache;
use sonde_core::scheduler::{self, ActionOutcome, Options, Runner, SchedulerHandle, TriggerError};
use sonde_sandbox::verdict::{Reason, RunResult, Status};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{Instant, sleep, sleep_until};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Pass,
    Fail,
    Error,
}

/// One run the runner saw: probe, attempt, and when (since the start).
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    probe: String,
    attempt: u32,
    at: Duration,
}

struct Script {
    start: Instant,
    modes: Mutex<HashMap<String, Mode>>,
    run_time: Mutex<HashMap<String, Duration>>,
    action_time: Duration,
    runs: Mutex<Vec<Seen>>,
    actions: Mutex<Vec<(String, Duration)>>,
    running: Mutex<HashMap<String, u32>>,
    overlaps: Mutex<u32>,
}

impl Script {
    fn new(action_time: Duration) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            modes: Mutex::default(),
            run_time: Mutex::default(),
            action_time,
            runs: Mutex::default(),
            actions: Mutex::default(),
            running: Mutex::default(),
            overlaps: Mutex::default(),
        })
    }

    fn set(&self, probe: &str, mode: Mode) {
        self.modes.lock().unwrap().insert(probe.into(), mode);
    }

    fn takes(&self, probe: &str, d: Duration) {
        self.run_time.lock().unwrap().insert(probe.into(), d);
    }

    /// When `probe` ran (first attempts only), in milliseconds since the start.
    fn runs_of(&self, probe: &str) -> Vec<u128> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.probe == probe && s.attempt == 1)
            .map(|s| s.at.as_millis())
            .collect()
    }

    fn attempts_of(&self, probe: &str) -> Vec<u32> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.probe == probe)
            .map(|s| s.attempt)
            .collect()
    }
}

impl Runner for Script {
    async fn probe(&self, spec: &ProbeSpec, attempt: u32) -> RunResult {
        let name = spec.name.to_string();
        self.runs.lock().unwrap().push(Seen {
            probe: name.clone(),
            attempt,
            at: self.start.elapsed(),
        });
        {
            let mut running = self.running.lock().unwrap();
            let n = running.entry(name.clone()).or_default();
            *n += 1;
            if *n > 1 {
                *self.overlaps.lock().unwrap() += 1;
            }
        }
        let took = self.run_time.lock().unwrap().get(&name).copied().unwrap_or_default();
        sleep(took).await;
        *self.running.lock().unwrap().get_mut(&name).unwrap() -= 1;
        let mode = self.modes.lock().unwrap().get(&name).copied().unwrap_or(Mode::Pass);
        let status = match mode {
            Mode::Pass => Status::Success,
            Mode::Fail => Status::Failure,
            Mode::Error => return RunResult::error(Reason::Io, "scripted error"),
        };
        RunResult {
            status,
            message: format!("scripted {mode:?}"),
            ..RunResult::error(Reason::Io, "")
        }
        .without_reason()
    }

    async fn act(&self, target: &TargetSpec) -> ActionOutcome {
        self.actions
            .lock()
            .unwrap()
            .push((target.name.to_string(), self.start.elapsed()));
        sleep(self.action_time).await;
        ActionOutcome {
            ok: true,
            message: "scripted action".into(),
        }
    }
}

async fn registry(yaml: &str) -> Catalog {
    Catalog::load_text(&engine(), Path::new("test.yaml"), yaml)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn start(script: &Arc<Script>, yaml: &str) -> (SchedulerHandle, ResultCache) {
    let reg = registry(yaml).await;
    let results = ResultCache::default();
    let handle = scheduler::spawn(
        script.clone(),
        results.clone(),
        reg,
        Options {
            jitter: false,
            ..Default::default()
        },
    );
    (handle, results)
}

fn state(results: &ResultCache, probe: &str) -> (Status, u32) {
    let p = results.get(probe).expect("probe in the cache");
    (p.state, p.consecutive)
}

/// Sleeps until `ms` milliseconds after the script started.
async fn at(script: &Script, ms: u64) {
    sleep_until(script.start + Duration::from_millis(ms)).await;
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn initial_delay_then_runs_on_planned_times_without_drift() {
    let script = Script::new(SECOND);
    script.takes("p", Duration::from_millis(300));
    let (_h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: p, plugin: tcp, period: 1s, initial_delay: 5s}\n",
    )
    .await;
    at(&script, 4_900).await;
    assert!(script.runs_of("p").is_empty(), "no run before the initial delay");
    assert_eq!(
        state(&results, "p"),
        (Status::Failure, 0),
        "readiness starts as failure"
    );
    at(&script, 8_100).await;
    // Each run takes 300ms, yet the next starts one period after the last
    // one was planned, not after it ended.
    assert_eq!(script.runs_of("p"), [5_000, 6_000, 7_000, 8_000]);
}

#[tokio::test(start_paused = true)]
async fn failure_threshold_and_success_threshold() {
    let script = Script::new(SECOND);
    let (_h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: r, plugin: tcp, period: 1s, success_threshold: 2, failure_threshold: 3}\n",
    )
    .await;
    at(&script, 500).await;
    assert_eq!(state(&results, "r"), (Status::Failure, 1), "one pass is not enough");
    at(&script, 1_500).await;
    assert_eq!(state(&results, "r"), (Status::Success, 2));
    script.set("r", Mode::Fail);
    at(&script, 2_500).await;
    assert_eq!(state(&results, "r"), (Status::Success, 1));
    at(&script, 3_500).await;
    assert_eq!(state(&results, "r"), (Status::Success, 2));
    at(&script, 4_500).await;
    assert_eq!(state(&results, "r"), (Status::Failure, 3), "the third failure flips it");
    script.set("r", Mode::Pass);
    at(&script, 5_500).await;
    assert_eq!(state(&results, "r"), (Status::Failure, 1));
    at(&script, 6_500).await;
    assert_eq!(state(&results, "r"), (Status::Success, 2));
}

#[tokio::test(start_paused = true)]
async fn a_prober_error_is_retried_three_times_and_never_flips_state() {
    let script = Script::new(SECOND);
    script.set("l", Mode::Error);
    let (_h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: l, kind: liveness, plugin: tcp, period: 1s, failure_threshold: 1}\n",
    )
    .await;
    at(&script, 2_500).await;
    assert_eq!(script.attempts_of("l"), [1, 2, 3, 1, 2, 3, 1, 2, 3]);
    let p = results.get("l").unwrap();
    assert_eq!(p.state, Status::Success, "liveness keeps its initial success");
    let last = p.last.unwrap().result;
    assert_eq!((last.status, last.reason), (Status::Unknown, Some(Reason::Io)));
    script.set("l", Mode::Fail);
    at(&script, 3_500).await;
    assert_eq!(
        state(&results, "l"),
        (Status::Failure, 1),
        "a real failure still counts"
    );
}

#[tokio::test(start_paused = true)]
async fn startup_gates_the_other_probes_and_stops_once_it_succeeded() {
    let script = Script::new(SECOND);
    script.set("s", Mode::Fail);
    let (_h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: s, kind: startup, plugin: tcp, period: 1s, failure_threshold: 30}\n  - {name: r, plugin: tcp, period: 1s}\n  - {name: l, kind: liveness, plugin: tcp, period: 1s, initial_delay: 2s}\n",
    )
    .await;
    at(&script, 3_500).await;
    assert_eq!(script.runs_of("s").len(), 4);
    assert!(script.runs_of("r").is_empty() && script.runs_of("l").is_empty());
    assert_eq!(state(&results, "s").0, Status::Unknown, "startup starts unknown");
    assert!(!results.targets()[0].started);
    script.set("s", Mode::Pass);
    at(&script, 6_500).await;
    assert_eq!(
        script.runs_of("s"),
        [0, 1_000, 2_000, 3_000, 4_000],
        "startup stops once it succeeded"
    );
    assert_eq!(script.runs_of("r"), [4_000, 5_000, 6_000]);
    // The initial delay counts from the target's start, which is long past.
    assert_eq!(script.runs_of("l"), [4_000, 5_000, 6_000]);
    let t = &results.targets()[0];
    assert!(t.started && t.ready && t.live);
}

#[tokio::test(start_paused = true)]
async fn a_liveness_failure_holds_the_target_until_its_action_is_done() {
    let script = Script::new(Duration::from_secs(3));
    script.set("l", Mode::Fail);
    let (_h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  on_failure: {command: [/bin/true]}\n  probes:\n  - {name: l, kind: liveness, plugin: tcp, period: 1s, failure_threshold: 2, initial_delay: 2s}\n  - {name: r, plugin: tcp, period: 1s, initial_delay: 2s}\n",
    )
    .await;
    at(&script, 3_500).await;
    assert_eq!(state(&results, "l"), (Status::Failure, 2));
    assert_eq!(
        *script.actions.lock().unwrap(),
        [("t".to_string(), Duration::from_secs(3))]
    );
    // The action runs 3s; then the probes start over after their initial delay.
    at(&script, 7_500).await;
    assert_eq!(script.runs_of("l"), [2_000, 3_000]);
    assert_eq!(script.runs_of("r"), [2_000, 3_000]);
    assert_eq!(
        state(&results, "l"),
        (Status::Success, 0),
        "back to liveness's initial state"
    );
    assert_eq!(
        state(&results, "r"),
        (Status::Failure, 0),
        "back to readiness's initial state"
    );
    script.set("l", Mode::Pass);
    at(&script, 8_500).await;
    assert_eq!(script.runs_of("l"), [2_000, 3_000, 8_000]);
    assert_eq!(script.runs_of("r"), [2_000, 3_000, 8_000]);
    assert_eq!(script.actions.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_run_longer_than_the_period_delays_the_next_and_never_overlaps() {
    let script = Script::new(SECOND);
    script.takes("p", Duration::from_millis(2_500));
    let (h, _results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: p, plugin: tcp, period: 1s}\n",
    )
    .await;
    at(&script, 1_000).await;
    // A manual run while one is in flight waits for that run.
    let r = h.trigger("p").await.unwrap();
    assert_eq!(r.status, Status::Success);
    assert_eq!(Instant::now() - script.start, Duration::from_millis(2_500));
    at(&script, 6_000).await;
    assert_eq!(script.runs_of("p"), [0, 2_500, 5_000]);
    assert_eq!(*script.overlaps.lock().unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_manual_run_counts_and_keeps_the_schedule() {
    let script = Script::new(SECOND);
    let (h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: p, plugin: tcp, period: 10s}\n",
    )
    .await;
    at(&script, 1_000).await;
    script.set("p", Mode::Fail);
    let r = h.trigger("p").await.unwrap();
    assert_eq!(r.status, Status::Failure);
    assert_eq!(state(&results, "p"), (Status::Success, 1));
    assert_eq!(h.trigger("nope").await, Err(TriggerError::NotFound("nope".into())));
    at(&script, 10_500).await;
    assert_eq!(script.runs_of("p"), [0, 1_000, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_unchanged_probes_restarts_changed_ones_and_drops_removed_ones() {
    let script = Script::new(SECOND);
    let probes = |b_period: &str, third: &str| {
        format!(
            "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {{name: a, plugin: tcp, period: 1s}}\n  - {{name: b, plugin: tcp, period: {b_period}}}\n  - {{name: {third}, plugin: tcp, period: 1s}}\n"
        )
    };
    let (h, results) = start(&script, &probes("1s", "gone")).await;
    at(&script, 2_500).await;
    assert_eq!(state(&results, "a"), (Status::Success, 3));
    assert_eq!(state(&results, "b"), (Status::Success, 3));
    let summary = h.reload(registry(&probes("2s", "new")).await).await;
    assert_eq!(summary.kept, 1);
    assert_eq!(summary.changed, ["b"]);
    assert_eq!(summary.added, ["new"]);
    assert_eq!(summary.removed, ["gone"]);
    assert!(results.get("gone").is_none());
    at(&script, 3_500).await;
    assert_eq!(
        state(&results, "a"),
        (Status::Success, 4),
        "an unchanged probe keeps counting"
    );
    assert_eq!(
        state(&results, "b"),
        (Status::Success, 1),
        "a changed probe starts over"
    );
    assert_eq!(script.runs_of("a"), [0, 1_000, 2_000, 3_000], "and keeps its schedule");
    assert_eq!(script.runs_of("gone"), [0, 1_000, 2_000]);
    assert_eq!(script.runs_of("b"), [0, 1_000, 2_000, 2_500]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_a_run_in_flight_finish_within_the_grace() {
    let script = Script::new(SECOND);
    script.takes("p", Duration::from_millis(700));
    let (h, results) = start(
        &script,
        "targets:\n- name: t\n  address: 127.0.0.1:1\n  probes:\n  - {name: p, plugin: tcp, period: 1s}\n",
    )
    .await;
    at(&script, 1_200).await;
    h.shutdown(Duration::from_secs(5)).await;
    assert_eq!(Instant::now() - script.start, Duration::from_millis(1_700));
    assert_eq!(
        state(&results, "p"),
        (Status::Success, 2),
        "the run in flight was recorded"
    );
    at(&script, 5_000).await;
    assert_eq!(script.runs_of("p"), [0, 1_000], "nothing starts after shutdown");
}
