//! Asks the host's `icmp` for echoes it should refuse or bound: each host
//! in its config, `repeat` times, with the payload size and timeout it
//! names (a huge payload, a timeout of 0 or of u64::MAX), whatever its
//! target. The message lists what each echo came to, in order.

use serde::Deserialize;
use sonde_sdk::bindings::sonde::probe::icmp::{self, IcmpError, IpProtocol, Options};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    hosts: Vec<String>,
    #[serde(default = "one")]
    repeat: usize,
    #[serde(default)]
    payload_size: u32,
    #[serde(default = "second")]
    timeout_ms: u64,
}

fn one() -> usize {
    1
}

fn second() -> u64 {
    1000
}

fn kind(result: &Result<icmp::Reply, IcmpError>) -> String {
    match result {
        Ok(reply) => format!("ok {}", reply.address),
        Err(IcmpError::Denied(_)) => "denied".into(),
        Err(IcmpError::Invalid(m)) => format!("invalid ({m})"),
        Err(IcmpError::Dns(_)) => "dns".into(),
        Err(IcmpError::Connect(_)) => "connect".into(),
        Err(IcmpError::Timeout(_)) => "timeout".into(),
        Err(IcmpError::Unavailable(m)) => format!("unavailable ({m})"),
        Err(IcmpError::Reply(_)) => "reply".into(),
    }
}

struct IcmpAbuse;

impl Probe for IcmpAbuse {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let options = Options {
            preferred: IpProtocol::Ip4,
            fallback: true,
            payload_size: config.payload_size,
            dont_fragment: false,
            ttl: None,
        };
        let mut seen = Vec::new();
        for _ in 0..config.repeat {
            for host in &config.hosts {
                let result = icmp::echo(host, options, config.timeout_ms);
                seen.push(format!("{host}={}", kind(&result)));
            }
        }
        Ok(Outcome::success(seen.join("; ")))
    }
}

sonde_sdk::export!(IcmpAbuse);
