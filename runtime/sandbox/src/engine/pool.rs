//! The wasmtime configuration: the pooling allocator that holds every
//! call's instance, and its fallback.

use super::{EngineError, limits};

/// What the engine's instance pool holds at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Linear memories calls use now.
    pub memories_in_use: u64,
    /// Memory slots calls have used that are idle now, keeping pages
    /// resident for the next call.
    pub idle_memories: u64,
    /// The bytes those idle slots keep resident.
    pub idle_bytes_resident: u64,
}

fn wasmtime_config(max_calls: u32, keep_resident: usize) -> wasmtime::Config {
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    // A Rust wasip2 component has a few core instances (the program and
    // wit-component's shims), one memory and a few tables.
    pool.total_component_instances(max_calls)
        .total_core_instances(max_calls * 8)
        .max_core_instances_per_component(16)
        .total_memories(max_calls * 2)
        .max_memories_per_component(2)
        .total_tables(max_calls * 8)
        .max_tables_per_component(8)
        .total_stacks(max_calls)
        .max_memory_size(limits::MAX_MEMORY as usize)
        // A call touches few pages; resetting just those with memset (found
        // with PAGEMAP_SCAN where the kernel has it) is cheaper than
        // madvise plus a page fault per page on the next call.
        .pagemap_scan(wasmtime::Enabled::Auto)
        .linear_memory_keep_resident(keep_resident)
        .table_keep_resident(64 * 1024)
        .max_unused_warm_slots(UNUSED_WARM_SLOTS);
    let mut config = base_config();
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    config
}

/// Bytes of a linear memory kept resident between calls: the pages a call
/// wrote (found with PAGEMAP_SCAN), up to this many, are zeroed and stay
/// mapped for the next call; the rest is given back. A page kept this way
/// stays resident in its slot for good, so this bounds what every slot a
/// call has ever used holds: at most `2 × max_concurrent_calls` slots
/// (512 by default) × this.
///
/// Measured in the 10-minute soak (`scripts/soak.sh`): the built-in and
/// well-behaved plugins leave 0–4 KiB written outside their data segments,
/// but a plugin that fills its memory (`alloc_forever`) left a whole 2 MiB
/// (the former value) in each slot it ran in, and as calls of other plugins
/// took its idle slots it moved on to fresh ones: the slots' resident
/// memory grew by ~0.4 MiB/s for the whole run (148 MiB after 4 minutes,
/// 368 MiB after 10: the soak's RSS +27.6 % where 5 % is allowed), towards
/// 1 GiB.
/// 32 KiB keeps the well-behaved plugins' pages resident as before and
/// bounds the pool's idle memory at 16 MiB.
pub const KEEP_RESIDENT: usize = 32 * 1024;

/// Idle memory slots the pool may prefer over a never-used one. With
/// wasmtime's default (100) a call whose plugin has no idle slot of its
/// own took a fresh slot while fewer than 100 were idle, so plugins
/// replaced through the API (each a new module) walked through fresh
/// slots. With 0, a fresh slot is taken only when every used one is busy:
/// the slots ever used are the most calls run at once (counted per
/// allocator shard: wasmtime gives each core's threads one), and a plugin
/// without an idle slot of its own takes the least recently used one.
const UNUSED_WARM_SLOTS: u32 = 0;

pub(super) fn base_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true);
    config
}

/// The pooling engine, or, where the address space for its pool cannot be
/// reserved (a low `ulimit -v`, valgrind), an engine that allocates per call.
pub(super) fn new_wasmtime_engine(max_calls: u32, keep_resident: usize) -> Result<wasmtime::Engine, EngineError> {
    match wasmtime::Engine::new(&wasmtime_config(max_calls, keep_resident)) {
        Ok(engine) => Ok(engine),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "cannot reserve the instance pool; allocating per call instead");
            wasmtime::Engine::new(&base_config()).map_err(EngineError)
        }
    }
}
