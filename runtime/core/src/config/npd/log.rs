//! An NPD system-log monitor file (`plugin: kmsg`, `filelog` or
//! `journald`): its rules match the lines a log source gives, each pattern
//! compiled in sonde's one regex dialect ([`sonde_regex`], Go's RE2
//! syntax) and, as NPD anchors it, matched against the end of the last
//! `bufferSize` lines.

use super::gotime::TimeLayout;
use super::*;

/// The `plugin`s of a system-log monitor.
pub const LOG_PLUGINS: [&str; 3] = ["kmsg", "filelog", "journald"];

/// A line's longest length in bytes, by default: a longer one is cut.
pub const DEFAULT_LINE_BYTES: u64 = 4096;
/// `max_line_bytes` at most (and at least [`MIN_LINE_BYTES`]).
pub const MAX_LINE_BYTES: u64 = 64 * 1024;
/// `max_line_bytes` at least.
pub const MIN_LINE_BYTES: u64 = 64;
/// Lines read in a second, by default: past it they are dropped.
pub const DEFAULT_LINES_PER_SECOND: u64 = 1000;
/// `max_lines_per_second` at most.
pub const MAX_LINES_PER_SECOND: u64 = 100_000;
/// NPD's `bufferSize` when the file leaves it out (or says 0).
pub const DEFAULT_BUFFER_LINES: usize = 10;
/// `bufferSize` at most: a pattern spans at most that many lines.
pub const MAX_BUFFER_LINES: usize = 1000;
/// `skipList` entries at most.
pub const MAX_SKIP_LIST: usize = 256;
/// `lookback` and `delay` at most.
pub const MAX_LOOKBACK: Duration = Duration::from_secs(366 * 24 * 3600);

/// Why a system-log monitor's bound is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogBoundError {
    /// `max_line_bytes` outside its range.
    #[error("max_line_bytes: {0} is outside {MIN_LINE_BYTES}-{MAX_LINE_BYTES}")]
    LineBytes(u64),
    /// `max_lines_per_second` outside its range.
    #[error("max_lines_per_second: {0} is outside 1-{MAX_LINES_PER_SECOND}")]
    LinesPerSecond(u64),
    /// `bufferSize` outside its range.
    #[error("{0}: must be 0 (NPD's default, {DEFAULT_BUFFER_LINES}) to {MAX_BUFFER_LINES}")]
    BufferSize(i64),
    /// A key only a custom plugin monitor has, on a system-log monitor.
    #[error("{0}: a system-log monitor runs no program; only a custom plugin monitor (plugin: custom) takes it")]
    NotForLogs(&'static str),
    /// A key only a system-log monitor has, on a custom plugin monitor.
    #[error("{0}: only a system-log monitor (plugin: kmsg, filelog or journald) takes it")]
    NotForCustom(&'static str),
}

/// How a system-log monitor reads its lines, bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBounds {
    /// A longer line is cut to this many bytes.
    pub max_line_bytes: usize,
    /// Lines read in a second, at most.
    pub max_lines_per_second: u32,
}

impl Default for LogBounds {
    fn default() -> Self {
        Self {
            max_line_bytes: DEFAULT_LINE_BYTES as usize,
            max_lines_per_second: DEFAULT_LINES_PER_SECOND as u32,
        }
    }
}

impl LogBounds {
    /// The bounds an entry asks for, its defaults filled in, or why not.
    pub fn of(spec: &NpdSpec) -> Result<Self, LogBoundError> {
        let mut b = Self::default();
        if let Some(n) = &spec.max_line_bytes {
            if !(MIN_LINE_BYTES..=MAX_LINE_BYTES).contains(&n.value) {
                return Err(LogBoundError::LineBytes(n.value));
            }
            b.max_line_bytes = n.value as usize;
        }
        if let Some(n) = &spec.max_lines_per_second {
            if !(1..=MAX_LINES_PER_SECOND).contains(&n.value) {
                return Err(LogBoundError::LinesPerSecond(n.value));
            }
            b.max_lines_per_second = n.value as u32;
        }
        Ok(b)
    }
}

