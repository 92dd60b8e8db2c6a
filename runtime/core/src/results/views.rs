//! What the cache tells: a probe's outcome, history and state changes as
//! the API, the metrics and the event streams show them.

use super::*;

/// One outcome, as the `?all=1` watch stream shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunEvent {
    /// The probe.
    pub probe: Arc<str>,
    /// Its target.
    pub target: Arc<str>,
    /// The tenant that owns it.
    pub tenant: Arc<str>,
    /// The plugin that ran, as the registry shows it (an `oci://`
    /// reference pinned to the digest that ran).
    pub plugin: Arc<str>,
    /// Its kind.
    pub kind: Kind,
    /// Its state after this outcome.
    pub state: Status,
    /// Like results in a row, after this outcome.
    pub consecutive: u32,
    /// The outcome.
    #[serde(flatten)]
    pub outcome: Arc<Observation>,
}

/// How many runs of a probe ended with a status and reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunCount {
    /// The status.
    pub status: Status,
    /// The reason, if any.
    pub reason: Option<Reason>,
    /// How many runs.
    pub runs: u64,
}

/// What a metrics scrape reads of one probe, without copying it.
#[derive(Debug)]
pub struct ProbeSample<'a> {
    /// Its name.
    pub name: &'a Arc<str>,
    /// Its target.
    pub target: &'a Arc<str>,
    /// Its kind.
    pub kind: Kind,
    /// Its groups.
    pub groups: &'a [String],
    /// Its extra labels.
    pub labels: &'a Arc<[(String, String)]>,
    /// The tenant that owns it.
    pub tenant: &'a Arc<str>,
    /// Its state.
    pub state: Status,
    /// Restored from disk and not run since.
    pub stale: bool,
    /// The last outcome (shared: a scrape keeps it without copying).
    pub last: Option<&'a Arc<Observation>>,
    /// Runs by status and reason since the agent started.
    pub runs: &'a [RunCount],
}

/// A state change, as broadcast.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StateChange {
    /// The probe.
    pub probe: Arc<str>,
    /// Its target.
    pub target: Arc<str>,
    /// The tenant that owns it.
    pub tenant: Arc<str>,
    /// The plugin, as the registry shows it (pinned to its digest).
    pub plugin: Arc<str>,
    /// Its kind.
    pub kind: Kind,
    /// The state before.
    pub from: Status,
    /// The state now.
    pub to: Status,
    /// The message of the run that changed it (empty for a reset).
    pub message: String,
    /// When.
    #[serde(serialize_with = "rfc3339")]
    pub at: SystemTime,
}

/// One run's outcome and when it ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// What the run produced.
    #[serde(flatten)]
    pub result: RunResult,
    /// When it ended.
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub at: SystemTime,
    /// Why it failed, sorted when it ended (from what the host saw, which
    /// is not kept); absent when it passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

/// A compact entry of a probe's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// The run's status.
    pub status: Status,
    /// Its reason, if any.
    pub reason: Option<Reason>,
    /// How long it took, in milliseconds.
    pub duration_ms: f64,
    /// When it ended.
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub at: SystemTime,
}

/// A probe as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeView {
    /// Its name.
    pub name: String,
    /// Its target's name.
    pub target: String,
    /// Its kind.
    pub kind: Kind,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its extra labels (`labels:` in the config; a Kubernetes gate's
    /// `namespace`, `pod` and `check`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub labels: BTreeMap<String, String>,
    /// The tenant that owns it.
    pub tenant: String,
    /// The plugin that runs it, as the registry shows it: a built-in's
    /// name, a file's path, or an `oci://` reference pinned to the digest
    /// that runs (`…@sha256:…`), whatever tag the config named.
    pub plugin: String,
    /// Its state.
    pub state: Status,
    /// Restored from disk and not run since.
    pub stale: bool,
    /// Like results in a row.
    pub consecutive: u32,
    /// The last outcome.
    pub last: Option<Observation>,
    /// When the state last changed.
    #[serde(with = "opt_rfc3339")]
    pub last_transition: Option<SystemTime>,
    /// Recent outcomes, oldest first (only for a single probe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<HistoryEntry>>,
}

/// A target as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetView {
    /// Its name.
    pub name: String,
    /// The tenant that owns it.
    pub tenant: String,
    /// Its startup probe succeeded, or it has none.
    pub started: bool,
    /// Started, and every readiness probe passes.
    pub ready: bool,
    /// No liveness probe is failing.
    pub live: bool,
    /// Its probes' names.
    pub probes: Vec<String>,
}

/// Identity of a probe in the cache.
#[derive(Clone, Debug)]
pub struct ProbeMeta {
    /// Its name.
    pub name: Arc<str>,
    /// Its target's name.
    pub target: Arc<str>,
    /// Its kind.
    pub kind: Kind,
    /// Its groups.
    pub groups: Arc<[String]>,
    /// Its extra labels, sorted by name.
    pub labels: Arc<[(String, String)]>,
    /// The tenant that owns it.
    pub tenant: Arc<str>,
    /// The plugin, as the registry shows it (pinned to its digest).
    pub plugin: Arc<str>,
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

fn from_rfc3339<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_rfc3339(&s).map_err(serde::de::Error::custom)
}

pub(super) mod opt_rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::SystemTime;

    pub(crate) fn serialize<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(&humantime::format_rfc3339_millis(*t)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| humantime::parse_rfc3339(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}
