//! The agent's capacity for plugin work that blocks a thread: name lookups
//! (the system resolver blocks until it answers, tens of seconds when it
//! is dead) and whatever else the host does for a plugin on a blocking
//! thread (opening a file in a `files` grant).
//!
//! Each kind of work passes a [`Gate`]: at most `size` at once per engine
//! (the engine's [`Gates`], sized by its `sandbox:` bounds, entered through
//! the call's [`CallBounds`](super::bounds::CallBounds)), each holding
//! its permit on the blocking thread until the work ends, even when the
//! call that asked has given up. So plugins hold at most the lookup and
//! thread gates' sizes of tokio's blocking threads (512 by default); the
//! rest stay the agent's (result persistence, compiles, its own lookups).
//!
//! A call that finds a gate full waits for a permit, up to its deadline
//! (or the timeout it asked for); cut off while waiting, it is recorded as
//! having run into a host bound, so the run is `unknown`, reason
//! `host-limit`, with the gate named. A gate full for longer than the
//! agent's `health_timeout` makes `/livez` fail ([`Gate::exhausted_for`]):
//! the sandbox can no longer serve the probes that need it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most name lookups the host makes for plugins at once, agent-wide,
/// by default (`sandbox.lookups_in_flight`).
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 32;
/// The most blocking threads plugin work holds at once, agent-wide, by
/// default (`sandbox.blocking_threads`): lookups and file opens
/// together. The sizes in force are the engine's
/// ([`super::bounds::HostLimits`]).
pub(crate) const PLUGIN_BLOCKING_THREADS: usize = 64;

/// A bounded kind of blocking work, with the time it has been full. Its
/// size can change while permits are out ([`Gate::resize`]): a smaller
/// size takes effect as the permits in use come back.
pub(crate) struct Gate {
    what: &'static str,
    permits: Arc<Semaphore>,
    state: Mutex<GateState>,
}

struct GateState {
    size: usize,
    /// Permits to forget as they come back (a shrink while they were out).
    owed: usize,
    full_since: Option<Instant>,
}

