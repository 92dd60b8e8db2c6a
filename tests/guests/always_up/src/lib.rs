//! The plugin of the SDK's documentation: always up. The trivial plugin the
//! sandbox-overhead benchmark runs, built without std as the built-ins are.

#![cfg_attr(target_arch = "wasm32", no_std)]

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct AlwaysUp;

impl Probe for AlwaysUp {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success("up"))
    }
}

sonde_sdk::export!(AlwaysUp);
