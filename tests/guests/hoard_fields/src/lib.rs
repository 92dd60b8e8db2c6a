//! Grows `wasi:http` header fields without sending anything: fills one
//! `fields` resource until the host refuses more, then starts another,
//! keeping every one. All of it is host memory held for the guest, so the
//! host must bound it and report `host-limit`.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[cfg(target_arch = "wasm32")]
fn hoard() -> String {
    use wasi::http::types::Fields;
    let value = vec![b'x'; 4096];
    let mut kept = Vec::new();
    let mut bytes = 0usize;
    for _ in 0..1_000 {
        let fields = Fields::new();
        for i in 0..100 {
            if fields.append(&format!("x-hoard-{i}"), &value).is_err() {
                break;
            }
            bytes += value.len();
        }
        kept.push(fields);
    }
    format!("kept {} fields, {bytes} bytes", kept.len())
}

#[cfg(not(target_arch = "wasm32"))]
fn hoard() -> String {
    String::from("wasi:http exists only in wasm")
}

struct HoardFields;

impl Probe for HoardFields {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success(hoard()))
    }
}

sonde_sdk::export!(HoardFields);
