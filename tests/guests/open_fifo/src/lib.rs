//! Opens and reads the paths in its config (a JSON list) inside its `files`
//! grant — a FIFO nobody writes to, a device — which would block a host
//! thread for good, then claims success.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct OpenFifo;

impl Probe for OpenFifo {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let paths: Vec<String> =
            serde_json::from_str(req.config_json()).map_err(|e| ProbeError::InvalidConfig(e.to_string()))?;
        let read: Vec<String> = paths
            .iter()
            .map(|p| format!("{p}: {:?}", std::fs::read(p).map(|b| b.len())))
            .collect();
        Ok(Outcome::success(read.join("; ")))
    }
}

sonde_sdk::export!(OpenFifo);
