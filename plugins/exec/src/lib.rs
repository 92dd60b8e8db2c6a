//! The built-in `exec` probe: the host runs a granted program under the
//! probe's deadline and the plugin maps how it ended.
//!
//! - `mode: exit-code` (default): 0 → success, anything else → failure.
//! - `mode: nagios`: 0/1/2/3 → success/warning/failure/unknown, the first
//!   line of stdout is the message, and the performance data after `|` becomes
//!   metrics — so the monitoring-plugins ecosystem runs unchanged.
//! - `mode: npd`: node-problem-detector's custom plugin convention: 0/1 →
//!   success/failure (no problem / a problem), anything else, a timeout or
//!   a signal → unknown; the message is stdout, trimmed and cut to
//!   `max_output_length` bytes (default 80, as NPD's) — so NPD's custom
//!   plugins run unchanged.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::time::Duration;
use serde::Deserialize;
use sonde_sdk::exec::{ExecOutput, run};
use sonde_sdk::{Capability, CapabilityKind, Outcome, PluginInfo, Probe, ProbeError, Request, Status};

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    #[default]
    ExitCode,
    Nagios,
    Npd,
}

/// node-problem-detector's default `max_output_length`.
const NPD_OUTPUT: usize = 80;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    command: Vec<String>,
    #[serde(default)]
    mode: Mode,
    /// `mode: npd` only: the longest message, in bytes.
    #[serde(default)]
    max_output_length: Option<usize>,
}

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "exec",
  "description": "Run a program the probe's exec grant names, under the probe timeout.",
  "type": "object",
  "additionalProperties": false,
  "required": ["command"],
  "properties": {
    "command": {
      "description": "The program's absolute path, then its arguments. No shell unless you name one.",
      "type": "array", "items": {"type": "string"}, "minItems": 1
    },
    "mode": {
      "description": "exit-code: 0 is success, anything else failure. nagios: 0/1/2/3 are success/warning/failure/unknown and perfdata after | becomes metrics. npd: node-problem-detector's 0/1/other as success/failure/unknown, stdout as the message.",
      "enum": ["exit-code", "nagios", "npd"], "default": "exit-code"
    },
    "max_output_length": {
      "description": "mode npd only: the message is stdout, trimmed and cut to this many bytes (node-problem-detector's max_output_length).",
      "type": "integer", "minimum": 1, "maximum": 4096, "default": 80
    }
  }
}"#;

/// Time kept back from the deadline so the plugin reports a timeout itself.
const MARGIN: Duration = Duration::from_millis(20);

struct Exec;

impl Probe for Exec {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "Runs a granted program; maps its exit code, or the Nagios plugin convention.".into(),
            config_schema: Some(SCHEMA.into()),
            capabilities: vec![Capability {
                kind: CapabilityKind::Exec,
                value: "the configured command".into(),
                why: "the probe is the program's verdict".into(),
            }],
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        if config.command.first().is_none_or(|p| !p.starts_with('/')) {
            return Err(ProbeError::invalid_config(
                "command must start with the program's absolute path",
            ));
        }
        if config.max_output_length.is_some() && config.mode != Mode::Npd {
            return Err(ProbeError::invalid_config("max_output_length applies to mode npd only"));
        }
        let timeout = req.remaining().saturating_sub(MARGIN);
        let out = run(&config.command, timeout)?;
        Ok(verdict(&config, &out, timeout))
    }
}

fn verdict(config: &Config, out: &ExecOutput, timeout: Duration) -> Outcome {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let program = &config.command[0];
    if config.mode == Mode::Npd {
        let limit = config.max_output_length.unwrap_or(NPD_OUTPUT);
        return npd(program, out, &stdout, limit, timeout);
    }
    let outcome = match (out.exit_code, out.timed_out) {
        (_, true) => Outcome::failure(format!("{program} timed out after {}ms", timeout.as_millis())),
        (None, false) => Outcome::failure(format!("{program} was killed by a signal")),
        (Some(code), false) => match config.mode {
            Mode::ExitCode => {
                let first = stderr
                    .lines()
                    .chain(stdout.lines())
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                match code {
                    0 => Outcome::success(format!("{program} exited 0")),
                    c => Outcome::failure(
                        format!("{program} exited {c}: {first}")
                            .trim_end_matches([':', ' '])
                            .to_string(),
                    ),
                }
            }
            Mode::Nagios => nagios(code, &stdout),
            Mode::Npd => unreachable!("mode npd returned above"),
        },
    };
    let detail = if stderr.trim().is_empty() {
        stdout.to_string()
    } else {
        format!("{stdout}\n--- stderr ---\n{stderr}")
    };
    if detail.trim().is_empty() {
        outcome
    } else {
        outcome.with_detail(detail)
    }
}

