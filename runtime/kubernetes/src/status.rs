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
//! those only what [`PodView`] holds), counts each check's gates, decides
//! `Accepted` with the controller's own pure functions ([`desired`] and a
//! dry run of the registry change, [`Control::check_change`]) against one
//! Pod that names the check, and patches a check's status only when it
//! differs from what the object has, at most once per [`WRITE_EVERY`] per
//! check, under the agent-wide rate limit. Losing the Lease drops the Pod
//! watch and everything it held.

use super::controller::Services;
use super::crd::{GATE_PREFIX, SondeCheck, SondeCheckStatus, StatusCondition};
use super::mapping::{CondStatus, GateSettings, PodKey, PodView, Refusal, desired};
use super::plan::{messages, parse_target};
use super::stats::Stats;
use super::writer::{Outcome, TokenBucket, backoff};
use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use sonde_core::config::ConfigErrors;
use sonde_core::control::Control;
use sonde_core::registry::Change;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The Lease the agents elect the status writer with.
pub const LEASE_NAME: &str = "sonde-status";
/// The namespace of the Lease when `$POD_NAMESPACE` is unset.
pub const DEFAULT_NAMESPACE: &str = "sonde-system";
/// The field manager of status writes.
pub const FIELD_MANAGER: &str = "sonde-status";
/// The type of the condition that says whether the agents accept a check.
pub const ACCEPTED: &str = "Accepted";
/// The shortest time between two status writes of one check.
pub const WRITE_EVERY: Duration = Duration::from_secs(10);
/// How often the leader compares what it counts with what the checks say.
pub const EVALUATE_EVERY: Duration = Duration::from_secs(2);
/// How long a dry run's verdict on a check is reused while neither the
/// check nor the Pod it was tried on changes (the registry may: a plugin
/// file appears, a tenant's ceiling is reloaded).
const VERDICT_TTL: Duration = Duration::from_secs(60);
/// The most dry runs of the registry change one evaluation makes: with
/// more checks to try than that (thousands created at once), the rest keep
/// their status until a later evaluation, and the registry's lock is not
/// held for long.
const DRY_RUNS_PER_EVALUATION: usize = 32;
/// The name of the stand-in Pod a check with no Pod yet is tried on.
const ANY_POD: &str = "any-pod";

/// The election's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a Lease not renewed stays its holder's (`leaseDurationSeconds`).
    pub duration: Duration,
    /// How often the holder renews.
    pub renew_every: Duration,
    /// How long the holder goes on writing without a renewal (less than
    /// `duration`, so it stops before anyone else may take over).
    pub renew_deadline: Duration,
    /// How often a non-holder reads the Lease, plus up to `jitter`.
    pub retry_every: Duration,
    /// The most added at random to each `retry_every`.
    pub jitter: Duration,
}

impl Default for LeaseTiming {
    /// A 30 s lease renewed every 10 s; non-holders read it every 30-50 s.
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            renew_deadline: Duration::from_secs(20),
            retry_every: Duration::from_secs(30),
            jitter: Duration::from_secs(20),
        }
    }
}

/// The gates of one check, by their condition's status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// `True`.
    pub(crate) ready: u32,
    /// `False`.
    pub(crate) not_ready: u32,
    /// `Unknown`, or no condition yet.
    pub(crate) unknown: u32,
}

/// A Pod the leader follows: one with a `sonde.dev/*` readiness gate.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Tracked {
    /// What the controller would see of it.
    pub(crate) view: PodView,
    /// Its node.
    pub(crate) node: Option<String>,
}

impl Tracked {
    /// `pod`, when one of its readiness gates names a SondeCheck.
    pub(crate) fn of(pod: &Pod) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let gated = spec
            .readiness_gates
            .iter()
            .flatten()
            .any(|g| g.condition_type.starts_with(GATE_PREFIX));
        if !gated {
            return None;
        }
        Some(Self {
            view: PodView::of(pod)?,
            node: spec.node_name.clone(),
        })
    }

    /// Whether a check can be tried on it: it has an address and is not going.
    fn usable(&self) -> bool {
        !self.view.ips.is_empty() && !self.view.gone
    }
}

