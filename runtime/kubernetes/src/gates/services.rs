//! The Services and EndpointSlices the controller follows, for checks
//! through a Service: their reflectors keep only what a check reads
//! ([`trim_service`], [`trim_slice`]), and [`Services::view`] is a Service
//! as such a check sees it.

use crate::desired::{Refusal, ServiceView};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

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
    /// The Services, trimmed.
    pub(crate) services: Store<Service>,
    /// The EndpointSlices of Services, trimmed.
    pub(crate) slices: Store<EndpointSlice>,
    /// Both have listed once.
    pub(crate) ready: Arc<std::sync::atomic::AtomicBool>,
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
