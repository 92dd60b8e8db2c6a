//! How each SondeCheck is doing, the Kubernetes way: its `status`
//! subresource (observedGeneration, an `Accepted` condition, and how many
//! Pods have its gate True, False or Unknown), written by **one** agent.
//!
//! Every agent runs this task, but only the holder of the Lease
//! `sonde-status` (in the agent's own namespace, `$POD_NAMESPACE`, by
//! default `sonde-system`) writes. The election is optimistic concurrency
//! on that Lease: the holder renews it every [`LeaseTiming::renew_every`]
//! by a replace carrying the resourceVersion it last wrote (a `409` means
//! it lost); a non-holder reads it (from the API server's cache) once per
//! [`LeaseTiming::retry_every`] plus jitter, never watches it, and takes it
//! over when the same resourceVersion has been seen for a whole lease
//! duration (by its own clock: no clock skew between nodes matters). The
//! holder stops writing when it could not renew within
//! [`LeaseTiming::renew_deadline`], before anyone else may take over.
//!
//! While it leads, the agent watches every Pod cluster-wide (a second Pod
//! watch, keeping only Pods with a `sonde.dev/*` readiness gate, and of
//! those only what `PodView` holds), counts each check's gates, decides
//! `Accepted` with the controller's own pure functions (`desired` and a
//! dry run of the catalog change, [`Control::check_change`]) against one
//! Pod that names the check, and patches a check's status only when it
//! differs from what the object has, at most once per [`WRITE_EVERY`] per
//! check, under the agent-wide rate limit. Losing the Lease drops the Pod
//! watch and everything it held.

use super::crd::{SondeCheck, SondeCheckStatus};
use super::desired::desired;
use super::settings::GateSettings;
use super::stats::Stats;
use super::view::PodKey;
use super::writer::{Outcome, TokenBucket, backoff};
use crate::desired::messages;
use crate::gates::plan::parse_target;
use crate::gates::services::Services;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use sonde_core::catalog::Change;
use sonde_core::control::Control;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The namespace of the Lease when `$POD_NAMESPACE` is unset.
pub const DEFAULT_NAMESPACE: &str = "sonde-system";
pub use crate::crd::STATUS_FIELD_MANAGER;
pub use crate::lease::{Election, LEASE_NAME, LeaseTiming, elect};
pub use summary::ACCEPTED;
#[cfg(test)]
use summary::REASONS;
pub(crate) use summary::errors_reason;
use summary::{Tracked, Verdict, aggregate, next_status, refusal_reason, stand_in};

mod summary;
/// The shortest time between two status writes of one check.
pub const WRITE_EVERY: Duration = Duration::from_secs(10);
/// How often the leader compares what it counts with what the checks say.
pub const EVALUATE_EVERY: Duration = Duration::from_secs(2);
/// How long a dry run's verdict on a check is reused while neither the
/// check nor the Pod it was tried on changes (the catalog may: a plugin
/// file appears, a tenant's ceiling is reloaded).
const VERDICT_TTL: Duration = Duration::from_secs(60);
/// The most dry runs of the catalog change one evaluation makes: with
/// more checks to try than that (thousands created at once), the rest keep
/// their status until a later evaluation, and the catalog's lock is not
/// held for long.
const DRY_RUNS_PER_EVALUATION: usize = 32;

/// What the status task needs.
pub(super) struct Inputs {
    pub(super) client: kube::Client,
    pub(super) control: Arc<Control>,
    pub(super) settings: GateSettings,
    pub(super) stats: Arc<Stats>,
    /// The controller's SondeChecks (the status writer reads the same).
    pub(super) checks: Store<SondeCheck>,
    /// The controller's Services, for checks through one.
    pub(super) services: Services,
    /// Whether the controller's stores listed.
    pub(super) synced: watch::Receiver<bool>,
    /// Told whether this agent leads (the node checks' status follows it).
    pub(super) leading: watch::Sender<bool>,
}

