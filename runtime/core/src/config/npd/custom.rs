//! An NPD custom plugin monitor file (`plugin: custom`): its rules run
//! programs on a clock.

use super::*;

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

impl NpdMonitor {
    /// Reads the monitor file `file`; relative rule paths start at
    /// `workdir`. Every problem is returned, each naming the file and the
    /// key path (`rules[0].condition`), with the line where the parser
    /// knows it.
    pub fn read(file: &Path, workdir: &Path) -> Result<Self, Vec<ConfigError>> {
        let text = read_text(file)?;
        Self::parse(file, &text, workdir)
    }

    /// The monitor file `file` whose text is `text` (read by
    /// [`NpdFile::read`]).
    pub(super) fn parse(file: &Path, text: &str, workdir: &Path) -> Result<Self, Vec<ConfigError>> {
        let raw: RawMonitor = parse_json(file, text)?;
        checked(file, |bad| check(raw, workdir, bad))
    }
}

/// Checks `raw` as NPD's `ApplyConfiguration` and `Validate` do, and what
/// sonde adds (kubelet conditions, bounds); each problem goes to `bad`
/// with its key path.
fn check(raw: RawMonitor, workdir: &Path, bad: &mut dyn FnMut(String, String)) -> NpdMonitor {
    if raw.plugin != "custom" {
        bad(
            "plugin".into(),
            format!(
                "{:?}: must be \"custom\" (a custom plugin monitor) or one of {} (a system-log monitor)",
                raw.plugin,
                LOG_PLUGINS.join(", ")
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

fn check_rule(
    i: usize,
    r: RawRule,
    conditions: &[NpdCondition],
    workdir: &Path,
    (interval, timeout): (Duration, Duration),
    bad: &mut dyn FnMut(String, String),
) -> Option<NpdRule> {
    let key = |k: &str| format!("rules[{i}].{k}");
    let kind = rule_kind(i, &r.kind, r.condition, conditions, bad)?;
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
