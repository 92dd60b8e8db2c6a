//! Host bindings generated from the WIT contract in `sdk/wit/`.
//!
//! The bottom of the host's dependency graph: [`crate::engine`] (which
//! instantiates plugins) and every capability in [`crate::host`] (which
//! implement the imports) use these types, and this module uses nothing of
//! theirs. The one host type the WIT names, the `session` resource, is
//! declared here for that reason; its behaviour lives in `host::tls`.
//!
//! Every sonde import is `trappable`: a host function returns
//! `wasmtime::Result<…>`, and an `Err` (a failure that is not the plugin's
//! fault, such as a resource-table error) traps the call instead of
//! reaching the plugin as one of the WIT's error values.

wasmtime::component::bindgen!({
    path: "../../sdk/wit",
    world: "plugin",
    imports: {
        "sonde:probe/exec.run": async | trappable,
        "sonde:probe/http.send": async | trappable,
        "sonde:probe/http.send-keeping": async | trappable,
        "sonde:probe/http.send-with": async | trappable,
        "sonde:probe/grpc.call": async | trappable,
        "sonde:probe/tls.handshake": async | trappable,
        "sonde:probe/tls.connect": async | trappable,
        "sonde:probe/tcp.connect": async | trappable,
        "sonde:probe/icmp.echo": async | trappable,
        "sonde:probe/udp.exchange": async | trappable,
        "sonde:probe/credentials.postgres-login": async | trappable,
        "sonde:probe/credentials.redis-login": async | trappable,
        "sonde:probe/tls.[method]session.send": async | trappable,
        "sonde:probe/tls.[method]session.receive": async | trappable,
        "sonde:probe/tls.[method]session.starttls": async | trappable,
        default: trappable,
    },
    with: { "sonde:probe/tls.session": crate::bindings::Session },
    exports: { default: async },
});

use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection a plugin holds open through the host (the `tls` interface's
/// `session` resource): over TLS, or plain TCP from the `tcp` interface.
#[allow(
    unreachable_pub,
    reason = "the generated bindings re-export it as the `session` resource's type"
)]
pub struct Session {
    pub(crate) stream: SessionStream,
    /// The host and port the plugin asked for, as checked: where a login
    /// on this session may send a secret (`host::credentials`).
    pub(crate) peer: (String, u16),
    /// What a peer sent, as a probe that holds secrets may read it: a
    /// fixed lag behind, checked for reflections (`host::tls`).
    pub(crate) scan: sonde_policy::secrets::scrub::Stream,
    /// What was checked and not handed over yet (more than `max`).
    pub(crate) ready: Vec<u8>,
}

/// The connection under a [`Session`].
pub(crate) enum SessionStream {
    /// From `tls.connect`.
    Tls(Box<TlsStream<TcpStream>>),
    /// From `tcp.connect`.
    Plain(TcpStream),
    /// A plain connection whose `starttls` failed: the handshake took the
    /// connection and closed it.
    Closed,
}
