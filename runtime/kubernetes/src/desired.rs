//! The probe a (Pod, gate) pair maps to ([`desired`]): its name, tenant,
//! address and the config text the registry checks like any other
//! probe's; or why it has none ([`Refusal`]). Pure functions of the
//! settings, the Pod's view and the SondeCheck.

use crate::crd::{GATE_PREFIX, Mode, SelectorError, SondeCheck, check_selector};
use crate::expand::{PodIdentity, expand};
use crate::settings::GateSettings;
use crate::view::PodView;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sonde_core::config::ConfigErrors;
use sonde_core::tenants::DEFAULT_TENANT;
use std::net::IpAddr;

/// The name of the probe (and its target) of gate `check` of a Pod:
/// `k8s_<namespace>_<pod>_<check>` (`_` appears in none of them, so the
/// name is unambiguous), or, past the catalog's 128 bytes, a prefix and a
/// hash of the three.
pub(crate) fn probe_name(namespace: &str, pod: &str, check: &str) -> String {
    bounded_name(format!("k8s_{namespace}_{pod}_{check}"))
}

/// `full` as a catalog name: itself up to 128 bytes, else a prefix and a
/// hash of the whole.
pub(crate) fn bounded_name(full: String) -> String {
    if full.len() <= 128 {
        return full;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(full.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{hash}", &full[..128 - 17])
}

/// The probe a (Pod, gate) pair maps to.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Desired {
    /// The probe's and its target's name.
    pub name: String,
    /// Its tenant.
    pub tenant: String,
    /// The Pod's primary IP and the port.
    pub address: String,
    /// The whole target entry, as the config file would have it.
    pub target: serde_json::Value,
    /// The check's mode.
    pub mode: Mode,
}

/// Why a (Pod, gate) pair has no probe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// The namespace maps to no tenant.
    #[error("namespace {namespace:?} has no tenant: list it in the agent's kubernetes.namespaces")]
    NoTenant { namespace: String },
    /// The plugin is not on the allowlist.
    #[error("plugin {plugin:?} is not on the agent's allowlist (kubernetes.plugins)")]
    PluginNotAllowed { plugin: String },
    /// The port names no container port of the Pod.
    #[error("port {port:?} names no container port of the Pod")]
    NoSuchPort { port: String },
    /// A port number out of range.
    #[error("port {port} is not a port number (1-65535)")]
    BadPort { port: i64 },
    /// The check targets a Service the namespace does not have.
    #[error("service {service:?} does not exist in namespace {namespace:?}")]
    NoSuchService { namespace: String, service: String },
    /// The agent has not listed Services and EndpointSlices (yet): the
    /// watch is failing, most likely for want of RBAC.
    #[error(
        "the agent has not listed Services and EndpointSlices yet (does its ClusterRole allow services and discovery.k8s.io endpointslices list and watch?)"
    )]
    ServicesNotListed,
    /// The Service has no cluster IP to dial: headless (`clusterIP: None`)
    /// or `type: ExternalName`.
    #[error("service {service:?} has no cluster IP ({why}): a check through a Service dials its ClusterIP")]
    ServiceWithoutClusterIp { service: String, why: &'static str },
    /// The Service has no such port.
    #[error("service {service:?} has no port {port:?} (it has {has})")]
    NoSuchServicePort { service: String, port: String, has: String },
    /// Both or neither of `port` and `service` (an API server with the
    /// CRD's rules refuses it first).
    #[error("set exactly one of port and service")]
    PortOrService,
    /// A malformed `podSelector` (an API server with the CRD's schema
    /// refuses an unknown operator first).
    #[error(transparent)]
    InvalidPodSelector(#[from] SelectorError),
    /// Malformed `secretRefs` (an API server with the CRD's schema refuses
    /// them first).
    #[error(transparent)]
    InvalidSecretRefs(#[from] crate::secrets::RefsError),
}

impl Refusal {
    /// Whether the SondeCheck itself is refused (an Event goes on it),
    /// rather than its use by one Pod.
    pub(crate) fn of_check(&self) -> bool {
        matches!(
            self,
            Self::NoTenant { .. }
                | Self::PluginNotAllowed { .. }
                | Self::NoSuchService { .. }
                | Self::ServicesNotListed
                | Self::ServiceWithoutClusterIp { .. }
                | Self::NoSuchServicePort { .. }
                | Self::PortOrService
                | Self::InvalidPodSelector(_)
                | Self::InvalidSecretRefs(_)
        )
    }
}

/// What the controller needs of a Service ([`ServiceView::of`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ServiceView {
    /// Its cluster IPs, primary first; empty when it has none.
    pub cluster_ips: Vec<IpAddr>,
    /// Why it has no cluster IP: headless, or an ExternalName Service.
    pub no_cluster_ip: Option<&'static str>,
    /// Its ports: (name, port).
    pub ports: Vec<(Option<String>, u16)>,
    /// The endpoints ready to serve it, per address family of its primary
    /// cluster IP (from its EndpointSlices).
    pub ready_endpoints: usize,
}

impl ServiceView {
    /// The view of `service`, with `ready_endpoints` counted from its
    /// EndpointSlices.
    pub(crate) fn of(service: &k8s_openapi::api::core::v1::Service, ready_endpoints: usize) -> Self {
        let spec = service.spec.clone().unwrap_or_default();
        let external = spec.type_.as_deref() == Some("ExternalName");
        let mut ips: Vec<String> = spec.cluster_ips.unwrap_or_default();
        if ips.is_empty() {
            ips.extend(spec.cluster_ip);
        }
        let headless = ips.iter().any(|ip| ip == "None");
        let cluster_ips = if external || headless {
            Vec::new()
        } else {
            ips.iter().filter_map(|ip| ip.parse().ok()).collect()
        };
        let no_cluster_ip = if external {
            Some("type ExternalName")
        } else if headless {
            Some("headless, clusterIP: None")
        } else if cluster_ips.is_empty() {
            Some("none assigned yet")
        } else {
            None
        };
        let ports = spec
            .ports
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
            .filter_map(|p| Some((p.name, u16::try_from(p.port).ok()?)))
            .collect();
        Self {
            cluster_ips,
            no_cluster_ip,
            ports,
            ready_endpoints,
        }
    }

    /// The port `port` names (a number or a port's name).
    fn port(&self, service: &str, port: &IntOrString) -> Result<u16, Refusal> {
        let found = match port {
            IntOrString::Int(n) => self.ports.iter().find(|(_, p)| i64::from(*p) == i64::from(*n)),
            IntOrString::String(name) => self.ports.iter().find(|(n, _)| n.as_deref() == Some(name.as_str())),
        };
        found.map(|(_, p)| *p).ok_or_else(|| Refusal::NoSuchServicePort {
            service: service.to_string(),
            port: match port {
                IntOrString::Int(n) => n.to_string(),
                IntOrString::String(s) => s.clone(),
            },
            has: self
                .ports
                .iter()
                .map(|(n, p)| n.as_ref().map_or(p.to_string(), |n| format!("{n} ({p})")))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// The most attempts a run of the http plugin's `backend` check makes by
/// default (its own ceiling).
pub(crate) const MAX_BACKEND_ATTEMPTS: u64 = 60;

/// The attempts of a `backend` check through a Service when the config
/// names none: three per endpoint ready to serve it (at least three; the
/// Pod checked may not be one yet), as many as a balancer that spreads
/// connections needs to reach each endpoint with high probability.
pub(crate) fn default_attempts(ready_endpoints: usize) -> u64 {
    (ready_endpoints.max(1) as u64)
        .saturating_mul(3)
        .min(MAX_BACKEND_ATTEMPTS)
}

fn json_duration(secs: u32) -> serde_json::Value {
    format!("{secs}s").into()
}

/// Where a gate's probe connects: the address, the other addresses of the
/// same Pod or Service (other families) and, through a Service, how many
/// endpoints are ready to serve it.
struct Dial {
    address: std::net::SocketAddr,
    others: Vec<std::net::SocketAddr>,
    ready_endpoints: Option<usize>,
}

/// Where the probe of `check` connects for `pod`: the Pod's primary IP and
/// port, or the cluster IP and port of the Service the check names
/// (`services` looks one up in the Pod's namespace, or says why it
/// cannot). `Ok(None)` while the
/// Pod has no IP.
fn dial(
    pod: &PodView,
    check: &SondeCheck,
    services: &dyn Fn(&str) -> Result<ServiceView, Refusal>,
) -> Result<Option<Dial>, Refusal> {
    let spec = &check.spec;
    let check_name = check.metadata.name.as_deref().unwrap_or_default();
    match (&spec.port, &spec.service) {
        (Some(port), None) => {
            let override_key = format!("{GATE_PREFIX}{check_name}.port");
            let port = match pod.annotations.get(&override_key) {
                Some(p) => match p.trim().parse::<i64>() {
                    Ok(n) => IntOrString::Int(i32::try_from(n).unwrap_or(-1)),
                    Err(_) => IntOrString::String(p.trim().to_string()),
                },
                None => port.clone(),
            };
            let port: u16 = match port {
                IntOrString::Int(n) => u16::try_from(n)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or(Refusal::BadPort { port: n.into() })?,
                IntOrString::String(name) => *pod.ports.get(&name).ok_or(Refusal::NoSuchPort { port: name })?,
            };
            let Some(primary) = pod.ips.first() else {
                return Ok(None);
            };
            Ok(Some(Dial {
                address: std::net::SocketAddr::new(*primary, port),
                others: pod.ips[1..]
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(*ip, port))
                    .collect(),
                ready_endpoints: None,
            }))
        }
        (None, Some(service)) => {
            let view = services(&service.name)?;
            if let Some(why) = view.no_cluster_ip {
                return Err(Refusal::ServiceWithoutClusterIp {
                    service: service.name.clone(),
                    why,
                });
            }
            let port = view.port(&service.name, &service.port)?;
            if pod.ips.is_empty() {
                return Ok(None);
            }
            Ok(Some(Dial {
                address: std::net::SocketAddr::new(view.cluster_ips[0], port),
                others: view.cluster_ips[1..]
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(*ip, port))
                    .collect(),
                ready_endpoints: Some(view.ready_endpoints),
            }))
        }
        _ => Err(Refusal::PortOrService),
    }
}

/// The probe of gate `check` of `pod`: `Ok(None)` while the Pod has no IP
/// or is going away. `services` looks up a Service of the Pod's namespace
/// by name, for a check through a Service ([`Refusal::NoSuchService`] when
/// there is none).
pub(crate) fn desired(
    pod: &PodView,
    check: &SondeCheck,
    settings: &GateSettings,
    services: &dyn Fn(&str) -> Result<ServiceView, Refusal>,
) -> Result<Option<Desired>, Refusal> {
    let (namespace, pod_name) = &pod.key;
    let check_name = check.metadata.name.as_deref().unwrap_or_default();
    let tenant = settings.tenant_of(namespace).ok_or_else(|| Refusal::NoTenant {
        namespace: namespace.clone(),
    })?;
    let spec = &check.spec;
    if !settings.allows(&spec.plugin) {
        return Err(Refusal::PluginNotAllowed {
            plugin: spec.plugin.clone(),
        });
    }
    if let Some(selector) = &spec.pod_selector {
        check_selector(selector)?;
    }
    crate::secrets::check_refs(&spec.secret_refs)?;
    let Some(dial) = dial(pod, check, services)? else {
        return Ok(None);
    };
    if pod.gone {
        return Ok(None);
    }
    let address = dial.address.to_string();
    let name = probe_name(namespace, pod_name, check_name);
    // Whose gate it is: `$(POD_IP)` and the like in the check's config.
    let identity = PodIdentity {
        ip: pod.ips.first().map(ToString::to_string),
        ipv4: pod.ips.iter().find(|ip| ip.is_ipv4()).map(ToString::to_string),
        ipv6: pod.ips.iter().find(|ip| ip.is_ipv6()).map(ToString::to_string),
        name: pod_name.clone(),
        namespace: namespace.clone(),
        node: Some(settings.node_name.clone()),
    };
    let mut config = spec.config.clone().unwrap_or_else(|| serde_json::json!({}));
    // Through a Service, the built-in http plugin's backend check makes by
    // default three attempts per ready endpoint.
    if let Some(ready) = dial.ready_endpoints
        && spec.plugin == "http"
        && let Some(backend) = config.get_mut("backend").and_then(|b| b.as_object_mut())
    {
        backend
            .entry("attempts")
            .or_insert_with(|| default_attempts(ready).into());
    }
    let mut probe = serde_json::json!({
        "name": name,
        "kind": "readiness",
        "plugin": spec.plugin,
        "config": expand(&config, &identity),
        "period": json_duration(spec.period_seconds),
        "initial_delay": json_duration(spec.initial_delay_seconds),
        "timeout": json_duration(spec.timeout_seconds),
        "success_threshold": spec.success_threshold,
        "failure_threshold": spec.failure_threshold,
        "labels": { "namespace": namespace, "pod": pod_name, "check": check_name },
    });
    // The Pod's (or the Service's) other families are its own too; the
    // secretRefs are the check's secrets.
    let others: Vec<String> = dial.others.iter().map(ToString::to_string).collect();
    let mut grants = serde_json::Map::new();
    if !others.is_empty() {
        grants.insert("net".into(), others.into());
    }
    if !spec.secret_refs.is_empty() {
        let names: Vec<&str> = spec.secret_refs.iter().map(|r| r.name.as_str()).collect();
        grants.insert("secrets".into(), names.into());
    }
    if !grants.is_empty() {
        probe["grants"] = grants.into();
    }
    if let Some(l) = &spec.limits {
        let mut limits = serde_json::Map::new();
        if let Some(f) = l.fuel {
            limits.insert("fuel".into(), f.into());
        }
        if let Some(m) = &l.memory {
            limits.insert("memory".into(), m.clone().into());
        }
        probe["limits"] = limits.into();
    }
    let mut target = serde_json::json!({ "name": name, "address": address, "probes": [probe] });
    if tenant != DEFAULT_TENANT {
        target["tenant"] = tenant.into();
    }
    Ok(Some(Desired {
        name,
        tenant: tenant.to_string(),
        address,
        target,
        mode: spec.mode,
    }))
}

/// The problems of a refused probe, for an Event and a condition that the
/// namespace's users read: what is wrong, not where the agent keeps its
/// config (a path on the node is none of their business).
pub(crate) fn messages(errors: &ConfigErrors) -> String {
    errors
        .0
        .iter()
        .map(|e| e.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::SondeCheckSpec;
    use crate::settings::*;
    use crate::view::*;
    use k8s_openapi::api::core::v1::Pod;
    use sonde_core::config::KubernetesSpec;
    use sonde_sandbox::verdict::{Reason, RunResult, Status};
    use std::collections::BTreeSet;

    fn no_services(name: &str) -> Result<ServiceView, Refusal> {
        Err(Refusal::NoSuchService {
            namespace: "shop".into(),
            service: name.into(),
        })
    }

    fn settings() -> GateSettings {
        GateSettings::new(None, Some("node-1".into())).unwrap()
    }

    fn pod() -> PodView {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "web-1", "uid": "u1",
                         "annotations": {"sonde.dev/ready.port": "9090", "sonde.dev/ready.path": "/x", "other": "y"}},
            "spec": {"nodeName": "node-1", "readinessGates": [{"conditionType": "sonde.dev/ready"}, {"conditionType": "example.com/x"}],
                     "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}],
                       "conditions": [{"type": "sonde.dev/ready", "status": "True", "reason": "CheckPassed"}, {"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        PodView::of(&pod).unwrap()
    }

    fn check(port: IntOrString) -> SondeCheck {
        SondeCheck {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("ready".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: SondeCheckSpec {
                plugin: "http".into(),
                port: Some(port),
                period_seconds: 1,
                ..Default::default()
            },
            status: None,
        }
    }

    #[test]
    fn the_check_s_config_names_the_pod_whose_gate_it_is() {
        let mut c = check(IntOrString::Int(9002));
        c.spec.config = Some(serde_json::json!({
            "backend": {"header": "Pod-IPv4", "equals": "$(POD_IPV4)"},
            "headers": {"X-Gate": "$(POD_NAMESPACE)/$(POD_NAME)@$(NODE_NAME) $(POD_IP) $(POD_IPV6) $$(POD_IP)"},
        }));
        let d = desired(&pod(), &c, &settings(), &no_services).unwrap().unwrap();
        assert_eq!(
            d.target["probes"][0]["config"],
            serde_json::json!({
                "backend": {"header": "Pod-IPv4", "equals": "10.0.0.5"},
                "headers": {"X-Gate": "shop/web-1@node-1 10.0.0.5 fd00::5 $(POD_IP)"},
            })
        );
    }

    /// The example of docs/kubernetes.md, as shipped, expands for the Pod.
    #[test]
    fn the_documented_identity_example_expands() {
        let block = &sonde_tests::doc_documents(
            "docs/kubernetes.md",
            "### The Pod's identity in a check's config",
            "yaml kubernetes",
        )[0];
        let c: SondeCheck = serde_saphyr::from_str(block).unwrap();
        let d = desired(&pod(), &c, &settings(), &no_services).unwrap().unwrap();
        assert_eq!(d.target["probes"][0]["config"]["backend"]["equals"], "10.0.0.5");
        assert_eq!(d.target["probes"][0]["config"]["backend"]["attempts"], 6);
    }

    const ROLLOUT: &str = "## Gate a rollout on Service routing";

    /// The objects of docs/kubernetes.md's "Gate a rollout on Service
    /// routing", as shipped.
    fn rollout_objects() -> Vec<serde_json::Value> {
        sonde_tests::doc_documents("docs/kubernetes.md", ROLLOUT, "yaml kubernetes")
            .iter()
            .map(|o| serde_saphyr::from_str(o).unwrap())
            .collect()
    }

    /// The documented Service, as the API server would have it, with a
    /// ClusterIP.
    fn egress(ready: usize) -> ServiceView {
        let mut service: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(rollout_objects().into_iter().find(|o| o["kind"] == "Service").unwrap()).unwrap();
        let spec = service.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.0.10".into());
        spec.cluster_ips = Some(vec!["10.96.0.10".into(), "fd00:96::10".into()]);
        ServiceView::of(&service, ready)
    }

    /// The worked example dials the Service's ClusterIP (its other family
    /// granted), requires this Pod's answer, and tries three times per
    /// ready endpoint; the StatefulSet's Pods name the gate.
    #[test]
    fn the_documented_rollout_example_dials_the_service_and_wants_this_pod() {
        let objects = rollout_objects();
        let check: SondeCheck =
            serde_json::from_value(objects.iter().find(|o| o["kind"] == "SondeCheck").unwrap().clone()).unwrap();
        assert_eq!(check.spec.mode, Mode::StartupOnly);
        let set = objects.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
        assert_eq!(
            set["spec"]["template"]["spec"]["readinessGates"][0]["conditionType"],
            condition_type(check.metadata.name.as_deref().unwrap())
        );
        let mut p = pod();
        p.key = ("shop".into(), "egress-0".into());
        let services = |name: &str| match name {
            "egress" => Ok(egress(3)),
            _ => no_services(name),
        };
        let d = desired(&p, &check, &settings(), &services).unwrap().unwrap();
        assert_eq!(d.address, "10.96.0.10:80");
        let probe = &d.target["probes"][0];
        assert_eq!(probe["grants"]["net"], serde_json::json!(["[fd00:96::10]:80"]));
        assert_eq!(
            probe["config"]["backend"],
            serde_json::json!({"header": "Pod-IPv4", "equals": "10.0.0.5", "missing": "pass", "attempts": 9})
        );
        let few = |_: &str| Ok(egress(0));
        let d = desired(&p, &check, &settings(), &few).unwrap().unwrap();
        assert_eq!(
            d.target["probes"][0]["config"]["backend"]["attempts"], 3,
            "at least three"
        );
        let many = |_: &str| Ok(egress(500));
        let d = desired(&p, &check, &settings(), &many).unwrap().unwrap();
        assert_eq!(
            d.target["probes"][0]["config"]["backend"]["attempts"], 60,
            "the plugin's most"
        );
        let mut given = check.clone();
        given.spec.config.as_mut().unwrap()["backend"]["attempts"] = 4.into();
        let d = desired(&p, &given, &settings(), &services).unwrap().unwrap();
        assert_eq!(
            d.target["probes"][0]["config"]["backend"]["attempts"], 4,
            "as configured"
        );
    }

    #[test]
    fn a_service_without_a_cluster_ip_or_the_port_or_at_all_is_refused_naming_it() {
        let mut c = check(IntOrString::Int(80));
        c.spec.port = None;
        c.spec.service = Some(crate::crd::ServiceRef {
            name: "egress".into(),
            port: IntOrString::String("grpc".into()),
        });
        let refusal = desired(&pod(), &c, &settings(), &|_| Ok(egress(1))).unwrap_err();
        assert!(refusal.of_check());
        assert_eq!(
            refusal.to_string(),
            "service \"egress\" has no port \"grpc\" (it has http (80))"
        );
        let refusal = desired(&pod(), &c, &settings(), &no_services).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "service \"egress\" does not exist in namespace \"shop\""
        );
        for (kind, ip, why) in [
            ("ClusterIP", "None", "headless, clusterIP: None"),
            ("ExternalName", "", "type ExternalName"),
        ] {
            let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "egress", "namespace": "shop"},
                "spec": {"type": kind, "clusterIP": ip, "externalName": "db.example.com", "ports": [{"port": 80}]}
            }))
            .unwrap();
            let view = ServiceView::of(&service, 0);
            let refusal = desired(&pod(), &c, &settings(), &|_| Ok(view.clone())).unwrap_err();
            assert!(refusal.to_string().contains(why), "{refusal}");
        }
        c.spec.port = Some(IntOrString::Int(80));
        assert_eq!(
            desired(&pod(), &c, &settings(), &no_services),
            Err(Refusal::PortOrService)
        );
    }

    #[test]
    fn a_pod_view_keeps_gates_ips_ports_and_sonde_conditions() {
        let p = pod();
        assert_eq!(p.gates, BTreeSet::from(["ready".to_string()]));
        assert_eq!(p.ips.len(), 2);
        assert_eq!(p.ports["http"], 8080);
        assert_eq!(p.conditions.len(), 1);
        assert_eq!(p.conditions["sonde.dev/ready"].status, CondStatus::True);
        assert_eq!(p.unknown_overrides("ready"), ["sonde.dev/ready.path"]);
    }

    #[test]
    fn the_annotation_overrides_the_port_and_other_families_are_granted() {
        let d = desired(
            &pod(),
            &check(IntOrString::String("http".into())),
            &settings(),
            &no_services,
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.address, "10.0.0.5:9090");
        assert_eq!(d.name, "k8s_shop_web-1_ready");
        assert_eq!(d.tenant, "shop");
        assert_eq!(d.target["probes"][0]["grants"]["net"][0], "[fd00::5]:9090");
        assert_eq!(d.target["probes"][0]["period"], "1s");
        let mut p = pod();
        p.annotations.clear();
        let d = desired(
            &p,
            &check(IntOrString::String("http".into())),
            &settings(),
            &no_services,
        )
        .unwrap()
        .unwrap();
        assert_eq!(d.address, "10.0.0.5:8080");
        assert_eq!(
            desired(
                &p,
                &check(IntOrString::String("grpc".into())),
                &settings(),
                &no_services
            ),
            Err(Refusal::NoSuchPort { port: "grpc".into() })
        );
        p.ips.clear();
        assert_eq!(
            desired(&p, &check(IntOrString::Int(80)), &settings(), &no_services),
            Ok(None)
        );
    }

    #[test]
    fn a_pod_selector_is_no_matter_to_the_probe_unless_malformed() {
        let mut c = check(IntOrString::Int(80));
        let plain = desired(&pod(), &c, &settings(), &no_services).unwrap();
        c.spec.pod_selector = Some(serde_json::from_value(serde_json::json!({"matchLabels": {"app": "web"}})).unwrap());
        assert_eq!(desired(&pod(), &c, &settings(), &no_services).unwrap(), plain);
        c.spec.pod_selector = Some(
            serde_json::from_value(serde_json::json!({"matchExpressions": [{"key": "track", "operator": "In"}]}))
                .unwrap(),
        );
        let refusal = desired(&pod(), &c, &settings(), &no_services).unwrap_err();
        assert!(matches!(refusal, Refusal::InvalidPodSelector(_)), "{refusal:?}");
        assert!(refusal.of_check());
        assert!(
            refusal.to_string().contains("\"track\": operator In needs values"),
            "{refusal}"
        );
    }

    #[test]
    fn the_allowlist_and_the_tenant_mapping_refuse() {
        let mut s = settings();
        let d1 = format!("sha256:{}", "a".repeat(64));
        let d2 = format!("sha256:{}", "b".repeat(64));
        s.plugins = Allowlist::parse(&[
            "http".into(),
            "oci://ghcr.io/acme/*".into(),
            d1.clone(),
            "/opt/sonde/plugins/".into(),
            "/srv/one.wasm".into(),
        ])
        .unwrap();
        assert!(s.allows("http"));
        assert!(!s.allows("tcp"));
        assert!(s.allows(&format!("oci://ghcr.io/acme/check@{d2}")));
        assert!(s.allows("oci://ghcr.io/acme/team/check:1.0"));
        assert!(!s.allows(&format!("oci://ghcr.io/acmeevil/check@{d2}")));
        assert!(
            !s.allows(&format!("oci://ghcr.io/acme@{d2}")),
            "the scope is under acme/"
        );
        assert!(!s.allows(&format!("oci://ghcr.io.evil/acme/check@{d2}")));
        assert!(!s.allows("oci://ghcr.io/acme/../x:1"), "not a reference");
        assert!(s.allows(&format!("oci://elsewhere.io/x@{d1}")));
        assert!(!s.allows(&format!("oci://elsewhere.io/x:{}", &d1[7..20])));
        assert!(s.allows("/opt/sonde/plugins/pg.wasm"));
        assert!(!s.allows("/opt/sonde/plugins/../../../tmp/evil.wasm"));
        assert!(!s.allows("/opt/sonde/plugins/./x/../../x.wasm"));
        assert!(!s.allows("/opt/sonde/pluginsevil.wasm"));
        assert!(s.allows("/srv/one.wasm"));
        assert!(!s.allows("/srv//one.wasm"));
        assert!(!s.allows("/srv/one.wasm/"));
        for bad in [
            "oci://ghcr.io/acme/",
            "sha256:abcd",
            "/opt/../etc/",
            "./x.wasm",
            "ghcr.io/acme",
        ] {
            let spec = KubernetesSpec {
                plugins: Some(vec![bad.to_string()]),
                ..Default::default()
            };
            let e = GateSettings::new(Some(&spec), Some("n".into())).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert_eq!(s.tenant_of("shop"), Some("shop"));
        assert_eq!(s.tenant_of("default"), None, "the operator's tenant is never implied");
        s.namespaces.insert("default".into(), "shop".into());
        assert_eq!(s.tenant_of("default"), Some("shop"));
        let mut c = check(IntOrString::Int(80));
        c.spec.plugin = "exec".into();
        assert!(desired(&pod(), &c, &s, &no_services).unwrap_err().of_check());
    }

    #[test]
    fn a_gate_takes_the_latest_message_only_from_a_run_that_agrees_with_its_state() {
        let run = |status, reason, message: &str| RunResult {
            status,
            reason,
            message: message.into(),
            metrics: Vec::new(),
            detail: None,
            duration: std::time::Duration::ZERO,
            fuel_consumed: 0,
            memory_bytes: 0,
            observed: None,
        };
        let refused = run(Status::Failure, None, "connection refused");
        let c = Cond::latest(Status::Failure, &refused).unwrap();
        assert_eq!((c.status, c.reason.as_str()), (CondStatus::False, "CheckFailed"));
        assert_eq!(c.message, "connection refused");
        let slow = run(Status::Failure, Some(Reason::Timeout), "no answer within 1s");
        assert_eq!(Cond::latest(Status::Failure, &slow).unwrap().reason, "CheckTimeout");
        // A failure under the threshold does not explain a passing gate,
        // nor a success a failing one; an unknown state says nothing.
        assert_eq!(Cond::latest(Status::Success, &refused), None);
        assert_eq!(Cond::latest(Status::Failure, &run(Status::Success, None, "200")), None);
        assert_eq!(Cond::latest(Status::Unknown, &run(Status::Unknown, None, "x")), None);
        let warned = Cond::latest(Status::Success, &run(Status::Warning, None, "slow")).unwrap();
        assert_eq!((warned.status, warned.message.as_str()), (CondStatus::True, "slow"));
    }

    #[test]
    fn names_are_unambiguous_and_bounded() {
        assert_ne!(probe_name("a", "b.c", "d"), probe_name("a", "b", "c.d"));
        let long = probe_name("ns", &"p".repeat(200), "check");
        assert_eq!(long.len(), 128);
        assert!(sonde_core::catalog::valid_name(&long));
    }

    #[test]
    fn conditions_and_seeds() {
        assert_eq!(Cond::of_state(Status::Failure, true, "deadline").reason, "CheckTimeout");
        assert_eq!(Cond::of_state(Status::Warning, false, "").status, CondStatus::True);
        assert_eq!(
            Cond::of_state(Status::Failure, false, &"x".repeat(1000)).message.len(),
            MAX_MESSAGE
        );
        let c = Cond::of_state(Status::Success, false, "ok");
        assert_eq!(Cond::seed(Some(&c)).state, Status::Success);
        assert_eq!(Cond::seed(None).state, Status::Unknown);
    }

    #[test]
    fn a_check_s_secret_refs_are_its_probe_s_grants_and_malformed_ones_are_refused() {
        let mut c = check(IntOrString::Int(80));
        c.spec.secret_refs = vec![crate::crd::SecretRef {
            name: "token".into(),
            secret_name: "api-token".into(),
            key: "token".into(),
        }];
        let d = desired(&pod(), &c, &settings(), &no_services).unwrap().unwrap();
        let grants = &d.target["probes"][0]["grants"];
        assert_eq!(grants["secrets"], serde_json::json!(["token"]));
        assert_eq!(
            grants["net"],
            serde_json::json!(["[fd00::5]:9090"]),
            "the other family too"
        );
        c.spec.secret_refs.push(c.spec.secret_refs[0].clone());
        let refusal = desired(&pod(), &c, &settings(), &no_services).unwrap_err();
        assert!(refusal.of_check());
        assert_eq!(refusal.to_string(), "secretRefs: \"token\" is listed twice");
    }
}
