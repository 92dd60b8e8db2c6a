//! The built-in `icmp` probe: one ICMP echo request to the target (a name
//! or an address, no port), sent by the host on an unprivileged ping
//! socket; success when the reply comes back within the deadline, failure
//! (with the reason) when it does not, or when what came back is not the
//! reply to this request.
//!
//! The options are blackbox_exporter's that apply: `preferred_ip_protocol`
//! (`ip6` by default) with `ip_protocol_fallback`, `payload_size`,
//! `dont_fragment` and `ttl`. The outcome reports the time of each phase
//! as blackbox_exporter names them (`resolve_seconds`, `setup_seconds`,
//! `rtt_seconds`), the reply's TTL or hop limit when the host saw it
//! (`reply_hop_limit`) and the IP version used (`ip_protocol`).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use serde::Deserialize;
use sonde_sdk::icmp::{EchoError, EchoOptions, IpProtocol};
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

/// The largest payload the host sends.
const MAX_PAYLOAD: u32 = 16 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "ip6")]
    preferred_ip_protocol: String,
    #[serde(default = "yes")]
    ip_protocol_fallback: bool,
    #[serde(default)]
    payload_size: u32,
    #[serde(default)]
    dont_fragment: bool,
    ttl: Option<u8>,
}

fn ip6() -> String {
    "ip6".into()
}

fn yes() -> bool {
    true
}

impl Config {
    fn options(&self) -> Result<EchoOptions, ProbeError> {
        let preferred = match self.preferred_ip_protocol.as_str() {
            "ip4" | "ipv4" => IpProtocol::Ip4,
            "ip6" | "ipv6" => IpProtocol::Ip6,
            other => {
                return Err(ProbeError::invalid_config(format!(
                    "preferred_ip_protocol {other:?}: give ip4 or ip6"
                )));
            }
        };
        if self.payload_size > MAX_PAYLOAD {
            return Err(ProbeError::invalid_config(format!(
                "payload_size {}: at most {MAX_PAYLOAD}",
                self.payload_size
            )));
        }
        if self.ttl == Some(0) {
            return Err(ProbeError::invalid_config("ttl 0: give 1 to 255"));
        }
        Ok(EchoOptions {
            preferred,
            fallback: self.ip_protocol_fallback,
            payload_size: self.payload_size,
            dont_fragment: self.dont_fragment,
            ttl: self.ttl,
        })
    }
}

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "icmp",
  "description": "Send one ICMP echo request to the target (a host, no port) and wait for its reply within the probe timeout.",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "preferred_ip_protocol": {"enum": ["ip4", "ip6", "ipv4", "ipv6"], "default": "ip6", "description": "The IP version to use when the target's name has addresses of both."},
    "ip_protocol_fallback": {"type": "boolean", "default": true, "description": "Use the other IP version when the name has no address of the preferred one."},
    "payload_size": {"type": "integer", "minimum": 0, "maximum": 16384, "default": 0, "description": "Bytes of payload after the ICMP header."},
    "dont_fragment": {"type": "boolean", "default": false, "description": "Set the Don't Fragment bit (IPv4) or refuse fragmenting (IPv6)."},
    "ttl": {"type": "integer", "minimum": 1, "maximum": 255, "description": "The request's TTL (IPv4) or hop limit (IPv6); the system's default when not given."}
  }
}"#;

/// The target's host: an address (`[v6]` brackets allowed) or a name; a
/// port is a mistake.
fn host_of(target: &str) -> Result<&str, ProbeError> {
    let target = target.trim();
    if target.is_empty() || target.contains('/') || (target.matches(':').count() == 1 && !target.starts_with('[')) {
        return Err(ProbeError::invalid_config(format!(
            "target {target:?}: give a host or an IP address, without a port or a scheme"
        )));
    }
    Ok(target)
}

struct Icmp;

impl Probe for Icmp {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description:
                "Sends one ICMP echo request to the target (by the host, unprivileged) and waits for its reply.".into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let options = config.options()?;
        let host = host_of(req.target())?;
        let reply = match sonde_sdk::icmp::echo(host, &options, req.remaining()) {
            Ok(reply) => reply,
            Err(EchoError::Failed(m)) => return Ok(Outcome::failure(format!("{host}: {m}"))),
            Err(EchoError::Probe(e)) => return Err(e),
        };
        let version = match reply.protocol {
            IpProtocol::Ip4 => 4.0,
            IpProtocol::Ip6 => 6.0,
        };
        let hops = reply.hop_limit.map_or_else(String::new, |h| format!(", hop limit {h}"));
        let message = format!(
            "echo reply from {} in {:.3} ms ({} bytes{hops})",
            reply.address,
            reply.rtt_seconds * 1000.0,
            reply.payload_size
        );
        let mut outcome = Outcome::success(message)
            .with_metric("resolve_seconds", reply.resolve_seconds, "seconds")
            .with_metric("setup_seconds", reply.setup_seconds, "seconds")
            .with_metric("rtt_seconds", reply.rtt_seconds, "seconds")
            .with_metric(
                "probe_seconds",
                reply.resolve_seconds + reply.setup_seconds + reply.rtt_seconds,
                "seconds",
            )
            .with_metric("ip_protocol", version, "");
        if let Some(h) = reply.hop_limit {
            outcome = outcome.with_metric("reply_hop_limit", f64::from(h), "");
        }
        Ok(outcome)
    }
}

sonde_sdk::export!(Icmp);

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> Result<EchoOptions, ProbeError> {
        serde_json::from_str::<Config>(json)
            .map_err(|e| ProbeError::invalid_config(e.to_string()))?
            .options()
    }

    #[test]
    fn config_forms() {
        let o = options("{}").unwrap();
        assert!(matches!(o.preferred, IpProtocol::Ip6));
        assert!(o.fallback && !o.dont_fragment && o.ttl.is_none() && o.payload_size == 0);
        let o = options(r#"{"preferred_ip_protocol": "ip4", "ip_protocol_fallback": false, "payload_size": 56, "dont_fragment": true, "ttl": 5}"#).unwrap();
        assert!(matches!(o.preferred, IpProtocol::Ip4));
        assert!(!o.fallback && o.dont_fragment && o.ttl == Some(5) && o.payload_size == 56);
        assert!(options(r#"{"preferred_ip_protocol": "ip5"}"#).is_err());
        assert!(options(r#"{"payload_size": 100000}"#).is_err());
        assert!(options(r#"{"ttl": 0}"#).is_err());
        assert!(options(r#"{"ttl": 300}"#).is_err());
        assert!(options(r#"{"count": 3}"#).is_err());
    }

    #[test]
    fn targets() {
        assert_eq!(host_of("10.0.0.1").unwrap(), "10.0.0.1");
        assert_eq!(host_of("::1").unwrap(), "::1");
        assert_eq!(host_of("[::1]").unwrap(), "[::1]");
        assert_eq!(host_of("db.internal").unwrap(), "db.internal");
        assert!(host_of("db.internal:80").is_err());
        assert!(host_of("http://db").is_err());
        assert!(host_of("").is_err());
    }
}
