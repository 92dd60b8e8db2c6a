//! The built-in `tcp` probe: success when a TCP connection to the target
//! opens within the deadline, failure (with the reason) when it is refused,
//! unreachable or times out.
//!
//! Optional send/expect steps, like blackbox_exporter's `query_response`,
//! check what the service says: `{"send": "PING\r\n", "expect": "\\+PONG"}`
//! for one exchange, `{"steps": [{"expect": "^220"}, {"send": "QUIT\r\n"}]}`
//! for several. An `expect` reads until its regex matches what arrived since
//! the previous `expect`, the peer closes, or 64 KiB have arrived.
//! `expect_bytes` (or `expect_bytes_base64`) reads exactly its bytes and
//! compares them; `send_base64` sends bytes that are not text; `send_expand`
//! sends its text with `${1}`, `$name`… replaced by the groups of the last
//! `expect`'s match (blackbox_exporter's `query_response`).
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
    send_base64: Option<String>,
    send_expand: Option<String>,
    expect: Option<String>,
    expect_bytes: Option<String>,
    expect_bytes_base64: Option<String>,
}

enum Step {
    Send(Vec<u8>),
    /// Text whose `$1`, `${name}`… the last `expect`'s groups replace.
    SendExpand(String),
    Expect(Regex),
    ExpectBytes(Vec<u8>),
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
      "description": "Several exchanges in order; each step has exactly one key. Not with top-level send/expect.",
      "type": "array",
      "items": {
        "type": "object",
        "additionalProperties": false,
        "properties": {
          "send": {"type": "string", "description": "Text to send."},
          "send_base64": {"type": "string", "contentEncoding": "base64", "description": "Bytes to send, in standard base64."},
          "send_expand": {"type": "string", "description": "Text to send, with $1, ${1}, $name or ${name} replaced by the groups of the last expect's match ($$ for a $)."},
          "expect": {"type": "string", "format": "regex"},
          "expect_bytes": {"type": "string", "minLength": 1, "description": "Read exactly these bytes (the text's UTF-8); a difference fails with failed_due_to_bytes 1."},
          "expect_bytes_base64": {"type": "string", "minLength": 1, "contentEncoding": "base64", "description": "As expect_bytes, the bytes in standard base64."}
        },
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
    // The last expect's regex and what it matched in.
    let mut last: Option<(&Regex, Vec<u8>)> = None;
    for (i, step) in steps.iter().enumerate() {
        let failed = |why: String| {
            Some(with_metrics(
                Outcome::failure(format!("step {}: {why}", i + 1)),
                metrics,
            ))
        };
        match step {
            Step::Send(data) => {
                if let Err(e) = session.send(data) {
                    return failed(format!("send: {}", e.describe()));
                }
            }
            Step::SendExpand(template) => {
                let mut data = Vec::new();
                match &last {
                    // The groups of the first line that matches, without its
                    // end (\n or \r\n), as blackbox_exporter reads lines.
                    Some((re, bytes)) => {
                        let lines = bytes.split(|b| *b == b'\n');
                        let line = lines
                            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                            .find_map(|l| re.captures(l));
                        if let Some(caps) = line {
                            caps.expand(template.as_bytes(), &mut data);
                        }
                    }
                    None => data.extend_from_slice(template.as_bytes()),
                }
                if let Err(e) = session.send(&data) {
                    return failed(format!("send: {}", e.describe()));
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
                    let failure = failed(format!("expected /{}/: {why}", re.as_str()))?.with_detail(excerpt(&bytes));
                    return Some(if closed {
                        failure.with_metric("failed_due_to_regex", 1.0, "")
                    } else {
                        failure
                    });
                }
                last = Some((re, bytes));
            }
            Step::ExpectBytes(want) => {
                let left = req.remaining().saturating_sub(MARGIN).max(Duration::from_millis(1));
                session.set_read_timeout(left);
                let (got, error) = read_exactly(session, want.len());
                if got.len() < want.len() {
                    let why = error.map_or_else(|| "the peer closed".into(), |e| e.describe());
                    return Some(
                        failed(format!("expected {} bytes: {why} after {}", want.len(), got.len()))?
                            .with_detail(excerpt(&got)),
                    );
                }
                if got != *want {
                    // blackbox's `probe_failed_due_to_bytes`.
                    let why = format!("expected the bytes {}, got {}", excerpt(want), excerpt(&got));
                    return Some(failed(why)?.with_metric("failed_due_to_bytes", 1.0, ""));
                }
            }
        }
    }
    None
}

/// Reads until `n` bytes arrived (never more: the rest is the next step's),
/// the peer closes or a read fails: what arrived, and the failure.
fn read_exactly(session: &mut Session, n: usize) -> (Vec<u8>, Option<sonde_sdk::tls::SessionError>) {
    let mut got = alloc::vec![0u8; n];
    let mut have = 0;
    while have < n {
        match session.read(&mut got[have..]) {
            Ok(0) => break,
            Ok(k) => have += k,
            Err(e) => {
                got.truncate(have);
                return (got, Some(e));
            }
        }
    }
    got.truncate(have);
    (got, None)
}

/// Standard base64 (padding optional, no whitespace), decoded.
fn base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let text = text.trim_end_matches('=').as_bytes();
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= u32::from(value(c)?) << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
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
        steps.push(Step::Send(s.into_bytes()));
    }
    if let Some(e) = config.expect {
        steps.push(Step::Expect(compile(&e)?));
    }
    for (i, step) in config.steps.into_iter().enumerate() {
        steps.push(step_of(i, step)?);
    }
    Ok(steps)
}

