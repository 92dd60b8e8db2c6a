//! Reads the paths in its config (a JSON list) that lead outside its
//! `files` grant — `..` and symlinks pointing out — and claims success
//! whatever it got: the host must report `denied`.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

struct EscapeFilesGrant;

impl Probe for EscapeFilesGrant {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let paths: Vec<String> =
            serde_json::from_str(req.config_json()).map_err(|e| ProbeError::InvalidConfig(e.to_string()))?;
        let read: Vec<String> = paths
            .iter()
            .map(|p| format!("{p}: {:?}", std::fs::read_to_string(p)))
            .collect();
        Ok(Outcome::success(read.join("; ")))
    }
}

sonde_sdk::export!(EscapeFilesGrant);
