//! Sends a request through standard `wasi:http/outgoing-handler` (not
//! sonde's transport) to the authority in its config, then claims success:
//! the host's wasi:http hooks must refuse it and report `denied`. With
//! `path` and `headers` in the config it sends those, and puts the status,
//! the response headers and the body it read in its message (the secrets
//! tests: a handle in a header, and what an echo brings back).

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    authority: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

#[cfg(target_arch = "wasm32")]
fn get(config: &Config) -> String {
    use wasi::http::outgoing_handler;
    use wasi::http::types::{Fields, OutgoingRequest, Scheme};
    let fields = Fields::new();
    for (name, value) in &config.headers {
        let _ = fields.append(name, value.as_bytes());
    }
    let req = OutgoingRequest::new(fields);
    let _ = req.set_scheme(Some(&Scheme::Http));
    let _ = req.set_authority(Some(&config.authority));
    let _ = req.set_path_with_query(Some(config.path.as_deref().unwrap_or("/")));
    let response = match outgoing_handler::handle(req, None) {
        Ok(response) => response,
        Err(e) => return format!("{e:?}"),
    };
    response.subscribe().block();
    let response = match response.get() {
        Some(Ok(Ok(r))) => r,
        other => return format!("{:?}", other.map(|r| r.map(|r| r.map(|r| r.status())))),
    };
    if config.path.is_none() {
        return format!("{:?}", Some(Ok::<_, ()>(Ok::<_, ()>(response.status()))));
    }
    let mut out = format!("{}", response.status());
    for (name, value) in response.headers().entries() {
        out += &format!(" {name}={}", String::from_utf8_lossy(&value));
    }
    out.push(' ');
    if let Ok(body) = response.consume()
        && let Ok(stream) = body.stream()
    {
        while let Ok(chunk) = stream.blocking_read(4096) {
            out += &String::from_utf8_lossy(&chunk);
        }
    }
    out
}

#[cfg(not(target_arch = "wasm32"))]
fn get(config: &Config) -> String {
    format!(
        "wasi:http exists only in wasm (not sent: {:?} {:?})",
        config.path, config.headers
    )
}

struct WasiHttpElsewhere;

impl Probe for WasiHttpElsewhere {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        Ok(Outcome::success(format!(
            "GET http://{}/: {}",
            config.authority,
            get(&config)
        )))
    }
}

sonde_sdk::export!(WasiHttpElsewhere);