impl Gate {
    fn new(what: &'static str, size: usize) -> Arc<Self> {
        let size = size.max(1);
        Arc::new(Self {
            what,
            permits: Arc::new(Semaphore::new(size)),
            state: Mutex::new(GateState {
                size,
                owed: 0,
                full_since: None,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many may pass at once.
    pub(crate) fn size(&self) -> usize {
        self.state().size
    }

    /// Makes the gate `size` wide (at least 1): a wider gate admits more
    /// at once; a narrower one forgets free permits now and the rest as
    /// the work holding them ends, so what passes never exceeds the new
    /// size once that work is done, and never the old one before.
    pub(crate) fn resize(&self, size: usize) {
        let size = size.max(1);
        let mut state = self.state();
        if size > state.size {
            let more = size - state.size;
            let repaid = more.min(state.owed);
            state.owed -= repaid;
            self.permits.add_permits(more - repaid);
        } else {
            let fewer = state.size - size;
            let forgotten = self.permits.forget_permits(fewer);
            state.owed += fewer - forgotten;
        }
        state.size = size;
        self.note(&mut state);
    }

    /// How long every permit has been taken (`None` when one is free).
    pub(crate) fn exhausted_for(&self) -> Option<Duration> {
        if self.permits.available_permits() > 0 {
            return None;
        }
        self.state().full_since.map(|t| t.elapsed())
    }

    /// What a call cut off while waiting for a permit ran into.
    pub(crate) fn cut_off(&self) -> String {
        format!(
            "cut off waiting for one of the agent's {} {}: all were in use",
            self.size(),
            self.what
        )
    }

    fn note(&self, state: &mut GateState) {
        match (self.permits.available_permits(), state.full_since) {
            (0, None) => state.full_since = Some(Instant::now()),
            (n, Some(_)) if n > 0 => state.full_since = None,
            _ => {}
        }
    }

    /// Waits for a permit. The caller notes the wait, and a wait cut off
    /// ([`CallBounds::pass`](super::bounds::CallBounds::pass)).
    pub(crate) async fn acquire(self: &Arc<Self>) -> Permit {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("a gate's semaphore is never closed");
        self.note(&mut self.state());
        Permit {
            gate: self.clone(),
            permit: Some(permit),
        }
    }
}

/// Why blocking work for a plugin's call gave no result: its task panicked
/// or was cancelled (the runtime shutting down).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct WorkLost(#[from] pub(crate) tokio::task::JoinError);

/// A pass through a [`Gate`], given back when dropped (or forgotten, when
/// the gate has shrunk since it was taken).
pub(crate) struct Permit {
    gate: Arc<Gate>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.gate.state();
        if let Some(permit) = self.permit.take() {
            if state.owed > 0 {
                state.owed -= 1;
                permit.forget();
            } else {
                drop(permit);
            }
        }
        self.gate.note(&mut state);
    }
}

/// An engine's gates: the name lookups and the blocking threads its
/// plugins may hold at once (`sandbox.lookups_in_flight`,
/// `sandbox.blocking_threads`). Clones share them.
#[derive(Clone)]
pub(crate) struct Gates {
    lookups: Arc<Gate>,
    threads: Arc<Gate>,
}

impl Gates {
    /// Gates for `lookups` name lookups and `threads` blocking threads at
    /// once (`sandbox.lookups_in_flight`, `sandbox.blocking_threads`).
    pub(crate) fn new(lookups: usize, threads: usize) -> Self {
        Self {
            lookups: Gate::new("name-lookup slots", lookups),
            threads: Gate::new("blocking threads for plugins", threads),
        }
    }

    /// Makes them `lookups` and `threads` wide ([`Gate::resize`]).
    pub(crate) fn resize(&self, lookups: usize, threads: usize) {
        self.lookups.resize(lookups);
        self.threads.resize(threads);
    }

    /// The gate of name lookups for plugins.
    pub(crate) fn lookups(&self) -> &Arc<Gate> {
        &self.lookups
    }

    /// The gate of blocking threads for plugins.
    pub(crate) fn threads(&self) -> &Arc<Gate> {
        &self.threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::bounds::{AgentBounds, CallBounds, HostLimits};

    #[tokio::test]
    async fn a_full_gate_is_noticed_and_a_cut_off_wait_is_recorded() {
        let gate = Gate::new("test slots", 1);
        let bounds = CallBounds::new(&AgentBounds::new(1, HostLimits::default()));
        let first = bounds.pass(&gate).await;
        assert!(gate.exhausted_for().is_some());
        assert!(bounds.breach().is_none());
        let mut waiting = Box::pin(bounds.pass(&gate));
        assert!(futures_util::FutureExt::now_or_never(&mut waiting).is_none());
        // Still waiting when the call ends: cut off.
        assert_eq!(
            bounds.breach().unwrap(),
            "cut off waiting for one of the agent's 1 test slots: all were in use"
        );
        drop(waiting);
        assert_eq!(
            bounds.breach().unwrap(),
            "cut off waiting for one of the agent's 1 test slots: all were in use"
        );
        drop(first);
        assert_eq!(gate.exhausted_for(), None);
        drop(bounds.pass(&gate).await);
    }

    #[tokio::test]
    async fn a_gate_resized_while_in_use_shrinks_as_its_permits_come_back() {
        let gate = Gate::new("test slots", 3);
        let bounds = CallBounds::new(&AgentBounds::new(1, HostLimits::default()));
        let held: Vec<Permit> = vec![bounds.pass(&gate).await, bounds.pass(&gate).await];
        // Two of three in use; down to one: the free one goes now, one of
        // the two in use when it comes back.
        gate.resize(1);
        assert_eq!(gate.size(), 1);
        assert!(gate.exhausted_for().is_some());
        let mut held = held.into_iter();
        drop(held.next());
        assert!(gate.exhausted_for().is_some(), "one is still in use, the new size");
        drop(held.next());
        assert_eq!(gate.exhausted_for(), None);
        let one = bounds.pass(&gate).await;
        let mut waiting = Box::pin(bounds.pass(&gate));
        assert!(futures_util::FutureExt::now_or_never(&mut waiting).is_none());
        drop(waiting);
        // Wider again: two more at once.
        gate.resize(3);
        let _two = bounds.pass(&gate).await;
        let _three = bounds.pass(&gate).await;
        assert!(gate.exhausted_for().is_some());
        drop(one);
        assert_eq!(gate.exhausted_for(), None);
    }
}
