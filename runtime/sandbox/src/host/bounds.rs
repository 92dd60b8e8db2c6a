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
//! - **What one host call copies out of the guest**: the strings and lists
//!   a plugin passes to a host function (and returns from `check` or
//!   `describe`) are copied into host memory before any host code sees
//!   them, at most [`ARGUMENT_BYTES`] per host call, counted by wasmtime as
//!   it copies (each string's bytes, each list's elements at their host
//!   size). Guest memory alone would not bound it: a list's strings may all
//!   point at the same bytes, so a few MiB of guest memory could name
//!   gigabytes. Past the bound the call traps and the run is `unknown`,
//!   reason `host-limit`; the bound is also taken out of the call's memory
//!   cap.
//! - **What one host call hands back**: bodies and messages as above;
//!   `wasi:random` at most [`RANDOM_BYTES`] per call (past it the call
//!   traps, `host-limit`); WASI reads at most 64 KiB (wasmtime-wasi's own
//!   cap); `tls`/`tcp` receives at most 64 KiB; `exec` output 4 KiB.
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
//! (`quotas.max_concurrent_runs`, default 4: 256 sockets, 32 MiB of host
//! memory); the agent-wide socket budget keeps half of the file
//! descriptors for everything else, so a hoarding tenant makes its own
//! runs `unknown` but cannot take the descriptors other tenants' probes and
//! the API need.

use super::blocking::{Gate, Gates, Permit, WorkLost};
use crate::verdict::Observed;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Resource-table entries one call may hold at once. A `wasi:http` request
/// in flight holds about fifteen (request, fields, body, streams,
/// pollables, response); 256 leaves room for a plugin with several at once
/// and is far below what a hoarder needs to hurt the host.
pub const TABLE_ENTRIES_PER_CALL: usize = 256;
/// Bytes (roughly, as wasmtime-wasi-http counts them) one `wasi:http`
/// `fields` resource may hold: twice what HTTP servers usually accept for
/// all of a request's headers.
pub(crate) const FIELDS_BYTES: usize = 16 * 1024;
/// Bytes one host call may copy out of the guest: its arguments, or the
/// result of `check` or `describe` (wasmtime's "hostcall fuel", 128 MiB
/// unless set). Room for the largest a plugin needs: a 1 MiB request
/// body, or a 1 MiB message and detail with their metrics.
pub const ARGUMENT_BYTES: usize = 4 * 1024 * 1024;
/// Bytes one `wasi:random` call may return. The host makes them, and holds
/// them, before copying them into the guest (wasmtime-wasi allows 64 MiB,
/// ~60 ms of generation that no deadline interrupts); a plugin needs a few
/// dozen. As the largest body or message the host hands a plugin.
pub const RANDOM_BYTES: u64 = 1024 * 1024;
/// The host memory a call can make the host hold: every table entry a
/// full `fields` (4 MiB), and one host call's copied arguments (4 MiB).
/// Taken out of the call's memory cap.
pub const HOST_MEMORY_PER_CALL: u64 = (TABLE_ENTRIES_PER_CALL * FIELDS_BYTES + ARGUMENT_BYTES) as u64;
/// Sockets the host opens for one call, in all (a probe needs one or a
/// few; retries within one call a few more).
pub const SOCKETS_PER_CALL: usize = 64;
/// `wasi:sockets` name lookups one call may have in flight at once (sonde's
/// own transports look up one name at a time). Agent-wide, lookups are
/// bounded by [`MAX_LOOKUPS_IN_FLIGHT`](super::blocking::MAX_LOOKUPS_IN_FLIGHT).
pub const LOOKUPS_PER_CALL: usize = 4;
/// File descriptors kept out of the agent's socket budget for its own use
/// (API connections, state, compile cache, logs).
const FDS_RESERVED: u64 = 256;

