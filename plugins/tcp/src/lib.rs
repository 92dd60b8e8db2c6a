//! The built-in `tcp` probe: success when a TCP connection to the target
//! opens within the deadline, failure (with the reason) when it is refused,
//! unreachable or times out.
//!
//! Optional send/expect steps, like blackbox_exporter's `query_response`,
//! check what the service says: `{"send": "PING\r\n", "expect": "\\+PONG"}`
//! for one exchange, `{"steps": [{"expect": "^220"}, {"send": "QUIT\r\n"}]}`
//! for several. An `expect` reads until its regex matches what arrived since
//! the previous `expect`, the peer closes, or 64 KiB have arrived.
//!
//! With `{"tls": true}` the host connects and completes a TLS handshake
//! instead (the system's roots, or `ca_file` / `ca_pem`, or
//! `insecure_skip_verify`), and the outcome reports the handshake time and
//! the seconds until the server certificate expires. Send/expect steps then
//! run over the TLS session, which the host holds for the plugin.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;
use serde::Deserialize;
use sonde_regex::BytesRegex as Regex;
use sonde_sdk::time::Instant;
use sonde_sdk::tls::{HandshakeError, Session, TlsOptions};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

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
    #[serde(default)]
    tls: bool,
    ca_file: Option<String>,
    ca_pem: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
    server_name: Option<String>,
    /// With `tls`: a client certificate (mTLS), each part a handle or PEM.
    client_cert: Option<sonde_sdk::credentials::ClientCert>,
}

impl Config {
    /// The TLS options, when `tls` is on; TLS keys without it are a mistake.
    fn tls_options(&self) -> Result<Option<TlsOptions>, ProbeError> {
        if !self.tls {
            if self.ca_file.is_some()
                || self.ca_pem.is_some()
                || self.insecure_skip_verify
                || self.server_name.is_some()
                || self.client_cert.is_some()
            {
                return Err(ProbeError::invalid_config(
                    "ca_file, ca_pem, insecure_skip_verify, server_name and client_cert need \"tls\": true",
                ));
            }
            return Ok(None);
        }
        let options = TlsOptions::from_config(
            self.ca_file.as_deref(),
            self.ca_pem.as_deref(),
            self.insecure_skip_verify,
            self.server_name.as_deref(),
        )?;
        Ok(Some(options))
    }
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
    "expect": {"type": "string", "format": "regex", "description": "A regex the reply must match, after `send` if both are given."},
    "tls": {"type": "boolean", "default": false, "description": "Complete a TLS handshake (by the host) after connecting; reports tls_seconds and cert_expiry_seconds. Send/expect steps then run over TLS."},
    "ca_file": {"type": "string", "description": "With tls: PEM file of CAs to trust instead of the system roots (needs a files grant). Not with ca_pem."},
    "ca_pem": {"type": "string", "description": "With tls: PEM text of CAs to trust instead of the system roots."},
    "insecure_skip_verify": {"type": "boolean", "default": false, "description": "With tls: accept any certificate (its expiry is still reported)."},
    "server_name": {"type": "string", "description": "With tls: name sent as SNI and verified, instead of the target's host."},
    "client_cert": {"type": "object", "additionalProperties": false, "required": ["cert", "key"], "description": "With tls: a client certificate (mTLS) the host presents; each of cert and key is a secret's handle, $(secret:NAME), or PEM text.", "properties": {"cert": {"type": "string"}, "key": {"type": "string"}}},
    "steps": {
      "description": "Several exchanges in order; each step has exactly one of send or expect. Not with top-level send/expect.",
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "properties": {"send": {"type": "string"}, "expect": {"type": "string", "format": "regex"}},
        "minProperties": 1,
        "maxProperties": 1
      }
    }
  }
}"#;

fn compile(pattern: &str) -> Result<Regex, ProbeError> {
    sonde_regex::compile_bytes(pattern).map_err(|e| ProbeError::invalid_config(format!("expect {pattern:?}: {e}")))
}

fn with_metrics(mut outcome: Outcome, metrics: &[(&str, f64)]) -> Outcome {
    for (name, value) in metrics {
        outcome = outcome.with_metric(*name, *value, "seconds");
    }
    outcome
}

/// Runs `steps` over `session`: the failure of the first that fails (with
/// `metrics`), or `None` when all passed.
fn exchange(req: &Request, session: &mut Session, steps: &[Step], metrics: &[(&str, f64)]) -> Option<Outcome> {
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Send(data) => {
                if let Err(e) = session.send(data.as_bytes()) {
                    let failure = Outcome::failure(format!("step {}: send: {}", i + 1, e.describe()));
                    return Some(with_metrics(failure, metrics));
                }
            }
            Step::Expect(re) => {
                let left = req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
                session.set_read_timeout(left);
                let (bytes, error) = session.read_until(MAX_READ, |buf| re.is_match(buf));
                if !re.is_match(&bytes) {
                    // The peer closed without a match: what blackbox's
                    // `probe_failed_due_to_regex` counts (a timeout is not).
                    let closed = error.is_none() && bytes.len() < MAX_READ;
                    let why = match error {
                        Some(e) => format!("{} after {} bytes", e.describe(), bytes.len()),
                        None => format!("no match in {} bytes", bytes.len()),
                    };
                    let failure = Outcome::failure(format!("step {}: expected /{}/: {why}", i + 1, re.as_str()));
                    let failure = with_metrics(failure, metrics).with_detail(excerpt(&bytes));
                    return Some(if closed {
                        failure.with_metric("failed_due_to_regex", 1.0, "")
                    } else {
                        failure
                    });
                }
            }
        }
    }
    None
}

