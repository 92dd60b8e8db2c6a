//! Abuses the host's `udp` exchange as its config says, and reports what
//! the host answered as a success whatever it was:
//! - `flood`: exchanges with the target again and again (1 ms each),
//!   past the call's bound on sockets;
//! - `elsewhere`: one exchange with `host:port` instead of the target;
//! - `max`: one exchange with the target asking for at most `max` bytes;
//! - `timeout`: one exchange with the target waiting `timeout_ms`.

use serde::Deserialize;
use sonde_sdk::tls::HandshakeError;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::time::Duration;

#[derive(Deserialize)]
struct Config {
    mode: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    port: u16,
    #[serde(default)]
    max: u32,
    #[serde(default)]
    timeout_ms: u64,
}

fn said(r: Result<sonde_sdk::udp::Reply, HandshakeError>) -> String {
    match r {
        Ok(reply) => format!("reply of {} bytes", reply.data.len()),
        Err(HandshakeError::Failed(m)) => format!("failed: {m}"),
        Err(HandshakeError::Probe(e)) => format!("refused: {e}"),
    }
}

struct AbuseUdp;

impl Probe for AbuseUdp {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let c: Config = req.config()?;
        let (host, port) = sonde_sdk::net::host_port(req.target())?;
        let ms = Duration::from_millis;
        let message = match c.mode.as_str() {
            "flood" => {
                let mut last = String::new();
                for i in 0..10_000 {
                    last = format!(
                        "exchange {i}: {}",
                        said(sonde_sdk::udp::exchange(host, port, b"x", 512, ms(1)))
                    );
                }
                last
            }
            "elsewhere" => said(sonde_sdk::udp::exchange(&c.host, c.port, b"x", 512, req.remaining())),
            "max" => said(sonde_sdk::udp::exchange(host, port, b"x", c.max, req.remaining())),
            "timeout" => said(sonde_sdk::udp::exchange(host, port, b"x", 512, ms(c.timeout_ms))),
            other => return Err(ProbeError::invalid_config(format!("mode {other:?}"))),
        };
        Ok(Outcome::success(message))
    }
}

sonde_sdk::export!(AbuseUdp);
