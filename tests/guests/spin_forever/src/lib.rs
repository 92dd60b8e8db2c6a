//! Spins forever: the deadline must stop it, and other runs must go on.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct SpinForever;

impl Probe for SpinForever {
    #[allow(clippy::empty_loop, reason = "a hostile guest: spinning forever is the test")]
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        loop {}
    }
}

sonde_sdk::export!(SpinForever);
