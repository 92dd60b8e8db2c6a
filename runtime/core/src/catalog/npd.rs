//! The config's `node_problem_detector:`, resolved: each monitor file read
//! (`config::NpdMonitor`) and each of its rules made a probe of the
//! built-in `exec` plugin in `mode: npd`, granted its one program.
//!
//! A system-log monitor's file (`plugin: kmsg`, `filelog`, `journald`)
//! runs no program: it is read and checked, its bounds resolved
//! ([`LogMonitor`]).
//!
//! A rule goes through the registry's steps as a module does (the tenant's
//! ceiling, quotas and timeout bounds), as a probe of a target named
//! `node_problem_detector.<n>` that is never committed: the monitor runs
//! it on its own clock ([`crate::npd`]) and it shows in no `/v1/probes`.
//! Its errors name the file, line and key, so `sonde validate` refuses what
//! `sonde run` would.

use super::{Catalog, Change, ProbeSpec};
use crate::config::{
    self, ConfigError, ConfigErrors, LogBoundError, LogBounds, NpdFile, NpdLogMonitor, NpdMonitor, NpdSpec,
};
use crate::tenants::Ceiling;
use sonde_sandbox::engine::Engine;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One monitor file of the config in force, its rules resolved.
#[derive(Debug)]
pub struct Monitor {
    /// The monitor file.
    pub file: PathBuf,
    /// Where its relative rule paths start.
    pub workdir: PathBuf,
    /// The programs (or directories of them) its rules may run.
    pub exec: Vec<PathBuf>,
    /// What it says.
    pub monitor: NpdMonitor,
    /// Each rule's probe, in the order of `monitor.rules`.
    pub rules: Vec<Arc<ProbeSpec>>,
}

/// The monitors of the config in force.
pub type Monitors = Vec<Arc<Monitor>>;

/// One system-log monitor file of the config in force.
#[derive(Debug, PartialEq)]
pub struct LogMonitor {
    /// The monitor file.
    pub file: PathBuf,
    /// What it says.
    pub monitor: NpdLogMonitor,
    /// How its lines are read, bounded.
    pub bounds: LogBounds,
}

/// The system-log monitors of the config in force.
pub type LogMonitors = Vec<Arc<LogMonitor>>;

/// The name the catalog knows entry `n`'s stand-in target by.
fn target_name(n: usize) -> String {
    format!("node_problem_detector.{n}")
}

