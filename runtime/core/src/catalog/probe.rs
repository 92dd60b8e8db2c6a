//! The normalise step for one target and its probes: names, defaults
//! (lowered to the tenant's quotas), durations, thresholds, grants and
//! limits, each checked on its own. Pure: it reads no catalog, loads no
//! plugin and touches the filesystem only to see that granted programs and
//! directories exist. What depends on the rest of the catalog (unique
//! names, quotas, ceilings) is [`super::admit`]'s; the plugin and its
//! schema, [`super::resolve`]'s.

use super::problem::{ConfigProblem, Located};
use super::{ActionSpec, DEFAULT_ACTION_TIMEOUT, DEFAULT_FAILURE_THRESHOLD, DEFAULT_PERIOD, MIN_PERIOD};
use crate::config::{self, Kind};
use crate::tenants::Quotas;
use serde_saphyr::Location;
use sonde_sandbox::engine::{Limits, limits};
use sonde_sandbox::host::{Grants, NetPattern};
use std::path::Path;
use std::time::Duration;

/// A target's own keys, checked.
#[derive(Debug)]
pub struct TargetDraft {
    /// Its name, trimmed.
    pub name: String,
    /// Its address, trimmed.
    pub address: String,
    /// Its `on_failure` action, if one is written and valid.
    pub on_failure: Option<ActionSpec>,
}

/// Checks a target's name, address and action.
pub fn target(t: &config::Target, problems: &mut Vec<Located>) -> TargetDraft {
    let name = t.name.value.trim();
    if !super::valid_name(name) {
        problems.push(Located {
            at: t.name.referenced,
            problem: ConfigProblem::NameInvalid(name.to_string()),
        });
    }
    if let Err(error) = NetPattern::for_target(&t.address.value)
        && !(t.targetless && t.address.value.is_empty())
    {
        problems.push(Located {
            at: t.address.referenced,
            problem: ConfigProblem::Address { key: "address", error },
        });
    }
    let on_failure = t.on_failure.as_ref().and_then(|a| {
        let argv = &a.command.value;
        let problem = match argv.first() {
            None => ConfigProblem::ActionEmpty,
            Some(p) if !Path::new(p).is_absolute() || !Path::new(p).is_file() => {
                ConfigProblem::ActionProgram(p.clone())
            }
            Some(_) => {
                return Some(ActionSpec {
                    argv: argv.clone(),
                    timeout: a.timeout.map_or(DEFAULT_ACTION_TIMEOUT, |d| d.0),
                    env: a.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                });
            }
        };
        problems.push(Located {
            at: a.command.referenced,
            problem,
        });
        None
    });
    TargetDraft {
        name: name.to_string(),
        address: t.address.value.trim().to_string(),
        on_failure,
    }
}

/// A probe's keys, defaults filled in and each checked on its own.
#[derive(Debug)]
pub struct ProbeDraft {
    /// Its name: as written, or `<target>-<kind>`.
    pub name: String,
    /// Whether the name is the default.
    pub defaulted: bool,
    /// Where the name is (the plugin's place for a default name).
    pub name_at: Location,
    /// Its kind.
    pub kind: Kind,
    /// What it probes.
    pub address: String,
    /// Its plugin config (`{}` by default).
    pub config: serde_json::Value,
    /// Time between runs.
    pub period: Duration,
    /// No run before it.
    pub initial_delay: Duration,
    /// `propagate:`.
    pub propagate: bool,
    /// Passes in a row that make `success`.
    pub success_threshold: u32,
    /// Failures in a row that make `failure`.
    pub failure_threshold: u32,
    /// Deadline, fuel and memory of one run.
    pub limits: Limits,
    /// What it may reach besides its target.
    pub grants: Grants,
    /// Where each of `grants.net` is written.
    pub net_at: Vec<Location>,
    /// Aggregation groups.
    pub groups: Vec<String>,
    /// Extra labels, by name.
    pub labels: Vec<(String, String)>,
}