/// One entry of `steps`, which has exactly one key.
fn step_of(i: usize, step: StepConfig) -> Result<Step, ProbeError> {
    let StepConfig {
        send,
        send_base64,
        send_expand,
        expect,
        expect_bytes,
        expect_bytes_base64,
    } = step;
    let given = [
        send.is_some(),
        send_base64.is_some(),
        send_expand.is_some(),
        expect.is_some(),
        expect_bytes.is_some(),
        expect_bytes_base64.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ProbeError::invalid_config(format!(
            "steps[{i}]: give exactly one of send, send_base64, send_expand, expect, expect_bytes or expect_bytes_base64"
        )));
    }
    let decode = |key: &str, text: &str| {
        base64(text).ok_or_else(|| ProbeError::invalid_config(format!("steps[{i}].{key}: not base64")))
    };
    let step = if let Some(s) = send {
        Step::Send(s.into_bytes())
    } else if let Some(b) = send_base64 {
        Step::Send(decode("send_base64", &b)?)
    } else if let Some(t) = send_expand {
        Step::SendExpand(t)
    } else if let Some(e) = expect {
        Step::Expect(compile(&e)?)
    } else if let Some(b) = expect_bytes {
        Step::ExpectBytes(b.into_bytes())
    } else {
        Step::ExpectBytes(decode("expect_bytes_base64", &expect_bytes_base64.unwrap_or_default())?)
    };
    if matches!(&step, Step::ExpectBytes(b) if b.is_empty()) {
        return Err(ProbeError::invalid_config(format!("steps[{i}]: expect_bytes is empty")));
    }
    Ok(step)
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
    fn byte_steps() {
        assert_eq!(base64("AAAACATSFi8=").unwrap(), [0, 0, 0, 8, 4, 0xd2, 0x16, 0x2f]);
        assert_eq!(base64("SGk").unwrap(), b"Hi");
        assert_eq!(base64("").unwrap(), b"");
        assert!(base64("S").is_none() && base64("S*==").is_none());
        let steps =
            parse(r#"{"steps": [{"send_base64": "SGk="}, {"expect_bytes": "S"}, {"send_expand": "PONG ${1}"}]}"#)
                .unwrap();
        assert!(matches!(&steps[0], Step::Send(b) if b == b"Hi"));
        assert!(matches!(&steps[1], Step::ExpectBytes(b) if b == b"S"));
        assert!(parse(r#"{"steps": [{"expect_bytes": ""}]}"#).is_err());
        assert!(parse(r#"{"steps": [{"send_base64": "%"}]}"#).is_err());
        assert!(parse(r#"{"steps": [{"send": "a", "send_base64": "SGk="}]}"#).is_err());
    }

    #[test]
    fn excerpts_are_printable() {
        assert_eq!(excerpt(b"+PONG\r\n"), "+PONG\\r\\n");
        assert!(excerpt(&[0u8; 300]).ends_with('…'));
    }
}