/// Each check's counts and the Pod it is tried on (the first usable one by
/// name), by (namespace, check).
pub(crate) fn aggregate<'a>(
    pods: impl IntoIterator<Item = &'a Tracked>,
) -> BTreeMap<PodKey, (Counts, Option<&'a Tracked>)> {
    let mut out: BTreeMap<PodKey, (Counts, Option<&'a Tracked>)> = BTreeMap::new();
    for pod in pods {
        if pod.view.gone {
            continue;
        }
        for check in &pod.view.gates {
            let entry = out.entry((pod.view.key.0.clone(), check.clone())).or_default();
            let cond = pod.view.conditions.get(&format!("{GATE_PREFIX}{check}"));
            match cond.map(|c| c.status) {
                Some(CondStatus::True) => entry.0.ready += 1,
                Some(CondStatus::False) => entry.0.not_ready += 1,
                _ => entry.0.unknown += 1,
            }
            if pod.usable() && entry.1.is_none_or(|o| pod.view.key < o.view.key) {
                entry.1 = Some(pod);
            }
        }
    }
    out
}

/// Whether the agents accept a check, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Accepted.
    pub(crate) accepted: bool,
    /// `Accepted`, or why not (`PluginNotAllowed`, `OutsideCeiling`, ...).
    pub(crate) reason: &'static str,
    /// For people.
    pub(crate) message: String,
}

impl Verdict {
    fn accepted(with_pod: bool) -> Self {
        let message = if with_pod {
            "the plugin is allowed, and the probe of a Pod that names it fits its tenant's ceiling and the plugin's schema"
        } else {
            "the plugin is allowed and its config fits the plugin's schema; no Pod names it in a readiness gate yet, so the address is checked against the tenant's ceiling when one does"
        };
        Self {
            accepted: true,
            reason: "Accepted",
            message: message.into(),
        }
    }

    fn refused(reason: &'static str, message: String) -> Self {
        Self {
            accepted: false,
            reason,
            message: super::mapping::cut(&message, 1024),
        }
    }
}

/// Every reason of the `Accepted` condition (the docs list them all).
#[cfg(test)]
pub(crate) const REASONS: &[&str] = &[
    "Accepted",
    "PluginNotAllowed",
    "NoTenant",
    "OutsideCeiling",
    "InvalidConfig",
    "PluginUnavailable",
    "NoSuchPort",
    "InvalidPort",
    "ServiceNotFound",
    "ServicesNotListed",
    "ServiceWithoutClusterIP",
    "NoSuchServicePort",
];

/// The `Accepted` reason of a refusal by [`desired`].
pub(crate) fn refusal_reason(r: &Refusal) -> &'static str {
    match r {
        Refusal::NoTenant { .. } => "NoTenant",
        Refusal::NoSuchService { .. } => "ServiceNotFound",
        Refusal::ServicesNotListed => "ServicesNotListed",
        Refusal::ServiceWithoutClusterIp { .. } => "ServiceWithoutClusterIP",
        Refusal::NoSuchServicePort { .. } => "NoSuchServicePort",
        Refusal::PortOrService => "InvalidPort",
        Refusal::PluginNotAllowed { .. } => "PluginNotAllowed",
        Refusal::NoSuchPort { .. } => "NoSuchPort",
        Refusal::BadPort { .. } => "InvalidPort",
    }
}

/// The `Accepted` reason of the registry's refusal: a tenant's ceiling or
/// quota, a plugin that cannot be had, or anything else in the config.
pub(crate) fn errors_reason(errors: &ConfigErrors) -> &'static str {
    let any = |f: &dyn Fn(&str) -> bool| errors.0.iter().any(|e| f(&e.message));
    if any(&|m| m.contains("tenant's") && (m.contains("ceiling") || m.contains("quota"))) {
        "OutsideCeiling"
    } else if any(&|m| m.starts_with("plugin: ")) {
        "PluginUnavailable"
    } else {
        "InvalidConfig"
    }
}

/// The stand-in a check with no usable Pod is tried on: an address of
/// TEST-NET-1 and every port name resolving, so what does not depend on a
/// Pod (tenant, allowlist, schema, limits) is checked.
fn stand_in(namespace: &str, check: &SondeCheck) -> PodView {
    let mut ports = BTreeMap::new();
    if let Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) = &check.spec.port {
        ports.insert(name.clone(), 9);
    }
    PodView {
        key: (namespace.to_string(), ANY_POD.to_string()),
        uid: ANY_POD.to_string(),
        ips: vec![std::net::IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1))],
        ports,
        ..PodView::default()
    }
}

