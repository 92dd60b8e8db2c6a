//! Pulls off the critical path. In the agent, an `oci://` plugin that is
//! neither resolved already nor whole in the disk cache is pulled by a
//! background task: the change that named it goes on without the probes
//! that need it ([`super::Waiting`]), and [`Pulls::subscribe`] says when the
//! pull ended (landed or failed) so that they are added then.
//!
//! - **Concurrency.** At most [`MAX_PULLS_PER_TENANT`] pulls of one tenant
//!   and [`MAX_PULLS_PER_AGENT`] in all run at once; a pull waits for its
//!   tenant's slot before it takes one of the agent's, so one tenant's
//!   silent registry cannot hold the slots of another.
//! - **Negative cache.** A failed pull is not tried again before its
//!   backoff ([`BACKOFF_FIRST`], doubling to [`BACKOFF_MAX`]) has passed,
//!   however often a reconcile asks; when it has, the waiters are told, and
//!   the next ask starts one new pull.
//! - **Tags.** A tag resolved less than [`TAG_FRESH`] ago is used as it is;
//!   an older one is used while a new pull refreshes it.

use super::outcome::{PullCost, ResolveError};
use crate::tenants::TenantId;
use sonde_sandbox::engine::Plugin;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{Semaphore, broadcast};
use tokio::time::Instant;

/// Pulls one tenant may run at once.
pub(crate) const MAX_PULLS_PER_TENANT: usize = 2;
/// Pulls the agent runs at once.
pub(crate) const MAX_PULLS_PER_AGENT: usize = 4;
/// The wait after a first failed pull of a reference.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between two pulls of a reference that keeps failing.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How long a resolved tag is used without asking the registry again.
pub(crate) const TAG_FRESH: Duration = Duration::from_secs(60);

/// A resolved plugin and its reference pinned to the digest that runs.
pub(crate) type Ready = (Arc<Plugin>, String);

/// What asking for a reference gives.
pub(crate) enum Asked {
    /// Resolved: the plugin, and what its pull cost when this is the first
    /// ask since it landed (charged once).
    Ready(Ready, Option<PullCost>),
    /// Being pulled (or waiting for a slot) since then.
    Pulling(SystemTime),
    /// The last pull failed; not tried again before its backoff passed.
    Failed(ResolveError),
}

enum Entry {
    Pulling {
        since: SystemTime,
        /// What was there before (a tag being refreshed).
        stale: Option<Box<Landed>>,
    },
    Landed(Box<Landed>),
    Failed {
        error: ResolveError,
        retry_at: Instant,
        failures: u32,
    },
}

struct Landed {
    ready: Ready,
    cost: Option<PullCost>,
    at: Instant,
    pinned: bool,
}

/// The agent's pulls: their state by reference, their slots, and who to
/// tell when one ends. Clones share it.
#[derive(Clone)]
pub struct Pulls {
    inner: Arc<Inner>,
}

struct Inner {
    entries: Mutex<HashMap<String, Entry>>,
    agent: Arc<Semaphore>,
    tenants: Mutex<HashMap<TenantId, Arc<Semaphore>>>,
    ended: broadcast::Sender<Arc<str>>,
    /// Bumped when the trust settings change: older pulls' results are dropped.
    generation: Mutex<u64>,
}

impl Default for Pulls {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                entries: Mutex::new(HashMap::new()),
                agent: Arc::new(Semaphore::new(MAX_PULLS_PER_AGENT)),
                tenants: Mutex::new(HashMap::new()),
                ended: broadcast::channel(256).0,
                generation: Mutex::new(0),
            }),
        }
    }
}

impl std::fmt::Debug for Pulls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulls").field("in_flight", &self.in_flight()).finish()
    }
}

