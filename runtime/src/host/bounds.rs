//! Bounds on what a plugin can make the host hold, per call and per agent.
//!
//! - **Resource-table entries** (every WASI and sonde resource: sockets,
//!   `wasi:http` fields, requests, bodies, streams, pollables, sessions):
//!   at most [`TABLE_ENTRIES_PER_CALL`] at once. wasmtime's table refuses
//!   the next one and the call traps; the run is `unknown`, reason
//!   `host-limit`.
//! - **Host memory behind them**: a `wasi:http` `fields` resource holds at
//!   most [`FIELDS_BYTES`], so the table bound caps the host memory a call
//!   can pin at [`HOST_MEMORY_PER_CALL`]; that much is taken out of the
//!   call's memory cap (the guest's linear memory may grow to the rest).
//!   Bodies and messages the host reads for a plugin are capped where they
//!   are read (`http::MAX_BODY_BYTES`, `grpc::MAX_MESSAGE_BYTES`) and
//!   copied into the guest's memory, which its cap bounds.
//! - **Sockets**: every socket the host opens for a call (a `wasi:sockets`
//!   socket, created or not connected; a `tcp`/`tls` session or handshake;
//!   an `http` or `grpc` connection) counts: at most [`SOCKETS_PER_CALL`]
//!   per call, and each holds a permit of the agent's socket budget
//!   ([`agent_sockets`], derived from the file-descriptor limit) until the
//!   call ends. A refusal is reported to the plugin as its interface's
//!   error (`new-socket-limit` for `wasi:sockets`) and recorded, so the run
//!   is `unknown`, reason `host-limit`, whatever the plugin makes of it.
//!
//! Per tenant, the per-call bounds multiply by the tenant's concurrent runs
//! (`quotas.max_concurrent_runs`, default 4: 256 sockets, 16 MiB of host
//! memory); the agent-wide socket budget keeps half of the file
//! descriptors for everything else, so a hoarding tenant makes its own
//! runs `unknown` but cannot take the descriptors other tenants' probes and
//! the API need.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Resource-table entries one call may hold at once. A `wasi:http` request
/// in flight holds about fifteen (request, fields, body, streams,
/// pollables, response); 256 leaves room for a plugin with several at once
/// and is far below what a hoarder needs to hurt the host.
pub const TABLE_ENTRIES_PER_CALL: usize = 256;
/// Bytes (roughly, as wasmtime-wasi-http counts them) one `wasi:http`
/// `fields` resource may hold: twice what HTTP servers usually accept for
/// all of a request's headers.
pub const FIELDS_BYTES: usize = 16 * 1024;
/// The host memory a call's resources can pin: every table entry a full
/// `fields` (4 MiB). Taken out of the call's memory cap.
pub const HOST_MEMORY_PER_CALL: u64 = (TABLE_ENTRIES_PER_CALL * FIELDS_BYTES) as u64;
/// Sockets the host opens for one call, in all (a probe needs one or a
/// few; retries within one call a few more).
pub const SOCKETS_PER_CALL: usize = 64;
/// File descriptors kept out of the agent's socket budget for its own use
/// (API connections, state, compile cache, logs).
const FDS_RESERVED: u64 = 256;

/// The agent-wide socket budget: half of the file-descriptor limit (after
/// raising the soft limit to the hard one, see [`raise_fd_limit`]), less
/// [`FDS_RESERVED`], and at least [`SOCKETS_PER_CALL`]. The other half
/// stays for the keep-alive pool, the API's clients and the agent itself.
pub fn agent_sockets() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    let budget = (limit / 2).saturating_sub(FDS_RESERVED);
    usize::try_from(budget).unwrap_or(usize::MAX).max(SOCKETS_PER_CALL)
}

/// Raises the soft file-descriptor limit to the hard one (as Go's runtime
/// does at start): the default soft limit of 1024 is a relic of `select`,
/// which sonde does not use. Returns the limit in force.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "cannot raise the file-descriptor limit");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The agent's share of what calls may hold (built once per engine).
#[derive(Clone)]
pub(crate) struct AgentBounds {
    sockets: Arc<Semaphore>,
    total: usize,
}

impl AgentBounds {
    pub(crate) fn new(sockets: usize) -> Self {
        Self {
            sockets: Arc::new(Semaphore::new(sockets)),
            total: sockets,
        }
    }

    /// Sockets of the agent's budget held by calls now.
    #[cfg(test)]
    pub(crate) fn sockets_in_use(&self) -> usize {
        self.total - self.sockets.available_permits()
    }
}

/// What one call holds against the bounds (built per call, dropped with
/// its store, which gives the permits back).
pub(crate) struct CallBounds {
    agent: AgentBounds,
    held: Option<OwnedSemaphorePermit>,
    sockets: usize,
    breach: Option<String>,
}

impl CallBounds {
    pub(crate) fn new(agent: &AgentBounds) -> Self {
        Self {
            agent: agent.clone(),
            held: None,
            sockets: 0,
            breach: None,
        }
    }

    /// Counts one more socket for the call, or refuses it (and records
    /// why) past [`SOCKETS_PER_CALL`] or when the agent's budget is spent.
    pub(crate) fn take_socket(&mut self) -> Result<(), String> {
        if self.sockets >= SOCKETS_PER_CALL {
            return Err(self.record(format!(
                "the plugin opened more than {SOCKETS_PER_CALL} sockets in one call"
            )));
        }
        let Ok(permit) = self.agent.sockets.clone().try_acquire_owned() else {
            return Err(self.record(format!(
                "the agent's budget of {} sockets is in use by other calls",
                self.agent.total
            )));
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        self.sockets += 1;
        Ok(())
    }

    fn record(&mut self, why: String) -> String {
        self.breach.get_or_insert_with(|| why.clone());
        why
    }

    /// The first bound the call ran into, if any.
    pub(crate) fn breach(&self) -> Option<&str> {
        self.breach.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_bounded_per_call_and_per_agent_and_given_back() {
        let agent = AgentBounds::new(SOCKETS_PER_CALL + 10);
        let mut one = CallBounds::new(&agent);
        for _ in 0..SOCKETS_PER_CALL {
            one.take_socket().unwrap();
        }
        assert!(one.breach().is_none());
        assert!(one.take_socket().unwrap_err().contains("more than 64 sockets"));
        assert!(one.breach().is_some());
        let mut two = CallBounds::new(&agent);
        for _ in 0..10 {
            two.take_socket().unwrap();
        }
        assert!(two.take_socket().unwrap_err().contains("agent's budget"));
        assert_eq!(agent.sockets_in_use(), SOCKETS_PER_CALL + 10);
        drop((one, two));
        assert_eq!(agent.sockets_in_use(), 0);
    }

    #[test]
    fn the_agent_budget_leaves_room() {
        assert!(agent_sockets() >= SOCKETS_PER_CALL);
    }
}
