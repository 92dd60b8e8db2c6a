//! The Pod-gate controller: one task that follows this node's Pods and every
//! SondeCheck through kube-runtime reflectors, keeps one probe per (Pod,
//! gate) in the catalog through incremental changes, turns probe state
//! changes into gate conditions and writes them through a per-Pod
//! latest-wins queue under the agent-wide rate limit.
//!
//! The reflectors' [`Store`]s are the only copies of the Pods and checks;
//! the Pods are trimmed before they are stored to what the controller
//! reads ([`trim_pod`]). Reconciling a Pod is a pure [`plan_pod`] and an
//! applier ([`Reconciler::apply_plan`]) that performs it and reports every
//! error (logged and counted in [`Stats`]).
//!
//! The pure parts sit beside it: reconciling one Pod is `plan`, the
//! per-Pod write queue `queue`, the Services and EndpointSlices a check's
//! target names `services`. Performing a plan is in `apply`; probe states
//! becoming gate conditions, queued and written, in `conditions`; the
//! Secrets of a Pod's checks in `secrets`.
//!
//! All state lives in the one task ([`Reconciler`]); API calls run in
//! spawned tasks that report back on a channel, so the task never waits on
//! the API server while it could be taking a watch event or a result.

use self::plan::{Binding, PodInputs, plan_pod};
use self::queue::{Done, WriteQueue};
use self::services::{SERVICE_NAME_LABEL, Services, trim_service, trim_slice};
use super::crd::SecretRef;
use super::crd::SondeCheck;
use super::events::EventSink;
use super::secrets::{CellKey, Held, SecretBook};
use super::settings::GateSettings;
use super::stats::Stats;
use super::view::{PodKey, PodView, trim_pod};
use super::writer::sleep_until;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use sonde_core::control::Control;
use sonde_core::results::ResultCache;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

mod apply;
mod conditions;
pub(crate) mod plan;
mod queue;
mod secrets;
pub(crate) mod services;

/// How long the first gates wait for the Services and EndpointSlices to
/// list before they are served without them.
const SERVICES_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// The gate conditions waiting to be written, and those written.
    writes: WriteQueue,
    wake: Option<Instant>,
    events: EventSink,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Which of the Service and EndpointSlice stores have listed once
    /// (checks at Pods do not wait on them).
    services_listed: (bool, bool),
    /// Both stores have listed once.
    ready: bool,
    synced: watch::Sender<bool>,
    /// The Secrets of the checks this node's Pods name, and their cells.
    secrets: SecretBook,
    /// Where reads of Secrets report.
    secret_tx: mpsc::UnboundedSender<secrets::SecretRead>,
    /// When the references no Pod needs any more are next dropped.
    secret_sweep: Instant,
    /// What the last Event on each (namespace, check, secretRef) said: the
    /// problem's message, or `None` when it had its value.
    secret_events: HashMap<(String, String, String), Option<String>>,
}

/// The two reflectors' streams, which fill the stores as they are polled.
type Reflected<K> = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

impl Reconciler {
    /// A controller writing through `client` and changing the catalog
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
        let (secret_tx, _) = mpsc::unbounded_channel();
        let events = EventSink::new(
            client.clone(),
            &settings.node_name,
            settings.qps,
            settings.burst,
            stats.clone(),
        );
        let writes = WriteQueue::new(settings.qps, settings.burst);
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
            bindings: HashMap::new(),
            started: HashSet::new(),
            refusals: HashMap::new(),
            retry_pods: HashSet::new(),
            overrides_reported: HashSet::new(),
            writes,
            wake: None,
            events,
            done_tx,
            services_listed: (false, false),
            ready: false,
            synced,
            secrets: SecretBook::default(),
            secret_tx,
            secret_sweep: Instant::now(),
            secret_events: HashMap::new(),
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
        let (secret_tx, mut secret_rx) = mpsc::unbounded_channel();
        self.secret_tx = secret_tx;
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
            let read_secrets = self.secrets.next_due();
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
                    // A reload replaced the catalog without the gates' probes.
                    self.bindings.clear();
                    self.reconcile_all().await;
                }
                ended = pulls.recv() => match ended {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => self.on_pull_ended().await,
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                Some(done) = done_rx.recv() => self.on_done(done),
                Some(read) = secret_rx.recv() => self.on_secret_read(read).await,
                () = sleep_until(read_secrets), if read_secrets.is_some() => self.start_secret_reads(),
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
                let pods = self.pods.clone();
                self.writes
                    .on_relist(|key| pods.get(&pod_ref(key)).and_then(|pod| pod.metadata.uid.clone()));
                self.reconcile_all().await;
            }
            Event::Apply(pod) | Event::Delete(pod) => {
                let Some(key) = key_of(&pod) else { return };
                let stored = self.pods.get(&pod_ref(&key)).and_then(|p| p.metadata.uid.clone());
                // Gone, or recreated under the same name: nothing of the old one's is written.
                self.writes.on_pod_event(&key, stored.as_deref());
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
                    self.hurry_secrets(&c);
                    self.reconcile_check(&key).await;
                    self.start_secret_reads();
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
        self.writes.overlay(&mut view);
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
        let held = self.hold_secrets(pod.as_ref());
        let owner = self.settings.tenant_of(&key.0).unwrap_or_default().to_string();
        let secrets = |r: &SecretRef| {
            held.get(&CellKey::of(&key.0, &owner, r))
                .cloned()
                .unwrap_or(Held::Pending)
        };
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
            secrets: &secrets,
        });
        self.apply_plan(key, pod.as_ref(), plan).await;
        self.start_secret_reads();
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