/// The bounds an engine enforces: the defaults above unless the config's
/// `sandbox:` block sets others. They belong to the engine that uses them
/// (`EngineConfig::host_limits`, `Engine::set_host_limits`), never to the
/// process: two engines in one process each enforce their own. What each
/// bounds is in `docs/security.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostLimits {
    /// `sandbox.table_entries_per_call` ([`TABLE_ENTRIES_PER_CALL`]).
    pub table_entries_per_call: usize,
    /// `sandbox.fields_bytes` ([`FIELDS_BYTES`]).
    pub fields_bytes: usize,
    /// `sandbox.argument_bytes` ([`ARGUMENT_BYTES`]).
    pub argument_bytes: usize,
    /// `sandbox.sockets_per_call` ([`SOCKETS_PER_CALL`]).
    pub sockets_per_call: usize,
    /// `sandbox.lookups_per_call` ([`LOOKUPS_PER_CALL`]).
    pub lookups_per_call: usize,
    /// `sandbox.lookups_in_flight`
    /// ([`MAX_LOOKUPS_IN_FLIGHT`](super::blocking::MAX_LOOKUPS_IN_FLIGHT)).
    pub lookups_in_flight: usize,
    /// `sandbox.blocking_threads`
    /// ([`PLUGIN_BLOCKING_THREADS`](super::blocking::PLUGIN_BLOCKING_THREADS)).
    pub blocking_threads: usize,
    /// `sandbox.exec_pids` ([`MAX_RUN_PIDS`](super::contain::MAX_RUN_PIDS)).
    pub exec_pids: u32,
    /// `sandbox.keepalive_idle_per_host`
    /// ([`MAX_IDLE_PER_HOST`](super::pool::MAX_IDLE_PER_HOST)).
    pub keepalive_idle_per_host: usize,
    /// `sandbox.keepalive_idle_per_tenant`
    /// ([`MAX_IDLE_PER_TENANT`](super::pool::MAX_IDLE_PER_TENANT)).
    pub keepalive_idle_per_tenant: usize,
    /// `sandbox.keepalive_idle`
    /// ([`MAX_IDLE`](super::pool::MAX_IDLE)).
    pub keepalive_idle: usize,
}

impl Default for HostLimits {
    fn default() -> Self {
        Self {
            table_entries_per_call: TABLE_ENTRIES_PER_CALL,
            fields_bytes: FIELDS_BYTES,
            argument_bytes: ARGUMENT_BYTES,
            sockets_per_call: SOCKETS_PER_CALL,
            lookups_per_call: LOOKUPS_PER_CALL,
            lookups_in_flight: super::blocking::MAX_LOOKUPS_IN_FLIGHT,
            blocking_threads: super::blocking::PLUGIN_BLOCKING_THREADS,
            exec_pids: super::contain::MAX_RUN_PIDS,
            keepalive_idle_per_host: super::pool::MAX_IDLE_PER_HOST,
            keepalive_idle_per_tenant: super::pool::MAX_IDLE_PER_TENANT,
            keepalive_idle: super::pool::MAX_IDLE,
        }
    }
}

impl HostLimits {
    /// The host memory a call can make the host hold: every table entry a
    /// full `fields`, and one host call's copied arguments. Taken out of
    /// the call's memory cap.
    pub(crate) fn host_memory_per_call(&self) -> u64 {
        (self.table_entries_per_call as u64)
            .saturating_mul(self.fields_bytes as u64)
            .saturating_add(self.argument_bytes as u64)
    }

