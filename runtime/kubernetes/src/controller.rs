//! The controller: one task that follows this node's Pods and every
//! SondeCheck through kube-runtime reflectors, keeps one probe per (Pod,
//! gate) in the registry through incremental changes, turns probe state
//! changes into gate conditions and writes them through a per-Pod
//! latest-wins queue under the agent-wide rate limit.
//!
//! The reflectors' [`Store`]s are the only copies of the Pods and checks;
//! the Pods are trimmed before they are stored to what the controller
//! reads ([`trim_pod`]). Reconciling a Pod is a pure [`plan_pod`] and an
//! applier ([`Reconciler::apply_plan`]) that performs it and reports every
//! error (logged and counted in [`Stats`]).
//!
//! All state lives in the one task ([`Reconciler`]); API calls run in
//! spawned tasks that report back on a channel, so the task never waits on
//! the API server while it could be taking a watch event or a result.

use super::crd::GATE_PREFIX;
use super::crd::{Mode, SondeCheck};
use super::events::{EventSink, pod_reference};
use super::mapping::{Cond, CondStatus, GateSettings, PodKey, PodView, Refusal, ServiceView, condition_type};
use super::plan::{AddProbe, Binding, PodInputs, PodPlan, messages, plan_pod};
use super::stats::Stats;
use super::writer::{Outcome, TokenBucket, backoff, patch_body};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Pod, PodCondition, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use sonde_core::control::{ChangeError, Control};
use sonde_core::registry::Change;
use sonde_core::results::{ResultCache, StateChange};
use sonde_sandbox::verdict::{Reason, Status};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

/// How long the first gates wait for the Services and EndpointSlices to
/// list before they are served without them.
const SERVICES_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The field manager of sonde's writes (`managedFields` shows it owning
/// its conditions only).
pub const FIELD_MANAGER: &str = "sonde";

/// The conditions waiting to be written on one Pod (latest wins).
#[derive(Debug)]
struct PendingWrite {
    uid: String,
    conds: BTreeMap<String, Cond>,
    attempts: u32,
    not_before: Option<Instant>,
}

impl PendingWrite {
    fn new(uid: &str) -> Self {
        Self {
            uid: uid.to_string(),
            conds: BTreeMap::new(),
            attempts: 0,
            not_before: None,
        }
    }
}

/// The conditions the agent wrote on a Pod since its last watch event
/// (so they are not written twice before the watch shows them).
#[derive(Debug)]
struct Written {
    uid: String,
    conds: BTreeMap<String, Cond>,
}

/// Why a registry change of the controller's was not applied.
enum Applied {
    /// Refused: what is wrong.
    Refused(sonde_core::config::ConfigErrors),
    /// Its plugin is being pulled: the text for the gate and the Event.
    Pulling(String),
}

/// What a spawned patch reports.
pub(super) struct Done {
    pod: PodKey,
    uid: String,
    sent: Vec<(String, Cond)>,
    outcome: Outcome,
}

/// Keeps only what the controller reads of a Pod, so the store holds no
/// more than that: its name, namespace, UID, resource version, deletion
/// time and `sonde.dev/` annotations; its node, readiness gates and named
/// container ports; its phase, IPs and `sonde.dev/` conditions.
pub(crate) fn trim_pod(pod: &mut Pod) {
    let meta = std::mem::take(&mut pod.metadata);
    let annotations: BTreeMap<String, String> = meta
        .annotations
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with(GATE_PREFIX))
        .collect();
    pod.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        deletion_timestamp: meta.deletion_timestamp,
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    pod.spec = pod.spec.take().map(|spec| PodSpec {
        node_name: spec.node_name,
        readiness_gates: spec.readiness_gates,
        containers: spec
            .containers
            .into_iter()
            .map(|c| Container {
                name: c.name,
                ports: c.ports.map(|ports| {
                    ports
                        .into_iter()
                        .filter(|p| p.name.is_some())
                        .map(|p| ContainerPort {
                            name: p.name,
                            container_port: p.container_port,
                            ..ContainerPort::default()
                        })
                        .collect()
                }),
                ..Container::default()
            })
            .collect(),
        ..PodSpec::default()
    });
    pod.status = pod.status.take().map(|status| PodStatus {
        phase: status.phase,
        pod_ip: status.pod_ip,
        pod_ips: status.pod_ips,
        conditions: status.conditions.map(|c| {
            c.into_iter()
                .filter(|c: &PodCondition| c.type_.starts_with(GATE_PREFIX))
                .collect()
        }),
        ..PodStatus::default()
    });
}

