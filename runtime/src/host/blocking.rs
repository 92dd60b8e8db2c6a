//! The agent's capacity for plugin work that blocks a thread: name lookups
//! (the system resolver blocks until it answers, tens of seconds when it
//! is dead) and whatever else the host does for a plugin on a blocking
//! thread (opening a file in a `files` grant).
//!
//! Each kind of work passes a [`Gate`]: at most `size` at once
//! agent-wide, each holding its permit on the blocking thread until the
//! work ends, even when the call that asked has given up. So plugins hold
//! at most [`lookups`]' and [`threads`]' sizes of tokio's blocking threads
//! (512 by default); the rest stay the agent's (result persistence,
//! compiles, its own lookups).
//!
//! A call that finds a gate full waits for a permit, up to its deadline
//! (or the timeout it asked for); cut off while waiting, it is recorded as
//! having run into a host bound, so the run is `unknown`, reason
//! `host-limit`, with the gate named. A gate full for longer than the
//! agent's `health_timeout` makes `/livez` fail ([`exhausted_for`]): the
//! sandbox can no longer serve the probes that need it.

use super::bounds::CallBounds;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most name lookups the host makes for plugins at once, agent-wide,
/// by default (`sandbox.lookups_in_flight`).
pub const MAX_LOOKUPS_IN_FLIGHT: usize = 32;
/// The most blocking threads plugin work holds at once, agent-wide, by
/// default (`sandbox.blocking_threads`): lookups and file opens
/// together. The sizes in force are [`super::bounds::limits`]'.
pub const PLUGIN_BLOCKING_THREADS: usize = 64;

/// A bounded kind of blocking work, with the time it has been full.
pub struct Gate {
    what: &'static str,
    permits: Arc<Semaphore>,
    size: usize,
    full_since: Mutex<Option<Instant>>,
}

impl Gate {
    fn new(what: &'static str, size: usize) -> Self {
        Self {
            what,
            permits: Arc::new(Semaphore::new(size)),
            size,
            full_since: Mutex::new(None),
        }
    }

    /// How many may pass at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// How long every permit has been taken (`None` when one is free).
    pub fn exhausted_for(&self) -> Option<Duration> {
        if self.permits.available_permits() > 0 {
            return None;
        }
        let since = *self.full_since.lock().unwrap_or_else(|e| e.into_inner());
        since.map(|t| t.elapsed())
    }

    fn cut_off(&self) -> String {
        format!(
            "cut off waiting for one of the agent's {} {}: all were in use",
            self.size, self.what
        )
    }

    fn note(&self) {
        let mut since = self.full_since.lock().unwrap_or_else(|e| e.into_inner());
        match (self.permits.available_permits(), *since) {
            (0, None) => *since = Some(Instant::now()),
            (n, Some(_)) if n > 0 => *since = None,
            _ => {}
        }
    }

    /// Waits for a permit. Cut off while waiting (the future dropped), it
    /// records the breach in `bounds`.
    pub(crate) async fn enter(&'static self, bounds: &CallBounds) -> Permit {
        struct Waiting<'a> {
            gate: &'static Gate,
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
        bounds.waiting(Some(self.cut_off()));
        let mut waiting = Waiting {
            gate: self,
            bounds,
            done: false,
        };
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("a gate's semaphore is never closed");
        waiting.done = true;
        self.note();
        Permit {
            gate: self,
            permit: Some(permit),
        }
    }
}

/// A pass through a [`Gate`], given back when dropped.
pub(crate) struct Permit {
    gate: &'static Gate,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.gate.note();
    }
}

struct Gates {
    lookups: Gate,
    threads: Gate,
}

static GATES: OnceLock<Gates> = OnceLock::new();

fn gates() -> &'static Gates {
    GATES.get_or_init(|| {
        let limits = super::bounds::limits();
        Gates {
            lookups: Gate::new("name-lookup slots", limits.lookups_in_flight.max(1)),
            threads: Gate::new("blocking threads for plugins", limits.blocking_threads.max(1)),
        }
    })
}

/// The gate of name lookups for plugins.
pub fn lookups() -> &'static Gate {
    &gates().lookups
}

/// The gate of blocking threads for plugins.
pub fn threads() -> &'static Gate {
    &gates().threads
}

/// How long a gate has been full, the longest of them: `/livez` fails when
/// this passes the health timeout.
pub fn exhausted_for() -> Option<Duration> {
    [lookups(), threads()].iter().filter_map(|g| g.exhausted_for()).max()
}

/// Runs `work` on a blocking thread for a plugin's call, once the call has
/// a pass through [`threads`] (waiting for one as [`Gate::enter`] does).
/// `held` (another gate's permit) is kept with the work and given back
/// when it ends, like the thread's own permit.
pub(crate) async fn run<R, F>(bounds: &CallBounds, held: Option<Permit>, work: F) -> Result<R, String>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let permit = threads().enter(bounds).await;
    let task = tokio::task::spawn_blocking(move || {
        let result = work();
        drop((permit, held));
        result
    });
    task.await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::bounds::AgentBounds;

    #[tokio::test]
    async fn a_full_gate_is_noticed_and_a_cut_off_wait_is_recorded() {
        let gate: &'static Gate = Box::leak(Box::new(Gate::new("test slots", 1)));
        let bounds = CallBounds::new(&AgentBounds::new(1));
        let first = gate.enter(&bounds).await;
        assert!(gate.exhausted_for().is_some());
        assert!(bounds.breach().is_none());
        let mut waiting = Box::pin(gate.enter(&bounds));
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
        drop(gate.enter(&bounds).await);
    }
}