impl Pulls {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells of every reference whose pull ended (landed or failed) or
    /// whose backoff passed, so that what waits for it is tried again.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.inner.ended.subscribe()
    }

    /// Pulls running or waiting for a slot.
    pub fn in_flight(&self) -> usize {
        self.entries()
            .values()
            .filter(|e| matches!(e, Entry::Pulling { .. }))
            .count()
    }

    /// Forgets every result (the trust settings changed: what was verified
    /// under the old ones is checked again); pulls in flight land unused.
    pub(crate) fn forget(&self) {
        *self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.entries().retain(|_, e| matches!(e, Entry::Pulling { .. }));
    }

    /// A pinned plugin whose pull landed, handed over (the caller keeps
    /// it from now on) with what its pull cost.
    pub(crate) fn take_pinned(&self, name: &str) -> Option<(Ready, Option<PullCost>)> {
        let mut entries = self.entries();
        if !matches!(entries.get(name)?, Entry::Landed(l) if l.pinned) {
            return None;
        }
        match entries.remove(name) {
            Some(Entry::Landed(l)) => Some((l.ready, l.cost)),
            _ => None,
        }
    }

    /// Forgets the resolved tags nothing else holds (no probe in force), so
    /// that their compiled code is freed. A pull that landed and was not
    /// taken up yet (its cost not charged) is kept for the load to come.
    pub(crate) fn release_unused(&self) {
        self.entries()
            .retain(|_, e| !matches!(e, Entry::Landed(l) if l.cost.is_none() && Arc::strong_count(&l.ready.0) == 1));
    }

    /// Asks for `name` on behalf of `tenant`: what is known, or a new pull
    /// (`pull`) started in the background.
    pub(crate) fn ask<F>(&self, name: &str, tenant: &TenantId, pinned: bool, pull: F) -> Asked
    where
        F: Future<Output = Result<(Ready, PullCost), ResolveError>> + Send + 'static,
    {
        let mut entries = self.entries();
        let now = Instant::now();
        if matches!(entries.get(name), Some(Entry::Landed(l)) if l.pinned)
            && let Some(Entry::Landed(l)) = entries.remove(name)
        {
            // Handed over: the caller keeps a pinned plugin from now on.
            return Asked::Ready(l.ready, l.cost);
        }
        match entries.get_mut(name) {
            Some(Entry::Landed(l)) => {
                let cost = l.cost.take();
                let ready = l.ready.clone();
                if now.duration_since(l.at) < TAG_FRESH {
                    return Asked::Ready(ready, cost);
                }
                // A tag due for a refresh: used meanwhile.
                let stale = match entries.remove(name) {
                    Some(Entry::Landed(l)) => Some(l),
                    _ => None,
                };
                drop(entries);
                self.start(name, tenant, pinned, stale, pull);
                return Asked::Ready(ready, cost);
            }
            Some(Entry::Pulling { since, stale: old }) => {
                return match old {
                    Some(l) => Asked::Ready(l.ready.clone(), None),
                    None => Asked::Pulling(*since),
                };
            }
            Some(Entry::Failed { error, retry_at, .. }) if *retry_at > now => {
                return Asked::Failed(error.clone());
            }
            _ => {}
        }
        drop(entries);
        Asked::Pulling(self.start(name, tenant, pinned, None, pull))
    }

    fn tenant_slots(&self, tenant: &TenantId) -> Arc<Semaphore> {
        self.inner
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_PULLS_PER_TENANT)))
            .clone()
    }

    fn start<F>(&self, name: &str, tenant: &TenantId, pinned: bool, stale: Option<Box<Landed>>, pull: F) -> SystemTime
    where
        F: Future<Output = Result<(Ready, PullCost), ResolveError>> + Send + 'static,
    {
        let since = SystemTime::now();
        let failures = match self.entries().get(name) {
            Some(Entry::Failed { failures, .. }) => *failures,
            _ => 0,
        };
        let refresh = stale.is_some();
        self.entries().insert(name.to_string(), Entry::Pulling { since, stale });
        let me = self.clone();
        let name = name.to_string();
        let tenant_slots = self.tenant_slots(tenant);
        let agent_slots = self.inner.agent.clone();
        let generation = *self.inner.generation.lock().unwrap_or_else(|e| e.into_inner());
        tracing::info!(plugin = %name, tenant = %&**tenant, "pulling in the background");
        tokio::spawn(async move {
            // The tenant's slot first: waiting for it holds none of the agent's.
            let _mine = tenant_slots.acquire_owned().await;
            let _ours = agent_slots.acquire_owned().await;
            let result = pull.await;
            let current = *me.inner.generation.lock().unwrap_or_else(|e| e.into_inner());
            if current != generation {
                me.entries().remove(&name);
                let _ = me.inner.ended.send(name.as_str().into());
                return;
            }
            let mut entries = me.entries();
            let previous = entries.remove(&name);
            let (next, tell) = match result {
                Ok((ready, cost)) => {
                    let moved = match &previous {
                        Some(Entry::Pulling { stale: Some(l), .. }) => l.ready.1 != ready.1,
                        _ => true,
                    };
                    tracing::info!(plugin = %name, pinned = %ready.1, bytes = cost.bytes, elapsed_ms = cost.elapsed.as_millis() as u64, "pull landed");
                    let landed = Landed {
                        ready,
                        cost: Some(cost),
                        at: Instant::now(),
                        pinned,
                    };
                    (Entry::Landed(Box::new(landed)), !refresh || moved)
                }
                Err(error) => {
                    let failures = failures + 1;
                    let wait = backoff(failures);
                    tracing::warn!(plugin = %name, error = %error, retry_in_s = wait.as_secs(), "pull failed; not tried again before its backoff");
                    let retry_at = Instant::now() + wait;
                    let me2 = me.clone();
                    let again: Arc<str> = name.as_str().into();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(retry_at).await;
                        let _ = me2.inner.ended.send(again);
                    });
                    match previous {
                        // A tag that cannot be refreshed: the old digest stays.
                        Some(Entry::Pulling { stale: Some(l), .. }) => (Entry::Landed(l), false),
                        _ => (
                            Entry::Failed {
                                error,
                                retry_at,
                                failures,
                            },
                            true,
                        ),
                    }
                }
            };
            entries.insert(name.clone(), next);
            drop(entries);
            if tell {
                let _ = me.inner.ended.send(name.as_str().into());
            }
        });
        since
    }
}

