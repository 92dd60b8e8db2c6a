//! What the host itself saw while a plugin used its network capabilities
//! (`http`, `tcp`, `tls`, `grpc`, `icmp`, `udp`) during one run: the addresses and the
//! time each phase took, the HTTP answers, the TLS sessions, the gRPC
//! status. The plugin cannot forge any of it; `/probe` reads it to answer
//! with blackbox_exporter's series.
//!
//! It is bounded: fixed-size facts, and the certificates of the last TLS
//! session only ([`MAX_CHAIN_CERTS`], [`MAX_CHAIN_BYTES`]), kept as the
//! server sent them (DER) and parsed only by whoever reads them. A run
//! that opens no connection observes nothing (`None` on its result).
//!
//! Every run records it, `/probe` or scheduled, so it is kept cheap: an
//! uncontended lock of the call's bounds per fact, one allocation per run
//! that connects, and per TLS handshake a copy of the chain served (which
//! a kept-alive connection then shares with the runs that reuse it).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The most certificates of a served chain that are kept.
pub const MAX_CHAIN_CERTS: usize = 8;
/// The most bytes of a served chain that are kept.
pub const MAX_CHAIN_BYTES: usize = 64 * 1024;

/// What the host saw of one run's connections.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// The run's first name lookup (or address taken as written): how
    /// long it took, and whether it gave an address to connect to.
    pub first_lookup: Option<Lookup>,
    /// The address of the run's first connection (the one that answered,
    /// else the last one tried).
    pub peer: Option<IpAddr>,
    /// Every lookup of the run, summed.
    pub dns: Duration,
    /// Every TCP connect that succeeded, summed.
    pub connect: Duration,
    /// Every TLS handshake that succeeded, summed.
    pub handshake: Duration,
    /// Set when the plugin used `http`.
    pub http: Option<HttpSeen>,
    /// Set when the plugin used `grpc`.
    pub grpc: Option<GrpcSeen>,
    /// Whether the plugin used `tcp` or `tls`.
    pub tcp: bool,
    /// Whether a `tcp` connection was made, or a `tls` session completed
    /// its handshake: the exchange with the service could begin.
    pub tcp_ready: bool,
    /// Set when the plugin used `icmp`: its last echo.
    pub icmp: Option<IcmpSeen>,
    /// The run's last TLS session that completed its handshake (shared
    /// with the pooled connection that carries it, for the runs that
    /// reuse it).
    pub tls: Option<Arc<TlsSeen>>,
    /// The trace context the host sent with the run's HTTP and gRPC
    /// requests (`traceparent`), when the probe propagates one.
    pub trace: Option<TraceContext>,
}

/// A W3C trace context: the run's trace, and its span as the parent of
/// what the target does with the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace's id; never all zeros.
    pub trace_id: [u8; 16],
    /// The run's span id; never all zeros.
    pub span_id: [u8; 8],
}

impl TraceContext {
    /// The `traceparent` header's value: version 00, sampled.
    pub fn traceparent(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        for b in self.trace_id {
            let _ = write!(out, "{b:02x}");
        }
        out.push('-');
        for b in self.span_id {
            let _ = write!(out, "{b:02x}");
        }
        out.push_str("-01");
        out
    }
}

/// A name lookup: its time, and whether it found an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// How long it took.
    pub took: Duration,
    /// Whether an address came of it.
    pub found: bool,
}

/// The HTTP exchanges of a run, as the host's transport made them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpSeen {
    /// Responses received.
    pub responses: u32,
    /// Responses that were redirects (3xx with a `Location`).
    pub redirects: u32,
    /// The last response's status; 0 when none came.
    pub status: u16,
    /// The last response's HTTP version as major, minor; (0, 0) when none.
    pub version: (u8, u8),
    /// The last response's `Content-Length`; -1 when it has none.
    pub content_length: i64,
    /// The bytes of the last response's body the host read.
    pub body_bytes: u64,
    /// The last response's `Last-Modified`, Unix seconds, when it parses.
    pub last_modified: Option<i64>,
    /// Whether the last response came over TLS.
    pub ssl: bool,
    /// Whether a TLS handshake for a request failed.
    pub handshake_failed: bool,
    /// From a connection ready to each response's head, summed.
    pub processing: Duration,
    /// Reading the last response's body.
    pub transfer: Duration,
}

/// The gRPC calls of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrpcSeen {
    /// The last call's status code; `None` when no status came.
    pub code: Option<u32>,
    /// Whether the last call went over TLS.
    pub ssl: bool,
    /// The last call's time, its lookup left out.
    pub check: Duration,
}

/// An ICMP echo, as the host sent it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcmpSeen {
    /// Opening the socket.
    pub setup: Duration,
    /// From sending the request to its reply; `None` when none came.
    pub rtt: Option<Duration>,
    /// The reply's TTL (IPv4) or hop limit (IPv6), when the kernel told it.
    pub hop_limit: Option<u8>,
}

/// A TLS session, as the handshake established it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSeen {
    /// `TLS 1.2`, `TLS 1.3`, or `unknown`.
    pub version: &'static str,
    /// The certificates the server sent, leaf first, DER.
    pub chain: Vec<Vec<u8>>,
    /// Whether the chain was verified (not `insecure_skip_verify`).
    pub verified: bool,
    /// The cipher suite negotiated, by its IANA number (`0x1301` is
    /// `TLS_AES_128_GCM_SHA256`); 0 when unknown.
    pub cipher: u16,
}

impl Observed {
    /// Records a lookup (or an address taken as written) of `took`.
    pub(crate) fn looked_up(&mut self, took: Duration, found: bool) {
        self.dns += took;
        self.first_lookup.get_or_insert(Lookup { took, found });
    }

    /// Records a connection to `peer`, `Some(took)` when it was made.
    pub(crate) fn connected(&mut self, peer: IpAddr, took: Option<Duration>) {
        self.peer.get_or_insert(peer);
        if let Some(took) = took {
            self.connect += took;
        }
    }
}