/// Maps an NPD custom plugin's exit code and output: 0 no problem, 1 a
/// problem, anything else (a timeout, a signal) unknown; the message is
/// stdout, trimmed, at most `limit` bytes (cut on a character boundary).
/// stderr is kept as the detail, as NPD logs it.
fn npd(program: &str, out: &ExecOutput, stdout: &str, limit: usize, timeout: Duration) -> Outcome {
    let output = stdout.trim();
    let message = if out.timed_out {
        format!(
            "Timeout when running plugin {program:?} after {}ms. output - {output:?}",
            timeout.as_millis()
        )
    } else {
        output.to_string()
    };
    let mut cut = limit.min(message.len());
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = &message[..cut];
    let status = match (out.exit_code, out.timed_out) {
        (Some(0), false) => Status::Success,
        (Some(1), false) => Status::Failure,
        _ => Status::Unknown,
    };
    let outcome = Outcome::new(status, message);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.trim().is_empty() {
        outcome
    } else {
        outcome.with_detail(format!("--- stderr ---\n{stderr}"))
    }
}

/// Maps a Nagios plugin's exit code and output.
fn nagios(code: i32, stdout: &str) -> Outcome {
    let status = match code {
        0 => Status::Success,
        1 => Status::Warning,
        2 => Status::Failure,
        _ => Status::Unknown,
    };
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or("");
    let (message, perf) = first.split_once('|').unwrap_or((first, ""));
    let mut outcome = Outcome::new(status, message.trim());
    // Long output may carry more perfdata after a `|` on a later line.
    let more = lines.filter_map(|l| l.split_once('|').map(|(_, p)| p));
    for item in core::iter::once(perf).chain(more).flat_map(split_perfdata) {
        if let Some((name, value, unit)) = parse_perf_item(&item) {
            outcome = outcome.with_metric(name, value, unit);
        }
    }
    outcome
}

/// Splits perfdata on spaces, keeping quoted labels whole.
fn split_perfdata(perf: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in perf.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    items.push(core::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        items.push(cur);
    }
    items
}

/// `'label'=value[UOM];warn;crit;min;max` → (metric name, value, unit).
fn parse_perf_item(item: &str) -> Option<(String, f64, String)> {
    let (label, rest) = item.rsplit_once('=')?;
    let label = label.trim_matches('\'');
    let value = rest.split(';').next()?;
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let mut name: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    Some((name, number, unit.to_string()))
}

sonde_sdk::export!(Exec);

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(exit_code: Option<i32>, timed_out: bool, stdout: &str) -> ExecOutput {
        ExecOutput {
            exit_code,
            timed_out,
            stdout: stdout.as_bytes().to_vec(),
            stderr: Vec::new(),
        }
    }

    #[test]
    fn npd_codes_are_ok_problem_and_unknown() {
        let run = |code, timed_out| {
            let out = ended(code, timed_out, "  ntp service is down\n");
            npd("/p", &out, "  ntp service is down\n", 80, Duration::from_secs(3))
        };
        let o = run(Some(0), false);
        assert_eq!((o.status, o.message.as_str()), (Status::Success, "ntp service is down"));
        assert_eq!(run(Some(1), false).status, Status::Failure);
        for (code, timed_out) in [(Some(2), false), (Some(3), false), (Some(-1), false), (None, false)] {
            assert_eq!(run(code, timed_out).status, Status::Unknown, "{code:?}");
        }
        let o = run(None, true);
        assert_eq!(o.status, Status::Unknown);
        assert!(
            o.message.starts_with("Timeout when running plugin \"/p\" after 3000ms"),
            "{}",
            o.message
        );
    }

    #[test]
    fn npd_output_is_cut_to_its_length_on_a_character_boundary() {
        let text = "é".repeat(50);
        let o = npd("/p", &ended(Some(1), false, &text), &text, 81, Duration::ZERO);
        assert_eq!(o.message, "é".repeat(40), "81 bytes cut back to 80: no half character");
        let o = npd("/p", &ended(Some(1), false, "short"), "short", 80, Duration::ZERO);
        assert_eq!(o.message, "short");
    }

    #[test]
    fn nagios_codes_message_and_perfdata() {
        let o = nagios(
            1,
            "DISK WARNING - free space: / 3326 MB (56%) | /=2643MB;5948;5958;0;5968 'inode used'=12%\n",
        );
        assert_eq!(o.status, Status::Warning);
        assert_eq!(o.message, "DISK WARNING - free space: / 3326 MB (56%)");
        assert_eq!(o.metrics.len(), 2);
        assert_eq!(
            (
                o.metrics[0].name.as_str(),
                o.metrics[0].value,
                o.metrics[0].unit.as_str()
            ),
            ("_", 2643.0, "MB")
        );
        assert_eq!(
            (
                o.metrics[1].name.as_str(),
                o.metrics[1].value,
                o.metrics[1].unit.as_str()
            ),
            ("inode_used", 12.0, "%")
        );
        assert_eq!(nagios(7, "odd").status, Status::Unknown);
        assert_eq!(nagios(0, "").message, "");
    }

    #[test]
    fn long_output_perfdata() {
        let o = nagios(0, "OK | a=1s\nmore text | b=2;;;\n");
        let names: Vec<_> = o.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn bad_perf_items_are_skipped() {
        assert_eq!(parse_perf_item("novalue"), None);
        assert_eq!(parse_perf_item("x=U"), None);
        assert_eq!(parse_perf_item("1x=3c"), Some(("_1x".into(), 3.0, "c".into())));
    }
}
