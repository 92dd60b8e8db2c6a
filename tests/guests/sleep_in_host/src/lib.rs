//! Sleeps in a host call (a WASI clock wait) far past any deadline: epochs
//! do not interrupt host calls, so the host must stop it another way.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct SleepInHost;

impl Probe for SleepInHost {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        std::thread::sleep(std::time::Duration::from_secs(3600));
        Ok(Outcome::success("woke up"))
    }
}

sonde_sdk::export!(SleepInHost);