/// Runs the election and, while this agent leads, the status writer.
pub(super) async fn run(inputs: Inputs) {
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
    let election = elect(
        inputs.client.clone(),
        &namespace,
        &inputs.settings.node_name,
        LeaseTiming::default(),
    );
    let mut leading = election.leading.clone();
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        inputs.stats.status_leader.store(1, Ordering::Relaxed);
        inputs.leading.send_replace(true);
        let mut leader = Leader::new(&inputs);
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => {}
            () = leader.run() => {}
        }
        inputs.stats.status_leader.store(0, Ordering::Relaxed);
        inputs.leading.send_replace(false);
        tracing::info!("kubernetes: no longer the status writer; the cluster-wide Pod watch is dropped");
    }
}

/// A dry run's verdict on a check, and what it was run on.
struct Cached {
    tried: serde_json::Value,
    reloads: u64,
    at: Instant,
    verdict: Verdict,
}

/// A check's status writes.
#[derive(Default)]
struct Writes {
    /// What was written last, and when.
    last: Option<(SondeCheckStatus, Instant)>,
    in_flight: bool,
    attempts: u32,
    not_before: Option<Instant>,
}

/// What a spawned status write reports.
struct WriteDone {
    check: PodKey,
    status: SondeCheckStatus,
    outcome: Outcome,
}

/// The status writer's state while it leads.
struct Leader {
    client: kube::Client,
    control: Arc<Control>,
    settings: GateSettings,
    stats: Arc<Stats>,
    checks: Store<SondeCheck>,
    services: Services,
    synced: watch::Receiver<bool>,
    pods: HashMap<PodKey, Tracked>,
    /// A (re-)list in progress.
    relist: Option<HashMap<PodKey, Tracked>>,
    listed: bool,
    verdicts: HashMap<PodKey, Cached>,
    writes: HashMap<PodKey, Writes>,
    bucket: TokenBucket,
    /// The first check the next evaluation tries (see [`Leader::evaluate`]).
    cursor: usize,
    done_tx: mpsc::UnboundedSender<WriteDone>,
    done_rx: mpsc::UnboundedReceiver<WriteDone>,
}

