//! The `tcp` plugin's config: its keys, its JSON Schema, and the steps it
//! turns into.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::Deserialize;
use sonde_regex::BytesRegex as Regex;
use sonde_sdk::ProbeError;
use sonde_sdk::tls::TlsOptions;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    send: Option<String>,
    expect: Option<String>,
    #[serde(default)]
    steps: Vec<StepConfig>,
    #[serde(default)]
    pub(crate) tls: bool,
    ca_file: Option<String>,
    ca_pem: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
    server_name: Option<String>,
    /// With `tls`: a client certificate (mTLS), each part a handle or PEM.
    pub(crate) client_cert: Option<sonde_sdk::credentials::ClientCert>,
}

impl Config {
    /// The TLS options, when `tls` is on or a step is `starttls`; TLS keys
    /// without either are a mistake, and so is `starttls` with `tls`.
    pub(crate) fn tls_options(&self) -> Result<Option<TlsOptions>, ProbeError> {
        let starttls = self.steps.iter().any(|s| s.starttls.is_some());
        if self.tls && starttls {
            return Err(ProbeError::invalid_config(
                "a starttls step needs a plain connection: leave out \"tls\": true",
            ));
        }
        if !self.tls && !starttls {
            if self.ca_file.is_some()
                || self.ca_pem.is_some()
                || self.insecure_skip_verify
                || self.server_name.is_some()
                || self.client_cert.is_some()
            {
                return Err(ProbeError::invalid_config(
                    "ca_file, ca_pem, insecure_skip_verify, server_name and client_cert need \"tls\": true or a starttls step",
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
    starttls: Option<bool>,
}

pub(crate) enum Step {
    Send(Vec<u8>),
    /// Text whose `$1`, `${name}`… the last `expect`'s groups replace.
    SendExpand(String),
    Expect(Regex),
    ExpectBytes(Vec<u8>),
    /// Upgrade the plain connection to TLS (by the host), with the
    /// config's TLS options.
    StartTls,
}

pub(crate) const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "tcp",
  "description": "Connect to the target (host:port) within the probe timeout, then optionally exchange data.",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "send": {"type": "string", "description": "Bytes to send after connecting (JSON escapes such as \\r\\n apply)."},
    "expect": {"type": "string", "format": "regex", "description": "A regex the reply must match, after `send` if both are given."},
    "tls": {"type": "boolean", "default": false, "description": "Complete a TLS handshake (by the host) after connecting; reports tls_seconds and cert_expiry_seconds. Send/expect steps then run over TLS. Not with a starttls step."},
    "ca_file": {"type": "string", "description": "With tls or a starttls step: PEM file of CAs to trust instead of the system roots (needs a files grant). Not with ca_pem."},
    "ca_pem": {"type": "string", "description": "With tls or a starttls step: PEM text of CAs to trust instead of the system roots."},
    "insecure_skip_verify": {"type": "boolean", "default": false, "description": "With tls or a starttls step: accept any certificate (its expiry is still reported)."},
    "server_name": {"type": "string", "description": "With tls or a starttls step: name sent as SNI and verified, instead of the target's host."},
    "client_cert": {"type": "object", "additionalProperties": false, "required": ["cert", "key"], "description": "With tls or a starttls step: a client certificate (mTLS) the host presents; each of cert and key is a secret's handle, $(secret:NAME), or PEM text.", "properties": {"cert": {"type": "string"}, "key": {"type": "string"}}},
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
          "expect_bytes_base64": {"type": "string", "minLength": 1, "contentEncoding": "base64", "description": "As expect_bytes, the bytes in standard base64."},
          "starttls": {"const": true, "description": "Upgrade the connection to TLS here (after the server agreed to STARTTLS), verified with the TLS keys; later steps run over TLS, and the outcome reports tls_seconds and cert_expiry_seconds."}
        },
        "minProperties": 1,
        "maxProperties": 1
      }
    }
  }
}"#;

pub(crate) fn compile(pattern: &str) -> Result<Regex, ProbeError> {
    sonde_regex::compile_bytes(pattern).map_err(|e| ProbeError::invalid_config(format!("expect {pattern:?}: {e}")))
}

/// Standard base64 (padding optional, no whitespace), decoded.
pub(crate) fn base64(text: &str) -> Option<Vec<u8>> {
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

/// Turns the config into steps, refusing ambiguous or empty ones.
pub(crate) fn steps(config: Config) -> Result<Vec<Step>, ProbeError> {
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
        starttls,
    } = step;
    let given = [
        send.is_some(),
        send_base64.is_some(),
        send_expand.is_some(),
        expect.is_some(),
        expect_bytes.is_some(),
        expect_bytes_base64.is_some(),
        starttls.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(ProbeError::invalid_config(format!(
            "steps[{i}]: give exactly one of send, send_base64, send_expand, expect, expect_bytes, expect_bytes_base64 or starttls"
        )));
    }
    let decode = |key: &str, text: &str| {
        base64(text).ok_or_else(|| ProbeError::invalid_config(format!("steps[{i}].{key}: not base64")))
    };
    let step = if let Some(on) = starttls {
        if !on {
            return Err(ProbeError::invalid_config(format!(
                "steps[{i}]: starttls is true or left out"
            )));
        }
        Step::StartTls
    } else if let Some(s) = send {
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
    fn starttls_steps() {
        let config = |json: &str| serde_json::from_str::<Config>(json).unwrap().tls_options();
        let smtp = r#"{"steps": [{"expect": "^220"}, {"send": "STARTTLS\r\n"}, {"starttls": true}], "ca_pem": "x"}"#;
        assert_eq!(config(smtp).unwrap().unwrap().ca_pem.as_deref(), Some("x"));
        assert!(config(r#"{"steps": [{"starttls": true}]}"#).unwrap().is_some());
        let both = config(r#"{"tls": true, "steps": [{"starttls": true}]}"#).unwrap_err();
        assert!(matches!(both, ProbeError::InvalidConfig(m) if m.contains("plain connection")));
        let steps = parse(smtp).unwrap();
        assert!(matches!(steps[2], Step::StartTls));
        assert!(parse(r#"{"steps": [{"starttls": false}]}"#).is_err());
        assert!(parse(r#"{"steps": [{"starttls": true, "send": "x"}]}"#).is_err());
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
}
