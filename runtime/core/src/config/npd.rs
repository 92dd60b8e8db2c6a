//! The `node_problem_detector:` block, and the node-problem-detector
//! custom plugin monitor files it names, read as NPD reads them: the same
//! keys, defaults and checks, so an NPD user points sonde at the files they
//! have.
//!
//! ```yaml
//! node_problem_detector:
//!   - config: /etc/npd/custom-plugin-monitor.json
//!     exec: [/etc/npd/plugin]     # the programs its rules may run, or their directories
//!     workdir: /                  # where relative rule paths start (NPD's working directory)
//! ```

use super::*;

/// One `node_problem_detector:` entry: an NPD custom plugin monitor file
/// and what its rules may run.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpdSpec {
    /// `config: /etc/npd/custom-plugin-monitor.json` — the file, in NPD's
    /// own format (`plugin: custom`).
    pub config: Spanned<PathBuf>,
    /// `exec: [/etc/npd/plugin]` — programs, or directories whose programs
    /// all are, that its rules may run. A rule whose program is outside is
    /// refused at load, with its path. Default: none.
    #[serde(default)]
    pub exec: Vec<Spanned<PathBuf>>,
    /// `workdir: /` — where a relative rule `path` starts (itself relative
    /// to this file). Default: the agent's working directory, as NPD's.
    #[serde(default)]
    pub workdir: Option<Spanned<PathBuf>>,
    /// `env: {NAME: value}` — the programs' environment (empty by default,
    /// as every granted program's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `tenant: nodes` — the tenant whose ceiling and quotas bound the
    /// rules. Default: the operator's `default` tenant.
    #[serde(default)]
    pub tenant: Option<Spanned<String>>,
}

/// The condition types the kubelet owns: never set by a monitor.
pub const KUBELET_CONDITIONS: [&str; 5] = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

/// The most rules one monitor file may have.
pub const MAX_NPD_RULES: usize = 256;

/// The most bytes a monitor file may have.
pub const MAX_NPD_FILE: u64 = 1024 * 1024;

/// An NPD custom plugin monitor, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct NpdMonitor {
    /// `source`: the component its Events name.
    pub source: String,
    /// `pluginConfig.invoke_interval`: how often every rule runs (30s).
    pub invoke_interval: Duration,
    /// `pluginConfig.timeout`: the longest a rule's program runs (5s).
    pub timeout: Duration,
    /// `pluginConfig.max_output_length`: the longest message, in bytes (80).
    pub max_output_length: usize,
    /// `pluginConfig.concurrency`: programs run at once (3).
    pub concurrency: usize,
    /// `pluginConfig.enable_message_change_based_condition_update`: a
    /// problem's new message alone updates its condition (false).
    pub message_change_updates: bool,
    /// `pluginConfig.skip_initial_status`: no condition is reported before
    /// its first rule has run (false).
    pub skip_initial_status: bool,
    /// `conditions`: each condition's type and its reason and message when
    /// no problem is present.
    pub conditions: Vec<NpdCondition>,
    /// `rules`.
    pub rules: Vec<NpdRule>,
}

/// A condition a monitor owns, as it reads when there is no problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpdCondition {
    /// `type`, e.g. `NTPProblem`.
    pub kind: String,
    /// `reason` when the problem is absent, e.g. `NTPIsUp`.
    pub reason: String,
    /// `message` when the problem is absent.
    pub message: String,
}

/// Whether a rule's problem is passing (an Event) or lasting (a condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NpdRuleKind {
    /// `temporary`: each run that finds the problem makes a Warning Event.
    Temporary,
    /// `permanent`: the rule sets the condition of this type.
    Permanent(String),
}

/// One rule: a program and what its verdict means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpdRule {
    /// `type` and `condition`.
    pub kind: NpdRuleKind,
    /// `reason` when the problem is present.
    pub reason: String,
    /// `path`, made absolute against the entry's `workdir`.
    pub path: PathBuf,
    /// `args`.
    pub args: Vec<String>,
    /// `timeout`, else the monitor's.
    pub timeout: Duration,
    /// `invoke_interval`, else the monitor's.
    pub invoke_interval: Duration,
}