/// The wait after `failures` failed pulls in a row.
fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    BACKOFF_FIRST.saturating_mul(factor).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicUsize, Ordering};

    fn failing(
        calls: &Arc<AtomicUsize>,
    ) -> impl Future<Output = Result<(Ready, PullCost), ResolveError>> + Send + 'static {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(ResolveError::UnknownBuiltin { name: "gone".into() })
        }
    }

    fn hanging() -> impl Future<Output = Result<(Ready, PullCost), ResolveError>> + Send + 'static {
        std::future::pending()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pull_is_not_tried_again_before_its_backoff() {
        let pulls = Pulls::default();
        let mut ended = pulls.subscribe();
        let calls = Arc::new(AtomicUsize::new(0));
        let tenant: TenantId = "acme".into();
        assert!(matches!(
            pulls.ask("oci://r/a:1", &tenant, false, failing(&calls)),
            Asked::Pulling(_)
        ));
        assert_eq!(&*ended.recv().await.unwrap(), "oci://r/a:1", "told when it failed");
        for _ in 0..10 {
            assert!(matches!(
                pulls.ask("oci://r/a:1", &tenant, false, failing(&calls)),
                Asked::Failed(_)
            ));
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "asked ten times within the backoff: pulled once"
        );
        // The backoff passes: the waiters are told, and the next ask pulls.
        let told = ended.recv().await.unwrap();
        assert_eq!(&*told, "oci://r/a:1");
        assert!(matches!(
            pulls.ask("oci://r/a:1", &tenant, false, failing(&calls)),
            Asked::Pulling(_)
        ));
        ended.recv().await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenants_hanging_pulls_hold_only_its_own_slots() {
        let pulls = Pulls::default();
        let mut ended = pulls.subscribe();
        let hog: TenantId = "hog".into();
        for i in 0..MAX_PULLS_PER_AGENT + 2 {
            pulls.ask(&format!("oci://silent/p:{i}"), &hog, false, hanging());
        }
        let calls = Arc::new(AtomicUsize::new(0));
        pulls.ask("oci://fine/q:1", &"other".into(), false, failing(&calls));
        let told = tokio::time::timeout(Duration::from_secs(1), ended.recv()).await;
        assert_eq!(
            told.unwrap().unwrap().as_ref(),
            "oci://fine/q:1",
            "another tenant's pull ran at once"
        );
        assert_eq!(pulls.in_flight(), MAX_PULLS_PER_AGENT + 2);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_ceiling() {
        let waits: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
