//! CPU share: while several tenants have calls in flight, each may have at
//! most its share of the sandbox threads polled at once (threads divided
//! by those tenants, at least one); its other calls park until one of its
//! polls ends. Without it, a tenant's spinning guests, ready again after
//! every epoch tick, fill tokio's run queue and every other call waits
//! behind them at each wake-up (measured: another tenant's http calls took
//! 135-400 ms instead of ~2 ms).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// How many of one tenant's calls are being polled (running wasm or host
/// code) at once, and the calls waiting for their turn to be.
#[derive(Default)]
pub(super) struct Gate {
    in_poll: AtomicUsize,
    next_id: AtomicU64,
    parked: Mutex<VecDeque<(u64, Waker)>>,
}

impl Gate {
    fn try_enter(&self, limit: usize) -> bool {
        self.in_poll
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .is_ok()
    }

    fn parked(&self) -> MutexGuard<'_, VecDeque<(u64, Waker)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unpark(&self, id: u64) {
        self.parked().retain(|(i, _)| *i != id);
    }

    fn wake_next(&self) {
        let next = self.parked().pop_front();
        if let Some((_, w)) = next {
            w.wake();
        }
    }
}

/// A sandboxed call that takes its tenant's CPU share: while several
/// tenants have calls in flight, each may have at most
/// `threads / tenants` (at least one) of its calls polled at once, so a
/// tenant's spinning guests, ready again after every epoch tick, cannot
/// take every sandbox thread. A call over the share parks until one of its
/// tenant's polls ends. Alone, a tenant may use every thread.
pub(super) struct Fair<F> {
    call: Pin<Box<F>>,
    gate: Arc<Gate>,
    active: Arc<AtomicUsize>,
    threads: usize,
    id: u64,
}

impl<F: Future> Fair<F> {
    pub(super) fn new(call: F, gate: Arc<Gate>, active: Arc<AtomicUsize>, threads: usize) -> Self {
        let id = gate.next_id.fetch_add(1, Ordering::Relaxed);
        Self {
            call: Box::pin(call),
            gate,
            active,
            threads,
            id,
        }
    }
}

impl<F: Future> Future for Fair<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let limit = this.threads.div_ceil(this.active.load(Ordering::Relaxed).max(1));
        if !this.gate.try_enter(limit) {
            {
                let mut parked = this.gate.parked();
                match parked.iter_mut().find(|(i, _)| *i == this.id) {
                    Some((_, w)) => w.clone_from(cx.waker()),
                    None => parked.push_back((this.id, cx.waker().clone())),
                }
            }
            // A poll may have ended between the try and the parking.
            if !this.gate.try_enter(limit) {
                return Poll::Pending;
            }
        }
        this.gate.unpark(this.id);
        let out = this.call.as_mut().poll(cx);
        this.gate.in_poll.fetch_sub(1, Ordering::AcqRel);
        this.gate.wake_next();
        out
    }
}

impl<F> Drop for Fair<F> {
    fn drop(&mut self) {
        // Woken for a turn it will not take: hand the turn on.
        let was_parked = {
            let mut parked = self.gate.parked();
            let before = parked.len();
            parked.retain(|(i, _)| *i != self.id);
            parked.len() != before
        };
        if !was_parked {
            self.gate.wake_next();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future whose polls are counted, and each blocks until `go` says.
    struct Blocking {
        polls: Arc<AtomicUsize>,
        go: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
    }

    impl Future for Blocking {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            let _ = self.go.lock().unwrap().recv();
            Poll::Pending
        }
    }

    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Two calls of one tenant; the first is in a poll (on another
    /// thread) when the second is polled. Returns whether the second's
    /// inner future was polled then, and whether it was parked, then woken
    /// and polled once the first's poll ended.
    fn second_call_while_first_polls(tenants_active: usize) -> (bool, bool) {
        let gate = Arc::new(Gate::default());
        let active = Arc::new(AtomicUsize::new(tenants_active));
        let (tx, rx) = std::sync::mpsc::channel();
        let go = Arc::new(Mutex::new(rx));
        let (p1, p2) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let first = Blocking {
            polls: p1.clone(),
            go: go.clone(),
        };
        let (gate1, active1) = (gate.clone(), active.clone());
        let t = std::thread::spawn(move || {
            let mut f = Fair::new(first, gate1, active1, 2);
            let mut cx = Context::from_waker(Waker::noop());
            let _ = Pin::new(&mut f).poll(&mut cx);
        });
        while p1.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // The first call is inside its poll now.
        let (tx2, rx2) = std::sync::mpsc::channel();
        let second = Blocking {
            polls: p2.clone(),
            go: Arc::new(Mutex::new(rx2)),
        };
        tx2.send(()).unwrap();
        tx2.send(()).unwrap();
        let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let mut f2 = Fair::new(second, gate.clone(), active, 2);
        let _ = Pin::new(&mut f2).poll(&mut Context::from_waker(&waker));
        let ran_alongside = p2.load(Ordering::SeqCst) == 1;
        tx.send(()).unwrap();
        t.join().unwrap();
        let was_woken = woken.0.load(Ordering::SeqCst) >= 1;
        let _ = Pin::new(&mut f2).poll(&mut Context::from_waker(&waker));
        let ran_after = was_woken && p2.load(Ordering::SeqCst) >= 1;
        (ran_alongside, ran_after)
    }

    #[test]
    fn a_tenant_takes_its_share_of_the_threads_not_all_of_them() {
        // Two tenants with calls in flight, two threads: one poll each.
        assert_eq!(second_call_while_first_polls(2), (false, true));
        // Alone, a tenant may use every thread: the second never parks.
        assert_eq!(second_call_while_first_polls(1), (true, false));
    }
}