/// The status a check should have: `counts`, `verdict`, for `generation`;
/// the `Accepted` condition's transition time kept from `current` unless
/// its status flips (then `now`).
pub(crate) fn next_status(
    generation: Option<i64>,
    counts: Counts,
    verdict: &Verdict,
    current: Option<&SondeCheckStatus>,
    now: &str,
) -> SondeCheckStatus {
    let status = if verdict.accepted { "True" } else { "False" };
    let since = current
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == ACCEPTED))
        .filter(|c| c.status == status)
        .map_or_else(|| now.to_string(), |c| c.last_transition_time.clone());
    SondeCheckStatus {
        observed_generation: generation,
        conditions: vec![StatusCondition {
            type_: ACCEPTED.into(),
            status: status.into(),
            reason: verdict.reason.into(),
            message: verdict.message.clone(),
            last_transition_time: since,
            observed_generation: generation,
        }],
        pods_ready: counts.ready,
        pods_not_ready: counts.not_ready,
        pods_unknown: counts.unknown,
    }
}

/// What a non-holder or the holder does with the Lease it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// It is ours: renew it.
    Renew,
    /// Nobody holds it, or its holder let it expire: take it.
    Take,
    /// Someone else holds it.
    Wait,
}

/// The step for `spec` at resourceVersion `rv` read at `now` by `me`;
/// `observed` is the resourceVersion seen last and when it was first seen
/// (expiry is judged by the reader's clock, not the holder's timestamps).
pub(crate) fn step(
    spec: Option<&LeaseSpec>,
    rv: &str,
    me: &str,
    observed: &mut Option<(String, Instant)>,
    now: Instant,
    duration: Duration,
) -> Step {
    let holder = spec.and_then(|s| s.holder_identity.as_deref()).unwrap_or("");
    if holder == me {
        return Step::Renew;
    }
    if holder.is_empty() {
        return Step::Take;
    }
    // The holder's own duration, but no more than ten of ours: a Lease
    // written with a huge one does not stall the election forever.
    let lasts = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(duration, Duration::from_secs)
        .min(duration * 10);
    match observed {
        Some((seen, since)) if seen == rv => {
            if now.saturating_duration_since(*since) >= lasts {
                Step::Take
            } else {
                Step::Wait
            }
        }
        _ => {
            *observed = Some((rv.to_string(), now));
            Step::Wait
        }
    }
}

/// One elector's state.
struct Elector {
    api: Api<Lease>,
    me: String,
    timing: LeaseTiming,
    /// The Lease as this agent last wrote it, while it holds it.
    held: Option<Lease>,
    observed: Option<(String, Instant)>,
}

impl Elector {
    fn stamp(&self, lease: &mut Lease, take: bool) {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if take {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.map_or(0, |t| t.saturating_add(1)));
            spec.holder_identity = Some(self.me.clone());
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(i32::try_from(self.timing.duration.as_secs()).unwrap_or(i32::MAX));
    }