    /// Every bound with its `sandbox:` key, in the order of
    /// `docs/config.md`.
    pub fn entries(&self) -> [(&'static str, u64); 11] {
        [
            ("table_entries_per_call", self.table_entries_per_call as u64),
            ("fields_bytes", self.fields_bytes as u64),
            ("argument_bytes", self.argument_bytes as u64),
            ("sockets_per_call", self.sockets_per_call as u64),
            ("lookups_per_call", self.lookups_per_call as u64),
            ("lookups_in_flight", self.lookups_in_flight as u64),
            ("blocking_threads", self.blocking_threads as u64),
            ("exec_pids", u64::from(self.exec_pids)),
            ("keepalive_idle_per_host", self.keepalive_idle_per_host as u64),
            ("keepalive_idle_per_tenant", self.keepalive_idle_per_tenant as u64),
            ("keepalive_idle", self.keepalive_idle as u64),
        ]
    }

    /// Checks each bound's range; the error names the key
    /// (`sandbox.sockets_per_call: must be from 1 to 65536`).
    pub fn validate(&self) -> Result<(), LimitError> {
        // In the order of `entries`.
        const RANGES: [(&str, u64, u64); 11] = [
            ("table_entries_per_call", 64, 1 << 16),
            ("fields_bytes", 1024, 1 << 20),
            ("argument_bytes", 64 << 10, 64 << 20),
            ("sockets_per_call", 1, 1 << 16),
            ("lookups_per_call", 1, 256),
            ("lookups_in_flight", 1, 256),
            // tokio keeps 512 blocking threads; the agent needs some of them.
            ("blocking_threads", 1, 384),
            ("exec_pids", 1, 1 << 22),
            ("keepalive_idle_per_host", 0, 1 << 16),
            ("keepalive_idle_per_tenant", 0, 1 << 16),
            ("keepalive_idle", 0, 1 << 20),
        ];
        for ((key, got), (name, min, max)) in self.entries().into_iter().zip(RANGES) {
            debug_assert_eq!(key, name, "RANGES follows the order of `entries`");
            if !(min..=max).contains(&got) {
                return Err(LimitError::OutOfRange { key, min, max, got });
            }
        }
        if self.host_memory_per_call() > 256 << 20 {
            return Err(LimitError::HostMemory {
                bytes: self.host_memory_per_call(),
            });
        }
        Ok(())
    }
}

/// A `sandbox:` bound out of its range ([`HostLimits::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// One key's value is outside what the host accepts.
    #[error("sandbox.{key}: must be from {min} to {max} (got {got})")]
    OutOfRange {
        /// The key under `sandbox:`.
        key: &'static str,
        /// The smallest value accepted.
        min: u64,
        /// The largest value accepted.
        max: u64,
        /// The value given.
        got: u64,
    },
    /// The keys together let a call hold too much host memory.
    #[error(
        "sandbox: table_entries_per_call × fields_bytes + argument_bytes is the host memory a call may hold, at most 256MiB (got {bytes} bytes)"
    )]
    HostMemory {
        /// What they let a call hold.
        bytes: u64,
    },
}