impl Leader {
    fn new(inputs: &Inputs) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            client: inputs.client.clone(),
            control: inputs.control.clone(),
            settings: inputs.settings.clone(),
            stats: inputs.stats.clone(),
            checks: inputs.checks.clone(),
            services: inputs.services.clone(),
            synced: inputs.synced.clone(),
            pods: HashMap::new(),
            relist: None,
            listed: false,
            verdicts: HashMap::new(),
            writes: HashMap::new(),
            bucket: TokenBucket::new(inputs.settings.qps, inputs.settings.burst),
            cursor: 0,
            done_tx,
            done_rx,
        }
    }

    async fn run(&mut self) {
        let mut pods = watcher::watcher(Api::<Pod>::all(self.client.clone()), watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut tick = tokio::time::interval(EVALUATE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ev = pods.next() => match ev {
                    Some(Ok(ev)) => self.on_pod(ev),
                    Some(Err(e)) => tracing::warn!(error = %e, "watching every Pod for SondeCheck statuses failed; retrying with backoff (does the ClusterRole allow pods list and watch?)"),
                    None => return,
                },
                Some(done) = self.done_rx.recv() => self.on_done(done),
                _ = tick.tick() => self.evaluate().await,
            }
        }
    }

    fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(pod) => {
                if let (Some(t), Some(relist)) = (Tracked::of(&pod), self.relist.as_mut()) {
                    relist.insert(t.view.key.clone(), t);
                }
            }
            Event::InitDone => {
                self.pods = self.relist.take().unwrap_or_default();
                self.listed = true;
            }
            Event::Apply(pod) => match Tracked::of(&pod) {
                Some(t) => {
                    self.pods.insert(t.view.key.clone(), t);
                }
                None => {
                    if let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) {
                        self.pods.remove(&(ns, name));
                    }
                }
            },
            Event::Delete(pod) => {
                if let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) {
                    self.pods.remove(&(ns, name));
                }
            }
        }
    }

    /// Compares every check's status with what it should be, and writes
    /// what differs and is due.
    async fn evaluate(&mut self) {
        // The controller says when its stores listed (kube-runtime's own
        // readiness signal wakes only the last of two tasks waiting on it).
        if !self.listed || !*self.synced.borrow() {
            return;
        }
        self.stats.status_evaluations.fetch_add(1, Ordering::Relaxed);
        let pods = std::mem::take(&mut self.pods);
        let by_check = aggregate(pods.values());
        let mut checks: Vec<(PodKey, Arc<SondeCheck>)> = self
            .checks
            .state()
            .into_iter()
            .filter_map(|c| Some(((c.namespace()?, c.name_any()), c)))
            .collect();
        checks.sort_by(|a, b| a.0.cmp(&b.0));
        // Where the last evaluation ran out of dry runs: no check waits
        // behind the same others every time.
        let start = self.cursor.min(checks.len());
        checks.rotate_left(start);
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let mut seen = Vec::with_capacity(checks.len());
        let mut budget = DRY_RUNS_PER_EVALUATION;
        let mut starved = None;
        for (i, (key, check)) in checks.iter().enumerate() {
            seen.push(key.clone());
            let (counts, pod) = by_check.get(key).copied().unwrap_or_default();
            let Some(verdict) = self.verdict(key, check, pod, &mut budget).await else {
                starved.get_or_insert(i);
                continue;
            };
            let next = next_status(check.metadata.generation, counts, &verdict, check.status.as_ref(), &now);
            if check.status.as_ref() != Some(&next) {
                self.want(key, next);
            }
        }
        self.cursor = starved.map_or(0, |i| (self.cursor + i) % checks.len());
        drop(by_check);
        self.pods = pods;
        let seen: std::collections::HashSet<PodKey> = seen.into_iter().collect();
        self.verdicts.retain(|k, _| seen.contains(k));
        self.writes.retain(|k, w| w.in_flight || seen.contains(k));
    }

    /// Whether check `key` is accepted, tried on `pod` (or a stand-in);
    /// `None` when it needs a dry run and `budget` has none left.
    async fn verdict(
        &mut self,
        key: &PodKey,
        check: &SondeCheck,
        pod: Option<&Tracked>,
        budget: &mut usize,
    ) -> Option<Verdict> {
        let mut settings = self.settings.clone();
        if let Some(node) = pod.and_then(|p| p.node.clone()) {
            settings.node_name = node;
        }
        let with_pod = pod.is_some();
        let view = pod.map_or_else(|| stand_in(&key.0, check), |p| p.view.clone());
        let services = |name: &str| self.services.view(&key.0, name);
        let d = match desired(&view, check, &settings, &services) {
            Ok(Some(d)) => d,
            // A usable Pod or the stand-in always has an address.
            Ok(None) => return Some(Verdict::accepted(with_pod)),
            Err(r) => return Some(Verdict::refused(refusal_reason(&r), r.to_string())),
        };
        let reloads = *self.control.reloads().borrow();
        if let Some(c) = self.verdicts.get(key)
            && c.tried == d.target
            && c.reloads == reloads
            && c.at.elapsed() < VERDICT_TTL
        {
            return Some(c.verdict.clone());
        }
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        let verdict = match parse_target(&d, &view.key, &key.1) {
            Err(errors) => Verdict::refused(errors_reason(&errors), messages(&errors)),
            Ok(target) => {
                let change = Change {
                    remove: vec![d.name.as_str().into()],
                    add: vec![target],
                    secrets: crate::secrets::stand_ins(&d.tenant, &check.spec.secret_refs),
                };
                match self.control.check_change(change).await {
                    Ok(()) => Verdict::accepted(with_pod),
                    Err(mut errors) => {
                        if !with_pod {
                            // The stand-in's address is no Pod's: only a
                            // real one is held to the net ceiling.
                            errors.0.retain(|e| !e.message.contains("net ceiling"));
                        }
                        if errors.0.is_empty() {
                            Verdict::accepted(with_pod)
                        } else {
                            Verdict::refused(errors_reason(&errors), messages(&errors))
                        }
                    }
                }
            }
        };
        let cached = Cached {
            tried: d.target,
            reloads,
            at: Instant::now(),
            verdict: verdict.clone(),
        };
        self.verdicts.insert(key.clone(), cached);
        Some(verdict)
    }

    /// Writes `next` on check `key` when due: not while a write is in
    /// flight, not twice the same within a while, not twice within
    /// [`WRITE_EVERY`], after a failure's backoff, under the rate limit.
    fn want(&mut self, key: &PodKey, next: SondeCheckStatus) {
        let now = Instant::now();
        let w = self.writes.entry(key.clone()).or_default();
        if w.in_flight || w.not_before.is_some_and(|t| t > now) {
            return;
        }
        if let Some((last, at)) = &w.last {
            let since = now.saturating_duration_since(*at);
            // Written and not yet seen by the watch: wait for it a while.
            if *last == next && since < WRITE_EVERY * 6 {
                return;
            }
            if since < WRITE_EVERY {
                return;
            }
        }
        if self.bucket.take(now).is_err() {
            return;
        }
        w.in_flight = true;
        self.send(key.clone(), next);
    }

    fn send(&self, check: PodKey, status: SondeCheckStatus) {
        let api: Api<SondeCheck> = Api::namespaced(self.client.clone(), &check.0);
        let tx = self.done_tx.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some(STATUS_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let body = serde_json::json!({ "status": status });
            let result = api
                .patch_status(&check.1, &params, &Patch::Merge(&body))
                .await
                .map(|_| ());
            let outcome = Outcome::of(&result);
            if outcome == Outcome::Written {
                stats.status_writes.fetch_add(1, Ordering::Relaxed);
            } else {
                stats.status_write_errors.fetch_add(1, Ordering::Relaxed);
            }
            // The leader gone, nobody is left to tell.
            let _ = tx.send(WriteDone { check, status, outcome });
        });
    }

    fn on_done(&mut self, done: WriteDone) {
        let Some(w) = self.writes.get_mut(&done.check) else {
            return;
        };
        w.in_flight = false;
        match done.outcome {
            Outcome::Written => {
                w.last = Some((done.status, Instant::now()));
                w.attempts = 0;
                w.not_before = None;
            }
            // The check was deleted meanwhile.
            Outcome::Gone => {
                self.writes.remove(&done.check);
            }
            outcome @ (Outcome::Forbidden(_) | Outcome::Retry(_)) => {
                w.attempts += 1;
                let wait = backoff(&outcome, w.attempts);
                w.not_before = Some(Instant::now() + wait);
                let (namespace, check) = &done.check;
                tracing::warn!(%namespace, %check, ?outcome, retry_in_s = wait.as_secs(), "writing a SondeCheck's status failed (does the ClusterRole allow sondechecks/status patch?)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::summary::Counts;
    use super::*;
    use crate::desired::Refusal;
    use sonde_core::config::{ConfigError, ConfigErrors, Place};

    fn tracked(name: &str, gates: &[(&str, Option<&str>)], ip: bool) -> Tracked {
        let conditions: Vec<serde_json::Value> = gates
            .iter()
            .filter_map(|(g, s)| s.map(|s| serde_json::json!({"type": format!("sonde.dev/{g}"), "status": s})))
            .collect();
        let gates: Vec<serde_json::Value> = gates
            .iter()
            .map(|(g, _)| serde_json::json!({"conditionType": format!("sonde.dev/{g}")}))
            .collect();
        let mut pod = serde_json::json!({
            "metadata": {"namespace": "shop", "name": name, "uid": format!("u-{name}")},
            "spec": {"nodeName": "node-1", "readinessGates": gates, "containers": []},
            "status": {"phase": "Running", "conditions": conditions}
        });
        if ip {
            pod["status"]["podIP"] = "10.0.0.1".into();
        }
        Tracked::of(&serde_json::from_value(pod).unwrap()).unwrap()
    }

    #[test]
    fn counts_each_gate_by_its_condition_and_tries_the_first_usable_pod() {
        let pods = [
            tracked("c", &[("ready", Some("True")), ("db", Some("False"))], true),
            tracked("b", &[("ready", Some("False"))], false),
            tracked("a", &[("ready", None)], false),
            tracked("d", &[("ready", Some("Unknown"))], true),
        ];
        let agg = aggregate(pods.iter());
        let (counts, tried) = agg[&("shop".to_string(), "ready".to_string())];
        assert_eq!(
            counts,
            Counts {
                ready: 1,
                not_ready: 1,
                unknown: 2
            }
        );
        assert_eq!(
            tried.unwrap().view.key.1,
            "c",
            "a and b have no address; c comes before d"
        );
        let (counts, _) = agg[&("shop".to_string(), "db".to_string())];
        assert_eq!(counts.not_ready, 1);
        assert_eq!(agg.len(), 2);
    }

    #[test]
    fn a_pod_without_a_sonde_gate_is_not_followed_and_a_gone_one_not_counted() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "x", "uid": "u"},
            "spec": {"readinessGates": [{"conditionType": "example.com/x"}], "containers": []},
        }))
        .unwrap();
        assert!(Tracked::of(&pod).is_none());
        let mut gone = tracked("g", &[("ready", Some("True"))], true);
        gone.view.gone = true;
        assert!(aggregate([&gone]).is_empty());
    }

    #[test]
    fn the_transition_time_moves_only_when_accepted_flips() {
        let counts = Counts {
            ready: 2,
            ..Counts::default()
        };
        let first = next_status(Some(1), counts, &Verdict::accepted(true), None, "t1");
        assert_eq!(first.conditions[0].last_transition_time, "t1");
        assert_eq!(first.observed_generation, Some(1));
        let same = next_status(Some(2), counts, &Verdict::accepted(true), Some(&first), "t2");
        assert_eq!(same.conditions[0].last_transition_time, "t1");
        assert_eq!(same.conditions[0].observed_generation, Some(2));
        let refused = Verdict::refused("PluginNotAllowed", "no".into());
        let flipped = next_status(Some(2), counts, &refused, Some(&same), "t3");
        assert_eq!(
            (
                flipped.conditions[0].status.as_str(),
                flipped.conditions[0].last_transition_time.as_str()
            ),
            ("False", "t3")
        );
        assert_eq!(
            next_status(Some(2), counts, &refused, Some(&flipped), "t4"),
            flipped,
            "nothing to write"
        );
    }

    #[test]
    fn refusals_have_their_reasons() {
        let e = |m: &str| {
            ConfigErrors(vec![ConfigError {
                place: Place {
                    file: "x".into(),
                    line: 0,
                    column: 0,
                },
                message: m.into(),
            }])
        };
        let net = sonde_core::tenants::CeilingError::Target {
            tenant: "poor".into(),
            probe: "p".into(),
            target: "127.0.0.1:80".into(),
        };
        assert_eq!(errors_reason(&e(&format!("target: {net}"))), "OutsideCeiling");
        assert_eq!(
            errors_reason(&e(
                "quotas.max_probes: tenant \"a\": probe \"p\" is over the tenant's quota of 1 probes"
            )),
            "OutsideCeiling"
        );
        assert_eq!(
            errors_reason(&e("config at /path: 42 is not a string (plugin http)")),
            "InvalidConfig"
        );
        assert_eq!(errors_reason(&e("plugin: /x.wasm: no such file")), "PluginUnavailable");
        assert_eq!(
            refusal_reason(&Refusal::PluginNotAllowed { plugin: "x".into() }),
            "PluginNotAllowed"
        );
        assert_eq!(refusal_reason(&Refusal::NoTenant { namespace: "d".into() }), "NoTenant");
    }

    /// The status and the reasons docs/kubernetes.md shows, as shipped.
    #[test]
    fn the_documented_status_and_reasons_are_the_ones_written() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/kubernetes.md")).unwrap();
        let section = doc.split("## Is my check working?").nth(1).expect("the section");
        let section = section.split("\n## ").next().unwrap();
        let block = section
            .split("```yaml kubernetes\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("its status");
        #[derive(serde::Deserialize)]
        struct Doc {
            status: SondeCheckStatus,
        }
        let shown: Doc = serde_saphyr::from_str(block).unwrap();
        let c = &shown.status.conditions[0];
        assert_eq!((c.type_.as_str(), c.status.as_str()), (ACCEPTED, "False"));
        assert!(REASONS.contains(&c.reason.as_str()));
        let documented: Vec<&str> = section
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .flat_map(|l| l.split(" |").next().unwrap().split(", "))
            .map(|r| r.trim_matches('`'))
            .collect();
        let mut want = REASONS.to_vec();
        want.sort_unstable();
        let mut documented = documented;
        documented.sort_unstable();
        assert_eq!(documented, want, "every reason written is documented, and no other");
    }
}