/// Keeps only what the controller reads of a Service: its name and
/// namespace, type, cluster IPs and TCP ports.
pub(crate) fn trim_service(service: &mut Service) {
    let meta = std::mem::take(&mut service.metadata);
    service.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        ..ObjectMeta::default()
    };
    service.spec = service.spec.take().map(|spec| ServiceSpec {
        type_: spec.type_,
        cluster_ip: spec.cluster_ip,
        cluster_ips: spec.cluster_ips,
        ports: spec.ports.map(|ports| {
            ports
                .into_iter()
                .map(|p| ServicePort {
                    name: p.name,
                    port: p.port,
                    protocol: p.protocol,
                    ..ServicePort::default()
                })
                .collect()
        }),
        ..ServiceSpec::default()
    });
    service.status = None;
}

/// The label of an EndpointSlice that names its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Keeps only what the controller reads of an EndpointSlice: its Service,
/// address type and each endpoint's readiness (not its addresses).
pub(crate) fn trim_slice(slice: &mut EndpointSlice) {
    let meta = std::mem::take(&mut slice.metadata);
    let labels = meta
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == SERVICE_NAME_LABEL)
        .collect();
    slice.metadata = ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        labels: Some(labels),
        ..ObjectMeta::default()
    };
    slice.endpoints = std::mem::take(&mut slice.endpoints)
        .into_iter()
        .map(|e| Endpoint {
            conditions: e.conditions.map(|c| EndpointConditions {
                ready: c.ready,
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        })
        .collect();
    slice.ports = None;
}

/// The endpoints of Service `name` in `namespace` ready to serve it, of
/// the address family of `ip`: a missing `ready` counts as ready, as the
/// API defines it.
fn ready_endpoints(slices: &Store<EndpointSlice>, namespace: &str, name: &str, ip: Option<&std::net::IpAddr>) -> usize {
    let family = match ip {
        Some(std::net::IpAddr::V6(_)) => "IPv6",
        _ => "IPv4",
    };
    // Only the Service's slices are cloned out of the cluster-wide store.
    slices
        .state_filter(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.address_type == family
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| n == name)
        })
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .count()
}

/// The Services and EndpointSlices the controller follows, as checks
/// through a Service see them.
#[derive(Clone)]
pub(crate) struct Services {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    /// Both have listed once.
    ready: Arc<std::sync::atomic::AtomicBool>,
}

impl Services {
    /// Service `name` of `namespace`, with its ready endpoints; why not,
    /// when it cannot be had.
    pub(crate) fn view(&self, namespace: &str, name: &str) -> Result<ServiceView, Refusal> {
        if !self.ready.load(Ordering::Relaxed) {
            return Err(Refusal::ServicesNotListed);
        }
        let service = self
            .services
            .get(&ObjectRef::new(name).within(namespace))
            .ok_or_else(|| Refusal::NoSuchService {
                namespace: namespace.to_string(),
                service: name.to_string(),
            })?;
        let mut view = ServiceView::of(&service, 0);
        view.ready_endpoints = ready_endpoints(&self.slices, namespace, name, view.cluster_ips.first());
        Ok(view)
    }
}

/// The reflectors' streams, which fill the stores as they are polled.
pub(crate) struct Streams {
    pods: Reflected<Pod>,
    checks: Reflected<SondeCheck>,
    services: Reflected<Service>,
    slices: Reflected<EndpointSlice>,
}

/// The controller's state.
pub(crate) struct Reconciler {
    client: kube::Client,
    control: Arc<Control>,
    results: ResultCache,
    settings: GateSettings,
    stats: Arc<Stats>,
    pods: Store<Pod>,
    checks: Store<SondeCheck>,
    /// The Services and EndpointSlices, as checks through one see them.
    services: Services,
    written: HashMap<PodKey, Written>,
    bindings: HashMap<String, Binding>,
    /// StartupOnly gates already True, by (Pod UID, check).
    started: HashSet<(String, String)>,
    /// The last refusal recorded on each SondeCheck, so it is recorded once.
    refusals: HashMap<PodKey, String>,
    /// Pods with a gate whose `oci://` plugin is being pulled, or failed to
    /// pull: reconciled again when a pull ends, never waited for.
    retry_pods: HashSet<PodKey>,
    /// Unknown override annotations already reported, by (Pod UID, key).
    overrides_reported: HashSet<(String, String)>,
    pending: HashMap<PodKey, PendingWrite>,
    order: VecDeque<PodKey>,
    in_flight: HashSet<PodKey>,
    bucket: TokenBucket,
    wake: Option<Instant>,
    events: EventSink,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Which of the Service and EndpointSlice stores have listed once
    /// (checks at Pods do not wait on them).
    services_listed: (bool, bool),
    /// Both stores have listed once.
    ready: bool,
    synced: watch::Sender<bool>,
}