/// Where a system-log monitor's lines come from.
#[derive(Clone, Debug, PartialEq)]
pub enum LogSource {
    /// `plugin: kmsg`: the kernel's ring buffer, `/dev/kmsg` (NPD reads
    /// that device whatever `logPath` says, and so does sonde).
    Kmsg,
    /// `plugin: filelog`: a text file, followed.
    File {
        /// `logPath`.
        path: PathBuf,
        /// `pluginConfig.timestamp`: where a line's time is (its last
        /// group, else the whole match).
        timestamp: LogPattern,
        /// `pluginConfig.message`: where a line's message is (likewise).
        message: LogPattern,
        /// `pluginConfig.timestampFormat`, in Go's layout.
        format: TimeLayout,
    },
    /// `plugin: journald`: the systemd journal, the entries of one
    /// `SYSLOG_IDENTIFIER`.
    Journal {
        /// `logPath`: the journal's directory (`/var/log/journal`); absent,
        /// the system's journal.
        dir: Option<PathBuf>,
        /// `pluginConfig.source`: the `SYSLOG_IDENTIFIER` read.
        identifier: String,
    },
}

/// A pattern as written, compiled in sonde's one regex dialect.
#[derive(Clone, Debug)]
pub struct LogPattern {
    /// As written in the file.
    pub text: String,
    /// Compiled.
    pub regex: sonde_regex::Regex,
}

impl PartialEq for LogPattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text && self.regex.as_str() == other.regex.as_str()
    }
}

impl LogPattern {
    /// `text` compiled, with `suffix` after it (NPD anchors a rule's
    /// pattern with `\z`, outside any group: `a|b` + `\z` anchors `b` only).
    fn compile(text: &str, suffix: &str) -> Result<Self, sonde_regex::Error> {
        sonde_regex::compile(text)?;
        Ok(Self {
            text: text.to_string(),
            regex: sonde_regex::compile(&format!("{text}{suffix}"))?,
        })
    }
}

/// An NPD system-log monitor, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct NpdLogMonitor {
    /// `plugin` and its `pluginConfig` and `logPath`.
    pub log: LogSource,
    /// `source`: the component its Events name.
    pub source: String,
    /// `lookback`: lines older than this when the monitor starts are not
    /// matched (0).
    pub lookback: Duration,
    /// `delay`: lines of the first `delay` after boot are not matched (0).
    pub delay: Duration,
    /// `bufferSize`: the lines a pattern is matched against (10).
    pub buffer_lines: usize,
    /// `skipList`: a line containing one of these is not matched.
    pub skip_list: Vec<String>,
    /// `conditions`.
    pub conditions: Vec<NpdCondition>,
    /// `rules`.
    pub rules: Vec<NpdLogRule>,
}

/// One rule: a pattern and what its match means.
#[derive(Clone, Debug, PartialEq)]
pub struct NpdLogRule {
    /// `type` and `condition`.
    pub kind: NpdRuleKind,
    /// `reason`.
    pub reason: String,
    /// `pattern`, anchored at the end of the buffer.
    pub pattern: LogPattern,
    /// `patternGeneratedMessageSuffix`: after the message, past `"; "`.
    pub message_suffix: String,
}

/// The file's shape, as NPD's Go structs spell it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLogMonitor {
    plugin: String,
    #[serde(default, rename = "pluginConfig")]
    plugin_config: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "skipList")]
    skip_list: Option<Vec<String>>,
    #[serde(default, rename = "logPath")]
    log_path: String,
    #[serde(default)]
    lookback: String,
    #[serde(default)]
    delay: String,
    #[serde(default, rename = "bufferSize")]
    buffer_size: i64,
    #[serde(default)]
    source: String,
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
    #[serde(default)]
    rules: Option<Vec<RawLogRule>>,
    #[serde(default, rename = "metricsReporting")]
    _metrics_reporting: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLogRule {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    condition: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    pattern: String,
    #[serde(default, rename = "patternGeneratedMessageSuffix")]
    message_suffix: String,
}

impl NpdLogMonitor {
    /// The system-log monitor file `file` whose text is `text`.
    pub(super) fn parse(file: &Path, text: &str) -> Result<Self, Vec<ConfigError>> {
        let raw: RawLogMonitor = parse_json(file, text)?;
        checked(file, |bad| check(raw, bad))
    }
}