/// What differs between `before` and `after`, as `key: old -> new`
/// (for the log line of a reload that changes `sandbox:`).
pub fn changes(before: &HostLimits, after: &HostLimits) -> String {
    let (b, a) = (before.entries(), after.entries());
    b.iter()
        .zip(&a)
        .filter(|(x, y)| x.1 != y.1)
        .map(|(x, y)| format!("{}: {} -> {}", x.0, x.1, y.1))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The agent-wide socket budget: half of the file-descriptor limit (after
/// raising the soft limit to the hard one, see [`raise_fd_limit`]), less
/// [`FDS_RESERVED`], and at least [`SOCKETS_PER_CALL`]. The other half
/// stays for the keep-alive pool, the API's clients and the agent itself.
pub(crate) fn agent_sockets() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(1 << 20);
    let budget = (limit / 2).saturating_sub(FDS_RESERVED);
    usize::try_from(budget).unwrap_or(usize::MAX).max(SOCKETS_PER_CALL)
}

/// Raises the soft file-descriptor limit to the hard one (as Go's runtime
/// does at start): the default soft limit of 1024 is a relic of `select`,
/// which sonde does not use. Returns the limit in force.
pub(crate) fn raise_fd_limit() -> u64 {
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

/// What an engine's calls share against the bounds (built once per
/// engine; clones share it): the bounds in force, the agent's socket
/// budget and the gates of blocking work ([`super::blocking::Gates`]).
#[derive(Clone)]
pub(crate) struct AgentBounds {
    sockets: Arc<Semaphore>,
    total: usize,
    limits: Arc<Mutex<HostLimits>>,
    gates: Gates,
}

impl AgentBounds {
    /// A budget of `sockets` for calls, under `limits`.
    pub(crate) fn new(sockets: usize, limits: HostLimits) -> Self {
        Self {
            sockets: Arc::new(Semaphore::new(sockets)),
            total: sockets,
            limits: Arc::new(Mutex::new(limits)),
            gates: Gates::new(limits.lookups_in_flight, limits.blocking_threads),
        }
    }

    /// The bounds in force: what a call that starts now gets.
    pub(crate) fn limits(&self) -> HostLimits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `limits` in force: calls that start from now get them, and the
    /// gates take their new sizes (a narrower gate as the work in flight
    /// gives its permits back). Calls in flight keep the per-call bounds
    /// they started with.
    pub(crate) fn set_limits(&self, limits: HostLimits) {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
        self.gates.resize(limits.lookups_in_flight, limits.blocking_threads);
    }

    /// The gates of blocking work for plugins.
    pub(crate) fn gates(&self) -> &Gates {
        &self.gates
    }

    /// Sockets of the agent's budget held by calls now.
    #[cfg(test)]
    pub(crate) fn sockets_in_use(&self) -> usize {
        self.total - self.sockets.available_permits()
    }
}

/// What one call holds against the bounds (built per call; the clones a
/// capability keeps share it). The permits go back when the last clone is
/// dropped, with the store.
#[derive(Clone)]
pub(crate) struct CallBounds {
    agent: AgentBounds,
    /// The bounds in force when the call started, for all of it.
    limits: HostLimits,
    held: Arc<Mutex<Held>>,
    /// The `traceparent` the call's HTTP and gRPC requests carry, made
    /// once before the call starts (a request reads it without a lock).
    traceparent: Option<http::HeaderValue>,
    /// Whether everything seen is recorded (`GET /probe`'s runs), set
    /// before the call starts.
    observe_all: bool,
}

#[derive(Default)]
struct Held {
    permit: Option<OwnedSemaphorePermit>,
    sockets: usize,
    lookups: usize,
    breach: Option<String>,
    /// Waits for an agent-wide bound in progress, and what they wait for.
    waiting: usize,
    waiting_for: Option<String>,
    /// What the call's connections showed the host, from the first one:
    /// kept here because every capability that connects holds the call's
    /// bounds.
    observed: Option<Box<Observed>>,
}

impl CallBounds {
    pub(crate) fn new(agent: &AgentBounds) -> Self {
        Self {
            agent: agent.clone(),
            limits: agent.limits(),
            held: Arc::default(),
            traceparent: None,
            observe_all: false,
        }
    }

    /// The bounds the call runs under.
    pub(crate) fn limits(&self) -> &HostLimits {
        &self.limits
    }

    /// The gates of the call's engine.
    pub(crate) fn gates(&self) -> &Gates {
        self.agent.gates()
    }

    /// Waits for a pass through `gate`, one of the engine's agent-wide
    /// bounds on blocking work. While it waits, a call that ends counts as
    /// cut off by the gate ([`Self::breach`]); cut off (the future dropped),
    /// the breach is recorded.
    pub(crate) async fn pass(&self, gate: &Arc<Gate>) -> Permit {
        struct Waiting<'a> {
            gate: &'a Gate,
            bounds: &'a CallBounds,
            done: bool,
        }
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.bounds.waiting(None);
                if !self.done {
                    self.bounds.record(self.gate.cut_off());
                }
            }
        }
        self.waiting(Some(gate.cut_off()));
        let mut waiting = Waiting {
            gate,
            bounds: self,
            done: false,
        };
        let permit = gate.acquire().await;
        waiting.done = true;
        permit
    }

    /// Runs `work` on a blocking thread for the call, once the call has a
    /// pass through the engine's gate of blocking threads (waiting for one
    /// as [`Self::pass`] does). `held` (another gate's permit) is kept with
    /// the work and given back when it ends, like the thread's own permit.
    pub(crate) async fn run_blocking<R, F>(&self, held: Option<Permit>, work: F) -> Result<R, WorkLost>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let permit = self.pass(self.gates().threads()).await;
        let task = tokio::task::spawn_blocking(move || {
            let result = work();
            drop((permit, held));
            result
        });
        Ok(task.await?)
    }

    /// These bounds, for a call whose requests carry `trace` and that
    /// records everything the host sees when `observe_all` (not only what
    /// a run's cause and span read: [`crate::engine::Call::observe`]).
    /// Set when the call's state is built, before any capability keeps a
    /// clone.
    pub(crate) fn for_call(
        mut self,
        trace: Option<&crate::verdict::observed::TraceContext>,
        observe_all: bool,
    ) -> Self {
        self.traceparent = trace.and_then(|t| http::HeaderValue::from_str(&t.traceparent()).ok());
        self.observe_all = observe_all;
        self
    }

    /// Whether everything is recorded ([`Self::for_call`]).
    pub(crate) fn observes_all(&self) -> bool {
        self.observe_all
    }

    /// Records what a capability saw of one of the call's connections.
    pub(crate) fn observe(&self, record: impl FnOnce(&mut Observed)) {
        record(self.held().observed.get_or_insert_default());
    }

    /// What the call's connections showed the host, if it opened any.
    pub(crate) fn take_observed(&self) -> Option<Box<Observed>> {
        self.held().observed.take()
    }

    /// The `traceparent` header the call's requests carry, if any.
    pub(crate) fn traceparent(&self) -> Option<http::HeaderValue> {
        self.traceparent.clone()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more socket for the call, or refuses it (and records
    /// why) past `sockets_per_call` ([`SOCKETS_PER_CALL`]) or when the agent's budget is spent.
    pub(crate) fn take_socket(&self) -> Result<(), Refusal> {
        let mut held = self.held();
        let bound = self.limits.sockets_per_call;
        if held.sockets >= bound {
            return Err(refuse(&mut held, Refusal::SocketsPerCall { bound }));
        }
        let Ok(permit) = self.agent.sockets.clone().try_acquire_owned() else {
            let total = self.agent.total;
            return Err(refuse(&mut held, Refusal::AgentSockets { total }));
        };
        match &mut held.permit {
            Some(p) => p.merge(permit),
            None => held.permit = Some(permit),
        }
        held.sockets += 1;
        Ok(())
    }

    /// Counts one more name lookup in flight for the call, or refuses it
    /// (and records why) past `lookups_per_call` ([`LOOKUPS_PER_CALL`]); the lookup counts
    /// until the returned guard is dropped.
    pub(crate) fn take_lookup(&self) -> Result<LookupSlot, Refusal> {
        let mut held = self.held();
        let bound = self.limits.lookups_per_call;
        if held.lookups >= bound {
            return Err(refuse(&mut held, Refusal::LookupsPerCall { bound }));
        }
        held.lookups += 1;
        Ok(LookupSlot(self.held.clone()))
    }

    /// Records that the call ran into a bound (the first one is kept), and
    /// returns `why`.
    pub(crate) fn record(&self, why: String) -> String {
        record(&mut self.held(), why)
    }

    /// Notes that the call starts waiting for an agent-wide bound
    /// (`why`: what, should it be cut off), or stops (`None`).
    pub(crate) fn waiting(&self, why: Option<String>) {
        let mut held = self.held();
        match why {
            Some(why) => {
                held.waiting += 1;
                held.waiting_for = Some(why);
            }
            None => held.waiting = held.waiting.saturating_sub(1),
        }
    }

    /// The first bound the call ran into, if any; a call still waiting for
    /// an agent-wide bound when it ends was cut off by it.
    pub(crate) fn breach(&self) -> Option<String> {
        let held = self.held();
        match (&held.breach, held.waiting) {
            (Some(b), _) => Some(b.clone()),
            (None, 0) => None,
            (None, _) => held.waiting_for.clone(),
        }
    }
}

fn record(held: &mut Held, why: String) -> String {
    held.breach.get_or_insert_with(|| why.clone());
    why
}

/// Records `refusal` as the call's breach (if it is the first) and returns
/// it.
fn refuse(held: &mut Held, refusal: Refusal) -> Refusal {
    held.breach.get_or_insert_with(|| refusal.to_string());
    refusal
}

/// A bound a call ran into ([`CallBounds::take_socket`],
/// [`CallBounds::take_lookup`]); recorded as the call's breach.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refusal {
    /// `sandbox.sockets_per_call`.
    #[error("the plugin opened more than {bound} sockets in one call")]
    SocketsPerCall { bound: usize },
    /// The agent's socket budget ([`agent_sockets`]) is spent.
    #[error("the agent's budget of {total} sockets is in use by other calls")]
    AgentSockets { total: usize },
    /// `sandbox.lookups_per_call`.
    #[error("the plugin had more than {bound} name lookups in flight")]
    LookupsPerCall { bound: usize },
}

