//! Tenants for namespaces without hand-written entries: the agent watches
//! the Namespaces labelled `sonde.dev/tenant-template` (a label selector,
//! so a cluster's other namespaces are never sent) and hands the set
//! {namespace → label value} to [`Control::set_labelled_namespaces`],
//! which loads the config again with a tenant made from the named
//! `kubernetes.namespace_templates` entry for each one that has no
//! explicit tenant or mapping ([`sonde_core::catalog::settings::generate`]).
//!
//! A burst of Namespace events (a cluster admin labelling a hundred
//! namespaces) costs one load per [`MIN_INTERVAL`] at most: the last set
//! seen wins ([`Coalesce`]). Only who may update Namespaces (cluster
//! admins) can set the label; a namespace's own users cannot.
//!
//! The gate controller serves no gate before the first set is in force
//! (`super::spawn`), so an agent that restarts never refuses a templated
//! namespace's gates for the moment before it has listed the Namespaces.

use super::writer::sleep_until;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use sonde_core::catalog::settings::TEMPLATE_LABEL;
use sonde_core::control::Control;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The shortest time between two loads for Namespace changes.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps only what is read of a Namespace: its name, resource version
/// and the template label.
fn trim_namespace(ns: &mut Namespace) {
    let meta = std::mem::take(&mut ns.metadata);
    let labels: BTreeMap<String, String> = meta
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k == TEMPLATE_LABEL)
        .collect();
    ns.metadata = ObjectMeta {
        name: meta.name,
        resource_version: meta.resource_version,
        labels: (!labels.is_empty()).then_some(labels),
        ..ObjectMeta::default()
    };
    ns.spec = None;
    ns.status = None;
}

/// The labelled namespaces in `store`, each with its label's value.
fn labelled(store: &Store<Namespace>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .filter_map(|ns| {
            let name = ns.metadata.name.clone()?;
            let template = ns.metadata.labels.as_ref()?.get(TEMPLATE_LABEL)?.clone();
            Some((name, template))
        })
        .collect()
}

/// The latest set to hand on, sent at most once per interval, and never
/// twice the same.
#[derive(Debug)]
pub(crate) struct Coalesce<T> {
    interval: Duration,
    last_sent_at: Option<Instant>,
    sent: Option<T>,
    pending: Option<T>,
}

impl<T: PartialEq> Coalesce<T> {
    /// Nothing sent yet: the first offer is due at once.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_sent_at: None,
            sent: None,
            pending: None,
        }
    }

    /// `value` is the latest: it replaces what waits (nothing waits when
    /// it is what was sent last).
    pub(crate) fn offer(&mut self, value: T) {
        self.pending = (self.sent.as_ref() != Some(&value)).then_some(value);
    }

    /// When what waits may be sent; `None` when nothing waits.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.pending.as_ref()?;
        Some(self.last_sent_at.map_or_else(Instant::now, |t| t + self.interval))
    }

    /// What waits, if it is due at `now`, remembered as sent.
    pub(crate) fn take(&mut self, now: Instant) -> Option<T>
    where
        T: Clone,
    {
        if self.last_sent_at.is_some_and(|t| t + self.interval > now) {
            return None;
        }
        let value = self.pending.take()?;
        self.last_sent_at = Some(now);
        self.sent = Some(value.clone());
        Some(value)
    }
}

/// Follows the labelled Namespaces until the watch ends (never, unless the
/// client goes away), handing each new set to `control`; `synced` turns
/// true once the first list is in force.
pub(super) async fn follow(client: kube::Client, control: Arc<Control>, synced: watch::Sender<bool>) {
    let (store, writer) = reflector::store();
    let events = watcher::watcher(
        Api::<Namespace>::all(client),
        watcher::Config::default().labels(TEMPLATE_LABEL),
    )
    .default_backoff()
    .modify(trim_namespace)
    .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut coalesce = Coalesce::new(MIN_INTERVAL);
    let mut listed = false;
    loop {
        let due = coalesce.due();
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(Event::InitDone)) => {
                    listed = true;
                    coalesce.offer(labelled(&store));
                    if coalesce.due().is_none() {
                        // The same set as before a re-list: nothing to load.
                        synced.send_replace(true);
                    }
                }
                Some(Ok(Event::Apply(_) | Event::Delete(_))) if listed => coalesce.offer(labelled(&store)),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "watching Namespaces failed; retrying with backoff (does the ClusterRole allow namespaces list and watch? no gate is served until they are listed)"),
                None => break,
            },
            () = sleep_until(due), if due.is_some() => {
                if let Some(set) = coalesce.take(Instant::now()) {
                    tracing::debug!(namespaces = set.len(), "kubernetes: labelled namespaces");
                    control.set_labelled_namespaces(set).await;
                    synced.send_replace(true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of sets within the interval goes out as its last one, one
    /// interval after the previous send; a set equal to the last sent is
    /// not sent again.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_one_send_per_interval_of_the_latest_set() {
        let mut c = Coalesce::new(MIN_INTERVAL);
        assert_eq!(c.due(), None, "nothing offered, nothing due");
        let t0 = Instant::now();
        c.offer(1);
        assert_eq!(c.due(), Some(t0), "the first set goes at once");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            c.take(t0),
            Some(1),
            "and is taken whenever asked, even at a time read before its due time was"
        );
        for n in 2..=50 {
            tokio::time::advance(Duration::from_millis(10)).await;
            c.offer(n);
            assert_eq!(c.take(Instant::now()), None, "within the interval: held");
        }
        let due = c.due().expect("the latest waits");
        assert_eq!(due, t0 + MIN_INTERVAL, "one interval after the first send");
        tokio::time::sleep_until(due).await;
        assert_eq!(c.take(Instant::now()), Some(50), "the last of the burst, once");
        assert_eq!(c.take(Instant::now()), None);
        tokio::time::advance(MIN_INTERVAL * 3).await;
        c.offer(50);
        assert_eq!(c.due(), None, "what was sent last is not sent again");
        c.offer(7);
        c.offer(50);
        assert_eq!(c.due(), None, "a change undone before it was sent is nothing");
        c.offer(8);
        assert_eq!(c.take(Instant::now()), Some(8), "past the interval: at once");
    }

    #[test]
    fn a_trimmed_namespace_keeps_its_name_and_the_template_label_only() {
        let mut ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "team-a", "resourceVersion": "3", "uid": "u",
                         "labels": {TEMPLATE_LABEL: "small", "kubernetes.io/metadata.name": "team-a"},
                         "annotations": {"x": "y".repeat(1000)}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"}
        }))
        .unwrap();
        trim_namespace(&mut ns);
        assert_eq!(
            serde_json::to_value(&ns).unwrap(),
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "team-a", "resourceVersion": "3", "labels": {TEMPLATE_LABEL: "small"}}})
        );
    }
}