/// The file's shape, as NPD's Go structs spell it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMonitor {
    #[serde(default)]
    plugin: String,
    #[serde(default, rename = "pluginConfig")]
    plugin_config: RawPluginConfig,
    #[serde(default)]
    source: String,
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
    #[serde(default)]
    rules: Option<Vec<RawRule>>,
    #[serde(default, rename = "metricsReporting")]
    _metrics_reporting: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPluginConfig {
    invoke_interval: Option<String>,
    timeout: Option<String>,
    max_output_length: Option<i64>,
    concurrency: Option<i64>,
    enable_message_change_based_condition_update: Option<bool>,
    skip_initial_status: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    // NPD's condition struct also has these; a monitor file leaves them out.
    #[serde(default)]
    _status: Option<serde_json::Value>,
    #[serde(default, rename = "transition")]
    _transition: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    condition: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    args: Option<Vec<String>>,
    timeout: Option<String>,
    invoke_interval: Option<String>,
}

/// What the file's defaults are (NPD's).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_OUTPUT: usize = 80;
const DEFAULT_CONCURRENCY: usize = 3;
/// The longest message sonde keeps (the exec capability's stdout bound).
const MAX_OUTPUT: usize = 4096;
/// Programs one monitor runs at once, at most.
const MAX_CONCURRENCY: usize = 64;
/// How often a rule may run: at most every 100ms (a probe's shortest
/// period), at least once a week.
const INTERVALS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(7 * 24 * 3600));
/// How long a rule's program may run: 1ms to an hour.
const TIMEOUTS: (Duration, Duration) = (Duration::from_millis(1), Duration::from_secs(3600));

/// Why a monitor file's duration is refused.
#[derive(Debug, thiserror::Error)]
enum DurationError {
    /// A duration outside the bounds of its key.
    #[error("{text:?} is outside {}-{}", humantime::format_duration(*min), humantime::format_duration(*max))]
    Outside { text: String, min: Duration, max: Duration },
    /// Not a Go duration.
    #[error("{0:?} is not a duration (such as \"30s\", \"1m30s\", \"500ms\")")]
    NotADuration(String),
}

/// The Go duration `text`, if it is one within `(min, max)`; else why not.
fn bounded(text: &str, (min, max): (Duration, Duration)) -> Result<Duration, DurationError> {
    match go_duration(text) {
        Some(d) if d >= min && d <= max => Ok(d),
        Some(_) => Err(DurationError::Outside {
            text: text.to_string(),
            min,
            max,
        }),
        None => Err(DurationError::NotADuration(text.to_string())),
    }
}

impl NpdMonitor {
    /// Reads the monitor file `file`; relative rule paths start at
    /// `workdir`. Every problem is returned, each naming the file and the
    /// key path (`rules[0].condition`), with the line where the parser
    /// knows it.
    pub fn read(file: &Path, workdir: &Path) -> Result<Self, Vec<ConfigError>> {
        let at = |line: u64, column: u64| Place {
            file: file.to_path_buf(),
            line,
            column,
        };
        let one = |place: Place, message: String| vec![ConfigError { place, message }];
        let text = match read_bounded(file) {
            Ok(t) => t,
            Err(e) => return Err(one(at(0, 0), e.to_string())),
        };
        let mut de = serde_json::Deserializer::from_str(&text);
        let raw: RawMonitor = match serde_path_to_error::deserialize(&mut de) {
            Ok(r) => r,
            Err(e) => {
                let path = e.path().to_string();
                let inner = e.into_inner();
                let key = if path == "." {
                    String::new()
                } else {
                    format!("{path}: ")
                };
                return Err(one(
                    at(inner.line() as u64, inner.column() as u64),
                    format!("{key}{}", strip_position(&inner.to_string())),
                ));
            }
        };
        let mut errors = Vec::new();
        let monitor = check(raw, workdir, &mut |key: String, message: String| {
            errors.push(ConfigError {
                place: at(0, 0),
                message: format!("{key}: {message}"),
            })
        });
        if errors.is_empty() { Ok(monitor) } else { Err(errors) }
    }
}

/// Why a monitor file could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// Opening or reading it failed.
    #[error("cannot read the NPD monitor file: {0}")]
    Io(#[from] std::io::Error),
    /// It is a directory, a device...
    #[error("not a regular file")]
    NotAFile,
    /// It is larger than [`MAX_NPD_FILE`].
    #[error("larger than {MAX_NPD_FILE} bytes")]
    TooLarge,
}

