//! Connects with plain `std::net` to the address in its config instead of
//! its target, then claims success: the host must report `denied`.

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    addr: String,
}

struct ConnectElsewhere;

impl Probe for ConnectElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let attempt = std::net::TcpStream::connect(config.addr.as_str());
        Ok(Outcome::success(format!(
            "tried {}: {:?}",
            config.addr,
            attempt.map(|_| ())
        )))
    }
}

sonde_sdk::export!(ConnectElsewhere);
