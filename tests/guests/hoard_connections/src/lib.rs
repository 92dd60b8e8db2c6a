//! Opens a new connection to its target again and again through the host's
//! transports — sonde's `http` (no keep-alive) or `grpc`, as its config
//! says — far more often than a probe needs, then claims success: every
//! connection is a socket of the agent, so the host must count them
//! against the call's bound and report `host-limit`.

use sonde_sdk::grpc::{GrpcRequest, call};
use sonde_sdk::http::{HttpRequest, send};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::time::Duration;

struct HoardConnections;

impl Probe for HoardConnections {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let grpc = req.config_json().contains("grpc");
        let target = req.target().to_string();
        let mut failed = 0;
        let mut last = String::new();
        for _ in 0..200 {
            let answer = if grpc {
                let request = GrpcRequest::new(
                    target.clone(),
                    "/grpc.health.v1.Health/Check",
                    Vec::new(),
                    Duration::from_secs(1),
                );
                call(&request).map(|r| r.code.0.to_string())
            } else {
                send(&HttpRequest::get(format!("http://{target}/"), Duration::from_secs(1)))
                    .map(|r| r.status.to_string())
            };
            if let Err(e) = answer {
                failed += 1;
                last = format!("{e:?}");
            }
        }
        Ok(Outcome::success(format!("{failed} of 200 failed; last {last}")))
    }
}

sonde_sdk::export!(HoardConnections);
