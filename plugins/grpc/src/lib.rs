//! The built-in `grpc` probe: `grpc.health.v1.Health/Check`, as the
//! kubelet's `grpc` probe and `grpc-health-probe` make it, through the host's
//! gRPC transport.
//!
//! `SERVING` is success; `NOT_SERVING`, `UNKNOWN` and an unknown service
//! (`SERVICE_UNKNOWN`, or the `NOT_FOUND` status servers answer with) are
//! failures, and so is any other gRPC status (`UNAVAILABLE` from a draining
//! server…), as the kubelet counts a failed Check. Only a server without the
//! health service (`UNIMPLEMENTED`) is an error of kind `io`: the check
//! cannot be made there at all.
//! The two health messages are encoded and decoded here by hand, so the
//! plugin carries no protobuf runtime.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use serde::Deserialize;
use sonde_sdk::grpc::{Code, GrpcRequest, GrpcResponse, call};
use sonde_sdk::tls::TlsOptions;
use sonde_sdk::{Outcome, PluginInfo, Probe, ProbeError, Request};

const CHECK: &str = "/grpc.health.v1.Health/Check";
const SCHEMA: &str = include_str!("schema.json");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    service: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    tls: bool,
    server_name: Option<String>,
    ca_file: Option<String>,
    ca_pem: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
    /// A client certificate (mTLS), each part a handle or PEM text.
    client_cert: Option<sonde_sdk::credentials::ClientCert>,
}

impl Config {
    fn tls(&self) -> Result<Option<TlsOptions>, ProbeError> {
        if !self.tls {
            if self.server_name.is_some()
                || self.ca_file.is_some()
                || self.ca_pem.is_some()
                || self.insecure_skip_verify
                || self.client_cert.is_some()
            {
                return Err(ProbeError::invalid_config(
                    "server_name, ca_file, ca_pem, insecure_skip_verify and client_cert need \"tls\": true",
                ));
            }
            return Ok(None);
        }
        TlsOptions::from_config(
            self.ca_file.as_deref(),
            self.ca_pem.as_deref(),
            self.insecure_skip_verify,
            self.server_name.as_deref(),
        )
        .map(Some)
    }
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Unknown,
    Serving,
    NotServing,
    ServiceUnknown,
    Other(u64),
}

impl Health {
    fn from_wire(v: u64) -> Self {
        match v {
            0 => Self::Unknown,
            1 => Self::Serving,
            2 => Self::NotServing,
            3 => Self::ServiceUnknown,
            n => Self::Other(n),
        }
    }

    /// The enum's number on the wire.
    fn wire(self) -> u64 {
        match self {
            Self::Unknown => 0,
            Self::Serving => 1,
            Self::NotServing => 2,
            Self::ServiceUnknown => 3,
            Self::Other(n) => n,
        }
    }