fn steps_done(steps: &[Step]) -> String {
    match steps.len() {
        0 => String::new(),
        n => format!(" and completed {n} step(s)"),
    }
}

/// The check of `{"tls": true}`: a handshake by the host, then the steps
/// over the session.
fn check_tls(req: &Request, options: &TlsOptions, steps: &[Step]) -> Result<Outcome, ProbeError> {
    let (host, port) = sonde_sdk::net::host_port(req.target())?;
    let (mut session, h) = match sonde_sdk::tls::connect(host, port, options, req.remaining()) {
        Ok(connected) => connected,
        Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(format!("{}: {m}", req.target()))),
        Err(HandshakeError::Probe(e)) => return Err(e),
    };
    let expires = h.info.expires_in_seconds();
    let metrics = [
        ("connect_seconds", h.connect_seconds),
        ("tls_seconds", h.tls_seconds),
        ("cert_expiry_seconds", expires),
    ];
    if let Some(failure) = exchange(req, &mut session, steps, &metrics) {
        return Ok(failure);
    }
    let message = format!(
        "{} with {}: certificate of {} expires in {} days{}",
        h.info.version,
        req.target(),
        h.info.subject,
        whole_days(expires),
        steps_done(steps)
    );
    Ok(with_metrics(Outcome::success(message), &metrics).with_metric(
        "probe_seconds",
        h.dns_seconds + h.connect_seconds + h.tls_seconds,
        "seconds",
    ))
}

/// Whole days in `seconds`, rounded down (`f64::floor` is not in `core`).
fn whole_days(seconds: f64) -> f64 {
    let days = seconds / 86_400.0;
    let truncated = days as i64 as f64;
    if truncated > days { truncated - 1.0 } else { truncated }
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
        .flat_map(|b| core::ascii::escape_default(*b))
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
        let config: Config = req.config()?;
        let tls = config.tls_options()?;
        if let Some(spec) = &config.client_cert {
            let (host, port) = sonde_sdk::net::host_port(req.target())?;
            spec.present(host, port)?;
        }
        let steps = steps(config)?;
        if let Some(options) = tls {
            return check_tls(&req, &options, &steps);
        }
        let start = Instant::now();
        // The host dials: no socket stack in the sandbox, and a reset at
        // the end instead of a FIN and a TIME_WAIT.
        let (host, port) = sonde_sdk::net::host_port(req.target())?;
        let (mut stream, connected) = match sonde_sdk::tcp::connect(host, port, req.remaining()) {
            Ok(c) => c,
            Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(format!("{}: {m}", req.target()))),
            Err(HandshakeError::Probe(e)) => return Err(e),
        };
        let metrics = [("connect_seconds", connected.connect_seconds)];
        if let Some(failure) = exchange(&req, &mut stream, &steps, &metrics) {
            return Ok(failure);
        }
        let message = format!("connected to {}{}", req.target(), steps_done(&steps));
        Ok(with_metrics(Outcome::success(message), &metrics).with_metric(
            "probe_seconds",
            start.elapsed().as_secs_f64(),
            "seconds",
        ))
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
    fn tls_config() {
        let config = |json: &str| serde_json::from_str::<Config>(json).unwrap().tls_options();
        assert_eq!(config("{}").unwrap(), None);
        assert!(
            config(r#"{"tls": true, "insecure_skip_verify": true}"#)
                .unwrap()
                .is_some()
        );
        assert!(config(r#"{"insecure_skip_verify": true}"#).is_err());
        assert!(config(r#"{"tls": true, "send": "x"}"#).unwrap().is_some());
        assert!(config(r#"{"tls": true, "ca_pem": "x", "insecure_skip_verify": true}"#).is_err());
        assert_eq!(sonde_sdk::net::host_port("[::1]:443").unwrap(), ("::1", 443));
        assert_eq!(sonde_sdk::net::host_port("db:5432").unwrap(), ("db", 5432));
        assert!(sonde_sdk::net::host_port("db").is_err());
    }

    #[test]
    fn days_round_down() {
        assert_eq!(whole_days(89.9 * 86_400.0), 89.0);
        assert_eq!(whole_days(-0.5 * 86_400.0), -1.0);
        assert_eq!(whole_days(0.0), 0.0);
        assert_eq!(whole_days(-2.0 * 86_400.0), -2.0);
    }

    #[test]
    fn excerpts_are_printable() {
        assert_eq!(excerpt(b"+PONG\r\n"), "+PONG\\r\\n");
        assert!(excerpt(&[0u8; 300]).ends_with('…'));
    }
}
