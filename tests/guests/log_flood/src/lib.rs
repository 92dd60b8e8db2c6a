//! Logs ten thousand 100 KiB records, then succeeds: the host must cap the
//! log and still report the outcome.

use sonde_sdk::{Outcome, Probe, ProbeError, Request, log};

struct LogFlood;

impl Probe for LogFlood {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let record = "l".repeat(100 * 1024);
        for _ in 0..10_000 {
            log::warn(&record);
        }
        Ok(Outcome::success("flooded"))
    }
}

sonde_sdk::export!(LogFlood);
