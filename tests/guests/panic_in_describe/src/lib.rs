//! Panics in `describe`, which the host calls when the plugin is loaded: a
//! bug in the upload, refused as such (422), not an error of the agent.

use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

struct PanicInDescribe;

impl Probe for PanicInDescribe {
    fn describe() -> PluginInfo {
        panic!("describe has a bug");
    }

    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success("never loaded"))
    }
}

sonde_sdk::export!(PanicInDescribe);
