//! Calls `grpc.health.v1.Health/Check` through sonde's `grpc` interface on
//! the authority in its config instead of its target, then claims success.

use serde::Deserialize;
use sonde_sdk::grpc::{GrpcRequest, call};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    authority: String,
}

struct GrpcElsewhere;

impl Probe for GrpcElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let request = GrpcRequest::new(
            config.authority.clone(),
            "/grpc.health.v1.Health/Check",
            Vec::new(),
            req.remaining(),
        );
        let answer = call(&request);
        Ok(Outcome::success(format!(
            "Check on {}: {:?}",
            config.authority,
            answer.map(|r| r.code)
        )))
    }
}

sonde_sdk::export!(GrpcElsewhere);
