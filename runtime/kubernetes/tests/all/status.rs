//! The Lease that elects one agent to write SondeCheck status, against
//! the mocked API server on tokio's paused clock: one leader at a time,
//! and a holder that cannot renew stops writing before its lease expires.

use crate::support::fake_api::{FakeApi, Recorded};
use sonde_kubernetes::status::{self, LeaseTiming};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const PATIENCE: Duration = Duration::from_secs(60);

/// Watches two electors and sets `both` if they ever lead at once.
fn never_both(mut a: watch::Receiver<bool>, mut b: watch::Receiver<bool>, both: Arc<AtomicBool>) {
    tokio::spawn(async move {
        loop {
            if *a.borrow_and_update() && *b.borrow_and_update() {
                both.store(true, Ordering::SeqCst);
            }
            tokio::select! {
                r = a.changed() => if r.is_err() { return },
                r = b.changed() => if r.is_err() { return },
            }
        }
    });
}

/// Two electors on one API server: `node-a`, leading once this returns,
/// then `node-b`; and the flag [`never_both`] sets.
async fn two_electors(api: &FakeApi) -> (status::Election, status::Election, Arc<AtomicBool>) {
    api.open_leases();
    let a = status::elect(api.client(), "sonde-system", "node-a", LeaseTiming::default());
    let mut leads_a = a.leading.clone();
    tokio::time::timeout(PATIENCE, leads_a.wait_for(|l| *l))
        .await
        .expect("the first agent creates the Lease")
        .unwrap();
    let b = status::elect(api.client(), "sonde-system", "node-b", LeaseTiming::default());
    let both = Arc::new(AtomicBool::new(false));
    never_both(a.leading.clone(), b.leading.clone(), both.clone());
    (a, b, both)
}

#[tokio::test(start_paused = true)]
async fn one_agent_leads_and_another_takes_over_only_after_it_stops_renewing() {
    let api = FakeApi::new();
    let (a, b, both) = two_electors(&api).await;
    let leads_a = a.leading.clone();
    let mut leads_b = b.leading.clone();

    // Ten minutes of renewals: the second agent reads the Lease now and
    // then and never takes it.
    let taken = tokio::time::timeout(Duration::from_secs(600), leads_b.wait_for(|l| *l))
        .await
        .is_ok();
    assert!(!taken, "b took a Lease that a renews");
    assert!(*leads_a.borrow(), "a still leads");
    let reads_by_b = api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.contains("/leases/"))
        .count();
    assert!(
        (10..=22).contains(&reads_by_b),
        "a non-holder reads every 30-50 s, so 12-20 times in 10 minutes: {reads_by_b}"
    );
    let lease_requests: Vec<Recorded> = api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/leases"))
        .collect();
    assert!(
        lease_requests
            .iter()
            .all(|r| r.method != "GET" || r.query.contains("resourceVersion=0")),
        "reads come from the API server's cache"
    );
    assert!(
        lease_requests.iter().all(|r| !r.query.contains("watch")),
        "nobody watches the Lease"
    );

    // The holder's agent goes: it renews no more.
    drop(a);
    tokio::time::timeout(Duration::from_secs(120), leads_b.wait_for(|l| *l))
        .await
        .expect("b takes over")
        .unwrap();
    let holders = api.lease_holders();
    let first_b = holders.iter().position(|(h, _)| h == "node-b").unwrap();
    assert!(
        holders[..first_b].iter().all(|(h, _)| h == "node-a") && holders[first_b..].iter().all(|(h, _)| h == "node-b"),
        "one holder after the other: {holders:?}"
    );
    let expired = holders[first_b].1 - holders[first_b - 1].1;
    assert!(
        expired >= LeaseTiming::default().duration,
        "taken only once a's last renewal was a lease duration old: {expired:?}"
    );
    assert!(!both.load(Ordering::SeqCst), "never two leaders at once");
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_cannot_renew_stops_writing_before_its_lease_expires() {
    let api = FakeApi::new();
    let (a, b, both) = two_electors(&api).await;
    let mut leads_a = a.leading.clone();
    let leads_b = b.leading.clone();
    let renewed = Instant::now();
    api.fail_lease_writes(true);
    tokio::time::timeout(PATIENCE, leads_a.wait_for(|l| !*l))
        .await
        .expect("a steps down")
        .unwrap();
    let led_for = renewed.elapsed();
    assert!(
        led_for < LeaseTiming::default().duration,
        "a stopped within its renew deadline, before anyone may take over: {led_for:?}"
    );
    // Writes work again: exactly one of them leads again, never both.
    api.fail_lease_writes(false);
    let mut any = leads_a.clone();
    let mut other = leads_b.clone();
    tokio::time::timeout(Duration::from_secs(300), async {
        tokio::select! {
            _ = any.wait_for(|l| *l) => {}
            _ = other.wait_for(|l| *l) => {}
        }
    })
    .await
    .expect("someone leads again");
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(
        *leads_a.borrow() != *leads_b.borrow(),
        "one leader after five more minutes"
    );
    assert!(!both.load(Ordering::SeqCst), "never two leaders at once");
}
