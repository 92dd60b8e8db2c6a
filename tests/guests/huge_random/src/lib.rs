//! Asks `wasi:random` for as many bytes as its config says (a number) in
//! one call: the host makes them, and holds them, before they are copied
//! into the plugin's memory (wasmtime-wasi allows 64 MiB unless told
//! otherwise). Reports how many came back.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[cfg(target_arch = "wasm32")]
fn random_bytes(len: u64) -> usize {
    wasi::random::random::get_random_bytes(len).len()
}
#[cfg(not(target_arch = "wasm32"))]
fn random_bytes(_: u64) -> usize {
    0
}

struct HugeRandom;

impl Probe for HugeRandom {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let len: u64 = req.config()?;
        Ok(Outcome::success(format!("{} random bytes", random_bytes(len))))
    }
}

sonde_sdk::export!(HugeRandom);
