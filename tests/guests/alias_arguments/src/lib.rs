//! Makes the host copy far more than the plugin's memory holds: a list
//! whose strings all point at the same bytes. The canonical ABI passes a
//! `list<string>` as (pointer, length) pairs, and nothing stops every pair
//! from naming one buffer; the host copies each string before any of its
//! code runs. With config `{"via": V, "count": N, "bytes": B}` it passes N
//! strings of B bytes (one buffer, 8 bytes of guest memory per string)
//! through V:
//!
//! - `"keep"`: `http.send-keeping`'s header names;
//! - `"exec"`: `exec.run`'s argv;
//! - `"fields"`: `wasi:http` `fields.from-list`, names and values.
//!
//! None of them is granted or valid; the host refuses each after the copy.
//! It reports what the host answered.

use serde::Deserialize;
use sonde_sdk::{Outcome, Probe, ProbeError, Request};
use std::mem::ManuallyDrop;

#[derive(Deserialize)]
struct Config {
    via: String,
    count: usize,
    bytes: usize,
}

/// `count` strings sharing one buffer of `bytes` bytes. Never dropped: the
/// strings do not own their bytes.
// A hostile guest: its `unsafe` (handles aliasing one buffer) is the attack.
#[allow(unsafe_code, reason = "a hostile guest: aliasing one buffer is the attack")]
fn aliases(count: usize, bytes: usize) -> ManuallyDrop<Vec<String>> {
    let buffer: &'static mut [u8] = Box::leak(vec![b'a'; bytes].into_boxed_slice());
    let ptr = buffer.as_mut_ptr();
    // SAFETY: each String points at the same valid UTF-8 bytes; none is
    // ever written, grown or dropped.
    ManuallyDrop::new(
        (0..count)
            .map(|_| unsafe { String::from_raw_parts(ptr, bytes, bytes) })
            .collect(),
    )
}

#[cfg(target_arch = "wasm32")]
// A hostile guest: its `unsafe` (handles aliasing one buffer) is the attack.
#[allow(unsafe_code, reason = "a hostile guest: aliasing one buffer is the attack")]
fn pass(config: &Config) -> String {
    use sonde_sdk::bindings::sonde::probe::{exec, http, tls};
    let names = aliases(config.count, config.bytes);
    match config.via.as_str() {
        "keep" => {
            let request = http::Request {
                method: "GET".into(),
                url: "http://127.0.0.1:9/".into(),
                headers: Vec::new(),
                body: Vec::new(),
                timeout_ms: 100,
                max_body: 0,
                tls: tls::Options {
                    ca_pem: None,
                    insecure_skip_verify: false,
                    server_name: None,
                },
                keepalive: false,
            };
            format!("{:?}", http::send_keeping(&request, &names).map(|r| r.status))
        }
        "exec" => {
            let command = exec::Command {
                argv: ManuallyDrop::into_inner(names),
                timeout_ms: 100,
            };
            let answer = format!("{:?}", exec::run(&command).map(|o| o.exit_code));
            std::mem::forget(command);
            answer
        }
        "fields" => {
            // Each name and its value: the same buffer again.
            let entries = ManuallyDrop::new(
                names
                    .iter()
                    .map(|n| {
                        let (ptr, len) = (n.as_ptr().cast_mut(), n.len());
                        // SAFETY: as in `aliases`: more handles on the same
                        // bytes, never written or dropped.
                        unsafe {
                            (
                                String::from_raw_parts(ptr, len, len),
                                Vec::from_raw_parts(ptr, len, len),
                            )
                        }
                    })
                    .collect::<Vec<_>>(),
            );
            format!("{:?}", wasi::http::types::Fields::from_list(&entries).map(|_| ()))
        }
        other => format!("unknown via {other:?}"),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn pass(config: &Config) -> String {
    let names = aliases(config.count, 0);
    format!(
        "nothing: {} names of {} bytes through {:?}, in wasm only",
        names.len(),
        config.bytes,
        config.via
    )
}

struct AliasArguments;

impl Probe for AliasArguments {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        Ok(Outcome::success(format!("the host answered {}", pass(&config))))
    }
}

sonde_sdk::export!(AliasArguments);