/// The two reflectors' streams, which fill the stores as they are polled.
type Reflected<K> = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

impl Reconciler {
    /// A controller writing through `client` and changing the registry
    /// through `control`, with the streams that fill its stores.
    pub(super) fn new(
        client: kube::Client,
        control: Arc<Control>,
        results: ResultCache,
        settings: GateSettings,
        stats: Arc<Stats>,
        synced: watch::Sender<bool>,
    ) -> (Self, Streams) {
        let (pods, pod_writer) = reflector::store();
        let selector = format!("spec.nodeName={}", settings.node_name);
        let pod_events = watcher::watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&selector),
        )
        .default_backoff()
        .modify(trim_pod)
        .reflect(pod_writer);
        let (checks, check_writer) = reflector::store();
        let check_events = watcher::watcher(Api::<SondeCheck>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(|c: &mut SondeCheck| c.managed_fields_mut().clear())
            .reflect(check_writer);
        // Services and their EndpointSlices, for checks through a Service:
        // the watches kube-proxy holds on every node, trimmed to what a
        // check reads.
        let (services, service_writer) = reflector::store();
        let service_events = watcher::watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(trim_service)
            .reflect(service_writer);
        let (slices, slice_writer) = reflector::store();
        let slice_events = watcher::watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default().labels(SERVICE_NAME_LABEL),
        )
        .default_backoff()
        .modify(trim_slice)
        .reflect(slice_writer);
        let (done_tx, _) = mpsc::unbounded_channel();
        let events = EventSink::new(
            client.clone(),
            &settings.node_name,
            settings.qps,
            settings.burst,
            stats.clone(),
        );
        let bucket = TokenBucket::new(settings.qps, settings.burst);
        let this = Self {
            client,
            control,
            results,
            settings,
            stats,
            pods,
            checks,
            services: Services {
                services,
                slices,
                ready: Arc::default(),
            },
            written: HashMap::new(),
            bindings: HashMap::new(),
            started: HashSet::new(),
            refusals: HashMap::new(),
            retry_pods: HashSet::new(),
            overrides_reported: HashSet::new(),
            pending: HashMap::new(),
            order: VecDeque::new(),
            in_flight: HashSet::new(),
            bucket,
            wake: None,
            events,
            done_tx,
            services_listed: (false, false),
            ready: false,
            synced,
        };
        let streams = Streams {
            pods: Box::pin(pod_events),
            checks: Box::pin(check_events),
            services: Box::pin(service_events),
            slices: Box::pin(slice_events),
        };
        (this, streams)
    }

    /// The SondeChecks as the controller's reflector holds them.
    pub(super) fn checks(&self) -> Store<SondeCheck> {
        self.checks.clone()
    }

    /// Runs until the watches end (never, unless the client goes away).
    pub(super) async fn run(mut self, streams: Streams) {
        let Streams {
            pods: mut pod_events,
            checks: mut check_events,
            services: mut service_events,
            slices: mut slice_events,
        } = streams;
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        self.done_tx = done_tx;
        let (pods, checks) = (self.pods.clone(), self.checks.clone());
        let (services, slices) = (self.services.services.clone(), self.services.slices.clone());
        let listed = async move {
            // Errs only when a writer is dropped, i.e. its stream ended,
            // which ends this loop too.
            let _ = pods.wait_until_ready().await;
            let _ = checks.wait_until_ready().await;
            // Services are waited for a while, not for ever: a ClusterRole
            // without their rule must not hold up checks at Pods.
            let both = async {
                let _ = services.wait_until_ready().await;
                let _ = slices.wait_until_ready().await;
            };
            tokio::time::timeout(SERVICES_GRACE, both).await.is_ok()
        };
        let mut listed = std::pin::pin!(listed);
        let mut changes = self.results.subscribe();
        let mut reloads = self.control.reloads();
        let mut pulls = self.control.pulls_ended();
        let every = self.settings.message_refresh;
        let mut refresh = tokio::time::interval_at(Instant::now() + every, every);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self.wake.take();
            tokio::select! {
                services = &mut listed, if !self.ready => {
                    if services {
                        self.services_listed = (true, true);
                        self.services.ready.store(true, Ordering::Relaxed);
                    } else {
                        tracing::warn!(grace_s = SERVICES_GRACE.as_secs(), "Services and EndpointSlices not listed yet: serving gates; checks through a Service wait (does the ClusterRole allow services and discovery.k8s.io endpointslices list and watch?)");
                    }
                    self.ready = true;
                    self.reconcile_all().await;
                }
                ev = pod_events.next() => match ev {
                    Some(Ok(ev)) => self.on_pod(ev).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Pods failed; retrying with backoff (does the ClusterRole allow pods list and watch?)"),
                    None => break,
                },
                ev = check_events.next() => match ev {
                    Some(Ok(ev)) => self.on_check(ev).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching SondeChecks failed; retrying with backoff (is the CRD installed? does the ClusterRole allow sondechecks list and watch?)"),
                    None => break,
                },
                ev = service_events.next() => match ev {
                    Some(Ok(ev)) => self.on_service(ev, true).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Services failed; retrying with backoff (does the ClusterRole allow services list and watch?)"),
                    None => break,
                },
                ev = slice_events.next() => match ev {
                    Some(Ok(ev)) => self.on_service(ev, false).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching EndpointSlices failed; retrying with backoff (does the ClusterRole allow discovery.k8s.io endpointslices list and watch?)"),
                    None => break,
                },
                change = changes.recv() => match change {
                    Ok(c) => self.on_change(&c).await,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "fell behind the state changes; re-reading every gate's state");
                        self.resync_states();
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                r = reloads.changed() => {
                    if r.is_err() {
                        break;
                    }
                    // A reload replaced the registry without the gates' probes.
                    self.bindings.clear();
                    self.reconcile_all().await;
                }
                ended = pulls.recv() => match ended {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.on_pull_ended().await,
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                Some(done) = done_rx.recv() => self.on_done(done),
                _ = refresh.tick() => self.refresh_messages(),
                () = sleep_until(wake), if wake.is_some() => {}
            }
            self.pump();
        }
    }

    /// A Pod event, after its reflector stored it.
    async fn on_pod(&mut self, ev: Event<Pod>) {
        match ev {
            Event::Init | Event::InitApply(_) => {}
            Event::InitDone => {
                // A (re-)list: the store holds what the API server has now,
                // newer than anything written before it.
                self.written.clear();
                let pods = self.pods.clone();
                self.pending.retain(|key, p| {
                    pods.get(&pod_ref(key))
                        .is_some_and(|pod| pod.metadata.uid.as_deref() == Some(p.uid.as_str()))
                });
                self.reconcile_all().await;
            }
            Event::Apply(pod) | Event::Delete(pod) => {
                let Some(key) = key_of(&pod) else { return };
                self.written.remove(&key);
                if let Some(p) = self.pending.get(&key)
                    && Some(p.uid.as_str())
                        != self
                            .pods
                            .get(&pod_ref(&key))
                            .and_then(|p| p.metadata.uid.clone())
                            .as_deref()
                {
                    // Gone, or recreated under the same name: nothing of the old one's is written.
                    self.pending.remove(&key);
                }
                self.reconcile_pod(&key).await;
            }
        }
    }

    /// A SondeCheck event, after its reflector stored it.
    async fn on_check(&mut self, ev: Event<SondeCheck>) {
        match ev {
            Event::Init | Event::InitApply(_) => {}
            Event::InitDone => {
                let checks = self.checks.clone();
                self.refusals
                    .retain(|(ns, name), _| checks.get(&ObjectRef::new(name).within(ns)).is_some());
                self.reconcile_all().await;
            }
            Event::Apply(c) => {
                if let Some(key) = key_of(&c) {
                    self.reconcile_check(&key).await;
                }
            }
            Event::Delete(c) => {
                if let Some(key) = key_of(&c) {
                    self.refusals.remove(&key);
                    self.reconcile_check(&key).await;
                }
            }
        }
    }

    /// A Service (`service`) or EndpointSlice event, after its reflector
    /// stored it: the checks through that Service are reconciled (all of
    /// them after a list).
    async fn on_service<K: reflector::Lookup + Resource>(&mut self, ev: Event<K>, service: bool) {
        let object = match ev {
            Event::Init | Event::InitApply(_) => return,
            Event::InitDone => {
                if service {
                    self.services_listed.0 = true;
                } else {
                    self.services_listed.1 = true;
                }
                if self.services_listed == (true, true) {
                    self.services.ready.store(true, Ordering::Relaxed);
                }
                return self.reconcile_all().await;
            }
            Event::Apply(o) | Event::Delete(o) => o,
        };
        let Some(namespace) = reflector::Lookup::namespace(&object).map(|n| n.into_owned()) else {
            return;
        };
        let service = match object.meta().labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)) {
            Some(name) => name.clone(),
            None => object.meta().name.clone().unwrap_or_default(),
        };
        let mut through: Vec<PodKey> = self
            .checks
            .state()
            .iter()
            .filter(|c| c.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .filter(|c| c.spec.service.as_ref().is_some_and(|s| s.name == service))
            .filter_map(|c| key_of(&**c))
            .collect();
        through.sort();
        for key in through {
            self.reconcile_check(&key).await;
        }
    }

    /// The Services as checks see them, for the status writer too.
    pub(super) fn services(&self) -> Services {
        self.services.clone()
    }

    /// The Pod `key` as the controller sees it: the store's, with the
    /// conditions written since its last watch event.
    fn view(&self, key: &PodKey) -> Option<PodView> {
        let pod = self.pods.get(&pod_ref(key))?;
        let mut view = PodView::of(&pod)?;
        if let Some(w) = self.written.get(key).filter(|w| w.uid == view.uid) {
            view.conditions
                .extend(w.conds.iter().map(|(t, c)| (t.clone(), c.clone())));
        }
        Some(view)
    }

    async fn reconcile_all(&mut self) {
        if !self.ready {
            return;
        }
        let mut keys: Vec<PodKey> = self.pods.state().iter().filter_map(|p| key_of(&**p)).collect();
        keys.extend(self.bindings.values().map(|b| b.pod.clone()));
        keys.sort();
        keys.dedup();
        for key in keys {
            self.reconcile_pod(&key).await;
        }
        self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        self.synced.send_replace(true);
    }

    async fn reconcile_check(&mut self, (namespace, name): &PodKey) {
        let mut keys: Vec<PodKey> = self
            .pods
            .state()
            .iter()
            .filter_map(|p| PodView::of(p))
            .filter(|p| &p.key.0 == namespace && p.gates.contains(name))
            .map(|p| p.key)
            .collect();
        keys.sort();
        for key in keys {
            self.reconcile_pod(&key).await;
        }
    }

    /// Brings the probes of Pod `key` in line with its gates and checks.
    async fn reconcile_pod(&mut self, key: &PodKey) {
        if !self.ready {
            return;
        }
        let pod = self.view(key);
        let checks = self.checks.clone();
        let namespace = key.0.clone();
        let lookup = move |name: &str| checks.get(&ObjectRef::new(name).within(&namespace));
        let started = |uid: &str, check: &str| self.started.contains(&(uid.to_string(), check.to_string()));
        let services = |name: &str| self.services.view(&key.0, name);
        let plan = plan_pod(&PodInputs {
            key,
            pod: pod.as_ref(),
            checks: &lookup,
            services: &services,
            settings: &self.settings,
            bindings: &self.bindings,
            started: &started,
        });
        self.apply_plan(key, pod.as_ref(), plan).await;
    }

    /// Performs `plan` for Pod `key` (`pod`): the registry changes, the
    /// Events, the conditions of gates that have no probe.
    async fn apply_plan(&mut self, key: &PodKey, pod: Option<&PodView>, plan: PodPlan) {
        let uid = pod.map(|p| p.uid.clone()).unwrap_or_default();
        for check in plan.started {
            self.started.insert((uid.clone(), check));
        }
        for (annotation, message) in plan.unknown_overrides {
            if self.overrides_reported.insert((uid.clone(), annotation))
                && let Some(pod) = pod
            {
                let about = pod_reference(&pod.key.0, &pod.key.1, &pod.uid);
                self.events.record(about, true, "UnknownOverride", &message);
            }
        }
        for (check, message) in &plan.refused_checks {
            self.note(check, "Refused", true, message);
        }
        self.stats.refused.fetch_add(plan.refusals, Ordering::Relaxed);
        for name in &plan.remove {
            self.remove_probe(name).await;
        }
        let mut unavailable = plan.unavailable;
        for bad in plan.bad {
            let message = messages(&bad.errors);
            self.refused(&bad.check, key, &message, bad.replaces, &bad.name).await;
            unavailable.push((bad.check, message));
        }
        for add in plan.add {
            if let Some(gate) = self.add_probe(key, &uid, add).await {
                unavailable.push(gate);
            }
        }
        self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        if pod.is_some_and(|p| !p.gone) {
            for (check, message) in unavailable {
                self.want(key, &uid, &condition_type(&check), Cond::unavailable(&message));
            }
        }
    }

    /// Adds (or replaces) the probe of one gate; the gate and why, when it
    /// has none after all.
    async fn add_probe(&mut self, key: &PodKey, uid: &str, add: AddProbe) -> Option<(String, String)> {
        let AddProbe {
            name,
            check,
            desired,
            target,
            replaces,
            seed,
            oci,
        } = add;
        let change = Change {
            remove: if replaces { vec![name.as_str().into()] } else { vec![] },
            add: vec![target],
        };
        // The state already on the Pod: no write until a threshold is crossed again.
        self.results.seed(&name, seed);
        match self.apply(change).await {
            Ok(()) => {
                let binding = Binding {
                    pod: key.clone(),
                    uid: uid.to_string(),
                    check,
                    target: desired.target,
                    mode: desired.mode,
                };
                self.bindings.insert(name, binding);
                None
            }
            Err(Applied::Pulling(message)) => {
                // Never waited for: the gate says so, the pull goes on in
                // the background, and its end brings this Pod back.
                self.retry_pods.insert(key.clone());
                if replaces {
                    self.remove_probe(&name).await;
                }
                if let Some(c) = self.check(key, &check) {
                    self.note(&c, "PluginPulling", false, &message);
                }
                Some((check, message))
            }
            Err(Applied::Refused(errors)) => {
                if oci {
                    // A failed pull is tried again when its backoff passes.
                    self.retry_pods.insert(key.clone());
                }
                let message = messages(&errors);
                self.refused(&check, key, &message, replaces, &name).await;
                Some((check, message))
            }
        }
    }

    fn check(&self, (namespace, _): &PodKey, name: &str) -> Option<Arc<SondeCheck>> {
        self.checks.get(&ObjectRef::new(name).within(namespace))
    }

    /// A gate's probe the registry refused: the Event on its SondeCheck,
    /// and the old probe (if any) removed.
    async fn refused(&mut self, check: &str, key: &PodKey, message: &str, replaces: bool, name: &str) {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        if replaces {
            self.remove_probe(name).await;
        }
        if let Some(c) = self.check(key, check) {
            self.note(&c, "Refused", true, message);
        }
    }

    /// Removes probe `name` from the registry and forgets it; a failure is
    /// logged and counted.
    async fn remove_probe(&mut self, name: &str) {
        if let Err(e) = self.control.apply_change(Change::remove([name])).await {
            self.stats.change_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(probe = name, error = %e, "kubernetes: cannot remove a gate's probe");
        } else {
            self.stats.changes.fetch_add(1, Ordering::Relaxed);
        }
        self.bindings.remove(name);
    }

    /// Records an Event on SondeCheck `c`, once per message.
    fn note(&mut self, c: &SondeCheck, reason: &str, warning: bool, message: &str) {
        let key = (c.namespace().unwrap_or_default(), c.name_any());
        if self.refusals.get(&key).map(String::as_str) == Some(message) {
            return;
        }
        tracing::warn!(namespace = %key.0, check = %key.1, event = reason, message = %message, "SondeCheck not applied");
        self.refusals.insert(key, message.to_string());
        self.events.record(c.object_ref(&()), warning, reason, message);
    }

    async fn apply(&mut self, change: Change) -> Result<(), Applied> {
        match self.control.apply_change(change).await {
            Ok(_) => {
                self.stats.changes.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(ChangeError::Invalid(e)) => Err(Applied::Refused(e)),
            Err(e @ ChangeError::Pulling(_)) => Err(Applied::Pulling(e.to_string())),
        }
    }

    /// A pull ended, or its backoff passed: the Pods whose gates waited on
    /// one, or whose pull failed, are reconciled again.
    async fn on_pull_ended(&mut self) {
        let mut pods: Vec<PodKey> = self.retry_pods.drain().collect();
        pods.sort();
        for key in pods {
            self.reconcile_pod(&key).await;
        }
    }

    async fn on_change(&mut self, c: &StateChange) {
        let Some(b) = self.bindings.get(&*c.probe).cloned() else {
            return;
        };
        let timed_out = self
            .results
            .get(&c.probe)
            .and_then(|v| v.last)
            .is_some_and(|o| o.result.reason == Some(Reason::Timeout));
        let cond = Cond::of_state(c.to, timed_out, &c.message);
        if let Some(pod) = self.view(&b.pod)
            && c.to != Status::Unknown
        {
            let message = format!("{}: {}", b.check, cond.message);
            let about = pod_reference(&pod.key.0, &pod.key.1, &pod.uid);
            self.events
                .record(about, cond.status == CondStatus::False, &cond.reason, &message);
        }
        let passed = cond.status == CondStatus::True;
        self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
        if b.mode == Mode::StartupOnly && passed {
            // Set once and left: the probe goes, the condition stays.
            self.started.insert((b.uid.clone(), b.check.clone()));
            self.remove_probe(&c.probe).await;
            self.stats.probes.store(self.bindings.len() as u64, Ordering::Relaxed);
        }
    }

    /// After missed state changes: every gate's condition from its probe's state.
    fn resync_states(&mut self) {
        let all: Vec<(String, Binding)> = self.bindings.iter().map(|(n, b)| (n.clone(), b.clone())).collect();
        for (name, b) in all {
            let Some(view) = self.results.get(&name) else { continue };
            if view.stale {
                continue;
            }
            let (timed_out, message) = view.last.as_ref().map_or((false, String::new()), |o| {
                (o.result.reason == Some(Reason::Timeout), o.result.message.clone())
            });
            let cond = Cond::of_state(view.state, timed_out, &message);
            self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
        }
    }

    /// Each gate whose status holds takes the message of its probe's
    /// latest run (see [`Cond::latest`]): `kubectl describe pod` says why
    /// now, not why when the status last flipped. Called every
    /// `kubernetes.message_refresh`, so a Pod gets at most one such write
    /// per period (its gates' changes share one patch), and none while the
    /// messages are the same.
    fn refresh_messages(&mut self) {
        let all: Vec<(String, Binding)> = self.bindings.iter().map(|(n, b)| (n.clone(), b.clone())).collect();
        for (name, b) in all {
            let Some(view) = self.results.get(&name).filter(|v| !v.stale) else {
                continue;
            };
            if let Some(cond) = view.last.as_ref().and_then(|o| Cond::latest(view.state, &o.result)) {
                self.want(&b.pod, &b.uid, &condition_type(&b.check), cond);
            }
        }
    }

    /// Queues `cond` for gate `ctype` of Pod `key` (of `uid`), replacing
    /// what was queued; nothing when the Pod has it already.
    fn want(&mut self, key: &PodKey, uid: &str, ctype: &str, cond: Cond) {
        let on_pod = self
            .view(key)
            .filter(|p| p.uid == uid)
            .and_then(|p| p.conditions.get(ctype).cloned());
        let same = on_pod.as_ref() == Some(&cond);
        let p = self
            .pending
            .entry(key.clone())
            .or_insert_with(|| PendingWrite::new(uid));
        if p.uid != uid {
            *p = PendingWrite::new(uid);
        }
        if same {
            p.conds.remove(ctype);
        } else {
            p.conds.insert(ctype.to_string(), cond);
            if !self.order.contains(key) {
                self.order.push_back(key.clone());
            }
        }
        if p.conds.is_empty() && !self.in_flight.contains(key) {
            self.pending.remove(key);
        }
    }

    /// Sends what is due, as the rate limit allows.
    fn pump(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.order.len() {
            let key = self.order[i].clone();
            if self.in_flight.contains(&key) {
                i += 1;
                continue;
            }
            let Some(p) = self.pending.get(&key) else {
                self.order.remove(i);
                continue;
            };
            if let Some(t) = p.not_before
                && t > now
            {
                self.wake = Some(self.wake.map_or(t, |w| w.min(t)));
                i += 1;
                continue;
            }
            let Some(pod) = self.view(&key).filter(|pod| pod.uid == p.uid) else {
                // The Pod went (or came back as another): nothing to write.
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            };
            let diffs = differences(&pod, &p.conds);
            if diffs.is_empty() {
                self.pending.remove(&key);
                self.order.remove(i);
                continue;
            }
            if let Err(at) = self.bucket.take(now) {
                self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
                break;
            }
            let uid = p.uid.clone();
            self.order.remove(i);
            self.in_flight.insert(key.clone());
            self.send(key, uid, diffs);
        }
    }

    fn send(&self, key: PodKey, uid: String, diffs: Vec<(String, Cond, bool)>) {
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let conds: Vec<(&str, &Cond, bool)> = diffs.iter().map(|(t, c, f)| (t.as_str(), c, *f)).collect();
        let body = patch_body(&uid, &conds, &now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let tx = self.done_tx.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            stats.patch_attempts.fetch_add(1, Ordering::Relaxed);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let result = api
                .patch_status(&key.1, &params, &Patch::Strategic(&body))
                .await
                .map(|_| ());
            let outcome = Outcome::of(&result);
            let sent = diffs.into_iter().map(|(t, c, _)| (t, c)).collect();
            // The controller gone, nobody is left to tell.
            let _ = tx.send(Done {
                pod: key,
                uid,
                sent,
                outcome,
            });
        });
    }

    fn on_done(&mut self, done: Done) {
        self.in_flight.remove(&done.pod);
        match &done.outcome {
            Outcome::Written => self.on_written(&done),
            Outcome::Gone => {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(namespace = %done.pod.0, pod = %done.pod.1, "the Pod is gone (or was recreated); its condition is not written");
                if self.pending.get(&done.pod).is_some_and(|p| p.uid == done.uid) {
                    self.pending.remove(&done.pod);
                }
            }
            Outcome::Forbidden(m) | Outcome::Retry(m) => self.on_failed(&done, m),
        }
        if let Some(p) = self.pending.get(&done.pod) {
            if p.conds.is_empty() {
                self.pending.remove(&done.pod);
            } else if !self.order.contains(&done.pod) {
                self.order.push_back(done.pod.clone());
            }
        }
    }

    fn on_written(&mut self, done: &Done) {
        self.stats.patches.fetch_add(1, Ordering::Relaxed);
        let on_pod = self.pods.get(&pod_ref(&done.pod));
        if on_pod.is_some_and(|p| p.metadata.uid.as_deref() == Some(done.uid.as_str())) {
            let w = self.written.entry(done.pod.clone()).or_insert_with(|| Written {
                uid: done.uid.clone(),
                conds: BTreeMap::new(),
            });
            if w.uid != done.uid {
                w.uid = done.uid.clone();
                w.conds.clear();
            }
            w.conds.extend(done.sent.iter().cloned());
        }
        if let Some(p) = self.pending.get_mut(&done.pod) {
            p.attempts = 0;
            p.not_before = None;
            // What changed meanwhile stays queued (latest wins).
            p.conds
                .retain(|t, c| !done.sent.iter().any(|(st, sc)| st == t && sc == c));
        }
    }

    fn on_failed(&mut self, done: &Done, message: &str) {
        let (namespace, name) = &done.pod;
        let forbidden = matches!(done.outcome, Outcome::Forbidden(_));
        if forbidden {
            self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
        } else {
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
        let Some(p) = self.pending.get_mut(&done.pod) else {
            return;
        };
        p.attempts += 1;
        let wait = backoff(&done.outcome, p.attempts);
        p.not_before = Some(Instant::now() + wait);
        if forbidden {
            tracing::error!(%namespace, pod = %name, error = %message, retry_in_s = wait.as_secs(), "writing the gate condition was forbidden: check the ClusterRole (pods/status patch) and the admission policy (own node only)");
        } else {
            tracing::warn!(%namespace, pod = %name, error = %message, retry_in_ms = wait.as_millis() as u64, "writing the gate condition failed; retrying");
        }
    }
}