    /// Writes `lease` (replace, by its resourceVersion): whether it is ours now.
    async fn write(&mut self, lease: Lease) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match self.api.replace(LEASE_NAME, &params, &lease).await {
            Ok(l) => {
                self.held = Some(l);
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.held = None;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// One round: renew what it holds, or read the Lease and create, take
    /// or leave it. Whether this agent holds it now.
    async fn attempt(&mut self) -> Result<bool, kube::Error> {
        if let Some(mut lease) = self.held.clone() {
            self.stamp(&mut lease, false);
            return self.write(lease).await;
        }
        let lease = match self.api.get_with(LEASE_NAME, &GetParams::any()).await {
            Ok(l) => Some(l),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => return Err(e),
        };
        let Some(mut lease) = lease else {
            let mut lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    ..ObjectMeta::default()
                },
                spec: None,
            };
            self.stamp(&mut lease, true);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            return match self.api.create(&params, &lease).await {
                Ok(l) => {
                    self.held = Some(l);
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let now = Instant::now();
        match step(
            lease.spec.as_ref(),
            &rv,
            &self.me,
            &mut self.observed,
            now,
            self.timing.duration,
        ) {
            Step::Wait => Ok(false),
            Step::Renew => {
                self.stamp(&mut lease, false);
                self.write(lease).await
            }
            Step::Take => {
                self.stamp(&mut lease, true);
                let won = self.write(lease).await?;
                if won {
                    tracing::info!(holder = %self.me, "kubernetes: took the status Lease; this agent writes SondeCheck statuses");
                }
                Ok(won)
            }
        }
    }

    /// Runs the election, telling `leading` whether this agent leads.
    async fn run(mut self, leading: watch::Sender<bool>) {
        let mut lead_until: Option<Instant> = None;
        loop {
            let start = Instant::now();
            // A call that hangs must not keep a leader past its deadline.
            let deadline = lead_until.unwrap_or(start + self.timing.renew_every);
            let result = match tokio::time::timeout_at(deadline, self.attempt()).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err("the API server did not answer in time".to_string()),
            };
            let jitter = self.timing.jitter.mul_f64(fastrand::f64());
            let wait = match result {
                Ok(true) => {
                    lead_until = Some(start + self.timing.renew_deadline);
                    self.timing.renew_every
                }
                Ok(false) => {
                    lead_until = None;
                    self.timing.retry_every + jitter
                }
                Err(e) => {
                    if lead_until.is_some_and(|t| Instant::now() >= t) {
                        tracing::warn!(error = %e, "kubernetes: could not renew the status Lease in time; no longer writing SondeCheck statuses");
                        lead_until = None;
                        self.held = None;
                    } else {
                        tracing::warn!(error = %e, "kubernetes: the status Lease could not be read or written (does the Role allow leases get, create and update in the agent's namespace?)");
                    }
                    match lead_until {
                        Some(_) => self.timing.renew_every / 5,
                        None => self.timing.retry_every + jitter,
                    }
                }
            };
            leading.send_if_modified(|l| std::mem::replace(l, lead_until.is_some()) != lead_until.is_some());
            // A leader wakes by its deadline at the latest: the attempt
            // then times out at once and it steps down.
            let mut at = Instant::now() + wait;
            if let Some(t) = lead_until {
                at = at.min(t);
            }
            tokio::time::sleep_until(at).await;
        }
    }
}

/// A running election ([`elect`]); dropping it stops it (the Lease is left
/// to expire).
pub struct Election {
    /// Whether this agent holds the Lease.
    pub leading: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Election {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the election for the Lease [`LEASE_NAME`] in `namespace` as
/// `holder` (the node's name).
pub fn elect(client: kube::Client, namespace: &str, holder: &str, timing: LeaseTiming) -> Election {
    let (tx, leading) = watch::channel(false);
    let elector = Elector {
        api: Api::namespaced(client, namespace),
        me: holder.to_string(),
        timing,
        held: None,
        observed: None,
    };
    Election {
        leading,
        task: tokio::spawn(elector.run(tx)),
    }
}

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
        let mut leader = Leader::new(&inputs);
        tokio::select! {
            _ = leading.wait_for(|l| !*l) => {}
            () = leader.run() => {}
        }
        inputs.stats.status_leader.store(0, Ordering::Relaxed);
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
                field_manager: Some(FIELD_MANAGER.into()),
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
    use super::*;
    use sonde_core::config::{ConfigError, Place};

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

    fn lease(holder: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(30),
            ..LeaseSpec::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_taken_only_when_unchanged_for_its_duration() {
        let d = Duration::from_secs(30);
        let mut seen = None;
        let t0 = Instant::now();
        assert_eq!(step(Some(&lease("me")), "1", "me", &mut seen, t0, d), Step::Renew);
        assert_eq!(step(Some(&lease("")), "1", "me", &mut seen, t0, d), Step::Take);
        assert_eq!(step(None, "1", "me", &mut seen, t0, d), Step::Take);
        assert_eq!(step(Some(&lease("a")), "1", "me", &mut seen, t0, d), Step::Wait);
        let t1 = t0 + Duration::from_secs(29);
        assert_eq!(step(Some(&lease("a")), "1", "me", &mut seen, t1, d), Step::Wait);
        // Renewed meanwhile: the clock starts again.
        let t2 = t0 + Duration::from_secs(40);
        assert_eq!(step(Some(&lease("a")), "2", "me", &mut seen, t2, d), Step::Wait);
        assert_eq!(
            step(Some(&lease("a")), "2", "me", &mut seen, t2 + Duration::from_secs(29), d),
            Step::Wait
        );
        assert_eq!(
            step(Some(&lease("a")), "2", "me", &mut seen, t2 + d, d),
            Step::Take,
            "unchanged for a whole lease duration"
        );
        // The lease's own duration wins over the reader's default.
        let mut long = lease("a");
        long.lease_duration_seconds = Some(300);
        let mut seen = None;
        assert_eq!(step(Some(&long), "5", "me", &mut seen, t0, d), Step::Wait);
        assert_eq!(step(Some(&long), "5", "me", &mut seen, t0 + d, d), Step::Wait);
    }
}