/// A name lookup the call has in flight ([`CallBounds::take_lookup`]).
pub(crate) struct LookupSlot(Arc<Mutex<Held>>);

impl Drop for LookupSlot {
    fn drop(&mut self) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        held.lookups = held.lookups.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_are_bounded_per_call_and_per_agent_and_given_back() {
        let agent = AgentBounds::new(SOCKETS_PER_CALL + 10, HostLimits::default());
        let one = CallBounds::new(&agent);
        for _ in 0..SOCKETS_PER_CALL {
            one.take_socket().unwrap();
        }
        assert!(one.breach().is_none());
        assert!(matches!(one.take_socket(), Err(Refusal::SocketsPerCall { bound: 64 })));
        assert!(one.breach().is_some());
        let two = CallBounds::new(&agent);
        for _ in 0..10 {
            two.take_socket().unwrap();
        }
        assert!(matches!(two.take_socket(), Err(Refusal::AgentSockets { .. })));
        assert_eq!(agent.sockets_in_use(), SOCKETS_PER_CALL + 10);
        drop((one, two));
        assert_eq!(agent.sockets_in_use(), 0);
    }

    #[test]
    fn lookups_in_flight_are_bounded_per_call() {
        let call = CallBounds::new(&AgentBounds::new(1, HostLimits::default()));
        let slots: Vec<_> = (0..LOOKUPS_PER_CALL).map(|_| call.take_lookup().unwrap()).collect();
        assert!(matches!(
            call.take_lookup(),
            Err(Refusal::LookupsPerCall {
                bound: LOOKUPS_PER_CALL
            })
        ));
        assert!(call.breach().unwrap().contains("name lookups"));
        drop(slots);
        assert!(call.take_lookup().is_ok());
    }