/// The file's text, refused when it is not a regular file or is larger
/// than [`MAX_NPD_FILE`].
fn read_bounded(file: &Path) -> Result<String, ReadError> {
    use std::io::Read;
    let f = std::fs::File::open(file)?;
    if !f.metadata()?.is_file() {
        return Err(ReadError::NotAFile);
    }
    let mut text = String::new();
    f.take(MAX_NPD_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_NPD_FILE {
        return Err(ReadError::TooLarge);
    }
    Ok(text)
}

/// serde_json's message without its own " at line L column C" (the place
/// says it).
fn strip_position(message: &str) -> &str {
    message.rsplit_once(" at line ").map_or(message, |(m, _)| m)
}

/// Checks `raw` as NPD's `ApplyConfiguration` and `Validate` do, and what
/// sonde adds (kubelet conditions, bounds); each problem goes to `bad`
/// with its key path.
fn check(raw: RawMonitor, workdir: &Path, bad: &mut dyn FnMut(String, String)) -> NpdMonitor {
    if raw.plugin != "custom" {
        bad(
            "plugin".into(),
            format!(
                "{:?}: only \"custom\" (a custom plugin monitor) is supported",
                raw.plugin
            ),
        );
    }
    if raw.source.trim().is_empty() {
        bad("source".into(), "missing: the name the monitor's Events carry".into());
    }
    let pc = raw.plugin_config;
    let mut duration = |key: &str, value: Option<String>, default: Duration, range| match value {
        None => default,
        Some(v) => bounded(&v, range).unwrap_or_else(|why| {
            bad(key.into(), why.to_string());
            default
        }),
    };
    let invoke_interval = duration(
        "pluginConfig.invoke_interval",
        pc.invoke_interval,
        DEFAULT_INTERVAL,
        INTERVALS,
    );
    let timeout = duration("pluginConfig.timeout", pc.timeout, DEFAULT_TIMEOUT, TIMEOUTS);
    let mut count = |key: &str, value: Option<i64>, default: usize, max: usize| match value {
        None => default,
        Some(n) if n >= 1 && n as u64 <= max as u64 => n as usize,
        Some(n) => {
            bad(key.into(), format!("{n}: must be 1-{max}"));
            default
        }
    };
    let max_output_length = count(
        "pluginConfig.max_output_length",
        pc.max_output_length,
        DEFAULT_OUTPUT,
        MAX_OUTPUT,
    );
    let concurrency = count(
        "pluginConfig.concurrency",
        pc.concurrency,
        DEFAULT_CONCURRENCY,
        MAX_CONCURRENCY,
    );
    let conditions = check_conditions(raw.conditions.unwrap_or_default(), bad);
    let rules = raw.rules.unwrap_or_default();
    if rules.len() > MAX_NPD_RULES {
        bad(
            "rules".into(),
            format!("{} rules: at most {MAX_NPD_RULES} per file", rules.len()),
        );
    }
    let rules = rules
        .into_iter()
        .take(MAX_NPD_RULES)
        .enumerate()
        .filter_map(|(i, r)| check_rule(i, r, &conditions, workdir, (invoke_interval, timeout), bad))
        .collect();
    NpdMonitor {
        source: raw.source,
        invoke_interval,
        timeout,
        max_output_length,
        concurrency,
        message_change_updates: pc.enable_message_change_based_condition_update.unwrap_or(false),
        skip_initial_status: pc.skip_initial_status.unwrap_or(false),
        conditions,
        rules,
    }
}

fn check_conditions(raw: Vec<RawCondition>, bad: &mut dyn FnMut(String, String)) -> Vec<NpdCondition> {
    let mut out: Vec<NpdCondition> = Vec::new();
    for (i, c) in raw.into_iter().enumerate() {
        let key = format!("conditions[{i}].type");
        if !valid_condition_type(&c.kind) {
            bad(
                key,
                format!(
                    "{:?}: a condition type is 1-316 letters, digits, `-`, `_`, `.` or `/`",
                    c.kind
                ),
            );
        } else if KUBELET_CONDITIONS.contains(&c.kind.as_str()) {
            bad(
                key,
                format!("{:?} is the kubelet's condition; a monitor may not set it", c.kind),
            );
        } else if out.iter().any(|o| o.kind == c.kind) {
            bad(key, format!("{:?} is defined twice", c.kind));
        } else {
            out.push(NpdCondition {
                kind: c.kind,
                reason: c.reason,
                message: c.message,
            });
        }
    }
    out
}

fn check_rule(
    i: usize,
    r: RawRule,
    conditions: &[NpdCondition],
    workdir: &Path,
    (interval, timeout): (Duration, Duration),
    bad: &mut dyn FnMut(String, String),
) -> Option<NpdRule> {
    let key = |k: &str| format!("rules[{i}].{k}");
    let kind = match r.kind.as_str() {
        "temporary" => NpdRuleKind::Temporary,
        "permanent" if conditions.iter().any(|c| c.kind == r.condition) => NpdRuleKind::Permanent(r.condition),
        "permanent" => {
            bad(
                key("condition"),
                format!(
                    "{:?} is not one of the file's conditions ({}): a permanent rule sets a condition defined there",
                    r.condition,
                    conditions
                        .iter()
                        .map(|c| c.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            return None;
        }
        other => {
            bad(
                key("type"),
                format!("{other:?}: must be \"temporary\" or \"permanent\""),
            );
            return None;
        }
    };
    if r.reason.is_empty() {
        bad(key("reason"), "missing: the reason a problem is reported with".into());
    }
    let rule_duration =
        |k: &str, v: Option<String>, default: Duration, range, bad: &mut dyn FnMut(String, String)| match v {
            None => Some(default),
            Some(v) => bounded(&v, range).map_err(|why| bad(key(k), why.to_string())).ok(),
        };
    let rule_timeout = rule_duration("timeout", r.timeout, timeout, TIMEOUTS, bad)?;
    if rule_timeout > timeout {
        bad(
            key("timeout"),
            format!("{rule_timeout:?} is longer than pluginConfig.timeout ({timeout:?})"),
        );
        return None;
    }
    let invoke_interval = rule_duration("invoke_interval", r.invoke_interval, interval, INTERVALS, bad)?;
    if r.path.is_empty() {
        bad(key("path"), "missing: the program the rule runs".into());
        return None;
    }
    let path = normalize(&workdir.join(&r.path));
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            bad(key("path"), format!("{}: not a regular file", path.display()));
            return None;
        }
        Err(e) => {
            bad(key("path"), format!("{}: {e}", path.display()));
            return None;
        }
    }
    Some(NpdRule {
        kind,
        reason: r.reason,
        path,
        args: r.args.unwrap_or_default(),
        timeout: rule_timeout,
        invoke_interval,
    })
}

/// A condition type as the API server takes it: a qualified name's
/// characters, bounded.
fn valid_condition_type(kind: &str) -> bool {
    (1..=316).contains(&kind.len())
        && kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// `path` with `.` and `..` taken out lexically (no link is followed: the
/// exec grant compares the path as written).
pub fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A Go `time.ParseDuration` string (`"30s"`, `"1m30s"`, `"1.5h"`,
/// `"500ms"`, `"86400s"`): its value, or `None` when it is not one or is
/// negative.
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().ok()?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += value * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_go_reads_them() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("30s", Some(s(30))),
            ("86400s", Some(s(86400))),
            ("1m30s", Some(s(90))),
            ("1.5h", Some(s(5400))),
            ("500ms", Some(Duration::from_millis(500))),
            ("2h45m0.5s", Some(Duration::from_millis(9_900_500))),
            ("0", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("-1s", None),
            ("1d", None),
            ("s", None),
            ("1s2", None),
        ] {
            assert_eq!(go_duration(text), want, "{text:?}");
        }
    }

    #[test]
    fn paths_are_made_absolute_lexically() {
        assert_eq!(
            normalize(&Path::new("/opt/npd").join("./config/plugin/../plugin/check.sh")),
            PathBuf::from("/opt/npd/config/plugin/check.sh")
        );
        assert_eq!(normalize(Path::new("/a/b/../../../c")), PathBuf::from("/c"));
    }
}
