//! Creates TCP sockets through `wasi:sockets` in a loop and keeps every
//! one, never connecting (no grant is needed to create a socket), then
//! claims success: each holds a file descriptor of the agent, so the host
//! must stop it and report `host-limit`.

use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[cfg(target_arch = "wasm32")]
fn hoard() -> String {
    use wasi::sockets::network::IpAddressFamily;
    use wasi::sockets::tcp_create_socket::create_tcp_socket;
    let mut kept = Vec::new();
    for _ in 0..100_000 {
        match create_tcp_socket(IpAddressFamily::Ipv4) {
            Ok(socket) => kept.push(socket),
            Err(e) => return format!("created {}; then {e:?}", kept.len()),
        }
    }
    format!("created {}", kept.len())
}

#[cfg(not(target_arch = "wasm32"))]
fn hoard() -> String {
    String::from("wasi:sockets exists only in wasm")
}

struct HoardSockets;

impl Probe for HoardSockets {
    fn check(_req: Request) -> Result<Outcome, ProbeError> {
        Ok(Outcome::success(hoard()))
    }
}

sonde_sdk::export!(HoardSockets);
