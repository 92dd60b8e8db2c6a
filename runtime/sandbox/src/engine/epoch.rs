//! The epoch ticker: what interrupts a running plugin at every tick so
//! that deadlines hold, and sleeps while no call runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the epoch ticks. A running plugin yields to the async executor
/// at every tick, so a spinning plugin holds a worker thread for at most
/// this long at a time.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// What drives the epoch: a thread that ticks every [`EPOCH_TICK`] while
/// wasm may be running, and once no call has run for
/// [`TICKS_BEFORE_SLEEP`] ticks sleeps on a condition variable until one
/// starts, so an idle agent does not wake a thousand times a second.
#[derive(Default)]
pub(super) struct Ticker {
    /// Calls (and describes) in flight.
    active: std::sync::atomic::AtomicUsize,
    /// The thread waits (or is about to) on `wake`.
    pub(super) sleeping: AtomicBool,
    stopped: AtomicBool,
    lock: Mutex<()>,
    wake: std::sync::Condvar,
}

impl Ticker {
    pub(super) fn run(&self, engine: &wasmtime::Engine) {
        let mut idle_ticks = 0;
        while !self.stopped.load(Ordering::Relaxed) {
            if self.active.load(Ordering::SeqCst) > 0 {
                idle_ticks = 0;
            } else if idle_ticks < TICKS_BEFORE_SLEEP {
                idle_ticks += 1;
            } else {
                // Idle for a while: sleep until a call starts. Under load
                // calls follow each other closely and this never happens,
                // so starting a call rarely has to wake the thread.
                idle_ticks = 0;
                let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                // Set before `active` is checked again: a call that starts
                // after the check sees it and wakes the thread.
                self.sleeping.store(true, Ordering::SeqCst);
                let _guard = self
                    .wake
                    .wait_while(guard, |_| {
                        self.active.load(Ordering::SeqCst) == 0 && !self.stopped.load(Ordering::SeqCst)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                self.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            std::thread::sleep(EPOCH_TICK);
            engine.increment_epoch();
        }
    }

    /// Marks a call in flight until the guard is dropped, waking the
    /// thread if it was idle.
    pub(super) fn busy(self: &Arc<Self>) -> TickerGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        // Only a sleeping thread needs the (system-call) wake-up; the lock
        // makes sure it is waiting, not between its check and its wait.
        if self.sleeping.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_one();
        }
        TickerGuard(self.clone())
    }

    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.wake.notify_one();
    }
}

/// Ticks with no call in flight before the ticker sleeps.
const TICKS_BEFORE_SLEEP: u32 = 50;

/// A call in flight, for the [`Ticker`].
pub(super) struct TickerGuard(Arc<Ticker>);

impl Drop for TickerGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}
