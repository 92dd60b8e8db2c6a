//! Returns a 1 MiB message, 10,000 metrics and a 1 MiB detail: the host must
//! cut them to its caps.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct HugeMessage;

impl Probe for HugeMessage {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let mut outcome = Outcome::success("x".repeat(1 << 20)).with_detail("d".repeat(1 << 20));
        for i in 0..10_000 {
            outcome = outcome.with_metric(format!("m{i}"), i as f64, "");
        }
        Ok(outcome)
    }
}

sonde_sdk::export!(HugeMessage);
