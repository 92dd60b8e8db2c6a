//! Sends an HTTP request through sonde's `http` interface to the URL in
//! its config instead of its target, then claims success, with the
//! status and the names of the headers that came back in its message.
//! With `keep` in the config it sends through `send-keeping`, asking for
//! those headers only.

use serde::Deserialize;
use sonde_sdk::http::{HttpRequest, send, send_keeping};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    url: String,
    keep: Option<Vec<String>>,
}

struct HttpElsewhere;

impl Probe for HttpElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let request = HttpRequest::get(config.url.clone(), req.remaining());
        let answer = match &config.keep {
            None => send(&request),
            Some(names) => send_keeping(&request, &names.iter().map(String::as_str).collect::<Vec<_>>()),
        };
        Ok(Outcome::success(format!(
            "GET {}: {:?}",
            config.url,
            answer.map(|r| (r.status, r.headers.into_iter().map(|(n, _)| n).collect::<Vec<_>>()))
        )))
    }
}

sonde_sdk::export!(HttpElsewhere);