    fn name(self) -> String {
        match self {
            Self::Unknown => "UNKNOWN".into(),
            Self::Serving => "SERVING".into(),
            Self::NotServing => "NOT_SERVING".into(),
            Self::ServiceUnknown => "SERVICE_UNKNOWN".into(),
            Self::Other(n) => format!("status {n}"),
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// `HealthCheckRequest { string service = 1; }`; proto3 leaves out an empty
/// string, so the whole-server check is an empty message.
fn encode_request(service: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if !service.is_empty() {
        out.push((1 << 3) | 2); // field 1, length-delimited
        put_varint(&mut out, service.len() as u64);
        out.extend_from_slice(service.as_bytes());
    }
    out
}

/// Why bytes are not a `HealthCheckResponse`.
#[derive(Debug, PartialEq)]
enum DecodeError {
    /// The message ends inside a field's key, varint or length.
    Truncated(&'static str),
    /// A length-delimited field longer than an address can count.
    LengthOutOfRange,
    /// A wire type protobuf does not define (or the deprecated groups).
    WireType {
        /// The field's number.
        field: u64,
        /// Its wire type.
        wire: u64,
    },
    /// A field claims more bytes than the message has left.
    PastEnd {
        /// The field's number.
        field: u64,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated(what) => write!(f, "truncated {what}"),
            Self::LengthOutOfRange => f.write_str("field length out of range"),
            Self::WireType { field, wire } => write!(f, "field {field} has unsupported wire type {wire}"),
            Self::PastEnd { field } => write!(f, "field {field} runs past the end of the message"),
        }
    }
}

/// `HealthCheckResponse { ServingStatus status = 1; }`, skipping fields it
/// does not know; a missing status is `UNKNOWN`, the enum's zero.
fn decode_response(bytes: &[u8]) -> Result<Health, DecodeError> {
    let mut at = 0;
    let mut status = 0;
    while at < bytes.len() {
        let key = get_varint(bytes, &mut at).ok_or(DecodeError::Truncated("field key"))?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                let v = get_varint(bytes, &mut at).ok_or(DecodeError::Truncated("varint"))?;
                if field == 1 {
                    status = v;
                }
            }
            1 | 5 => at += if wire == 1 { 8 } else { 4 },
            2 => {
                let len = get_varint(bytes, &mut at).ok_or(DecodeError::Truncated("length"))?;
                at = usize::try_from(len)
                    .ok()
                    .and_then(|l| at.checked_add(l))
                    .ok_or(DecodeError::LengthOutOfRange)?;
            }
            wire => return Err(DecodeError::WireType { field, wire }),
        }
        if at > bytes.len() {
            return Err(DecodeError::PastEnd { field });
        }
    }
    Ok(Health::from_wire(status))
}

fn with_metrics(outcome: Outcome, answer: &GrpcResponse) -> Outcome {
    let t = answer.timings;
    let outcome = match &answer.tls {
        Some(tls) => outcome.with_metric("cert_expiry_seconds", tls.expires_in_seconds(), "seconds"),
        None => outcome,
    };
    outcome
        .with_metric("grpc_status_code", f64::from(answer.code.0), "")
        .with_metric("dns_seconds", t.dns, "seconds")
        .with_metric("connect_seconds", t.connect, "seconds")
        .with_metric("tls_seconds", t.tls, "seconds")
        .with_metric("first_byte_seconds", t.first_byte, "seconds")
        .with_metric("total_seconds", t.total, "seconds")
}

/// The verdict on an answer to `Check` about `what` (the target, and the
/// service when one is named).
fn verdict(what: &str, answer: &GrpcResponse) -> Result<Outcome, ProbeError> {
    let status = |m: &str| match m {
        "" => answer.code.name(),
        m => format!("{}: {m}", answer.code),
    };
    let outcome = match answer.code {
        Code::OK => {
            let Some(message) = &answer.message else {
                return Err(ProbeError::io(format!("{what}: status OK without a response message")));
            };
            let serving = decode_response(message)
                .map_err(|e| ProbeError::io(format!("{what}: bad HealthCheckResponse: {e}")))?;
            let text = format!("{what}: {}", serving.name());
            let outcome = match serving {
                Health::Serving => Outcome::success(text),
                _ => Outcome::failure(text),
            };
            // Read by `/probe` for blackbox's `probe_grpc_healthcheck_response`.
            outcome.with_metric("grpc_serving_status", serving.wire() as f64, "")
        }
        // What servers answer for a service they do not know.
        Code::NOT_FOUND => Outcome::failure(format!("{what}: SERVICE_UNKNOWN ({})", status(&answer.status_message))),
        Code::UNIMPLEMENTED => {
            return Err(ProbeError::io(format!(
                "{what}: the server does not implement grpc.health.v1.Health ({})",
                status(&answer.status_message)
            )));
        }
        // The target answered, but not healthy: count it against it.
        _ => Outcome::failure(format!("{what}: {}", status(&answer.status_message))),
    };
    Ok(with_metrics(outcome, answer))
}

struct Grpc;

impl Probe for Grpc {
    fn describe() -> PluginInfo {
        PluginInfo {
            vendor: "sonde".into(),
            description: "gRPC health check (grpc.health.v1.Health/Check), as the kubelet's grpc probe.".into(),
            config_schema: Some(SCHEMA.into()),
            ..PluginInfo::default()
        }
    }

