//! What the instance pool holds between calls is bounded: a memory slot
//! keeps at most a few pages resident however much its last call wrote,
//! and the slots ever used are as many as calls ran at once, however many
//! plugins came and went (the 10-minute soak grew past its 5 % bound on
//! both before they were). And what a slot keeps is never seen: a call
//! finds nothing the calls before it left there.

use sonde_sandbox::engine::{Call, Engine, EngineConfig, Limits};
use sonde_sandbox::host::Grants;
use sonde_sandbox::verdict::{Reason, Status};
use sonde_tests::guests;
use std::sync::Arc;

/// An engine of its own: other tests' calls would change the counts.
fn engine() -> Engine {
    Engine::new(EngineConfig {
        cache_dir: Some(crate::support::cache_dir()),
        max_concurrent_calls: 8,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn call(grants: &Arc<Grants>) -> Call<'_> {
    Call {
        probe: "pool",
        target: "",
        config: "{}",
        limits: Limits::default(),
        grants,
        attempt: 1,
        observe: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_fills_its_memory_leaves_few_pages_resident_in_the_pool() {
    let engine = engine();
    let grants = Arc::new(Grants::default());
    let plugin = engine.load_file(guests::ALLOC_FOREVER.as_ref()).await.unwrap();
    let r = engine.run(&plugin, &call(&grants)).await;
    assert_eq!(r.reason, Some(Reason::Memory), "{r:?}");
    let pool = engine.pool_stats().expect("an instance pool");
    assert_eq!(pool.memories_in_use, 0, "{pool:?}");
    // It wrote its whole 64 MiB cap; the slot keeps a few pages of it for
    // the next call (it kept 2 MiB, in every slot such a plugin ran in).
    assert!(
        pool.idle_bytes_resident <= 64 * 1024,
        "{} bytes stay resident after a call that filled its memory: {pool:?}",
        pool.idle_bytes_resident
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_plugins_reuse_the_pools_idle_slots_instead_of_taking_fresh_ones() {
    let engine = engine();
    let grants = Arc::new(Grants::default());
    // A plugin replaced again and again, as the API's churn does: each
    // load is a new module, with no idle slot of its own. One call at a
    // time, so one slot is all the pool ever needs.
    const ROUNDS: u64 = 24;
    for _ in 0..ROUNDS {
        let plugin = engine.load_file(guests::ALWAYS_UP.as_ref()).await.unwrap();
        let r = engine.run(&plugin, &call(&grants)).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        // Nothing else holds it: its compiled code goes, and the next load
        // compiles (or deserializes) a new module.
        drop(plugin);
    }
    let pool = engine.pool_stats().expect("an instance pool");
    assert_eq!(pool.memories_in_use, 0, "{pool:?}");
    // A Rust component has one memory; a slot or two is the bound, not
    // one per replaced plugin.
    assert!(
        pool.idle_memories <= 2,
        "{} idle memory slots after {ROUNDS} one-at-a-time calls of replaced plugins: {pool:?}",
        pool.idle_memories
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_finds_nothing_an_earlier_call_left_in_its_slot() {
    let engine = engine();
    let grants = Arc::new(Grants::default());
    let plugin = engine.load_file(guests::REMEMBER_CALLS.as_ref()).await.unwrap();
    // The guest's scan finds its marker, and its statics changed, when the
    // call itself left them: what the calls below look for is visible.
    let own = engine
        .run(
            &plugin,
            &Call {
                config: "\"self-test\"",
                ..call(&grants)
            },
        )
        .await;
    assert_eq!(own.status, Status::Failure, "{own:?}");
    for trace in ["the marker at", ".data static 0x5eee", ".bss static 1"] {
        assert!(
            own.message.contains(trace),
            "the self-test did not see {trace:?}: {own:?}"
        );
    }
    // One call at a time, each in the slot the calls before it used (the
    // pool keeps a module's slot for it), each leaving its traces.
    let mut seen = Vec::new();
    for _ in 0..8 {
        let r = engine.run(&plugin, &call(&grants)).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
        seen.push(r.message);
    }
    // The same memory size and the same heap position every time: nothing
    // of the allocator's state carried over either.
    seen.dedup();
    assert_eq!(seen.len(), 1, "calls saw different memories: {seen:?}");
    let pool = engine.pool_stats().expect("an instance pool");
    assert!(
        pool.idle_memories <= 2,
        "the calls did not reuse a slot, so nothing was shown: {pool:?}"
    );
}
