//! Kubernetes Events the agent records: one on a Pod per gate transition,
//! one on a SondeCheck refused (naming what was refused). Events are
//! best-effort: rate-limited apart from condition writes, dropped (and
//! counted) past the limit, never retried.

use super::writer::TokenBucket;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The component Events are reported by.
pub const COMPONENT: &str = "sonde";

/// What an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    /// `Pod` or `SondeCheck`.
    pub kind: &'static str,
    /// `v1` or `sonde.dev/v1alpha1`.
    pub api_version: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// Records Events, within a rate.
pub struct Recorder {
    client: kube::Client,
    node: String,
    bucket: TokenBucket,
    /// Events sent.
    pub sent: Arc<AtomicU64>,
    /// Events dropped past the rate.
    pub dropped: Arc<AtomicU64>,
}

impl Recorder {
    /// A recorder of `node`'s agent, at most `qps` Events a second after a
    /// `burst`.
    pub fn new(client: kube::Client, node: &str, qps: f64, burst: u32) -> Self {
        Self {
            client,
            node: node.to_string(),
            bucket: TokenBucket::new(qps, burst),
            sent: Arc::default(),
            dropped: Arc::default(),
        }
    }

    /// Records an Event on `about` (`warning` or normal), in the background.
    pub fn record(&mut self, about: &Subject, warning: bool, reason: &str, message: &str) {
        if self.bucket.take(tokio::time::Instant::now()).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(namespace = %about.namespace, name = %about.name, reason, "event dropped: over the rate");
            return;
        }
        let event = build(
            about,
            &self.node,
            warning,
            reason,
            message,
            k8s_openapi::jiff::Timestamp::now(),
        );
        let api: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), &about.namespace);
        let sent = self.sent.clone();
        tokio::spawn(async move {
            match api.create(&kube::api::PostParams::default(), &event).await {
                Ok(_) => {
                    sent.fetch_add(1, Ordering::Relaxed);
                    crate::metrics::kubernetes_writes().written("event");
                }
                Err(e) => {
                    crate::metrics::kubernetes_writes().failed("event", "error");
                    tracing::warn!(error = %e, "cannot record a Kubernetes Event; does the ClusterRole allow events create?")
                }
            }
        });
    }
}

/// The Event itself (core/v1, which `kubectl describe` shows).
pub fn build(
    about: &Subject,
    node: &str,
    warning: bool,
    reason: &str,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", about.name)),
            namespace: Some(about.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some(about.kind.into()),
            api_version: Some(about.api_version.into()),
            namespace: Some(about.namespace.clone()),
            name: Some(about.name.clone()),
            uid: Some(about.uid.clone()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some("sonde.dev/agent".into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some("Check".into()),
        count: Some(1),
        ..Event::default()
    }
}