    #[test]
    fn limits_out_of_range_name_their_key() {
        assert_eq!(HostLimits::default().validate(), Ok(()));
        assert_eq!(HostLimits::default().host_memory_per_call(), HOST_MEMORY_PER_CALL);
        let d = HostLimits::default();
        for (limits, refusal) in [
            (
                HostLimits {
                    sockets_per_call: 0,
                    ..d
                },
                "sandbox.sockets_per_call: must be from 1 to 65536 (got 0)",
            ),
            (
                HostLimits {
                    argument_bytes: 1024,
                    ..d
                },
                "sandbox.argument_bytes: must be from 65536 to 67108864 (got 1024)",
            ),
            (
                HostLimits {
                    table_entries_per_call: 4096,
                    fields_bytes: 1 << 20,
                    ..d
                },
                "is the host memory a call may hold, at most 256MiB",
            ),
        ] {
            let e = limits.validate().unwrap_err().to_string();
            assert!(e.contains(refusal), "{e}");
        }
    }

    #[test]
    fn new_limits_apply_to_the_calls_that_start_after_them() {
        let agent = AgentBounds::new(100, HostLimits::default());
        let before = CallBounds::new(&agent);
        agent.set_limits(HostLimits {
            sockets_per_call: 1,
            lookups_in_flight: 2,
            blocking_threads: 3,
            ..HostLimits::default()
        });
        let after = CallBounds::new(&agent);
        after.take_socket().unwrap();
        assert!(matches!(after.take_socket(), Err(Refusal::SocketsPerCall { bound: 1 })));
        // A call in flight keeps the bounds it started with.
        for _ in 0..SOCKETS_PER_CALL {
            before.take_socket().unwrap();
        }
        assert!(matches!(
            before.take_socket(),
            Err(Refusal::SocketsPerCall { bound: 64 })
        ));
        assert_eq!(agent.gates().lookups().size(), 2);
        assert_eq!(agent.gates().threads().size(), 3);
        assert_eq!(agent.limits().sockets_per_call, 1);
    }

    #[test]
    fn the_agent_budget_leaves_room() {
        assert!(agent_sockets() >= SOCKETS_PER_CALL);
    }
}