/// The queued conditions that differ from `pod`'s, each with whether its
/// status flips.
fn differences(pod: &PodView, queued: &BTreeMap<String, Cond>) -> Vec<(String, Cond, bool)> {
    queued
        .iter()
        .filter(|(t, c)| pod.conditions.get(*t) != Some(*c))
        .map(|(t, c)| {
            let flip = pod.conditions.get(t).is_none_or(|old| old.status != c.status);
            (t.clone(), c.clone(), flip)
        })
        .collect()
}

/// The store's key of Pod `key`.
fn pod_ref((namespace, name): &PodKey) -> ObjectRef<Pod> {
    ObjectRef::new(name).within(namespace)
}

/// The namespace and name of `object`.
fn key_of<K: reflector::Lookup>(object: &K) -> Option<PodKey> {
    let namespace = reflector::Lookup::namespace(object)?;
    let name = reflector::Lookup::name(object)?;
    Some((namespace.into_owned(), name.into_owned()))
}

/// Sleeps until `at`; forever without one.
pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store keeps only what the controller reads, and the view of a
    /// trimmed Pod is the view of the whole one.
    #[test]
    fn a_trimmed_pod_keeps_its_view_and_nothing_else() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web-1", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "web"},
                         "annotations": {"sonde.dev/ready.port": "9090", "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(10_000)},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "node-1", "readinessGates": [{"conditionType": "sonde.dev/ready"}],
                     "volumes": [{"name": "v", "emptyDir": {}}],
                     "containers": [{"name": "app", "image": "app", "env": [{"name": "SECRET", "value": "s"}],
                                     "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9000}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}],
                       "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": true, "restartCount": 0}],
                       "conditions": [{"type": "sonde.dev/ready", "status": "True"}, {"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        let before = PodView::of(&pod).unwrap();
        let size = serde_json::to_string(&pod).unwrap().len();
        trim_pod(&mut pod);
        assert_eq!(PodView::of(&pod).unwrap(), before);
        let kept = serde_json::to_value(&pod).unwrap();
        assert!(kept.to_string().len() < size / 10, "{kept}");
        assert_eq!(
            kept["metadata"]["annotations"],
            serde_json::json!({"sonde.dev/ready.port": "9090"})
        );
        assert!(kept["metadata"].get("labels").is_none() && kept["metadata"].get("managedFields").is_none());
        assert!(kept["spec"].get("volumes").is_none() && kept["spec"]["containers"][0].get("env").is_none());
        assert!(kept["status"].get("containerStatuses").is_none());
        assert_eq!(kept["status"]["conditions"].as_array().unwrap().len(), 1);
        assert_eq!(
            kept["metadata"]["resourceVersion"], "7",
            "the reflector resumes its watch from it"
        );
    }
}
