//! Admission: when a call may enter a sandbox.
//!
//! A call first takes a permit of its tenant (at most its
//! `max_concurrent_runs` at once) and one of the agent's global limit.
//! Calls that must wait queue per tenant, and a freed slot goes to the
//! tenants with waiters in turn (round robin), not to the call that asked
//! first; so 500 queued calls of one tenant do not stand before another
//! tenant's one. Each tenant also has a **reserved share** of the global
//! limit (its `max_concurrent_runs`, but at most the global limit divided
//! by the number of tenants) that others may not take: a tenant whose calls
//! use their whole deadline cannot fill every slot and make the next tenant
//! wait for one of them to end.

use super::share::Gate;
use super::stats::{Counters, Slots, TenantStats};
use crate::tenants::{self, TenantId, Tenants};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// The permits of every tenant and of the agent. Shared by the executor
/// and the permits it hands out.
pub(super) struct Admission {
    /// The global limit.
    global: usize,
    state: Mutex<State>,
}

/// A call's right to run: one of its tenant's and one of the global
/// limit's, with what the call needs of its tenant's lane. Dropping it
/// hands the slot on.
pub(super) struct Permit {
    admission: Arc<Admission>,
    tenant: TenantId,
    armed: bool,
    /// The tenant's counters, for the call to record itself in.
    pub counters: Arc<Counters>,
    /// The tenant's CPU gate.
    pub gate: Arc<Gate>,
    /// How many tenants have calls in sandboxes now.
    pub active: Arc<AtomicUsize>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.admission.release(&self.tenant);
        }
    }
}

/// One tenant's queue and permits.
struct Lane {
    limit: usize,
    reserved: usize,
    running: usize,
    waiters: VecDeque<oneshot::Sender<Permit>>,
    counters: Arc<Counters>,
    gate: Arc<Gate>,
    /// Gone from the config: nothing reserved; kept for its counters and
    /// its runs in flight.
    retired: bool,
}

impl Lane {
    fn committed(&self) -> usize {
        self.running.max(self.reserved)
    }
}

#[derive(Default)]
struct State {
    /// The global limit.
    global: usize,
    /// Tenants with calls in sandboxes, shared with the CPU gates.
    active: Arc<AtomicUsize>,
    lanes: HashMap<TenantId, Lane>,
    /// Tenants with waiters, in turn order.
    turns: VecDeque<TenantId>,
    /// Σ over lanes of max(running, reserved): slots in use or kept.
    committed: usize,
}

impl State {
    fn lane(&mut self, tenant: &TenantId) -> &mut Lane {
        if !self.lanes.contains_key(tenant) {
            // A tenant the executor was not configured with: it gets a
            // configured tenant's default quota and its share, so it can
            // never wait on slots reserved for others.
            tracing::warn!(tenant = %tenant, "a run of a tenant the executor was not configured with; default quotas");
            self.insert(tenant, tenants::DEFAULT_MAX_CONCURRENT_RUNS as usize);
            self.rebalance();
        }
        self.lanes.get_mut(tenant).expect("the lane was just inserted")
    }

    fn insert(&mut self, tenant: &TenantId, limit: usize) {
        let lane = self.lanes.entry(tenant.clone()).or_insert_with(|| Lane {
            limit,
            reserved: 0,
            retired: false,
            running: 0,
            waiters: VecDeque::new(),
            counters: Arc::default(),
            gate: Arc::default(),
        });
        lane.limit = limit.clamp(1, self.global);
        lane.retired = false;
    }

    /// Shares the global limit out: each tenant not retired keeps its
    /// limit, up to an equal part of the global one.
    fn rebalance(&mut self) {
        let tenants = self.lanes.values().filter(|l| !l.retired).count();
        let share = self.global / tenants.max(1);
        for l in self.lanes.values_mut() {
            l.reserved = if l.retired { 0 } else { l.limit.min(share) };
        }
        self.committed = self.lanes.values().map(Lane::committed).sum();
    }

