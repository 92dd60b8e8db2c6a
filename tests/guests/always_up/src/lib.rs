//! The plugin of the SDK's documentation: always up. The trivial plugin the
//! sandbox-overhead benchmark runs.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct AlwaysUp;

impl Probe for AlwaysUp {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success("up"))
    }
}

sonde_sdk::export!(AlwaysUp);
