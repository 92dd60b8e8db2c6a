//! The `tls-cert` probe: how long until the target's certificate expires.
//!
//! The host connects to the target (`host:port`, or an `https://` URL) and
//! completes a TLS handshake, verifying the chain against the system roots
//! (or the configured CA) and the name; the plugin judges the leaf
//! certificate's `notAfter`: a warning when it expires within `warn_days`
//! (default 30), a failure within `fail_days` (default 7). A handshake that
//! fails — an untrusted chain, an expired certificate, a wrong name — is a
//! failure that says why.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use serde::Deserialize;
use sonde_sdk::tls::{HandshakeError, TlsOptions};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_warn")]
    warn_days: f64,
    #[serde(default = "default_fail")]
    fail_days: f64,
    server_name: Option<String>,
    ca_file: Option<String>,
    ca_pem: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

fn default_warn() -> f64 {
    30.0
}

fn default_fail() -> f64 {
    7.0
}

/// The host and port of a `host:port` target or an `https://` URL.
fn endpoint(target: &str) -> Result<(&str, u16), ProbeError> {
    let Some(rest) = target.strip_prefix("https://") else {
        return sonde_sdk::net::host_port(target);
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    match sonde_sdk::net::host_port(authority) {
        Ok(hp) => Ok(hp),
        Err(_) if !authority.is_empty() => Ok((authority.trim_start_matches('[').trim_end_matches(']'), 443)),
        Err(e) => Err(e),
    }
}

/// Judges a certificate that expires in `days`.
fn judge(days: f64, config: &Config) -> sonde_sdk::Status {
    use sonde_sdk::Status;
    if days < config.fail_days {
        Status::Failure
    } else if days < config.warn_days {
        Status::Warning
    } else {
        Status::Success
    }
}

struct TlsCert;

impl Probe for TlsCert {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "Days until the target's TLS certificate expires, with warning and failure thresholds.".into(),
            config_schema: Some(include_str!("schema.json").into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        if config.fail_days > config.warn_days {
            return Err(ProbeError::invalid_config("fail_days must not be more than warn_days"));
        }
        let options = TlsOptions::from_config(
            config.ca_file.as_deref(),
            config.ca_pem.as_deref(),
            config.insecure_skip_verify,
            config.server_name.as_deref(),
        )?;
        let (host, port) = endpoint(req.target())?;
        let h = match sonde_sdk::tls::handshake(host, port, &options, req.remaining()) {
            Ok(h) => h,
            Err(HandshakeError::Failed(m)) => return Ok(Outcome::failure(format!("{}: {m}", req.target()))),
            Err(HandshakeError::Probe(e)) => return Err(e),
        };
        let seconds = h.info.expires_in_seconds();
        let days = seconds / 86_400.0;
        let when = if seconds < 0.0 {
            format!("expired {:.1} days ago", -days)
        } else {
            format!("expires in {days:.1} days")
        };
        let message = format!(
            "certificate of {} (issuer {}) for {}:{port} {when}",
            h.info.subject, h.info.issuer, host
        );
        Ok(Outcome::new(judge(days, &config), message)
            .with_metric("cert_expiry_seconds", seconds, "seconds")
            .with_metric("tls_seconds", h.tls_seconds, "seconds"))
    }
}

sonde_sdk::export!(TlsCert);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn thresholds() {
        use sonde_sdk::Status;
        let c = config("{}");
        assert_eq!(judge(90.0, &c), Status::Success);
        assert_eq!(judge(29.9, &c), Status::Warning);
        assert_eq!(judge(6.9, &c), Status::Failure);
        assert_eq!(judge(-1.0, &c), Status::Failure);
        let c = config(r#"{"warn_days": 10, "fail_days": 0}"#);
        assert_eq!(judge(0.5, &c), Status::Warning);
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint("db:5432").unwrap(), ("db", 5432));
        assert_eq!(endpoint("https://example.com/x").unwrap(), ("example.com", 443));
        assert_eq!(endpoint("https://example.com:8443").unwrap(), ("example.com", 8443));
        assert!(endpoint("nope").is_err());
    }
}