    /// Whether `tenant` may start a call now without taking a slot another
    /// tenant has reserved.
    fn can_admit(&self, tenant: &str) -> bool {
        let Some(l) = self.lanes.get(tenant) else { return false };
        let after = self.committed - l.committed() + (l.running + 1).max(l.reserved);
        l.running < l.limit && after <= self.global
    }

    /// Counts a call of `tenant` as running and returns its permit.
    fn admit(&mut self, admission: &Arc<Admission>, tenant: &TenantId) -> Permit {
        let active = self.active.clone();
        let lane = self
            .lanes
            .get_mut(tenant)
            .expect("only a tenant with a lane is admitted");
        let before = lane.committed();
        lane.running += 1;
        if lane.running == 1 {
            active.fetch_add(1, Ordering::Relaxed);
        }
        let permit = Permit {
            admission: admission.clone(),
            tenant: tenant.clone(),
            armed: true,
            counters: lane.counters.clone(),
            gate: lane.gate.clone(),
            active,
        };
        let after = lane.committed();
        self.committed = self.committed - before + after;
        permit
    }

    fn release(&mut self, tenant: &str) {
        if let Some(l) = self.lanes.get_mut(tenant) {
            let before = l.committed();
            if l.running == 1 {
                self.active.fetch_sub(1, Ordering::Relaxed);
            }
            l.running = l.running.saturating_sub(1);
            self.committed = self.committed - before + l.committed();
        }
    }
}

impl Admission {
    /// Permits for `global` calls at once, knowing only the operator's
    /// tenant until [`configure`](Self::configure)d.
    pub(super) fn new(global: usize) -> Arc<Self> {
        let global = global.max(1);
        let admission = Arc::new(Self {
            global,
            state: Mutex::new(State {
                global,
                ..State::default()
            }),
        });
        admission.configure(&Tenants::default());
        admission
    }

    /// The global limit.
    pub(super) fn global(&self) -> usize {
        self.global
    }

