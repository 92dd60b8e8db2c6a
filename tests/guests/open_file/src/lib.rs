//! Reads a host file it was not granted, then claims success.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct OpenFile;

impl Probe for OpenFile {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let read = std::fs::read_to_string("/etc/passwd").map(|s| s.len());
        Ok(Outcome::success(format!("read /etc/passwd: {read:?}")))
    }
}

sonde_sdk::export!(OpenFile);
