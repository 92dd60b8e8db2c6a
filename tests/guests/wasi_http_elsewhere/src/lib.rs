//! Sends a request through standard `wasi:http/outgoing-handler` (not
//! sonde's transport) to the authority in its config, then claims success:
//! the host's wasi:http hooks must refuse it and report `denied`.

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    authority: String,
}

#[cfg(target_arch = "wasm32")]
fn get(authority: &str) -> String {
    use wasi::http::outgoing_handler;
    use wasi::http::types::{Fields, OutgoingRequest, Scheme};
    let req = OutgoingRequest::new(Fields::new());
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(authority));
    let _ = req.set_path_with_query(Some("/"));
    match outgoing_handler::handle(req, None) {
        Ok(response) => {
            response.subscribe().block();
            format!("{:?}", response.get().map(|r| r.map(|r| r.map(|r| r.status()))))
        }
        Err(e) => format!("{e:?}"),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn get(_authority: &str) -> String {
    String::from("wasi:http exists only in wasm")
}

struct WasiHttpElsewhere;

impl Probe for WasiHttpElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        Ok(Outcome::success(format!(
            "GET http://{}/: {}",
            config.authority,
            get(&config.authority)
        )))
    }
}

sonde_sdk::export!(WasiHttpElsewhere);