    /// The counters of `tenant`, for what it uses outside a call (pulls),
    /// only if the executor knows the tenant: counting never adds a lane.
    pub(super) fn counters(&self, tenant: &TenantId) -> Option<Arc<Counters>> {
        self.lock().lanes.get(tenant).map(|l| l.counters.clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies the tenants of a (re)loaded config: their limits and
    /// reserved shares. Calls in flight keep their permits; a tenant gone
    /// from the config keeps its counters.
    pub(super) fn configure(self: &Arc<Self>, tenants: &Tenants) {
        let mut st = self.lock();
        for lane in st.lanes.values_mut() {
            lane.retired = true;
        }
        for t in tenants.iter() {
            let limit = usize::try_from(t.quotas.max_concurrent_runs).unwrap_or(usize::MAX);
            st.insert(&t.id, limit);
        }
        st.rebalance();
        self.dispatch(&mut st);
    }

    /// Waits for a permit of `tenant`: at once if it may run and nobody of
    /// its own waits before it, else in its tenant's queue.
    pub(super) async fn acquire(self: &Arc<Self>, tenant: TenantId) -> Permit {
        let tenant = &tenant;
        let rx = {
            let mut st = self.lock();
            let lane = st.lane(tenant);
            if lane.waiters.is_empty() && st.can_admit(tenant) {
                return st.admit(self, tenant);
            }
            let (tx, rx) = oneshot::channel();
            let lane = st.lane(tenant);
            let first = lane.waiters.is_empty();
            lane.waiters.push_back(tx);
            if first && !st.turns.contains(tenant) {
                st.turns.push_back(tenant.clone());
            }
            rx
        };
        // The sender lives in the admission's state, which outlives `self`.
        rx.await.expect("a waiting call is always answered")
    }

    fn release(self: &Arc<Self>, tenant: &TenantId) {
        let mut st = self.lock();
        st.release(tenant);
        self.dispatch(&mut st);
    }

    /// Hands free slots to waiting tenants in turn, until a whole round
    /// admits nobody.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        let mut idle = 0;
        while idle < st.turns.len() {
            let Some(tenant) = st.turns.pop_front() else { break };
            let Some(lane) = st.lanes.get_mut(&tenant) else {
                continue;
            };
            while lane.waiters.front().is_some_and(oneshot::Sender::is_closed) {
                lane.waiters.pop_front();
            }
            if lane.waiters.is_empty() {
                continue;
            }
            if !st.can_admit(&tenant) {
                st.turns.push_back(tenant);
                idle += 1;
                continue;
            }
            let permit = st.admit(self, &tenant);
            let lane = st.lanes.get_mut(&tenant).expect("the lane just admitted");
            let waiter = lane.waiters.pop_front().expect("a waiter");
            let more = !lane.waiters.is_empty();
            if let Err(mut p) = waiter.send(permit) {
                // The caller gave up: undo here, not in its Drop, which
                // would take the lock we hold.
                p.armed = false;
                st.release(&tenant);
            } else {
                idle = 0;
            }
            if more {
                st.turns.push_back(tenant);
            }
        }
    }

    /// Every tenant's stats, unsorted.
    pub(super) fn stats(&self) -> Vec<TenantStats> {
        let st = self.lock();
        st.lanes
            .iter()
            .map(|(tenant, l)| {
                let slots = Slots {
                    running: l.running,
                    waiting: l.waiters.iter().filter(|w| !w.is_closed()).count(),
                    limit: l.limit,
                    reserved: l.reserved,
                };
                l.counters.snapshot(tenant.clone(), slots)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::{Ceiling, Quotas, Tenant};

    fn admission(global: usize, tenants: &[(&str, u32)]) -> Arc<Admission> {
        let a = Admission::new(global);
        let list = tenants
            .iter()
            .map(|(id, runs)| {
                Tenant::new(
                    id,
                    Quotas {
                        max_concurrent_runs: *runs,
                        ..Quotas::default()
                    },
                    Ceiling::default(),
                )
            })
            .collect();
        a.configure(&Tenants::new(list, None));
        a
    }

    fn id(s: &str) -> TenantId {
        s.into()
    }

    fn stats(a: &Admission, tenant: &str) -> TenantStats {
        a.stats().into_iter().find(|s| &*s.tenant == tenant).unwrap()
    }

    /// Polls a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    /// Polls each future still pending once; returns what became ready.
    fn poll_all<F: std::future::Future + Unpin>(fs: &mut [Option<F>]) -> Vec<F::Output> {
        let mut ready = Vec::new();
        for slot in fs.iter_mut() {
            if let Some(f) = slot
                && let Some(v) = futures_poll(f)
            {
                ready.push(v);
                *slot = None;
            }
        }
        ready
    }

    #[tokio::test]
    async fn a_tenant_never_exceeds_its_permits() {
        let e = admission(100, &[("a", 2)]);
        let p1 = e.acquire(id("a")).await;
        let _p2 = e.acquire(id("a")).await;
        let mut third = std::pin::pin!(e.acquire(id("a")));
        assert!(futures_poll(&mut third).is_none(), "a third run waits");
        assert_eq!(stats(&e, "a").waiting, 1);
        drop(p1);
        assert!(futures_poll(&mut third).is_some(), "and starts when one ends");
    }

    #[tokio::test]
    async fn freed_slots_go_to_tenants_in_turn_not_first_come() {
        // Global 4 among three tenants (a, b and the operator): each keeps
        // one slot (4 / 3) that the others may not take.
        let e = admission(4, &[("a", 4), ("b", 4)]);
        let mut a_held = vec![e.acquire(id("a")).await, e.acquire(id("a")).await];
        // The operator's and b's slots are kept: a's third call waits.
        let mut a_waiting: Vec<_> = (0..5).map(|_| Some(Box::pin(e.acquire(id("a"))))).collect();
        assert!(poll_all(&mut a_waiting).is_empty());
        // b starts at once, though five of a's calls asked first.
        let _b1 = e.acquire(id("b")).await;
        let mut b2 = [Some(Box::pin(e.acquire(id("b"))))];
        assert!(poll_all(&mut b2).is_empty());
        // A slot frees: a queued first, so it is a's turn...
        drop(a_held.pop());
        let got_a = poll_all(&mut a_waiting);
        assert_eq!(got_a.len(), 1);
        assert!(poll_all(&mut b2).is_empty());
        // ...and the next is b's, though four of a's calls still wait
        // from before b asked.
        drop(a_held.pop());
        let got_b = poll_all(&mut b2);
        assert_eq!(got_b.len(), 1, "b's turn");
        assert!(poll_all(&mut a_waiting).is_empty());
        let s = stats(&e, "a");
        assert_eq!((s.running, s.waiting, s.limit, s.reserved), (1, 4, 4, 1));
        drop((got_a, got_b));
    }

    #[tokio::test]
    async fn a_tenant_it_was_not_told_of_still_runs() {
        // Alone, the operator's tenant keeps every slot for itself...
        let e = admission(4, &[]);
        assert_eq!(stats(&e, "default").reserved, 4);
        // ...until another tenant shows up: then they share.
        let p = e.acquire(id("stranger")).await;
        let s = stats(&e, "stranger");
        assert_eq!((s.running, s.limit, s.reserved), (1, 4, 2));
        assert_eq!(stats(&e, "default").reserved, 2);
        drop(p);
    }

    #[tokio::test]
    async fn a_reload_changes_limits_and_keeps_counters() {
        let e = admission(8, &[("a", 2), ("b", 2)]);
        let p = e.acquire(id("a")).await;
        // `a` leaves the config with a call in flight; `b` may now run 3.
        e.configure(&Tenants::new(
            vec![Tenant::new(
                "b",
                Quotas {
                    max_concurrent_runs: 3,
                    ..Quotas::default()
                },
                Ceiling::default(),
            )],
            None,
        ));
        let a = stats(&e, "a");
        assert_eq!((a.running, a.reserved), (1, 0), "retired, its call still counted");
        let b = stats(&e, "b");
        assert_eq!((b.limit, b.reserved), (3, 3));
        let held: Vec<_> = [
            e.acquire(id("b")).await,
            e.acquire(id("b")).await,
            e.acquire(id("b")).await,
        ]
        .into();
        let mut fourth = [Some(Box::pin(e.acquire(id("b"))))];
        assert!(poll_all(&mut fourth).is_empty());
        drop((p, held));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_gives_its_turn_back() {
        let e = admission(1, &[]);
        let p = e.acquire(id("default")).await;
        let mut w1 = Box::pin(e.acquire(id("default")));
        assert!(futures_poll(&mut w1).is_none());
        drop(w1);
        let mut w2 = Box::pin(e.acquire(id("default")));
        assert!(futures_poll(&mut w2).is_none());
        drop(p);
        let got = futures_poll(&mut w2);
        assert!(got.is_some());
        let s = stats(&e, "default");
        assert_eq!((s.running, s.waiting), (1, 0));
    }

    #[tokio::test]
    async fn the_active_tenant_count_follows_running_calls() {
        let e = admission(8, &[("a", 2), ("b", 2)]);
        let p1 = e.acquire(id("a")).await;
        let p2 = e.acquire(id("a")).await;
        assert_eq!(p1.active.load(Ordering::Relaxed), 1, "one tenant, two calls");
        let p3 = e.acquire(id("b")).await;
        assert_eq!(p3.active.load(Ordering::Relaxed), 2);
        drop((p1, p3));
        assert_eq!(p2.active.load(Ordering::Relaxed), 1);
    }
}
