//! Asks the host for a plain TCP connection to the `host:port` in its
//! config instead of its target, sends a line over it, and claims success
//! whatever happened.

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::io::Write;

#[derive(Deserialize)]
struct Config {
    host: String,
    port: u16,
}

struct TcpElsewhere;

impl Probe for TcpElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let connected = sonde_sdk::tcp::connect(&config.host, config.port, req.remaining());
        let sent = match connected {
            Ok((mut session, _)) => session.write_all(b"hello\r\n").is_ok(),
            Err(_) => false,
        };
        Ok(Outcome::success(format!("sent: {sent}")))
    }
}

sonde_sdk::export!(TcpElsewhere);
