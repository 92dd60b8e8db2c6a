//! The built-in `tcp` probe: success when a TCP connection to the target
//! opens within the deadline, failure (with the reason) when it is refused,
//! unreachable or times out. The connection is closed at once.

use serde::Deserialize;
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request, net};
use std::time::Instant;

/// The plugin config. It takes no options yet: an empty object or nothing.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Config {}

const SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "tcp",
  "description": "Connect to the target (host:port) within the probe timeout.",
  "type": "object",
  "additionalProperties": false,
  "properties": {}
}"#;

struct Tcp;

impl Probe for Tcp {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "Opens a TCP connection to the target within the probe timeout.".into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let _config: Config = req.config()?;
        let start = Instant::now();
        match net::connect_target(&req) {
            Ok(stream) => {
                let elapsed = start.elapsed().as_secs_f64();
                drop(stream);
                Ok(Outcome::success(format!("connected to {}", req.target())).with_metric(
                    "connect_seconds",
                    elapsed,
                    "seconds",
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Err(ProbeError::denied(format!(
                "connect to {}: {}",
                req.target(),
                net::describe_error(&e)
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                Err(ProbeError::invalid_config(format!("target {:?}: {e}", req.target())))
            }
            Err(e) => Ok(Outcome::failure(format!(
                "connect to {}: {}",
                req.target(),
                net::describe_error(&e)
            ))),
        }
    }
}

sonde_sdk::export!(Tcp);
