//! Asks the host to connect to its target's name thousands of times with a
//! 5 ms timeout each: against a resolver that does not answer, every lookup
//! cut off that way would keep a host thread blocked.

use sonde_sdk::{Outcome, Probe, ProbeError, Request, tcp};
use std::time::Duration;

struct FloodLookups;

impl Probe for FloodLookups {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let (host, port) = req
            .target()
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| ProbeError::InvalidConfig("target is host:port".into()))?;
        let mut cut_off = 0;
        // Under the host's 64 sockets per call (host-limit), and 6 s in
        // all: longer than the deadlines the tests give it, so the call is
        // still flooding when its deadline comes.
        for _ in 0..60 {
            if tcp::connect(&host, port, Duration::from_millis(100)).is_err() {
                cut_off += 1;
            }
        }
        Ok(Outcome::success(format!("{cut_off} connections failed")))
    }
}

sonde_sdk::export!(FloodLookups);
