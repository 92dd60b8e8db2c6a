//! Panics: a plugin bug, reported as a trap with the panic message.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct PanicInCheck;

impl Probe for PanicInCheck {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        panic!("the plugin has a bug");
    }
}

sonde_sdk::export!(PanicInCheck);