/// Checks `raw` as NPD does when it loads it (its defaults, its fatal
/// errors), and what sonde adds (bounds, the kubelet's conditions).
fn check(raw: RawLogMonitor, bad: &mut dyn FnMut(String, String)) -> NpdLogMonitor {
    if raw.source.trim().is_empty() {
        bad("source".into(), "missing: the name the monitor's Events carry".into());
    }
    let log = log_source(&raw.plugin, raw.plugin_config.unwrap_or_default(), raw.log_path, bad);
    let mut duration = |key: &str, text: &str| {
        if text.is_empty() {
            return Duration::ZERO;
        }
        bounded(text, (Duration::ZERO, MAX_LOOKBACK)).unwrap_or_else(|why| {
            bad(key.into(), why.to_string());
            Duration::ZERO
        })
    };
    let lookback = duration("lookback", &raw.lookback);
    let delay = duration("delay", &raw.delay);
    let buffer_lines = match raw.buffer_size {
        0 => DEFAULT_BUFFER_LINES,
        n if n > 0 && n as u64 <= MAX_BUFFER_LINES as u64 => n as usize,
        n => {
            bad("bufferSize".into(), LogBoundError::BufferSize(n).to_string());
            DEFAULT_BUFFER_LINES
        }
    };
    let skip_list = raw.skip_list.unwrap_or_default();
    if skip_list.len() > MAX_SKIP_LIST {
        bad(
            "skipList".into(),
            format!("{} entries: at most {MAX_SKIP_LIST}", skip_list.len()),
        );
    }
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
        .filter_map(|(i, r)| check_rule(i, r, &conditions, bad))
        .collect();
    NpdLogMonitor {
        log,
        source: raw.source,
        lookback,
        delay,
        buffer_lines,
        skip_list,
        conditions,
        rules,
    }
}

/// The source `plugin` names, from its `pluginConfig` and `logPath`.
fn log_source(
    plugin: &str,
    mut config: BTreeMap<String, String>,
    log_path: String,
    bad: &mut dyn FnMut(String, String),
) -> LogSource {
    let mut take = |key: &str, what: &str, bad: &mut dyn FnMut(String, String)| match config.remove(key) {
        Some(v) if !v.is_empty() => Some(v),
        _ => {
            bad(format!("pluginConfig.{key}"), format!("missing: {what}"));
            None
        }
    };
    let source = match plugin {
        "kmsg" => LogSource::Kmsg,
        "journald" => LogSource::Journal {
            dir: (!log_path.is_empty()).then(|| PathBuf::from(&log_path)),
            identifier: take("source", "the SYSLOG_IDENTIFIER whose entries are read", bad).unwrap_or_default(),
        },
        _ => {
            let mut pattern = |key: &str, what: &str, bad: &mut dyn FnMut(String, String)| {
                let text = take(key, what, bad)?;
                LogPattern::compile(&text, "")
                    .map_err(|e| bad(format!("pluginConfig.{key}"), format!("{text:?}: {e}")))
                    .ok()
            };
            let timestamp = pattern("timestamp", "the pattern of a line's time", bad);
            let message = pattern("message", "the pattern of a line's message", bad);
            let format = take("timestampFormat", "the Go layout of a line's time", bad).and_then(|f| {
                TimeLayout::new(&f)
                    .map_err(|e| bad("pluginConfig.timestampFormat".into(), e.to_string()))
                    .ok()
            });
            if log_path.is_empty() {
                bad("logPath".into(), "missing: the file whose lines are read".into());
            }
            match (timestamp, message, format) {
                (Some(timestamp), Some(message), Some(format)) => LogSource::File {
                    path: PathBuf::from(log_path),
                    timestamp,
                    message,
                    format,
                },
                // Reported above; the monitor is refused.
                _ => LogSource::Kmsg,
            }
        }
    };
    for key in config.keys() {
        bad(
            format!("pluginConfig.{key}"),
            format!("not a key of the {plugin} plugin"),
        );
    }
    source
}

fn check_rule(
    i: usize,
    r: RawLogRule,
    conditions: &[NpdCondition],
    bad: &mut dyn FnMut(String, String),
) -> Option<NpdLogRule> {
    let key = |k: &str| format!("rules[{i}].{k}");
    let kind = rule_kind(i, &r.kind, r.condition, conditions, bad)?;
    if r.reason.is_empty() {
        bad(key("reason"), "missing: the reason a problem is reported with".into());
    }
    let pattern = match LogPattern::compile(&r.pattern, "\\z") {
        Ok(p) => p,
        Err(e) => {
            bad(key("pattern"), format!("{:?}: {e}", r.pattern));
            return None;
        }
    };
    Some(NpdLogRule {
        kind,
        reason: r.reason,
        pattern,
        message_suffix: r.message_suffix,
    })
}