    fn check(req: Request) -> Result<Outcome, ProbeError> {
        let config: Config = req.config()?;
        let target = req.target();
        if target.is_empty() || target.contains("://") {
            return Err(ProbeError::invalid_config(format!(
                "target {target:?}: expected HOST:PORT"
            )));
        }
        let tls = config.tls()?;
        if let Some(spec) = &config.client_cert {
            let (host, port) = sonde_sdk::net::host_port(target)?;
            spec.present(host, port)?;
        }
        let request = GrpcRequest {
            authority: target.to_string(),
            method: CHECK.into(),
            message: encode_request(&config.service),
            metadata: config.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            // The call's deadline bounds the call, so a server that does not
            // answer is recorded by the host as reason `timeout`.
            timeout: req.timeout(),
            tls,
        };
        let what = match config.service.as_str() {
            "" => target.to_string(),
            s => format!("{target} service {s:?}"),
        };
        match call(&request) {
            Ok(answer) => verdict(&what, &answer),
            // Refused, reset, not HTTP/2: the target is not serving gRPC.
            Err(ProbeError::Io(m)) => Ok(Outcome::failure(format!("{what}: {m}"))),
            Err(e) => Err(e),
        }
    }
}

sonde_sdk::export!(Grpc);

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_sdk::http::Timings;

    fn answer(code: u32, status_message: &str, message: Option<&[u8]>) -> GrpcResponse {
        GrpcResponse {
            code: Code(code),
            status_message: status_message.into(),
            message: message.map(<[u8]>::to_vec),
            metadata: Vec::new(),
            timings: Timings::default(),
            tls: None,
        }
    }

    #[test]
    fn requests_encode_the_service_name() {
        assert_eq!(encode_request(""), Vec::<u8>::new());
        assert_eq!(encode_request("api"), b"\x0a\x03api");
        let long = "s".repeat(200);
        let encoded = encode_request(&long);
        assert_eq!(&encoded[..3], &[0x0a, 0xc8, 0x01]);
        assert_eq!(encoded.len(), 203);
    }

    #[test]
    fn responses_decode_the_serving_status() {
        assert_eq!(decode_response(b""), Ok(Health::Unknown));
        assert_eq!(decode_response(b"\x08\x01"), Ok(Health::Serving));
        assert_eq!(decode_response(b"\x08\x02"), Ok(Health::NotServing));
        assert_eq!(decode_response(b"\x08\x03"), Ok(Health::ServiceUnknown));
        // Unknown fields of every wire type are skipped.
        assert_eq!(
            decode_response(b"\x12\x02hi\x19\0\0\0\0\0\0\0\0\x25\0\0\0\0\x08\x01"),
            Ok(Health::Serving)
        );
        assert_eq!(decode_response(b"\x08"), Err(DecodeError::Truncated("varint")));
        assert_eq!(decode_response(b"\x12\x05hi"), Err(DecodeError::PastEnd { field: 2 }));
        assert_eq!(
            decode_response(b"\x0b"),
            Err(DecodeError::WireType { field: 1, wire: 3 })
        );
        assert_eq!(
            DecodeError::WireType { field: 1, wire: 3 }.to_string(),
            "field 1 has unsupported wire type 3"
        );
    }

    #[test]
    fn verdicts() {
        let ok = verdict("t", &answer(0, "", Some(b"\x08\x01"))).unwrap();
        assert_eq!(
            (ok.status, ok.message.as_str()),
            (sonde_sdk::Status::Success, "t: SERVING")
        );
        let down = verdict("t", &answer(0, "", Some(b"\x08\x02"))).unwrap();
        assert_eq!(down.status, sonde_sdk::Status::Failure);
        let unknown = verdict("t", &answer(5, "service not registered", None)).unwrap();
        assert_eq!(unknown.status, sonde_sdk::Status::Failure);
        assert_eq!(
            unknown.message,
            "t: SERVICE_UNKNOWN (NOT_FOUND: service not registered)"
        );
        match verdict("t", &answer(12, "", None)) {
            Err(ProbeError::Io(m)) => assert!(m.contains("UNIMPLEMENTED"), "{m}"),
            other => panic!("{other:?}"),
        }
        let draining = verdict("t", &answer(14, "draining", None)).unwrap();
        assert_eq!(
            (draining.status, draining.message.as_str()),
            (sonde_sdk::Status::Failure, "t: UNAVAILABLE: draining")
        );
        assert!(matches!(verdict("t", &answer(0, "", None)), Err(ProbeError::Io(_))));
    }

    #[test]
    fn tls_options_need_tls() {
        let config: Config = serde_json::from_str(r#"{"insecure_skip_verify": true}"#).unwrap();
        assert!(matches!(config.tls(), Err(ProbeError::InvalidConfig(_))));
        let config: Config = serde_json::from_str(r#"{"tls": true, "server_name": "api"}"#).unwrap();
        assert_eq!(config.tls().unwrap().unwrap().server_name.as_deref(), Some("api"));
    }
}
