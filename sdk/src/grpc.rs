//! gRPC through the host (`sonde:probe/grpc`): one unary call.
//!
//! The plugin serializes the request message and decodes the response
//! message (protobuf or anything else); the host owns the connection (a new
//! HTTP/2 connection per call, closed with a reset), the gRPC framing and the
//! status. The authority must be the probe's target or one of its `net`
//! grants; anything else fails with [`ProbeError::Denied`] and the run is
//! recorded as `denied`.
//!
//! ```no_run
//! use sonde_sdk::grpc::{Code, GrpcRequest, call};
//! # fn f() -> Result<(), sonde_sdk::ProbeError> {
//! let req = GrpcRequest::new("127.0.0.1:50051", "/grpc.health.v1.Health/Check", Vec::new(),
//!     std::time::Duration::from_secs(1));
//! let answer = call(&req)?;
//! if answer.code == Code::OK {
//!     let _message = answer.message.unwrap_or_default();
//! }
//! # Ok(()) }
//! ```

use crate::ProbeError;
use crate::http::Timings;
use crate::tls::{TlsInfo, TlsOptions};
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

/// A unary call to make with [`call`].
#[derive(Clone, Debug)]
pub struct GrpcRequest {
    /// `host:port` to connect to.
    pub authority: String,
    /// The full method path: `/package.Service/Method`.
    pub method: String,
    /// The serialized request message (without gRPC's length prefix).
    pub message: Vec<u8>,
    /// Custom metadata: lower-case names, not `grpc-*`; `-bin` names carry
    /// base64 values.
    pub metadata: Vec<(String, String)>,
    /// The time the whole call may take; sent to the server as `grpc-timeout`.
    pub timeout: Duration,
    /// `None` for plaintext HTTP/2 (h2c with prior knowledge); else TLS by
    /// the host's client, offering `h2` by ALPN.
    pub tls: Option<TlsOptions>,
}

impl GrpcRequest {
    /// A plaintext call of `method` on `authority` with no metadata.
    pub fn new(authority: impl Into<String>, method: impl Into<String>, message: Vec<u8>, timeout: Duration) -> Self {
        Self {
            authority: authority.into(),
            method: method.into(),
            message,
            metadata: Vec::new(),
            timeout,
            tls: None,
        }
    }
}

/// A gRPC status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Code(pub u32);

impl Code {
    /// Not an error.
    pub const OK: Self = Self(0);
    /// The server does not know the entity asked for.
    pub const NOT_FOUND: Self = Self(5);
    /// The server does not implement the method.
    pub const UNIMPLEMENTED: Self = Self(12);
    /// The service is currently unavailable.
    pub const UNAVAILABLE: Self = Self(14);

    /// The code's name as gRPC spells it (`UNIMPLEMENTED`), or `CODE_<n>`
    /// for a code gRPC does not define.
    pub fn name(self) -> String {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        NAMES
            .get(self.0 as usize)
            .map_or_else(|| format!("CODE_{}", self.0), |n| n.to_string())
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The answer to a call: a status, and the response message when there is
/// one.
#[derive(Clone, Debug)]
pub struct GrpcResponse {
    /// `grpc-status` (a non-200 HTTP status is mapped as gRPC specifies).
    pub code: Code,
    /// `grpc-message`, decoded; empty when none.
    pub status_message: String,
    /// The response message; `None` when the server sent none.
    pub message: Option<Vec<u8>>,
    /// Response headers and trailers (lower-case names), without the status.
    pub metadata: Vec<(String, String)>,
    /// Time spent in each phase.
    pub timings: Timings,
    /// What the TLS handshake established, for a TLS call.
    pub tls: Option<TlsInfo>,
}

/// Makes one unary call through the host and waits for its status, within
/// `req.timeout`. A status other than OK is an answer, not an error; errors
/// are what kept the call from getting a status: a denial, a malformed
/// request ([`ProbeError::InvalidConfig`]), or an I/O failure
/// ([`ProbeError::Io`], its message starting with `dns:`, `connect:`,
/// `timeout:`, `tls:` or `protocol:`).
pub fn call(req: &GrpcRequest) -> Result<GrpcResponse, ProbeError> {
    use crate::bindings::sonde::probe::grpc::{self as host, GrpcError};
    let request = host::Request {
        authority: req.authority.clone(),
        path: req.method.clone(),
        message: req.message.clone(),
        metadata: req.metadata.clone(),
        timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
        tls: req.tls.as_ref().map(TlsOptions::to_wit),
    };
    match host::call(&request) {
        Ok(r) => Ok(GrpcResponse {
            code: Code(r.code),
            status_message: r.status_message,
            message: r.message,
            metadata: r.metadata,
            timings: Timings {
                dns: r.timings.dns,
                connect: r.timings.connect,
                tls: r.timings.tls,
                first_byte: r.timings.first_byte,
                total: r.timings.total,
            },
            tls: r.tls.map(TlsInfo::from),
        }),
        Err(GrpcError::Denied(m)) => Err(ProbeError::Denied(m)),
        Err(GrpcError::Invalid(m)) => Err(ProbeError::InvalidConfig(m)),
        Err(GrpcError::Dns(m)) => Err(ProbeError::Io(format!("dns: {m}"))),
        Err(GrpcError::Connect(m)) => Err(ProbeError::Io(format!("connect: {m}"))),
        Err(GrpcError::Timeout(m)) => Err(ProbeError::Io(crate::net::timeout_message(&m))),
        Err(GrpcError::Tls(m)) => Err(ProbeError::Io(format!("tls: {m}"))),
        Err(GrpcError::Protocol(m)) => Err(ProbeError::Io(format!("protocol: {m}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::Code;
    use alloc::string::ToString;

    #[test]
    fn codes_have_grpc_names() {
        assert_eq!(Code::OK.name(), "OK");
        assert_eq!(Code::UNIMPLEMENTED.to_string(), "UNIMPLEMENTED");
        assert_eq!(Code(16).name(), "UNAUTHENTICATED");
        assert_eq!(Code(99).name(), "CODE_99");
    }
}