/// Normalises probe `p` of target `target` (whose address is `address`),
/// with the per-call defaults of `quotas`.
pub fn probe(
    target: &str,
    address: &str,
    p: &config::Probe,
    quotas: &Quotas,
    problems: &mut Vec<Located>,
) -> ProbeDraft {
    let mut at = |at: Location, problem| problems.push(Located { at, problem });
    let defaults = quotas.default_limits();
    let kind = p.kind.as_ref().map_or(Kind::Readiness, |k| k.value);
    let (name, name_at) = match &p.name {
        Some(n) => (n.value.trim().to_string(), n.referenced),
        None => (format!("{target}-{kind}"), p.plugin.referenced),
    };
    if !super::valid_name(&name) {
        at(name_at, ConfigProblem::NameInvalid(name.clone()));
    }
    check_numbers(p, kind, problems);
    let address = match &p.target {
        Some(t) => {
            if let Err(error) = NetPattern::for_target(&t.value) {
                problems.push(Located {
                    at: t.referenced,
                    problem: ConfigProblem::Address { key: "target", error },
                });
            }
            t.value.trim().to_string()
        }
        None => address.to_string(),
    };
    let (grants, net_at) = grants(p, problems);
    for g in &p.groups {
        if !super::valid_name(&g.value) {
            problems.push(Located {
                at: g.referenced,
                problem: ConfigProblem::Group(g.value.clone()),
            });
        }
    }
    let labels = labels(p, problems);
    ProbeDraft {
        name,
        defaulted: p.name.is_none(),
        name_at,
        kind,
        address,
        config: p
            .config
            .as_ref()
            .map_or_else(|| serde_json::json!({}), |c| c.value.clone()),
        period: p.period.as_ref().map_or(DEFAULT_PERIOD, |d| d.value.0),
        initial_delay: p.initial_delay.map_or(Duration::ZERO, |d| d.0),
        propagate: p.propagate,
        success_threshold: p.success_threshold.as_ref().map_or(1, |s| s.value),
        failure_threshold: p
            .failure_threshold
            .as_ref()
            .map_or(DEFAULT_FAILURE_THRESHOLD, |s| s.value),
        limits: Limits {
            timeout: p.timeout.as_ref().map_or(defaults.timeout, |d| d.value.0),
            fuel: p.limits.fuel.as_ref().map_or(defaults.fuel, |f| f.value),
            memory: p.limits.memory.as_ref().map_or(defaults.memory, |m| m.value.0),
        },
        grants,
        net_at,
        groups: p.groups.iter().map(|g| g.value.clone()).collect(),
        labels,
    }
}

/// The probe's thresholds, period, timeout and memory, each within its
/// bounds.
fn check_numbers(p: &config::Probe, kind: Kind, problems: &mut Vec<Located>) {
    let mut at = |at: Location, problem| problems.push(Located { at, problem });
    if let Some(s) = &p.success_threshold {
        if s.value == 0 {
            at(s.referenced, ConfigProblem::SuccessThresholdZero);
        } else if s.value != 1 && kind != Kind::Readiness {
            at(
                s.referenced,
                ConfigProblem::SuccessThresholdNotOne { kind, value: s.value },
            );
        }
    }
    if let Some(f) = &p.failure_threshold
        && f.value == 0
    {
        at(f.referenced, ConfigProblem::FailureThresholdZero);
    }
    if let Some(d) = &p.period
        && d.value.0 < MIN_PERIOD
    {
        at(d.referenced, ConfigProblem::PeriodTooShort(d.value.0));
    }
    if let Some(d) = &p.timeout
        && d.value.0.is_zero()
    {
        at(d.referenced, ConfigProblem::TimeoutZero);
    }
    if let Some(m) = &p.limits.memory
        && m.value.0 > limits::MAX_MEMORY
    {
        at(m.referenced, ConfigProblem::MemoryOverMax(m.value.0));
    }
}

/// The probe's grants, each checked, and where each of its `net` grants
/// is written.
fn grants(p: &config::Probe, problems: &mut Vec<Located>) -> (Grants, Vec<Location>) {
    let mut at = |at: Location, problem| problems.push(Located { at, problem });
    let mut grants = Grants::default();
    let mut net_at = Vec::new();
    for n in &p.grants.net {
        match n.value.parse() {
            Ok(g) => {
                grants.net.push(g);
                net_at.push(n.referenced);
            }
            Err(e) => at(n.referenced, ConfigProblem::GrantNet(e)),
        }
    }
    for x in &p.grants.exec {
        if !x.value.is_absolute() || !x.value.is_file() {
            at(x.referenced, ConfigProblem::GrantExec(x.value.clone()));
        }
        grants.exec.push(x.value.clone());
    }
    for f in &p.grants.files {
        if !f.value.is_absolute() || !f.value.is_dir() {
            at(f.referenced, ConfigProblem::GrantFiles(f.value.clone()));
        } else if let Some((mount, fstype)) = super::mounts::pseudo_within(&f.value) {
            at(
                f.referenced,
                ConfigProblem::GrantFilesPseudo {
                    path: f.value.clone(),
                    mount,
                    fstype,
                },
            );
        }
        grants.files.push(f.value.clone());
    }
    grants.env = p.grants.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(v) = &p.grants.ip_protocol {
        match v.value.trim().parse() {
            Ok(prefer) => {
                grants.ip_protocol = Some(sonde_policy::grants::IpProtocol {
                    prefer,
                    fallback: p.grants.ip_protocol_fallback.unwrap_or(true),
                })
            }
            Err(e) => at(v.referenced, ConfigProblem::GrantIpProtocol(e)),
        }
    }
    (grants, net_at)
}

