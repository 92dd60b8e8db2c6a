//! Starts `wasi:sockets` name lookups of its target's host in a loop and
//! keeps every one in flight; with `"wait"` in its config, it starts four
//! (the host's default bound per call) and waits on them all: against a resolver that does not answer, each lookup waited on
//! holds a host thread, so the host must bound them per call and per agent
//! and report `host-limit`. It claims success whatever happens.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[cfg(target_arch = "wasm32")]
fn flood(host: &str, wait: bool) -> String {
    use wasi::sockets::instance_network::instance_network;
    use wasi::sockets::ip_name_lookup::resolve_addresses;
    let network = instance_network();
    let mut kept = Vec::new();
    let mut refused = None;
    for _ in 0..if wait { 4 } else { 1000 } {
        match resolve_addresses(&network, host) {
            Ok(stream) => kept.push(stream),
            Err(e) => {
                refused = Some(format!("{e:?}"));
                break;
            }
        }
    }
    if wait && !kept.is_empty() {
        let pollables: Vec<_> = kept.iter().map(|s| s.subscribe()).collect();
        let refs: Vec<_> = pollables.iter().collect();
        let _ = wasi::io::poll::poll(&refs);
    }
    format!("{} lookups in flight; then {refused:?}", kept.len())
}

#[cfg(not(target_arch = "wasm32"))]
fn flood(_host: &str, _wait: bool) -> String {
    String::from("wasi:sockets exists only in wasm")
}

struct FloodWasiLookups;

impl Probe for FloodWasiLookups {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let host = req
            .target()
            .rsplit_once(':')
            .map_or(req.target(), |(h, _)| h)
            .to_string();
        let wait = req.config_json().contains("wait");
        Ok(Outcome::success(flood(&host, wait)))
    }
}

sonde_sdk::export!(FloodWasiLookups);
