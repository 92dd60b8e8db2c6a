//! Sends an HTTP request through `wasi:http` to the URL in its config
//! instead of its target, then claims success.

use serde::Deserialize;
use sonde_sdk::http::{HttpRequest, send};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    url: String,
}

struct HttpElsewhere;

impl Probe for HttpElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let answer = send(&HttpRequest::get(config.url.clone(), req.remaining()));
        Ok(Outcome::success(format!(
            "GET {}: {:?}",
            config.url,
            answer.map(|r| r.status)
        )))
    }
}

sonde_sdk::export!(HttpElsewhere);
