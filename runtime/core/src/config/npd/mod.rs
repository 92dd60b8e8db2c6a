//! The `node_problem_detector:` block, and the node-problem-detector
//! monitor files it names, read as NPD reads them: the same keys, defaults
//! and checks, so an NPD user points sonde at the files they have. A file
//! whose `plugin` is `custom` is a custom plugin monitor ([`custom`]); one
//! whose `plugin` is `kmsg`, `filelog` or `journald` is a system-log
//! monitor ([`log`]).
//!
//! ```yaml
//! node_problem_detector:
//!   - config: /etc/npd/custom-plugin-monitor.json
//!     exec: [/etc/npd/plugin]     # the programs its rules may run, or their directories
//!     workdir: /                  # where relative rule paths start (NPD's working directory)
//!   - config: /etc/npd/kernel-monitor.json
//!     max_line_bytes: 4096        # a longer log line is cut
//!     max_lines_per_second: 1000  # past it lines are dropped, and counted
//! ```

use super::*;

mod custom;
mod gotime;
mod log;

pub use custom::*;
pub use gotime::{TimeError, TimeLayout};
pub use log::*;

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
    /// `max_line_bytes: 4096` — a system-log monitor's longest line: a
    /// longer one is cut to it (and counted). Default [`DEFAULT_LINE_BYTES`],
    /// at most [`MAX_LINE_BYTES`]. Refused on a custom plugin monitor.
    #[serde(default)]
    pub max_line_bytes: Option<Spanned<u64>>,
    /// `max_lines_per_second: 1000` — the most lines a system-log monitor
    /// reads in a second (a burst of that many at once): past it a line is
    /// dropped (and counted). Default [`DEFAULT_LINES_PER_SECOND`], at most
    /// [`MAX_LINES_PER_SECOND`]. Refused on a custom plugin monitor.
    #[serde(default)]
    pub max_lines_per_second: Option<Spanned<u64>>,
}

/// What a `node_problem_detector:` entry's file is.
#[derive(Clone, Debug, PartialEq)]
pub enum NpdFile {
    /// `plugin: custom`: rules that run programs.
    Custom(NpdMonitor),
    /// `plugin: kmsg`, `filelog` or `journald`: rules that match log lines.
    Log(NpdLogMonitor),
}

impl NpdFile {
    /// Reads the monitor file `file`, whichever its `plugin`; a custom
    /// monitor's relative rule paths start at `workdir`. Every problem is
    /// returned, each naming the file and the key path
    /// (`rules[0].pattern`), with the line where the parser knows it.
    pub fn read(file: &Path, workdir: &Path) -> Result<Self, Vec<ConfigError>> {
        #[derive(Deserialize)]
        struct Plugin {
            #[serde(default)]
            plugin: String,
        }
        let text = read_text(file)?;
        // The one key that says which shape the rest has.
        let plugin = serde_json::from_str::<Plugin>(&text)
            .map(|p| p.plugin)
            .unwrap_or_default();
        if LOG_PLUGINS.contains(&plugin.as_str()) {
            NpdLogMonitor::parse(file, &text).map(Self::Log)
        } else {
            NpdMonitor::parse(file, &text, workdir).map(Self::Custom)
        }
    }

    /// Its conditions.
    pub fn conditions(&self) -> &[NpdCondition] {
        match self {
            Self::Custom(m) => &m.conditions,
            Self::Log(m) => &m.conditions,
        }
    }

    /// Its `source`.
    pub fn source(&self) -> &str {
        match self {
            Self::Custom(m) => &m.source,
            Self::Log(m) => &m.source,
        }
    }
}

/// The text of the monitor file `file`, or why not, at the file.
fn read_text(file: &Path) -> Result<String, Vec<ConfigError>> {
    read_bounded(file).map_err(|e| {
        vec![ConfigError {
            place: Place {
                file: file.to_path_buf(),
                line: 0,
                column: 0,
            },
            message: e.to_string(),
        }]
    })
}

/// `text` (of `file`) in NPD's JSON shape `T`, or where and why not.
fn parse_json<T: serde::de::DeserializeOwned>(file: &Path, text: &str) -> Result<T, Vec<ConfigError>> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let key = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        vec![ConfigError {
            place: Place {
                file: file.to_path_buf(),
                line: inner.line() as u64,
                column: inner.column() as u64,
            },
            message: format!("{key}{}", strip_position(&inner.to_string())),
        }]
    })
}

/// What `check` makes of a file, unless it reported a problem (a key
/// path and why) at `file`.
fn checked<T>(file: &Path, check: impl FnOnce(&mut dyn FnMut(String, String)) -> T) -> Result<T, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let out = check(&mut |key: String, message: String| {
        errors.push(ConfigError {
            place: Place {
                file: file.to_path_buf(),
                line: 0,
                column: 0,
            },
            message: format!("{key}: {message}"),
        })
    });
    if errors.is_empty() { Ok(out) } else { Err(errors) }
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

/// Rule `i`'s `type`, and for a permanent rule its `condition`, which one
/// of the file's `conditions` must define; a problem goes to `bad`.
fn rule_kind(
    i: usize,
    kind: &str,
    condition: String,
    conditions: &[NpdCondition],
    bad: &mut dyn FnMut(String, String),
) -> Option<NpdRuleKind> {
    let key = |k: &str| format!("rules[{i}].{k}");
    match kind {
        "temporary" => Some(NpdRuleKind::Temporary),
        "permanent" if conditions.iter().any(|c| c.kind == condition) => Some(NpdRuleKind::Permanent(condition)),
        "permanent" => {
            bad(
                key("condition"),
                format!(
                    "{condition:?} is not one of the file's conditions ({}): a permanent rule sets a condition defined there",
                    conditions
                        .iter()
                        .map(|c| c.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            None
        }
        other => {
            bad(
                key("type"),
                format!("{other:?}: must be \"temporary\" or \"permanent\""),
            );
            None
        }
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
