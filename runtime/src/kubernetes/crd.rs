//! The `SondeCheck` custom resource (`sonde.dev/v1alpha1`, namespaced), as
//! `deploy/kubernetes/crd.yaml` declares it. Field names follow the
//! kubelet's probe spec.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The API group.
pub const GROUP: &str = "sonde.dev";
/// The API version within the group.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "SondeCheck";
/// The prefix of a readiness gate's condition type that names a
/// SondeCheck: `sonde.dev/<check-name>`.
pub const GATE_PREFIX: &str = "sonde.dev/";

/// A `SondeCheck`: what to run against each Pod that names it in a
/// readiness gate.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct SondeCheck {
    /// Its metadata (name, namespace, uid, resourceVersion).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What to run.
    pub spec: SondeCheckSpec,
}

/// With `apiVersion` and `kind`, which the API server requires of an object
/// it is sent (they are constants, so the struct does not carry them).
impl Serialize for SondeCheck {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut out = s.serialize_struct("SondeCheck", 4)?;
        out.serialize_field("apiVersion", &format!("{GROUP}/{VERSION}"))?;
        out.serialize_field("kind", KIND)?;
        out.serialize_field("metadata", &self.metadata)?;
        out.serialize_field("spec", &self.spec)?;
        out.end()
    }
}

/// What a [`SondeCheck`] runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SondeCheckSpec {
    /// A built-in name, an agent-local plugin or an `oci://…@sha256:` reference.
    pub plugin: String,
    /// The plugin's config.
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    /// The Pod's port: a number or a container port's name.
    pub port: IntOrString,
    /// Seconds before the first run.
    #[serde(default)]
    pub initial_delay_seconds: Option<u32>,
    /// Seconds between runs (default 10).
    #[serde(default)]
    pub period_seconds: Option<u32>,
    /// The deadline of one run, in seconds (default 1).
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
    /// Passes in a row that set the condition True (default 1).
    #[serde(default)]
    pub success_threshold: Option<u32>,
    /// Failures in a row that set it False (default 3).
    #[serde(default)]
    pub failure_threshold: Option<u32>,
    /// Continuous (default) or StartupOnly.
    #[serde(default)]
    pub mode: Mode,
    /// Per-run limits.
    #[serde(default)]
    pub limits: Option<CheckLimits>,
}

/// How long a check keeps running against a Pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Keep checking; the condition follows the result.
    #[default]
    Continuous,
    /// Set the condition True once, then stop checking that Pod.
    StartupOnly,
}

/// Per-run limits of a [`SondeCheck`], within its tenant's ceiling.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckLimits {
    /// Fuel per run.
    #[serde(default)]
    pub fuel: Option<u64>,
    /// Memory per run, such as `16MiB`.
    #[serde(default)]
    pub memory: Option<String>,
}

impl kube::Resource for SondeCheck {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        "sonde.dev/v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "sondechecks".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_crd_example() {
        let c: SondeCheck = serde_json::from_value(serde_json::json!({
            "apiVersion": "sonde.dev/v1alpha1",
            "kind": "SondeCheck",
            "metadata": {"name": "web-ready", "namespace": "shop"},
            "spec": {"plugin": "http", "config": {"path": "/ready"}, "port": "http",
                     "periodSeconds": 5, "mode": "StartupOnly", "limits": {"fuel": 1000}}
        }))
        .unwrap();
        assert_eq!(c.spec.port, IntOrString::String("http".into()));
        assert_eq!(c.spec.period_seconds, Some(5));
        assert_eq!(c.spec.mode, Mode::StartupOnly);
        assert_eq!(
            <SondeCheck as kube::Resource>::url_path(&(), Some("shop")),
            "/apis/sonde.dev/v1alpha1/namespaces/shop/sondechecks"
        );
    }
}
