//! Opens TLS sessions to its target (`host:port`) and keeps every one,
//! trying for ten; reports how many it got and why the next one failed.

use sonde_sdk::tls::{TlsOptions, connect};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct HoardTlsSessions;

impl Probe for HoardTlsSessions {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let (host, port) = req
            .target()
            .rsplit_once(':')
            .ok_or_else(|| ProbeError::invalid_config("expected HOST:PORT"))?;
        let port = port.parse().map_err(|_| ProbeError::invalid_config("bad port"))?;
        let options = TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        let mut kept = Vec::new();
        for _ in 0..10 {
            match connect(host, port, &options, req.remaining()) {
                Ok((session, _)) => kept.push(session),
                Err(e) => return Ok(Outcome::success(format!("opened {}; then {e:?}", kept.len()))),
            }
        }
        Ok(Outcome::success(format!("opened {}", kept.len())))
    }
}

sonde_sdk::export!(HoardTlsSessions);
