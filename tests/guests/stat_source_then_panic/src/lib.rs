//! Fails the way an interpreted plugin fails on a bug: it looks for its
//! source file, which it was never granted (a Python traceback reads the
//! lines it shows), then panics. The run is `denied`, and its message
//! must still say why the plugin stopped.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct StatSourceThenPanic;

impl Probe for StatSourceThenPanic {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let _ = std::fs::metadata("/0/app.py");
        panic!("TypeError: Request.__init__() missing 2 required positional arguments");
    }
}

sonde_sdk::export!(StatSourceThenPanic);
