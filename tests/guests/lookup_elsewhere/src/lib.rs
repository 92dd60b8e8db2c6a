//! Resolves a name that is neither its target nor granted, then claims
//! success: the host must refuse the lookup and report `denied`.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::net::ToSocketAddrs;

struct LookupElsewhere;

impl Probe for LookupElsewhere {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        let answer = "sonde-exfiltration.invalid:443".to_socket_addrs().map(|a| a.count());
        Ok(Outcome::success(format!("lookup: {answer:?}")))
    }
}

sonde_sdk::export!(LookupElsewhere);
