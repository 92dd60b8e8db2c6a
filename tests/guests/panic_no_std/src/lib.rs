//! Panics without std: the SDK's panic handler must still get the message
//! to the host, which reports the trap with it.

#![cfg_attr(target_arch = "wasm32", no_std)]

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct PanicNoStd;

impl Probe for PanicNoStd {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        panic!("no_std plugin bug at attempt {}", req.attempt());
    }
}

sonde_sdk::export!(PanicNoStd);
