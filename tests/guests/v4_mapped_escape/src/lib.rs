//! issue 16, escape 1: granted only IPv6 (`[::/0]:PORT`), tries to reach
//! IPv4 loopback through its v4-mapped address `::ffff:127.0.0.1` at the
//! config's port, by every way the host connects for a plugin (`tcp`,
//! `tls`, `http`, `grpc`) and by its own socket; then claims success. The
//! host must refuse each one and report `denied`.

use serde::Deserialize;
use sonde_sdk::grpc::{GrpcRequest, call};
use sonde_sdk::http::{HttpRequest, send};
use sonde_sdk::tls::{TlsOptions, handshake};
use sonde_sdk::{Outcome, Probe, ProbeError, Request};

#[derive(Deserialize)]
struct Config {
    port: u16,
}

struct V4MappedEscape;

const MAPPED: &str = "::ffff:127.0.0.1";

impl Probe for V4MappedEscape {
    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let port = req.config::<Config>()?.port;
        let tcp = sonde_sdk::tcp::connect(MAPPED, port, req.remaining()).is_ok();
        let options = TlsOptions {
            insecure_skip_verify: true,
            ..TlsOptions::default()
        };
        let tls = handshake(MAPPED, port, &options, req.remaining()).is_ok();
        let http = send(&HttpRequest::get(format!("http://[{MAPPED}]:{port}/"), req.remaining())).is_ok();
        let grpc = call(&GrpcRequest::new(
            format!("[{MAPPED}]:{port}"),
            "/grpc.health.v1.Health/Check",
            Vec::new(),
            req.remaining(),
        ))
        .is_ok();
        let socket = std::net::TcpStream::connect(format!("[{MAPPED}]:{port}")).is_ok();
        Ok(Outcome::success(format!(
            "tcp: {tcp}; tls: {tls}; http: {http}; grpc: {grpc}; socket: {socket}"
        )))
    }
}

sonde_sdk::export!(V4MappedEscape);
