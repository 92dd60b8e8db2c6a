//! The built-in `tcp` probe: success when a TCP connection to the target
//! opens within the deadline, failure (with the reason) when it is refused,
//! unreachable or times out.
//!
//! Optional send/expect steps, like blackbox_exporter's `query_response`,
//! check what the service says: `{"send": "PING\r\n", "expect": "\\+PONG"}`
//! for one exchange, `{"steps": [{"expect": "^220"}, {"send": "QUIT\r\n"}]}`
//! for several. An `expect` reads until its regex matches what arrived since
//! the previous `expect`, the peer closes, or 64 KiB have arrived.

use regex::bytes::Regex;
use serde::Deserialize;
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request, net};
use std::time::{Duration, Instant};

/// How much one `expect` reads at most.
const MAX_READ: usize = 64 * 1024;

/// Time kept back from the deadline so a reply that never matches is
/// reported by the plugin, with what arrived, rather than as a bare timeout.
const MARGIN: Duration = Duration::from_millis(50);

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    send: Option<String>,
    expect: Option<String>,
    #[serde(default)]
    steps: Vec<StepConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepConfig {
    send: Option<String>,
    expect: Option<String>,
}

enum Step {
    Send(String),
    Expect(Regex),
}

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "tcp",
  "description": "Connect to the target (host:port) within the probe timeout, then optionally exchange data.",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "send": {"type": "string", "description": "Bytes to send after connecting (JSON escapes such as \\r\\n apply)."},
    "expect": {"type": "string", "description": "A regex the reply must match, after `send` if both are given."},
    "steps": {
      "description": "Several exchanges in order; each step has exactly one of send or expect. Not with top-level send/expect.",
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "properties": {"send": {"type": "string"}, "expect": {"type": "string"}},
        "minProperties": 1,
        "maxProperties": 1
      }
    }
  }
}"#;

fn compile(pattern: &str) -> Result<Regex, ProbeError> {
    Regex::new(pattern).map_err(|e| ProbeError::invalid_config(format!("expect {pattern:?}: {e}")))
}

/// Turns the config into steps, refusing ambiguous or empty ones.
fn steps(config: Config) -> Result<Vec<Step>, ProbeError> {
    if !config.steps.is_empty() && (config.send.is_some() || config.expect.is_some()) {
        return Err(ProbeError::invalid_config("use either send/expect or steps, not both"));
    }
    let mut steps = Vec::new();
    if let Some(s) = config.send {
        steps.push(Step::Send(s));
    }
    if let Some(e) = config.expect {
        steps.push(Step::Expect(compile(&e)?));
    }
    for (i, step) in config.steps.into_iter().enumerate() {
        steps.push(match (step.send, step.expect) {
            (Some(s), None) => Step::Send(s),
            (None, Some(e)) => Step::Expect(compile(&e)?),
            _ => {
                return Err(ProbeError::invalid_config(format!(
                    "steps[{i}]: give exactly one of send or expect"
                )));
            }
        });
    }
    Ok(steps)
}

/// A short, printable excerpt of bytes that arrived.
fn excerpt(bytes: &[u8]) -> String {
    let text: String = bytes
        .iter()
        .take(256)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    if bytes.len() > 256 { format!("{text}…") } else { text }
}

struct Tcp;

impl Probe for Tcp {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description:
                "Opens a TCP connection to the target within the probe timeout, optionally with send/expect steps."
                    .into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let steps = steps(req.config()?)?;
        let start = Instant::now();
        let mut stream = match net::connect_target(&req) {
            Ok(stream) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(ProbeError::denied(format!(
                    "connect to {}: {}",
                    req.target(),
                    net::describe_error(&e)
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(ProbeError::invalid_config(format!("target {:?}: {e}", req.target())));
            }
            Err(e) => {
                return Ok(Outcome::failure(format!(
                    "connect to {}: {}",
                    req.target(),
                    net::describe_error(&e)
                )));
            }
        };
        let connected = start.elapsed().as_secs_f64();
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Send(data) => {
                    if let Err(e) = net::send(&mut stream, data.as_bytes()) {
                        return Ok(
                            Outcome::failure(format!("step {}: send: {}", i + 1, net::describe_error(&e))).with_metric(
                                "connect_seconds",
                                connected,
                                "seconds",
                            ),
                        );
                    }
                }
                Step::Expect(re) => {
                    let left = req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
                    stream.set_read_timeout(Some(left)).map_err(ProbeError::from)?;
                    let (bytes, error) = net::read_until(&mut stream, MAX_READ, |buf| re.is_match(buf));
                    if !re.is_match(&bytes) {
                        let why = match error {
                            Some(e) => format!("{} after {} bytes", net::describe_error(&e), bytes.len()),
                            None => format!("no match in {} bytes", bytes.len()),
                        };
                        return Ok(
                            Outcome::failure(format!("step {}: expected /{}/: {why}", i + 1, re.as_str()))
                                .with_metric("connect_seconds", connected, "seconds")
                                .with_detail(excerpt(&bytes)),
                        );
                    }
                }
            }
        }
        let message = match steps.len() {
            0 => format!("connected to {}", req.target()),
            n => format!("connected to {} and completed {n} step(s)", req.target()),
        };
        Ok(Outcome::success(message)
            .with_metric("connect_seconds", connected, "seconds")
            .with_metric("probe_seconds", start.elapsed().as_secs_f64(), "seconds"))
    }
}

sonde_sdk::export!(Tcp);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Vec<Step>, ProbeError> {
        steps(serde_json::from_str(json).map_err(|e| ProbeError::invalid_config(e.to_string()))?)
    }

    #[test]
    fn config_forms() {
        assert_eq!(parse("{}").unwrap().len(), 0);
        assert_eq!(parse(r#"{"send": "PING\r\n", "expect": "\\+PONG"}"#).unwrap().len(), 2);
        assert_eq!(
            parse(r#"{"steps": [{"expect": "^220"}, {"send": "QUIT\r\n"}]}"#)
                .unwrap()
                .len(),
            2
        );
        assert!(parse(r#"{"send": "x", "steps": [{"send": "y"}]}"#).is_err());
        assert!(parse(r#"{"steps": [{"send": "y", "expect": "z"}]}"#).is_err());
        assert!(parse(r#"{"steps": [{}]}"#).is_err());
        let err = parse(r#"{"expect": "("}"#).err().unwrap();
        assert!(matches!(err, ProbeError::InvalidConfig(m) if m.contains("expect \"(\"")));
    }

    #[test]
    fn excerpts_are_printable() {
        assert_eq!(excerpt(b"+PONG\r\n"), "+PONG\\r\\n");
        assert!(excerpt(&[0u8; 300]).ends_with('…'));
    }
}
