//! Host capabilities: what a plugin can reach, each checked against the
//! probe's grants.
//!
//! Each capability is a unit of the same small shape, after wasmtime's
//! `wasi-config`: the state it keeps per call (if any), a view of one call
//! (`…View`: that state plus what it borrows from the call, such as the
//! grants), an `add_to_linker` that takes an accessor returning the view,
//! and one grant check, [`CallGrants::authorize`](sonde_policy::grants::CallGrants::authorize). Files
//! are named after the WIT interface they implement:
//!
//! - [`sockets`]: `wasi:sockets`, filtered to the target and `net` grants,
//!   including name lookups;
//! - [`outgoing_handler`]: `wasi:http/outgoing-handler`, likewise;
//! - [`filesystem`]: `wasi:filesystem`, showing only the read-only `files`
//!   grants;
//! - [`http`]: sonde's `http`, the host-owned probe transport, with its
//!   keep-alive [`pool`];
//! - [`tls`]: sonde's `tls`, a TLS handshake or session by the host;
//! - [`tcp`]: sonde's `tcp`, a plain TCP session by the host;
//! - [`icmp`]: sonde's `icmp`, one echo on an unprivileged ping socket;
//! - [`grpc`]: sonde's `grpc`, one unary call;
//! - [`udp`]: sonde's `udp`, one request datagram and its reply;
//! - [`credentials`]: sonde's `credentials`, the secrets the host uses for
//!   the plugin (a client certificate, a database login);
//! - [`exec`]: sonde's `exec`, for granted programs only;
//! - [`log`]: sonde's `log`, capped per call.
//!
//! [`sonde_policy::grants`] holds the grants and their one check, and
//! [`sonde_policy::reach`] the
//! classes of address a name never leads to; [`bounds`] what a
//! call may make the host hold (sockets, table entries, host memory),
//! per call and per agent; [`blocking`] the agent's capacity for plugin
//! work that holds a thread (lookups, file opens); [`contain`] keeps what `exec` runs from
//! outliving its run; [`dial`] and
//! [`tls_client`] are the connection and TLS client the transports share.
//! What outlives a call (the TLS client, the pool) is in [`Shared`], built
//! once per engine. The engine composes the capabilities' states into its
//! store's data and wires each `add_to_linker`; no capability sees another's
//! state.
//!
//! Everything else WASI offers is present but empty: no environment, no
//! arguments, stdin closed, stdout discarded, stderr kept (bounded) so a
//! plugin's panic message can be reported.

pub mod blocking;
pub mod bounds;
pub(crate) mod client_certs;
pub mod contain;
pub(crate) mod credentials;
pub(crate) mod dial;
pub mod exec;
pub mod filesystem;
pub mod grpc;
pub mod http;
pub mod icmp;
pub mod log;
pub(crate) mod outgoing_handler;
pub mod pool;
pub(crate) mod reflections;
pub mod sockets;
mod spawn;
pub(crate) mod tasks;
pub mod tcp;
pub mod tls;
pub(crate) mod tls_client;
pub mod udp;

pub use sonde_policy::grants::{GrantError, Grants, NetPattern};

/// What every call of an engine shares (built once per engine): the TLS
/// client with its trust roots, the HTTP keep-alive pool, the bounds in
/// force with the agent's socket budget and gates, and the agent's own
/// listeners, which no plugin's connection may reach ([`sonde_policy::reach`]).
pub(crate) struct Shared {
    pub(crate) tls: tls_client::TlsClient,
    pub(crate) pool: pool::Pool,
    pub(crate) bounds: bounds::AgentBounds,
    pub(crate) listeners: std::sync::Arc<sonde_policy::reach::OwnListeners>,
}

impl Shared {
    /// What calls share, with an agent-wide budget of `sockets`, under
    /// `limits`.
    pub(crate) fn new(sockets: usize, limits: bounds::HostLimits) -> Self {
        let pool = pool::Pool::default();
        pool.set_limits(idle_limits(&limits));
        Self {
            tls: tls_client::TlsClient::default(),
            pool,
            bounds: bounds::AgentBounds::new(sockets, limits),
            listeners: Default::default(),
        }
    }

    /// Puts `limits` in force for the calls that start from now, the
    /// pool's idle bounds at its next check-in and the gates' sizes as
    /// [`bounds::AgentBounds::set_limits`] says.
    pub(crate) fn set_limits(&self, limits: bounds::HostLimits) {
        self.pool.set_limits(idle_limits(&limits));
        self.bounds.set_limits(limits);
    }
}

/// The pool's share of `limits`.
fn idle_limits(limits: &bounds::HostLimits) -> pool::IdleLimits {
    pool::IdleLimits {
        per_host: limits.keepalive_idle_per_host,
        per_tenant: limits.keepalive_idle_per_tenant,
        total: limits.keepalive_idle,
    }
}
