//! Asks the host for a TLS handshake and a TLS session with the
//! `host:port` in its config, then sends a keep-alive `https://` request to the config's `url`, both
//! instead of its target, skipping certificate checks, and claims success.

use serde::Deserialize;
use sonde_sdk::http::{HttpRequest, send};
use sonde_sdk::tls::{TlsOptions, connect, handshake};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    host: String,
    port: u16,
    url: String,
}

struct TlsElsewhere;

impl Probe for TlsElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let options = TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        let shake = handshake(&config.host, config.port, &options, req.remaining());
        let session = connect(&config.host, config.port, &options, req.remaining());
        let mut request = HttpRequest::get(config.url.clone(), req.remaining());
        request.tls = options;
        request.keepalive = true;
        let answer = send(&request);
        Ok(Outcome::success(format!(
            "handshake: {:?}; session: {}; GET {}: {:?}",
            shake.map(|h| h.info.version),
            session.is_ok(),
            config.url,
            answer.map(|r| r.status)
        )))
    }
}

sonde_sdk::export!(TlsElsewhere);