/// The probe's labels that pass their checks.
fn labels(p: &config::Probe, problems: &mut Vec<Located>) -> Vec<(String, String)> {
    let mut at = |at: Location, problem| problems.push(Located { at, problem });
    let mut labels = Vec::new();
    if let Some(l) = &p.labels {
        if l.value.len() > super::MAX_LABELS {
            at(
                l.referenced,
                ConfigProblem::Label {
                    key: l.value.keys().nth(super::MAX_LABELS).cloned().unwrap_or_default(),
                    why: "is one label too many (at most 8 per probe)",
                },
            );
        }
        for (k, v) in &l.value {
            match super::label_problem(k, v) {
                Some(why) => at(l.referenced, ConfigProblem::Label { key: k.clone(), why }),
                None => labels.push((k.clone(), v.clone())),
            }
        }
    }
    labels
}

/// The source location of the key a [`crate::tenants::CeilingError`] is
/// about, and the key's name.
pub(crate) fn ceiling_key(
    e: &crate::tenants::CeilingError,
    t: &config::Target,
    p: &config::Probe,
    d: &ProbeDraft,
) -> (&'static str, Location) {
    use crate::tenants::CeilingError as C;
    match e {
        C::Target { .. } => match &p.target {
            Some(t) => ("target", t.referenced),
            None => ("address", t.address.referenced),
        },
        C::Net { index, .. } => ("grants.net", d.net_at[*index]),
        C::Exec { index, .. } => ("grants.exec", p.grants.exec[*index].referenced),
        C::Files { index, .. } => ("grants.files", p.grants.files[*index].referenced),
        C::Limit { limit, .. } => (
            *limit,
            match *limit {
                "timeout" => p.timeout.as_ref().map(|s| s.referenced),
                "limits.fuel" => p.limits.fuel.as_ref().map(|s| s.referenced),
                _ => p.limits.memory.as_ref().map(|s| s.referenced),
            }
            .unwrap_or(p.plugin.referenced),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::Quotas;

    fn parse(probe: &str) -> config::File {
        let text = format!("targets:\n  - name: web\n    address: 127.0.0.1:80\n    probes:\n      - {probe}\n");
        config::parse(Path::new("t.yaml"), &text).unwrap()
    }

    fn draft(probe: &str, quotas: &Quotas) -> (ProbeDraft, Vec<String>) {
        let file = parse(probe);
        let t = &file.targets[0];
        let mut problems = Vec::new();
        let d = self::probe("web", "127.0.0.1:80", &t.probes[0], quotas, &mut problems);
        let texts = problems.into_iter().map(|p| p.problem.to_string()).collect();
        (d, texts)
    }

    #[test]
    fn defaults_are_filled_in() {
        let (d, p) = draft("plugin: tcp", &Quotas::UNLIMITED);
        assert!(p.is_empty());
        assert_eq!(d.name, "web-readiness");
        assert!(d.defaulted);
        assert_eq!(d.kind, Kind::Readiness);
        assert_eq!(d.address, "127.0.0.1:80");
        assert_eq!(d.period, DEFAULT_PERIOD);
        assert_eq!((d.success_threshold, d.failure_threshold), (1, 3));
        assert_eq!(d.limits, Limits::default());
        assert_eq!(d.config, serde_json::json!({}));
    }

    #[test]
    fn defaults_are_lowered_to_the_tenants_quotas() {
        let q = Quotas {
            timeout: Duration::from_millis(300),
            ..Quotas::default()
        };
        let (d, _) = draft("plugin: tcp", &q);
        assert_eq!(d.limits.timeout, Duration::from_millis(300));
    }

    #[test]
    fn each_key_is_checked_on_its_own() {
        let (_, p) = draft(
            "{plugin: tcp, name: 'bad name', kind: liveness, success_threshold: 2, failure_threshold: 0, period: 50ms, timeout: 0s, limits: {memory: 2GiB}, target: 'http://', grants: {net: ['no'], exec: [rel], files: [/nonexistent-dir]}, groups: ['a b']}",
            &Quotas::UNLIMITED,
        );
        let keys: Vec<&str> = p.iter().map(|m| m.split(':').next().unwrap()).collect();
        assert_eq!(
            keys,
            [
                "name",
                "success_threshold",
                "failure_threshold",
                "period",
                "timeout",
                "limits.memory",
                "target",
                "grants.net",
                "grants.exec",
                "grants.files",
                "groups"
            ],
            "{p:#?}"
        );
    }

    #[test]
    fn a_target_checks_its_name_address_and_action() {
        let file = config::parse(
            Path::new("t.yaml"),
            "targets:\n  - name: 'w w'\n    address: '[::1'\n    on_failure: {command: [systemctl]}\n",
        )
        .unwrap();
        let mut problems = Vec::new();
        let d = target(&file.targets[0], &mut problems);
        assert!(d.on_failure.is_none());
        let texts: Vec<String> = problems.iter().map(|p| p.problem.to_string()).collect();
        assert_eq!(texts.len(), 3, "{texts:#?}");
        assert!(texts[0].starts_with("name: \"w w\""));
        assert!(texts[1].starts_with("address: target \"[::1\""));
        assert!(texts[2].starts_with("on_failure.command: \"systemctl\" must be"));
    }
}