/// Resolves the `node_problem_detector:` entries (from the file at `path`)
/// against `catalog`: every error found, with its place.
pub(crate) async fn resolve(
    catalog: &Catalog,
    engine: &Engine,
    path: &Path,
    specs: Vec<NpdSpec>,
) -> Result<(Monitors, LogMonitors), ConfigErrors> {
    let mut errors = Vec::new();
    let mut out: Monitors = Vec::new();
    let mut logs: LogMonitors = Vec::new();
    for (n, spec) in specs.into_iter().enumerate() {
        let at = spec.config.referenced;
        let error = |message: String| ConfigError {
            place: config::place(path, &at),
            message: format!("node_problem_detector[{n}]: {message}"),
        };
        // Relative to the config file, as `state_dir` is.
        let workdir = match &spec.workdir {
            Some(w) => config::normalize(&catalog.base.join(&w.value)),
            None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        };
        if !workdir.is_dir() {
            errors.push(error(format!("workdir: {}: not a directory", workdir.display())));
            continue;
        }
        let file = catalog.base.join(&spec.config.value);
        let read = match NpdFile::read(&file, &workdir) {
            Ok(m) => m,
            Err(e) => {
                errors.extend(e);
                continue;
            }
        };
        let owners = out
            .iter()
            .map(|m| (&m.file, &m.monitor.conditions))
            .chain(logs.iter().map(|m| (&m.file, &m.monitor.conditions)));
        if let Some(clash) = claimed_twice(owners, read.conditions()) {
            errors.push(error(clash));
            continue;
        }
        let monitor = match read {
            NpdFile::Log(monitor) => {
                match log_bounds(&spec) {
                    Ok(bounds) => logs.push(Arc::new(LogMonitor { file, monitor, bounds })),
                    Err(e) => errors.push(error(e.to_string())),
                }
                continue;
            }
            NpdFile::Custom(monitor) => monitor,
        };
        if let Some(key) = [
            ("max_line_bytes", spec.max_line_bytes.is_some()),
            ("max_lines_per_second", spec.max_lines_per_second.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
        {
            errors.push(error(LogBoundError::NotForCustom(key).to_string()));
            continue;
        }
        match rules(catalog, engine, path, n, &spec, &file, &monitor).await {
            Ok(rules) => out.push(Arc::new(Monitor {
                file,
                workdir,
                exec: spec.exec.iter().map(|p| config::normalize(&p.value)).collect(),
                monitor,
                rules,
            })),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok((out, logs))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// A system-log monitor entry's bounds; refused when it has what only a
/// custom plugin monitor takes (it runs no program).
fn log_bounds(spec: &NpdSpec) -> Result<LogBounds, LogBoundError> {
    for (key, set) in [
        ("exec", !spec.exec.is_empty()),
        ("env", !spec.env.is_empty()),
        ("tenant", spec.tenant.is_some()),
    ] {
        if set {
            return Err(LogBoundError::NotForLogs(key));
        }
    }
    LogBounds::of(spec)
}

/// The condition type of `conditions` that an earlier monitor (its file
/// and conditions in `earlier`) claims too, as the message that refuses it.
fn claimed_twice<'a>(
    earlier: impl Iterator<Item = (&'a PathBuf, &'a Vec<config::NpdCondition>)> + Clone,
    conditions: &[config::NpdCondition],
) -> Option<String> {
    conditions.iter().find_map(|c| {
        earlier
            .clone()
            .find(|(_, theirs)| theirs.iter().any(|o| o.kind == c.kind))
            .map(|(file, _)| {
                format!(
                    "condition {:?} is claimed by {} already: one condition has one owner",
                    c.kind,
                    file.display()
                )
            })
    })
}

/// Each rule of `monitor` as a probe, in order: its program checked
/// against the entry's `exec`, then through the catalog.
async fn rules(
    catalog: &Catalog,
    engine: &Engine,
    path: &Path,
    n: usize,
    spec: &NpdSpec,
    file: &Path,
    monitor: &NpdMonitor,
) -> Result<Vec<Arc<ProbeSpec>>, Vec<ConfigError>> {
    let at = spec.config.referenced;
    let defined = spec.config.defined;
    let spanned = |value: String| config::Spanned::new(value, at, defined);
    let allowed = Ceiling {
        exec: spec.exec.iter().map(|p| config::normalize(&p.value)).collect(),
        ..Ceiling::default()
    };
    let mut errors = Vec::new();
    let mut probes = Vec::new();
    for (i, rule) in monitor.rules.iter().enumerate() {
        if !allowed.covers_exec(&rule.path) {
            errors.push(ConfigError {
                place: config::place(path, &at),
                message: format!(
                    "node_problem_detector[{n}]: {}: rules[{i}].path {} is not in the entry's exec grant ({}): add the program or its directory to `exec`",
                    file.display(),
                    rule.path.display(),
                    if spec.exec.is_empty() {
                        "empty".to_string()
                    } else {
                        spec.exec
                            .iter()
                            .map(|p| p.value.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            });
            continue;
        }
        let mut command = vec![rule.path.display().to_string()];
        command.extend(rule.args.iter().cloned());
        let plugin_config = serde_json::json!({
            "command": command,
            "mode": "npd",
            "max_output_length": monitor.max_output_length,
        });
        probes.push(config::Probe {
            name: Some(spanned(format!("rule-{i}"))),
            kind: None,
            plugin: spanned("exec".into()),
            config: Some(config::Spanned::new(plugin_config, at, defined)),
            target: None,
            period: None,
            initial_delay: None,
            propagate: false,
            timeout: Some(config::Spanned::new(config::Dur(rule.timeout), at, defined)),
            success_threshold: None,
            failure_threshold: None,
            grants: config::GrantsSpec {
                exec: vec![config::Spanned::new(rule.path.clone(), at, defined)],
                env: spec.env.clone(),
                ..config::GrantsSpec::default()
            },
            limits: config::LimitsSpec::default(),
            groups: Vec::new(),
            labels: None,
        });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    if probes.is_empty() {
        return Ok(Vec::new());
    }
    let count = probes.len();
    let target = config::Target {
        name: spanned(target_name(n)),
        tenant: spec.tenant.clone(),
        // No target: a rule runs its program, and is granted nothing else.
        address: spanned(String::new()),
        on_failure: None,
        probes,
        source: None,
        targetless: true,
    };
    let prepared = catalog
        .prepare(engine, Change::add(vec![target]))
        .await
        .map_err(|e| e.0)?;
    let mut specs: Vec<Arc<ProbeSpec>> = prepared.probes().cloned().collect();
    specs.sort_by_key(|p| rule_index(&p.name));
    if specs.len() != count {
        return Err(vec![ConfigError {
            place: config::place(path, &at),
            message: format!("node_problem_detector[{n}]: the exec plugin cannot be had"),
        }]);
    }
    Ok(specs)
}

/// `rule-<i>`'s `i` (a probe's name is `<name>` as given).
fn rule_index(name: &str) -> usize {
    name.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(usize::MAX)
}
